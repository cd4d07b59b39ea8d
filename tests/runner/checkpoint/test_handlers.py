"""The checkpoints' type handlers (``runner.checkpoint.handlers.type_handlers``): in one process a replicated
shard is written by one of its replicas, with no slice cut on the device (Orbax's default, replica-parallel,
compiles and runs one per replica); the arrays on disk are the same either way, so each reads the other's."""
import jax
import jax.monitoring
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from runner.checkpoint.manager import _manager

_COMPILING = {"on": False, "n": 0}


def _count(event, secs, **kw):
    if _COMPILING["on"] and event == "/jax/core/compile/backend_compile_duration":
        _COMPILING["n"] += 1


jax.monitoring.register_event_duration_secs_listener(_count)


def _state(rows: int, width: int) -> dict:
    """A table row-sharded over the 4 table devices of a 2x4 mesh (each shard on both rows of the data axis),
    its per-row state likewise, and a replicated dense array."""
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    rng = np.random.default_rng(rows)
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    return {"table": put(rng.normal(size=(rows, width)).astype(np.float32), P("table", None)),
            "acc": put(rng.random(rows).astype(np.float32), P("table")),
            "dense": put(rng.normal(size=(width, 3)).astype(np.float32), P())}


def _orbax_default_manager(directory, read_only=False):
    """What the runner wrote with before: the same items and options, Orbax's default type handlers."""
    opts = dict(read_only=True, create=False) if read_only else dict(max_to_keep=2, create=True)
    handlers = {"state": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False),
                "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(**opts), item_handlers=handlers)


def _save(manager, state) -> int:
    """Save ``state`` at step 1; the number of programs compiled meanwhile."""
    _COMPILING.update(on=True, n=0)
    try:
        manager.save(1, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state), meta=ocp.args.JsonSave({})))
        manager.wait_until_finished()
    finally:
        _COMPILING["on"] = False
    return _COMPILING["n"]


def _restore(manager, like: dict) -> dict:
    restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), like)
    out = manager.restore(1, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(item=like,
                                                                                   restore_args=restore_args)))
    return out["state"]


def test_a_save_on_the_mesh_cuts_no_slices_on_the_device(tmp_path):
    """Orbax's default compiles a slice program for each replica's part of each replicated array (the control,
    on arrays of shapes not seen before); the runner's handlers compile nothing."""
    assert _save(_orbax_default_manager(tmp_path / "orbax"), _state(40, 6)) > 0
    assert _save(_manager(tmp_path / "runner", keep=2, async_save=False), _state(56, 10)) == 0


def test_checkpoints_written_either_way_read_back_the_same_arrays(tmp_path):
    state = _state(48, 5)
    _save(_orbax_default_manager(tmp_path / "old"), state)  # as the runner wrote before
    assert _save(_manager(tmp_path / "new", keep=2, async_save=False), state) == 0
    readers = {"runner reads Orbax's": _manager(tmp_path / "old", keep=1, async_save=False, read_only=True),
               "Orbax reads the runner's": _orbax_default_manager(tmp_path / "new", read_only=True)}
    for name, reader in readers.items():
        got = _restore(reader, state)
        for k, x in state.items():
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(x), err_msg=f"{name}: {k}")
            assert got[k].sharding == x.sharding, (name, k)
