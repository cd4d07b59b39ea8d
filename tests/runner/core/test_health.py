"""Numbers a user can trust: evaluation on its own schedule, refused updates counted and a run that keeps
refusing them stopped, the async flush's record, what a mid-run async evaluation scores, and ids outside a
table read as zeros, counted, and refused under ``trainer.strict_ids``."""
from __future__ import annotations

import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optimizers import AsyncEmbContext
from runner.app import run
from runner.build import build
from runner.core import loop
from runner.core.embeddings import lookup
from runner.core.mesh import build_mesh, MeshPlan
from runner.errors import PreflightError, RunnerError, TrainingError
from tests.runner.support import compose_config, id_rows, numpy_tree, run_steps, seq_config


def jsonl(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class Recorder:
    """A tracker that keeps what it is given."""

    def __init__(self):
        self.rows, self.summary = [], None

    def log(self, metrics, step):
        self.rows.append({"step": step, **metrics})

    def log_summary(self, metrics):
        self.summary = dict(metrics)

    def define_summary(self, *args, **kwargs):
        pass

    def finish(self, *args, **kwargs):
        pass


# ----------------------------------------------------------------------------------------------------
# 1. Evaluation every eval_interval steps, whether or not the step is logged
# ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_eval_runs_on_its_own_schedule(tmp_path):
    run(compose_config(["trainer.steps=7", "trainer.log_interval=2", "trainer.eval_interval=3"]), tmp_path)
    rows = jsonl(tmp_path)
    assert [r["step"] for r in rows if "train/loss" in r] == [2, 4, 6, 7]
    assert [r["step"] for r in rows if "valid/auc_mean" in r] == [3, 6, 7]  # 7: the final evaluation
    step3 = [r for r in rows if r["step"] == 3]
    assert len(step3) == 1 and "train/loss" not in step3[0]  # an eval on a non-log step is its own row
    assert len([r for r in rows if r["step"] == 6]) == 1  # a log step that is also an eval step: one row


# ----------------------------------------------------------------------------------------------------
# 3. Refused updates: counted, and a run that keeps refusing them stops
# ----------------------------------------------------------------------------------------------------
DIVERGING = ["optimizer=async_sgd", "optimizer.learning_rate=1e38", "trainer.steps=30", "trainer.log_interval=1",
             "trainer.eval_interval=1000"]


@pytest.mark.slow
def test_consecutive_skipped_updates_stop_the_run_before_a_checkpoint_of_that_state(tmp_path):
    ck = tmp_path / "ck"
    cfg = compose_config(DIVERGING + ["checkpoint.interval=1", f"checkpoint.dir={ck}"])
    with pytest.raises(TrainingError) as info:
        run(cfg, tmp_path / "out")
    msg = str(info.value)
    assert isinstance(info.value, RunnerError)  # python -m runner: "error: <message>", exit code 2
    stopped = int(re.search(r"training stopped at step (\d+):", msg).group(1))
    assert re.search(r"the last 10 embedding updates of table '\w+' were all skipped", msg), msg
    for part in ("trainer.max_skipped_updates=10", "learning rate too high", "eps=0", "b1 or b2 >= 1",
                 "Its optimizer: AsyncSGD(learning_rate=1e+38). ", "trainer.max_skipped_updates=0 never stops",
                 f"No checkpoint was saved of this state; the newest is step {stopped - 1}"):
        assert part in msg, (part, msg)
    saved = sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    assert saved[-1] == stopped - 1 < 30  # nothing saved at (or after) the step that stopped the run
    rows = [r for r in jsonl(tmp_path / "out") if "train/loss" in r]
    skipped = [r["emb/skipped_updates"] for r in rows]
    assert skipped == sorted(skipped) and skipped[-1] >= 10  # cumulative
    assert max(r[k] for r in rows for k in r if k.startswith("emb/consecutive_skips/")) == 10
    assert rows[-1]["step"] == stopped


@pytest.mark.slow
def test_without_checkpoints_the_run_stops_too(tmp_path):
    with pytest.raises(TrainingError, match=r"^training stopped at step \d+: the last 10 embedding updates of "
                                            r"table '\w+' were all skipped \(trainer.max_skipped_updates=10\)"):
        run(compose_config(DIVERGING), tmp_path)
    assert not (tmp_path / "summary.json").exists() or json.loads((tmp_path / "summary.json").read_text()).get(
        "status") != "ok"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_run_too_short_for_the_limit_whose_every_update_was_skipped_fails(tmp_path, mode):
    """6 steps, all refused: too few for max_skipped_updates=10, but the tables never trained; it used to end ok."""
    ck = tmp_path / "ck"
    cfg = compose_config(["optimizer=async_sgd", "optimizer._target_=tests.runner.custom_optimizers.OverflowingSGD",
                          f"async_emb={mode}", "checkpoint.interval=3", f"checkpoint.dir={ck}"])
    with pytest.raises(TrainingError) as e:
        run(cfg, tmp_path / "out")
    assert str(e.value).startswith(
        "training ended without training table 'authors': every one of the run's 6 embedding updates of it was "
        "skipped (a longer run would have stopped at trainer.max_skipped_updates=10), each with a non-finite gradient "
        "or writing non-finite rows or optimizer state, so the table and its optimizer state are as initialised; so "
        "were 'items', 'users'. The metrics and summary are written. No checkpoint of this state was saved; the "
        f"newest is step 3 in {ck}. Its optimizer: OverflowingSGD(learning_rate=0.5"), str(e.value)
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [3]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["emb/skipped_updates/users"] == 6
    assert np.isfinite(summary["final/train_loss"])


@pytest.mark.slow
def test_a_run_whose_loss_ends_not_a_number_fails_and_saves_no_checkpoint_of_that_state(tmp_path):
    ck = tmp_path / "ck"  # 6 steps: too few for max_skipped_updates=10 to stop it first
    cfg = compose_config(["dense_optimizer.learning_rate=1e30", "dense_optimizer.warmup_steps=0",
                          "checkpoint.interval=3", f"checkpoint.dir={ck}"])
    with pytest.raises(TrainingError) as e:
        run(cfg, tmp_path / "out")
    assert str(e.value).startswith("training diverged: the last logged train loss is nan at the end of the run "
                                   "(step 6), so the model's parameters are not numbers; the metrics and summary are "
                                   "written, and no checkpoint of this state was saved. The newest checkpoint is step "
                                   f"3 in {ck}")
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [3]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 2  # the exit code the process ends with


@pytest.mark.slow
def test_max_skipped_updates_zero_never_stops_and_the_summary_counts(tmp_path):
    # every step runs; the run still fails at its end, since its loss is not a number (a diverged model)
    with pytest.raises(TrainingError, match=r"^training diverged: the last logged train loss is nan at the end of "
                                            r"the run \(step 14\)"):
        run(compose_config(DIVERGING[:2] + ["trainer.steps=14", "trainer.max_skipped_updates=0"]), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 14
    rows = jsonl(tmp_path)
    final = rows[-1]
    assert final["step"] == 14 and "valid/auc_mean" in final
    assert summary["emb/skipped_updates"] == final["emb/skipped_updates"] >= 10
    per_table = [final[k] for k in final if k.startswith("emb/skipped_updates/")]
    assert len(per_table) == 3 and sum(per_table) == final["emb/skipped_updates"]


def test_a_negative_max_skipped_updates_is_refused():
    with pytest.raises(PreflightError, match=r"trainer.max_skipped_updates=-1 is outside"):
        build(compose_config(["trainer.max_skipped_updates=-1"]))


@pytest.mark.slow
def test_skip_counts_survive_as_state():
    """The counts live in the train state (so a checkpoint keeps them): total and streak per table."""
    program, data, _ = build(compose_config(["optimizer=async_sgd", "optimizer.learning_rate=1e38",
                                             "async_emb=off"]))
    _, state, _, metrics = run_steps(program, data, 5)
    valid = np.array([[m[f"emb/valid/{n}"] for n in sorted(program.tables)] for m in metrics])
    for i, n in enumerate(sorted(program.tables)):
        refused = ~valid[:, i]
        streak = 0
        for r in refused:
            streak = streak + 1 if r else 0
        assert int(state.skips[n].total) == refused.sum() == metrics[-1][f"emb/skipped_updates/{n}"]
        assert int(state.skips[n].streak) == streak == metrics[-1][f"emb/consecutive_skips/{n}"]
    assert valid[1:].sum() < valid[1:].size  # the run diverged: some updates were refused


# ----------------------------------------------------------------------------------------------------
# 4. The async flush's record, and what a mid-run evaluation scores
# ----------------------------------------------------------------------------------------------------
class Spy:
    """The task, recording the state each evaluation scores."""

    def __init__(self, task):
        self.task, self.seen = task, []

    def __getattr__(self, name):
        return getattr(self.task, name)

    def evaluate(self, predict, state, put, batch_size):
        self.seen.append((int(state.step), numpy_tree(state.tables),
                          {n: bool(p.pending) for n, p in state.pending.items()}))
        return self.task.evaluate(predict, state, put, batch_size)


def same(a, b):
    return all(np.array_equal(a[n], b[n]) for n in a)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["on", "off"])
def test_mid_run_eval_scores_the_state_as_documented_and_the_flush_is_logged(mode):
    cfg = compose_config(["optimizer=async_sgd", f"async_emb={mode}", "trainer.steps=4", "trainer.log_interval=4",
                          "trainer.eval_interval=2"])
    program, task, _ = build(cfg)
    spy, tracker = Spy(task), Recorder()
    loop.train(program, spy, cfg.trainer, tracker, log=lambda *a: None)
    (mid_step, mid_tables, mid_pending), (end_step, end_tables, end_pending) = spy.seen
    assert (mid_step, end_step) == (2, 4)

    _, unflushed2, _, _ = run_steps(program, task, 2, flush=False)
    _, flushed2, _, _ = run_steps(program, task, 2, flush=True)
    _, flushed4, _, _ = run_steps(program, task, 4, flush=True)
    if mode == "on":  # README: a mid-run async evaluation lacks the last step's deferred update
        assert same(mid_tables, numpy_tree(unflushed2.tables)) and not same(mid_tables, numpy_tree(flushed2.tables))
        assert all(mid_pending.values())
    else:  # sync: every update of the steps so far is in the tables
        assert same(mid_tables, numpy_tree(flushed2.tables)) and mid_pending == {}
    assert same(end_tables, numpy_tree(flushed4.tables)) and not any(end_pending.values())  # after the flush

    final = tracker.rows[-1]
    assert final["step"] == 4 and "valid/auc_mean" in final
    if mode == "on":
        # The flush applies G_4: the norm step 5 would report for it, had the run gone on.
        _, _, _, five = run_steps(program, task, 5, flush=False)
        assert final["emb/flush_valid"] is True
        np.testing.assert_allclose(final["emb/flush_grad_norm"], float(five[4]["emb/grad_norm"]), rtol=1e-6)
        for n in program.tables:
            np.testing.assert_allclose(final[f"emb/flush_grad_norm/{n}"], float(five[4][f"emb/grad_norm/{n}"]),
                                       rtol=1e-6)
    else:
        assert "emb/flush_grad_norm" not in final
    assert final["emb/skipped_updates"] == 0 == tracker.summary["emb/skipped_updates"]


# ----------------------------------------------------------------------------------------------------
# 5. Ids outside a table: zeros on every layout, counted, refused under strict_ids
# ----------------------------------------------------------------------------------------------------
LAYOUTS = {
    "single": None,
    "row": MeshPlan((("data", 2), ("table", 4)), "table", "row"),
    "column": MeshPlan((("data", 2), ("table", 4)), "table", "column"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lookup_reads_zeros_for_out_of_range_ids(layout):
    rows, width = 16, 8
    plan = LAYOUTS[layout]
    mesh = build_mesh(plan) if plan else None
    ctx = AsyncEmbContext(rows, width, 32, mesh=mesh, table_axis=plan.table_axis if plan else None,
                          table_layout=plan.table_layout if plan else "row")
    table = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 1
    ids = np.array([[-1, -16, 3, 16], [20, 15, 0, -5]] * 4, np.int32)
    sharding = jax.sharding.NamedSharding(mesh, ctx.table_spec()) if mesh else None
    got = np.asarray(jax.jit(lambda t, i: lookup(ctx, t, i))(jax.device_put(table, sharding), ids))
    want = np.where(((ids >= 0) & (ids < rows))[..., None], table[np.clip(ids, 0, rows - 1)], 0)
    np.testing.assert_array_equal(got, want)


BAD = (-1, -7, 10**6)  # 10**6 is past the vocab; a negative id must not wrap around to the last rows


class BadIds:
    """The task with some input ids replaced by out-of-range ones (3 per batch)."""

    def __init__(self, task):
        self.task = task

    def __getattr__(self, name):
        return getattr(self.task, name)

    key = "inputs"

    def put(self, ids):
        for k, bad in enumerate(BAD):
            ids[k, -1 - k] = bad

    def batch(self, step, batch_size, **kw):
        b = dict(self.task.batch(step, batch_size, **kw))
        b[self.key] = b[self.key].copy()
        self.put(b[self.key])
        return b


SEQ_MESH = {"single": ["mesh=single"],
            "row": ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"],
            "column": ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column"]}


@functools.lru_cache(maxsize=None)  # the one-device run is the reference of both layouts: built and run once
def one_bad_step(layout):
    program, task, _ = build(seq_config("async_emb=off", "optimizer=async_sgd", *SEQ_MESH[layout]))
    state0, state, losses, metrics = run_steps(program, BadIds(task), 1)
    return program, task, state0, numpy_tree(state.tables), losses[0], metrics[0]


@pytest.mark.slow  # make test-fast: test_lookup_reads_zeros_for_out_of_range_ids above
@pytest.mark.parametrize("layout", ["row", "column"])
def test_out_of_range_ids_read_zeros_and_are_counted_on_every_layout(layout):
    program, task, state0, tables, loss, m = one_bad_step("single")
    # Reference: the model's loss with the out-of-range ids' rows as zeros, from the initial numpy table.
    B = 64
    batch = BadIds(task).batch(0, B)
    ids = np.asarray(program.model.table_ids({k: jnp.asarray(v) for k, v in batch.items()})["items"])
    vocab = program.tables["items"].vocab
    ok = (ids >= 0) & (ids < vocab)
    embs = {"items": jnp.asarray(np.where(ok[..., None], state0.tables["items"][np.clip(ids, 0, vocab - 1)], 0))}
    ref_loss, _ = program.model.loss(state0.params, embs, {k: jnp.asarray(batch[k]) for k in program.model_keys})
    np.testing.assert_allclose(loss, float(ref_loss), rtol=1e-5)
    assert m["emb/dropped_ids/items"] == len(BAD) == (~ok).sum()

    sharded_program, _, _, sharded_tables, sharded_loss, sm = one_bad_step(layout)
    assert sm["emb/dropped_ids/items"] == len(BAD)
    np.testing.assert_allclose(sharded_loss, loss, rtol=1e-5)
    np.testing.assert_allclose(id_rows(sharded_program.tables["items"], sharded_tables["items"]), tables["items"],
                               rtol=1e-5, atol=1e-7)  # the row layout's ids are permuted (mesh.permute_ids=auto)
    assert not sharded_tables["items"][vocab:].any()  # padded rows stay zero


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True])
def test_strict_ids_stops_with_the_table_the_id_and_the_vocab(strict):
    cfg = seq_config("trainer.steps=3", "trainer.log_interval=1", "trainer.eval_interval=1000",
                     f"trainer.strict_ids={str(strict).lower()}")
    program, task, _ = build(cfg)
    tracker = Recorder()
    vocab = program.tables["items"].vocab
    if strict:
        with pytest.raises(TrainingError) as info:
            loop.train(program, BadIds(task), cfg.trainer, tracker, log=lambda *a: None)
        assert str(info.value).startswith(
            f"table 'items' got id -1 in the batch of step 1, outside its vocab [0, {vocab}) (3 such ids in that "
            f"batch; trainer.strict_ids=true stops on them). Fix the data's ids, raise model.tables.items.vocab "
            f"above the largest id, or set trainer.strict_ids=false")
        assert (tracker.rows[0]["step"], tracker.rows[0]["emb/dropped_ids/items"]) == (1, 3)
        assert not any("valid/ndcg@10" in r for r in tracker.rows) and tracker.summary is None  # it stopped
    else:
        loop.train(program, BadIds(task), cfg.trainer, tracker, log=lambda *a: None)
        train_rows = [r for r in tracker.rows if "train/loss" in r]
        assert [r["emb/dropped_ids/items"] for r in train_rows] == [3, 3, 3]  # per step, not cumulative
        assert not any(k.startswith("emb/dropped_id_example") for r in tracker.rows for k in r)


def test_a_model_setting_that_can_make_every_update_non_finite_leads_the_likely_causes():
    from types import SimpleNamespace

    from runner.core.loop import check_health
    from runner.tasks.sequential.model import SequentialModel

    def message(temperature: float) -> str:
        model = SequentialModel(items=None, num_items=5, max_len=3, temperature=temperature)
        program = SimpleNamespace(tables={"items": None}, logical={"items": None}, emb_optimizers={"items": "AsyncAdam()"},
                                  model=model)
        with pytest.raises(TrainingError) as e:
            check_health(program, SimpleNamespace(max_skipped_updates=10), {"emb/consecutive_skips/items": 10}, 12)
        return str(e.value)

    assert ("Likely causes: model.temperature=1e-30, which multiplies every logit and gradient by 1e+30 (typical "
            "values are 0.05 to 1), a learning rate too high for this table") in message(1e-30)
    assert "Likely causes: a learning rate too high for this table" in message(1.0)


def test_a_runner_error_on_one_of_several_processes_ends_it_with_its_own_line_and_exit_code(monkeypatch):
    """Several processes: a runner error (training diverged, ...) is the one line and exit code one process
    gives, not a traceback and exit code 1; any other error keeps the traceback (exit_info) and 1."""
    from runner import distributed
    from runner.errors import CheckpointError

    ended = []
    monkeypatch.setattr(distributed.jax, "process_count", lambda: 2)
    monkeypatch.setattr(distributed, "_end", lambda why, exc_info=False, code=1: ended.append((why, exc_info, code)))
    for error in (TrainingError("training diverged: ..."), CheckpointError("saving failed: ..."), KeyError("x"),
                  CheckpointError("saving failed: Gloo AllGather failed: Connection reset by peer")):
        with distributed.fail_fast():
            raise error
    assert ended[0] == ("error: training diverged: ...", False, 2)
    assert ended[1] == ("error: saving failed: ...", False, 1)
    assert ended[2] == ("KeyError: 'x' -- see the traceback above", True, 1)
    assert ended[3][0].endswith("-- a collective failed, most likely because another process died or lost its "
                                "connection; see its log") and ended[3][2] == 1  # a peer's death, whatever failed


def test_a_peers_death_advises_a_relaunch_that_resumes_only_when_the_run_saves_checkpoints(monkeypatch):
    """A run without checkpoints was told to relaunch "to resume from the newest checkpoint", which it has none of."""
    from runner import distributed

    ended = []
    monkeypatch.setattr(distributed, "_process", lambda: (0, 2))  # as jax.distributed holds them in a 2-process run
    monkeypatch.setattr(distributed, "_end", lambda why, exc_info=False, code=1: ended.append(why))
    for saves in (True, False):
        with distributed.fail_fast(saves=saves):
            distributed._peer_died(1)
    died = "another process died (process 1 of 2: killed, or it ended on an error; see its log)"
    assert ended == [f"{died}. Relaunch every process with the same command to resume from the newest checkpoint",
                     f"{died}. The run saves no checkpoints (checkpoint.interval=0): relaunching every process starts "
                     f"it again from step 0 (set checkpoint.interval above 0 for a run a relaunch resumes)"]


def test_an_optimizer_in_a_message_shows_the_settings_that_differ_from_its_defaults():
    """The dataclass repr listed every field, enums as ``<WeightDecayMode.decoupled: 'decoupled'>``."""
    import optimizers
    from optimizers import Schedule
    from runner.core.diagnostics import settings_of

    assert settings_of(optimizers.AsyncSGD(learning_rate=1e38)) == "AsyncSGD(learning_rate=1e+38)"
    assert settings_of(optimizers.AsyncAdam()) == "AsyncAdam()"
    assert settings_of(optimizers.AsyncAdam(learning_rate=0.02, weight_decay=0.1, weight_decay_mode="l2",
                                            schedule=Schedule("warmup", warmup_steps=4))) == (
        "AsyncAdam(learning_rate=0.02, weight_decay=0.1, weight_decay_mode=l2, schedule=Schedule(kind=warmup, "
        "warmup_steps=4))")
    assert settings_of("MyOptimizer") == "'MyOptimizer'"  # not a dataclass: its repr
