"""No table-sized temporaries: the compiled train step, flush and table initialisation update the donated
table in place, in sync and async mode, on one device and sharded (row and column layouts), for float32 and
bfloat16 tables; and the async step writes its new deferred update without copying the old one. Checked on
XLA's own buffer plan (``memory_analysis().temp_size_in_bytes``) and the compiled step's HLO."""
import jax
import numpy as np
import pytest

from runner.build import build
from runner.core.embeddings import init_table
from runner.core.loop import to_device
from tests.runner.support import compose_config

ITEMS = 200_000  # the items table (x 8 wide) dwarfs everything else a TINY step allocates
MESHES = {"single": ["mesh=single"], "table8": ["mesh=table", "mesh.cpu_devices=8"],
          "2x4-column": ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column"]}


def compiled(overrides):
    cfg = compose_config([f"model.tables.items.vocab={ITEMS}", *overrides])
    program, task, _ = build(cfg)
    state = program.init_state(0)
    batch = to_device(program, task.batch(0, cfg.trainer.batch_size))
    step, flush, _ = program.compile(state, batch)
    table = state.tables["items"]
    shard_bytes = table.addressable_shards[0].data.nbytes
    return step.lower(state, batch).compile(), flush.lower(state).compile(), shard_bytes, program, state


@pytest.mark.slow
@pytest.mark.parametrize("mode,mesh,dtype", [("off", "single", "float32"),
                                             pytest.param("on", "table8", "bfloat16", marks=pytest.mark.slow),
                                             pytest.param("on", "2x4-column", "float32", marks=pytest.mark.slow),
                                             pytest.param("off", "table8", "float32", marks=pytest.mark.slow)])
def test_step_and_flush_update_tables_in_place(mode, mesh, dtype):
    step, flush, shard_bytes, program, state = compiled([f"async_emb={mode}", "optimizer=async_adam",
                                                         f"model.tables.items.dtype={dtype}", *MESHES[mesh]])
    assert state.tables["items"].dtype == np.dtype(dtype)
    for name, c in (("step", step), ("flush", flush)):
        temp = c.memory_analysis().temp_size_in_bytes
        assert temp < shard_bytes / 4, f"{name}: {temp} bytes of temporaries for a {shard_bytes}-byte table shard"
    if mode == "on":
        assert_deferred_update_not_copied(step, program, state)


def assert_deferred_update_not_copied(step, program, state):
    """The deferred update is not donated, so XLA writes the new one into a fresh buffer instead of copying
    the old and the new per-token gradients (it did, four copies per table per step, while it was donated)."""
    hlo = step.as_text()
    for name in program.contexts:
        pending = state.pending[name].grads  # one device's block of it is what the compiled step holds
        kind = {"float32": "f32", "bfloat16": "bf16"}[str(pending.dtype)]
        grads = f"{kind}[{','.join(map(str, pending.addressable_shards[0].data.shape))}]"
        assert grads in hlo, f"{name}: no {grads} in the compiled step"  # the check below looks for the right shape
        copies = [line for line in hlo.splitlines() if " copy(" in line and f"= {grads}" in line]
        assert not copies, f"{name}: {copies[:2]}"


@pytest.mark.parametrize("mesh", ["single", "table8"])
def test_table_init_fills_in_place(mesh):
    program, _, _ = build(compose_config([f"model.tables.items.vocab={ITEMS}", *MESHES[mesh]]))
    spec = program.tables["items"]
    sharding = jax.sharding.NamedSharding(program.mesh, program.contexts["items"].table_spec())
    shard_bytes = spec.rows * spec.width * 4 // program.contexts["items"].table_shards
    lowered = jax.jit(lambda k: init_table(spec, k, sharding)).lower(jax.random.key(0))
    temp = lowered.compile().memory_analysis().temp_size_in_bytes
    assert temp < shard_bytes / 2, f"init: {temp} bytes of temporaries for a {shard_bytes}-byte table shard"
