"""The accelerator benchmark counts whole-table copies in a compiled step (checked on HLO text shaped as
XLA:TPU prints it, and on this CPU's own compiled fused step, which must copy nothing), and writes its two
tables; the fused-update benchmark records a dense optimizer that does not fit in device memory instead of
stopping."""
import json

import jax
import pytest

from benchmarks import accelerator, fused_update

# Lines as XLA:TPU printed them for the fused row-wise Adagrad step of a [1000000, 64] float32 table
# (shortened): two copies and an asynchronous copy of the table, and what must not count.
TPU_HLO = """
ENTRY %main.29 (table.1: f32[1000000,64], accum.1: f32[1000000], ids.1: s32[16384]) -> (f32[1000000,64]) {
  %table.1 = f32[1000000,64]{0,1:T(8,128)} parameter(0), metadata={op_name="table"}
  %copy.3 = f32[1000000,64]{1,0:T(8,128)} copy(%table.1), metadata={op_name="table"}
  %copy.8 = f32[1000000,64]{1,0:T(8,128)} copy(%table.1), metadata={op_name="jit(step)/optimization_barrier"}
  %copy-start = (f32[1000000,64]{1,0}, f32[1000000,64]{0,1}, u32[]) copy-start(%copy.8)
  %copy-done = f32[1000000,64]{0,1:T(8,128)} copy-done(%copy-start)
  %copy.5 = f32[1000000]{0:T(1024)} copy(%accum.1)
  %copy.6 = f32[100000,64]{1,0:T(8,128)} copy(%other)
  %gather.1 = f32[16384,64]{1,0:T(8,128)} gather(%copy.3, %ids.1)
  %scatter_fusion = f32[1000000,64]{1,0:T(8,128)} fusion(%copy.8, %idx, %rows), kind=kCustom
  ROOT %copy.9 = f32[1000000,64]{0,1:T(8,128)} copy(%scatter_fusion)
}
"""


def test_relayouts_counts_whole_table_copies_only():
    # copy.3, copy.8, copy-done and the root copy.9: not the per-row state, another array's rows, a
    # copy-start (counted at its done), the parameter, the gather or the scatter
    assert accelerator.relayouts(TPU_HLO, 1_000_000) == 4
    assert accelerator.relayouts(TPU_HLO, 100_000) == 1
    assert accelerator.relayouts(TPU_HLO, 16_384) == 0


@pytest.mark.slow
def test_quick_run_writes_both_tables_and_the_cpu_step_copies_no_table(tmp_path):
    data = accelerator.run(True, tmp_path)
    cfg = accelerator.QUICK
    assert {(r["width"], r["stored_width"], r["vocab"]) for r in data["results"]} == \
        {(*w, v) for w in cfg["widths"] for v in cfg["sizes"]}
    padded = [r for r in data["results"] if r["stored_width"] > r["width"]]
    assert padded and all(r["bytes"] > r["vocab"] * r["stored_width"] * 4 for r in padded)  # stored padded
    scan = data["scan"]
    assert len(scan) == len(cfg["scan"]["widths"]) * len(cfg["scan"]["sizes"]) * len(cfg["scan"]["dtypes"])
    # XLA:CPU updates the donated table in place at every width and dtype: the property the TPU lacks at 64
    assert all(r["relayouts"] == 0 for r in data["results"] + scan), [(r["width"], r["relayouts"]) for r in scan]
    assert all(r["temp_bytes"] < r["table_bytes"] for r in scan)
    md = (tmp_path / "accelerator.md").read_text()
    assert "| 16 (16) | async_rowwise_adagrad | 4,000 |" in md
    assert "| 16 (32) | async_rowwise_adagrad | 4,000 |" in md
    assert "## Whole-table copies by width (compiled, not run)" in md
    assert "| bfloat16 | 4,000 | 0 (" in md
    assert json.loads((tmp_path / "accelerator.json").read_text())["config"]["backend"] == jax.default_backend()


@pytest.mark.slow
def test_a_dense_optimizer_out_of_device_memory_is_recorded_not_fatal(tmp_path, monkeypatch):
    real = fused_update.Table

    def dense_fails(message):  # fused_update.Table, whose dense (optax) tables raise this device error
        class Table(real):
            def __init__(self, name, *args):
                if not name.startswith("async_"):
                    raise jax.errors.JaxRuntimeError(message)
                super().__init__(name, *args)
        return Table

    monkeypatch.setattr(fused_update, "Table", dense_fails("RESOURCE_EXHAUSTED: Ran out of memory on HBM"))
    monkeypatch.setitem(fused_update.QUICK, "opts", ("async_rowwise_adagrad",))  # what the targets need
    monkeypatch.setitem(fused_update.QUICK, "bf16_opts", ())
    data = fused_update.run(True, tmp_path)
    dense = [r for r in data["results"] if r["kind"] == "dense"]
    assert dense and all(r["step"] is None and r["error"] == "out of device memory" for r in dense)
    assert not any("optax.adam" in t["target"] for t in data["targets"])  # no ratio to a step that did not run
    assert "| 10,000 | optax.adam | float32 | out of device memory |" in (tmp_path / "fused_update.md").read_text()

    monkeypatch.setattr(fused_update, "Table", dense_fails("INTERNAL: something else"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):  # only running out of memory is recorded
        fused_update.run(True, tmp_path)
