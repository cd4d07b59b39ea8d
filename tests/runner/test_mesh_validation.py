"""Mesh problems are refused before anything compiles, each with a message naming the value and the fix."""
import pytest

from runner.build import build
from runner.errors import PreflightError

DT = ["mesh=data_table"]


@pytest.mark.parametrize("overrides, needle", [
    (DT + ["mesh.table_axis=tabel"], "async_emb axis 'tabel' is not a mesh axis of {'data': 4, 'table': 2}"),
    (DT + ["mesh.table_axis=tabel", "async_emb=off"], "mesh.table_axis 'tabel' is not a mesh axis"),
    (DT + ["mesh.axes={data:2,table:4}", "mesh.table_layout=column", "model.emb_width=6"],
     "emb_width=6 does not shard evenly over the 4 'table' shards of the column layout"),
    (DT + ["mesh.axes={data:2,table:4}", "mesh.pad_vocab=false"],
     "table 'users': vocab=301 rows do not divide over the 4 'table' shards of the row layout; set "
     "mesh.pad_vocab=true (pads to 304 rows)"),
    (DT + ["trainer.batch_size=30"], "trainer.batch_size=30 does not divide over the 8 devices"),
    (DT + ["mesh.axes={data:4,table:4}"], "needs 16 devices but only 8 exist"),
    (DT + ["mesh.axes={data:-1,table:-1}"], "only one axis may be -1"),
    (DT + ["mesh.axes={data:-1,table:3}"], "8 devices do not divide by the fixed axes' product 3; choose sizes "
                                           "whose product divides 8"),
    (DT + ["mesh.cpu_devices=1"], "1 devices do not divide by the fixed axes' product 2; choose sizes whose product "
                                  "divides 1, or on a CPU give it virtual devices (mesh.cpu_devices=2 or a multiple of "
                                  "2)"),
])
def test_mesh_errors(cfg_of, overrides, needle):
    with pytest.raises(PreflightError) as e:
        build(cfg_of(overrides))
    assert needle in str(e.value)


def test_row_layout_pads_rows(cfg_of):
    program, _, plan = build(cfg_of(DT + ["mesh.axes={data:2,table:4}"]))
    assert plan.table_shards == 4
    assert program.tables["users"].vocab == 301 and program.tables["users"].rows == 304
    assert program.tables["items"].rows % 4 == 0
