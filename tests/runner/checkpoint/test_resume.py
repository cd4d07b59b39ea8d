"""Exact resume: 2N steps straight == N steps, stop, resume, N more (tables, optimizer state, dense params,
the deferred update and the logged rows bit-identical), in sync and async mode, on one device and on a
2x4 mesh; restore reshards onto another mesh and layout; the W&B run and metrics.jsonl continue.

Launches go through ``runner.app.run`` as ``python -m runner`` does; the final state of each run is read
back from its final checkpoint (step 2N, written after the last flush) with plain Orbax, no runner code.
"""
import json
import shutil
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

from optimizers import record_token_ids
from runner.app import run
from runner.build import build
from runner.checkpoint import open_checkpoints
from runner.errors import PreflightError
from runner.core.loop import to_device
from tests.runner.support import compose_config

N = 3
BASE = ["trainer.steps=6", "trainer.log_interval=1", "trainer.eval_interval=100", "checkpoint.interval=2",
        "data.num_items=500"]  # vocab 501: padded to 504 rows on 4 row shards, 501 on one device
MESHES = {
    "single": ["mesh=single"],
    "2x4-row": ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"],
    "4-column": ["mesh=data_table", "mesh.axes={data:1,table:4}", "mesh.table_layout=column"],
}


# async modes by name: one step stale, or a queue of two deferred updates with delay compensation
MODES = {"on": ["async_emb=on"], "off": ["async_emb=off"],
         "k2dc": ["async_emb=on", "async_emb.staleness=2", "async_emb.compensation=dc"],
         "bf16": ["async_emb=on", "model.tables.items.dtype=bfloat16"]}  # its init's compiler options: top-level only


def launch(tmp: Path, name: str, overrides=()) -> float:
    """One launch of the runner: its own output dir (as Hydra gives each launch), the run's checkpoint dir."""
    cfg = compose_config(BASE + [f"checkpoint.dir={tmp / 'ck'}", *overrides])
    return run(cfg, tmp / name)


def saved_arrays(ckpt_dir: Path, step: int) -> dict[str, np.ndarray]:
    """Every array of a checkpoint's state item, read with plain Orbax into numpy, by its tree path."""
    mgr = ocp.CheckpointManager(ckpt_dir, item_names=("state", "meta"),
                                options=ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0,
                                                                     create=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sharding info not provided": fine, we want numpy
        tree = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore())).state
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat}


def raw_key(*path) -> str:
    """A live state path as ``saved_arrays`` spells it (named tuples are read back as dicts)."""
    parts = []
    for p in path:
        name = getattr(p, "name", getattr(p, "key", None))
        parts.append(f"['{name}']" if name is not None else f"[{p.idx}]")
    return "".join(parts)


def metric_rows(out: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock columns."""
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def steps_in(ckpt_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())


def assert_same_arrays(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Launches shared by the tests of this module (per xdist worker): ``runs(kind, mode, mesh)`` is a
    directory with ``ck/`` and ``first/``: the straight 2N-step run, or the run stopped at step N."""
    cache = {}

    def get(kind: str, mode: str, mesh: str) -> Path:
        if (kind, mode, mesh) not in cache:
            d = tmp_path_factory.mktemp(f"{kind}-{mode}-{mesh}")
            stop = [f"trainer.stop_after={N}"] if kind == "stopped" else []
            launch(d, "first", [*MODES[mode], *MESHES[mesh], *stop])
            cache[kind, mode, mesh] = d
        return cache[kind, mode, mesh]

    return get


def copy_of(run_dir: Path, tmp: Path) -> Path:
    shutil.copytree(run_dir, tmp, dirs_exist_ok=True)
    return tmp


# make test-fast keeps the one-device async case. On the mesh, staleness 2 with delay compensation (two deferred
# updates and their rows in the checkpoint) covers what staleness 1 saves; the resharded resume runs staleness 1
# there. Sync mode (no deferred update in the checkpoint) runs on one device.
@pytest.mark.parametrize("mesh, mode", [pytest.param("2x4-row", "k2dc", marks=pytest.mark.slow), ("single", "on"),
                                        pytest.param("single", "off", marks=pytest.mark.slow),
                                        pytest.param("single", "bf16", marks=pytest.mark.slow)])
def test_resume_is_bit_identical(tmp_path, runs, mesh, mode):
    straight, tmp = runs("straight", mode, mesh), copy_of(runs("stopped", mode, mesh), tmp_path)
    assert steps_in(tmp / "ck") == [2, N]  # the interval's checkpoint, and the one the stop forced
    assert [r["step"] for r in metric_rows(tmp / "first")] == [1, 2, 3]
    at_stop = saved_arrays(tmp / "ck", N)
    # the deferred updates of step N (k2dc: of steps N-1 and N, oldest first) travel in the checkpoint, not
    # flushed into the table; under compensation each with the rows its gradient was computed on
    records = {"on": ["['pending']['items']"], "k2dc": ["['pending']['items'][0]", "['pending']['items'][1]"]}
    for key in records.get(mode, []):
        assert at_stop[key + "['pending']"].shape == () and at_stop[key + "['pending']"]
        assert np.abs(at_stop[key + "['grads']"]).sum() > 0
        if mode == "k2dc":
            assert at_stop[key + "['rows']"].shape == at_stop[key + "['grads']"].shape
            assert np.abs(at_stop[key + "['rows']"]).sum() > 0
    if mode == "k2dc":  # two different steps' records
        assert not np.array_equal(at_stop[records[mode][0] + "['grads']"], at_stop[records[mode][1] + "['grads']"])
    launch(tmp, "second", [*MODES[mode], *MESHES[mesh]])

    assert_same_arrays(saved_arrays(straight / "ck", 6), saved_arrays(tmp / "ck", 6))
    resumed = metric_rows(tmp / "second")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6, 6]  # every step once, then the final eval
    assert resumed == metric_rows(straight / "first")  # losses, grad norms, AUCs: bit-identical floats
    best = lambda out: {k: v for k, v in json.loads((out / "summary.json").read_text()).items()  # noqa: E731
                        if k.endswith(("/best", "/best_step"))}
    assert best(tmp / "second") == best(straight / "first") and best(tmp / "second")  # evaluations before the stop count


@pytest.mark.slow
def test_relaunch_of_finished_run_only_evaluates(tmp_path, runs):
    tmp = copy_of(runs("straight", "k2dc", "2x4-row"), tmp_path)  # the bit-identical test's straight run
    objective = json.loads((tmp / "first" / "summary.json").read_text())["valid/auc_mean"]
    assert launch(tmp, "again", [*MODES["k2dc"], *MESHES["2x4-row"]]) == objective
    # The same rows; only the final row's flush record differs: the relaunch restores the flushed state, so
    # its flush has nothing pending (the first run's flush applied steps 5 and 6's deferred updates).
    again, first = metric_rows(tmp / "again"), metric_rows(tmp / "first")
    assert again[:-1] == first[:-1]
    flush_keys = {k for k in first[-1] if k.startswith("emb/flush_")}
    assert flush_keys and again[-1]["emb/flush_valid"] is False and first[-1]["emb/flush_valid"] is True
    assert {k: v for k, v in again[-1].items() if k not in flush_keys} == \
        {k: v for k, v in first[-1].items() if k not in flush_keys}
    assert steps_in(tmp / "ck") == [2, 4, 6]


@pytest.mark.parametrize("mode", ["off", pytest.param("on", marks=pytest.mark.slow)])
def test_a_finished_run_extended_by_a_larger_budget_trains_on(tmp_path, runs, mode):
    """A finished run of N steps relaunched with trainer.steps=2N resumes from its final checkpoint and trains N
    more. Sync mode: bit-identical to the straight 2N-step run. Async mode: the final checkpoint holds the
    flushed state, so step N's deferred update was applied before step N+1's forward pass (the straight run
    applies it during it): a slightly different run, not the same one (docs/guide/checkpoints.md)."""
    straight = runs("straight", mode, "single")
    launch(tmp_path, "first", [*MODES[mode], f"trainer.steps={N}"])
    assert steps_in(tmp_path / "ck") == [2, N]
    launch(tmp_path, "second", MODES[mode])
    assert [r["step"] for r in metric_rows(tmp_path / "second")] == [1, 2, 3, 4, 5, 6, 6]
    a, b = saved_arrays(straight / "ck", 6), saved_arrays(tmp_path / "ck", 6)
    assert a.keys() == b.keys()
    if mode == "off":
        assert_same_arrays(a, b)
        assert metric_rows(tmp_path / "second")[N:] == metric_rows(straight / "first")[N:]
        return
    table = "['tables']['items']"
    assert not np.array_equal(a[table], b[table])
    norm = lambda x: float(np.linalg.norm(np.asarray(x, np.float64)))  # noqa: E731
    rel = {k: norm(a[k] - b[k]) / max(norm(a[k]), 1e-12) for k in a if a[k].dtype.kind == "f"}
    # measured: up to 0.13 of an array's norm after 3 steps at debug=tiny's rates (a table restarted from its
    # initial values, or not trained on, would be ~1)
    assert max(rel.values()) < 0.25, sorted(rel.items(), key=lambda kv: -kv[1])[:5]


@pytest.mark.slow
def test_wandb_run_resumes_with_the_same_id(tmp_path):
    over = ["logger=wandb", "logger.mode=offline", "trainer.run_id=resume-me"]
    launch(tmp_path, "first", over + [f"trainer.stop_after={N}"])
    launch(tmp_path, "second", over)
    runs = [list((tmp_path / name / "wandb").glob("offline-run-*")) for name in ("first", "second")]
    assert [len(r) for r in runs] == [1, 1]
    assert all(r[0].name.endswith("-resume-me") for r in runs)  # one W&B run, continued
    assert [r["step"] for r in metric_rows(tmp_path / "second")] == [1, 2, 3, 4, 5, 6, 6]


def test_run_id_is_stable_and_ignores_where_it_runs(tmp_path):
    from runner.checkpoint.meta import run_id

    a = run_id(compose_config(BASE))
    assert a == run_id(compose_config(BASE + ["logger=wandb", "checkpoint.interval=5", "trainer.log_interval=7",
                                              *MESHES["2x4-row"], "trainer.stop_after=2"]))
    assert a != run_id(compose_config(BASE + ["optimizer.learning_rate=0.5"]))
    assert a != run_id(compose_config(BASE + ["trainer.steps=8"]))  # another schedule, another run
    assert run_id(compose_config(BASE + ["trainer.run_id=mine"])) == "mine"


def restore_onto(tmp: Path, source: Path, mesh: str, mode: str = "on"):
    cfg = compose_config(BASE + [f"async_emb={mode}", *MESHES[mesh], f"checkpoint.resume={source}",
                                 "checkpoint.interval=0"])
    program, _, plan = build(cfg)
    state, start, _ = open_checkpoints(cfg, program, plan, tmp / f"restore-{mesh}").resume_point()
    return program, state, start


@pytest.mark.slow
@pytest.mark.parametrize("target, spec", [("4-column", P(None, "table")), ("single", P())])
def test_restore_reshards_onto_another_mesh_and_layout(tmp_path, runs, target, spec):
    source = runs("stopped", "on", "2x4-row") / "ck"
    saved = saved_arrays(source, N)
    assert saved["['tables']['items']"].shape == (504, 8)  # padded for 4 row shards
    program, state, start = restore_onto(tmp_path, source / str(N), target)
    assert start == N
    for name, table in state.tables.items():
        vocab, rows = program.tables[name].vocab, program.tables[name].rows
        assert table.shape[0] == rows and table.sharding.spec == spec
        np.testing.assert_array_equal(np.asarray(table)[:vocab], saved[f"['tables']['{name}']"][:vocab])
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.emb_states[name])[0]:
            got, want = np.asarray(leaf), saved[f"['emb_states']['{name}']" + raw_key(*path)]
            np.testing.assert_array_equal(got[:vocab] if got.ndim else got, want[:vocab] if want.ndim else want)
        upd = state.pending[name]
        ids = np.asarray(upd.unique_tokens)
        assert ids.shape == (program.contexts[name].record_unique,)  # this layout's kind of record
        assert (ids[ids >= vocab] == rows).all()  # padded with this layout's out-of-range id
        key = f"['pending']['{name}']"
        np.testing.assert_array_equal(  # every token still names the same row
            record_token_ids(ids, np.asarray(upd.segment_ids), rows),
            record_token_ids(saved[key + "['unique_tokens']"], saved[key + "['segment_ids']"], 504))
        np.testing.assert_array_equal(np.asarray(upd.grads), saved[key + "['grads']"])


@pytest.mark.slow  # two launches on the 2x4 mesh and a resume: make test (make test-fast resumes on one device)
@pytest.mark.parametrize("mode", ["on", "k2dc"])
def test_resharded_resume_continues_like_the_straight_run(tmp_path, runs, mode):
    """Saved on 2x4 row shards (504 rows), resumed on one device (501 rows): the deferred update (k2dc: the
    queue of two, in its order) lands on the same rows and the run ends where the straight sharded one does
    (padding rows aside)."""
    straight, tmp = runs("straight", mode, "2x4-row"), copy_of(runs("stopped", mode, "2x4-row"), tmp_path)
    launch(tmp, "second", [*MODES[mode], *MESHES["single"]])
    want, got = saved_arrays(straight / "ck", 6), saved_arrays(tmp / "ck", 6)
    assert want["['tables']['items']"].shape[0] == 504 and got["['tables']['items']"].shape[0] == 501
    assert want.keys() == got.keys()
    for key, value in want.items():
        g = got[key]
        table = f"['tables']{key.split(']')[1]}]" if key.count("]") > 1 else None  # a per-table leaf's table
        vocab = got[table].shape[0] if table in got else None  # one device stores exactly the vocab
        if key.endswith("['unique_tokens']"):  # each layout its own kind of record: per-token ids compared
            seg = key.replace("unique_tokens", "segment_ids")
            for i in np.ndindex(g.shape[:-1]):  # each record of a queue (k2dc) on its own
                np.testing.assert_array_equal(record_token_ids(g[i], got[seg][i], vocab),
                                              record_token_ids(value[i], want[seg][i], -(-vocab // 4) * 4),
                                              err_msg=key)
        elif key.endswith("['segment_ids']"):
            continue  # compared with the ids above
        elif g.shape != value.shape:  # row-padded leaves: the logical rows match, the padding stayed zero
            assert g.shape[0] == vocab and value.shape[0] == -(-vocab // 4) * 4, key
            np.testing.assert_allclose(g, value[:vocab], rtol=1e-5, atol=1e-7, err_msg=key)
            assert not value[vocab:].any(), key
        else:
            np.testing.assert_allclose(g, value, rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
def test_a_queue_resumes_only_with_its_own_staleness_and_compensation(tmp_path, runs):
    """A checkpoint of ``async_emb.staleness=2`` with delay compensation, resumed with another staleness and no
    compensation: refused before anything compiles, one message naming both settings and their values."""
    from runner.errors import PreflightError  # noqa: PLC0415

    tmp = copy_of(runs("stopped", "k2dc", "2x4-row"), tmp_path)
    with pytest.raises(PreflightError) as e:
        launch(tmp, "second", ["async_emb=on", "async_emb.staleness=4", *MESHES["2x4-row"]])
    msg = str(e.value)
    assert "async_emb.staleness: the checkpoint has 2, this config has 4" in msg
    assert "async_emb.compensation: the checkpoint has dc, this config has none" in msg


@pytest.mark.slow
def test_async_save_holds_the_state_of_its_step_while_training_goes_on(tmp_path):
    """The save returns while the write goes on; the next steps donate (reuse) the state's buffers. The
    checkpoint must still hold the state as it was at its step, not what later steps wrote."""
    cfg = compose_config(BASE + [f"checkpoint.dir={tmp_path / 'ck'}", "model.tables.items.vocab=200003",
                                 *MESHES["2x4-row"]])
    program, task, plan = build(cfg)
    checkpoints = open_checkpoints(cfg, program, plan, tmp_path)
    state = program.init_state(0)
    put = lambda t: to_device(program, task.batch(t, 32))  # noqa: E731
    step, _, _ = program.compile(state, put(0))
    state, _ = step(state, put(0))
    snapshot = {k: np.array(v) for k, v in numpy_leaves(state).items()}
    checkpoints.save(1, state)
    for t in range(1, 4):
        state, _ = step(state, put(t))
    jax.block_until_ready(state)
    checkpoints.wait()
    checkpoints.close()
    assert not np.array_equal(np.asarray(state.tables["items"]), snapshot["['tables']['items']"])
    assert_same_arrays(saved_arrays(tmp_path / "ck", 1), snapshot)


def numpy_leaves(state) -> dict[str, np.ndarray]:
    return {raw_key(*p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


@pytest.mark.slow
def test_checkpoint_records_its_config_versions_and_format(runs):
    step_dir = runs("stopped", "on", "single") / "ck" / str(N)
    layout = json.loads((step_dir / "state" / "_METADATA").read_text())
    assert layout["use_zarr3"] and layout["use_ocdbt"]  # tensorstore zarr3 arrays in an OCDBT store
    meta = json.loads((step_dir / "meta" / "metadata").read_text())
    assert meta["step"] == meta["data_step"] == N and meta["metrics_rows"] == N  # one row logged per step
    assert meta["config"]["trainer"]["stop_after"] == N and meta["config"]["model"]["emb_width"] == 8
    assert set(meta["versions"]) >= {"jax", "optax", "orbax-checkpoint", "tensorstore", "recsys-runner"}
    assert meta["versions"]["jax"] == jax.__version__
    assert meta["tables"]["items"] == {"vocab": 501, "rows": 501, "width": 8, "stored_width": 8, "dtype": "float32",
                                       "optimizer": "AsyncAdam", "tokens_per_batch": 32 * 5, "permute_ids": False,
                                       "kind": "dense"}


HASH = ["data.raw_ids=true", "data.drift=20", "trainer.eval_batches=2", "model.tables.items.kind=hash", "model.tables.items.capacity=60",
        "model.tables.items.probes=4", "model.tables.users.kind=hash", "model.tables.users.capacity=52",
        "model.tables.users.admit_after=2", "model.tables.users.evict=lfu"]  # capacities: 4 partitions on 2x4


@pytest.mark.slow
@pytest.mark.parametrize("mode, mesh", [("on", "single")])
def test_hash_tables_resume_bit_identical(tmp_path, mode, mesh):
    """Keys, slot metadata, the admission sketch, rows and optimizer state are checkpointed and digested: a
    stopped and resumed run of hash tables that evict every step ends bit-identical to the straight run. (On
    the 2x4 mesh a hash table's resume is in the re-bucketing test below: its checkpoint of 4 partitions resumes
    on the mesh and ends as the run that went on there.)"""
    over = [*MODES[mode], *MESHES[mesh], *HASH]
    straight = tmp_path / "straight"
    launch(straight, "first", over)
    stopped = tmp_path / "stopped"
    launch(stopped, "first", [*over, f"trainer.stop_after={N}"])
    at_stop = saved_arrays(stopped / "ck", N)
    assert {"['hashed']['items']['keys']", "['hashed']['users']['sketch']"} <= set(at_stop)
    meta = json.loads((stopped / "ck" / str(N) / "meta" / "metadata").read_text())
    assert ".hashed['items'].keys" in meta["arrays"]  # the digest covers the keys
    launch(stopped, "second", over)
    final = saved_arrays(stopped / "ck", 6)
    assert_same_arrays(saved_arrays(straight / "ck", 6), final)
    assert (final["['hashed']['items']['last']"] >= 0).all()
    rows = metric_rows(stopped / "second")
    assert rows == metric_rows(straight / "first")
    assert sum(r.get("emb/evicted/items", 0) for r in rows) > 0


@pytest.mark.slow
def test_a_hash_table_resumed_with_other_partitions_places_its_ids_again(tmp_path, caplog):
    """One device's checkpoint (one partition a table) resumed on the 2x4 mesh (the mesh's default: 4, one a row
    shard) places every id again in its new partition, with its row, optimizer state and metadata
    (``rebucket.py``), and the deferred update follows its rows. The reference: the same checkpoint resumed on
    one device with 4 partitions (a one-device program of the same partitions trains as the mesh's:
    ``test_hash_step.py``). Both end alike: slots exactly, rows to float rounding."""
    over = ["async_emb=on", *HASH]
    stopped, other = tmp_path / "stopped", tmp_path / "other"
    launch(stopped, "first", [*over, "mesh=single", f"trainer.stop_after={N}"])
    shutil.copytree(stopped, other)
    with caplog.at_level("WARNING", logger="runner"):
        launch(stopped, "second", [*over, *MESHES["2x4-row"]])
    assert "hash table 'items' was saved with 1 partitions and this run has 4" in caplog.text
    launch(other, "second", [*over, "mesh=single", "model.tables.items.partitions=4",
                             "model.tables.users.partitions=4"])
    a, b = saved_arrays(stopped / "ck", 6), saved_arrays(other / "ck", 6)
    assert_same_hash_runs(a, b)
    assert (a["['hashed']['items']['last']"] >= N).any()  # trained on after the move


def assert_same_hash_runs(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if "['pending']" in k:  # flushed at the end; each layout writes its records its own way (per device on a mesh)
            continue
        if "hashed" in k:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:  # the dense authors table: 52 rows on 4 row shards (padded), its 51 on one device
            x, y = np.atleast_1d(a[k]), np.atleast_1d(b[k])
            n = min(len(x), len(y))
            np.testing.assert_allclose(x[:n], y[:n], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_a_hash_table_resumes_only_with_its_own_kind_capacity_and_window(tmp_path):
    """A hash table's kind, window and capacity must match its checkpoint's, and its partitions and stored width
    may not both change on one resume (its rows are placed again as stored): each refused by its message."""
    over = ["async_emb=on", "mesh=single", *HASH, "trainer.stop_after=2"]
    launch(tmp_path, "first", over)
    for change, words in ((["model.tables.items.probes=8"], "table 'items' probes"),
                          (["model.tables.items.capacity=70"], r"table 'items' capacity \(model.tables.items."
                                                               r"capacity\): the checkpoint has 60, this config has 70"),
                          (["model.tables.users.kind=modulo", "model.tables.users.vocab=52"], "table 'users' kind"),
                          (["model.tables.users.sketch_width=1024"],
                           r"table 'users' admission sketch \(model.tables.users.sketch_width, model.tables.users."
                           r"admit_after\): the checkpoint has (\d+) columns, this config 1024; resume with the "
                           r"sketch it was saved with \(model.tables.users.sketch_width=\1\)"),
                          (["model.tables.items.capacity=64", "model.tables.items.partitions=4"],
                           r"table 'items' capacity \(model.tables.items.capacity\): the checkpoint has 60, this "
                           r"config has 64"),
                          (["model.tables.items.partitions=4", "model.tables.items.stored_width=13"],
                           r"table 'items' stored_width \(model.tables.items.stored_width\): the checkpoint has 8, "
                           r"this config has 13, and its partitions change too; resume with "
                           r"model.tables.items.stored_width=8 first, then change it")):
        with pytest.raises(PreflightError, match=words):
            launch(tmp_path, "again", [*over, *change])
