"""Model selection on validation (runner/core/selection.py): the best evaluation's metrics are reported as
best/*, its state is kept (a copy that the donated steps after it do not touch), early stopping stops after
``trainer.early_stop_patience`` evaluations without an improvement, a sweep gets the best value, and the
best state and its value survive a checkpoint resume.

The reference for "best" is independent of the runner: the argmax of the objective over the evaluation rows
of metrics.jsonl (or over a scripted sequence of validation values)."""
import json
import logging
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from runner.app import run
from runner.build import build
from runner.checkpoint import open_checkpoints
from runner.core.loop import make_selection, to_device, train
from runner.core.selection import Selection
from runner.tasks.ranking.task import RankingTask
from runner.tracking.base import NoopTracker
from tests.runner.support import compose_config, seq_config


def rows_of(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_selection_keeps_the_first_best_and_counts_stale_evaluations():
    s = Selection("valid/ndcg@10", select=False, patience=2)
    values = [0.1, 0.3, 0.3, float("nan"), 0.2]
    improved = [s.update(10 * (i + 1), {"valid/ndcg@10": v, "test/ndcg@10": -v}, None) for i, v in enumerate(values)]
    assert improved == [True, True, False, False, False]
    assert (s.value, s.step, s.stale) == (0.3, 20, 3) and s.should_stop()
    assert s.metrics["test/ndcg@10"] == -0.3
    loss = Selection("valid/loss", select=False, patience=None)  # a loss is minimised
    assert [loss.update(i + 1, {"valid/loss": v}, None) for i, v in enumerate([2.0, 1.0, 1.5])] == [True, True, False]
    assert not loss.should_stop()


@pytest.mark.slow  # make test-fast: the early-stopping test below keeps a peak and reports it
@pytest.mark.parametrize("async_emb", ["on", "off"])
def test_best_state_is_the_peak_evaluation_and_its_copy_survives_later_steps(async_emb):
    cfg = seq_config(f"async_emb={async_emb}", "trainer.steps=60", "trainer.eval_interval=10",
                     "trainer.log_interval=30", "optimizer.learning_rate=0.05")
    program, task, _ = build(cfg)
    rows = []

    class Rows(NoopTracker):
        def log(self, metrics, step):
            rows.append({"step": step, **metrics})

    result = train(program, task, cfg.trainer, Rows(), log=lambda *_: None)
    s = result["summary"]
    evals = [r for r in rows if "valid/ndcg@10" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40, 50, 60]
    peak = max(evals, key=lambda r: r["valid/ndcg@10"])  # the first of equal values wins, as max does
    assert s["best/step"] == peak["step"] and s["best/valid/ndcg@10"] == peak["valid/ndcg@10"]
    for k in ("test/ndcg@10", "test/hr@10", "test/mrr", "valid/mrr"):
        assert s[f"best/{k}"] == peak[k], k
        assert s[f"final/{k}"] == evals[-1][k], k
    # The kept copy, evaluated now (after later steps donated the live tables), scores the peak's numbers.
    best = result["best"]
    state = result["state"]._replace(params=best.params, tables=best.tables)
    put = lambda b: to_device(program, b)  # noqa: E731
    _, _, predict = program.compile(result["state"], put(task.batch(0, 64)))
    again = task.evaluate(lambda st, b: jax.device_get(predict(st, b)), state, put, 64)
    for k in ("valid/ndcg@10", "test/ndcg@10", "test/mrr"):
        assert again[k] == pytest.approx(peak[k], abs=1e-6), k


def scripted(monkeypatch, values, test_values=None):
    """RankingTask.evaluate with valid/auc_mean replaced, evaluation by evaluation, by ``values`` (and
    test/auc_mean by ``test_values``)."""
    real, calls = RankingTask.evaluate, []

    def evaluate(self, *args):
        out = real(self, *args)
        i = min(len(calls), len(values) - 1)
        out["valid/auc_mean"] = values[i]
        if test_values is not None:
            out["test/auc_mean"] = test_values[i]
        out["test/auc_click"] = 10 + len(calls)  # marks which evaluation a reported number came from
        calls.append(out["valid/auc_mean"])
        return out

    monkeypatch.setattr(RankingTask, "evaluate", evaluate)
    return calls


@pytest.mark.slow
def test_early_stopping_reports_the_peak_and_the_sweep_gets_its_value(tmp_path, monkeypatch):
    calls = scripted(monkeypatch, [0.5, 0.7, 0.6, 0.65, 0.9, 0.95])  # peak at the 2nd evaluation (step 4)
    objective = run(compose_config(["trainer.steps=12", "trainer.eval_interval=2", "trainer.select_best=true",
                                    "trainer.early_stop_patience=2"]), tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["early_stop/step"] == 8 and s["steps"] == 8  # evaluations at 2, 4, 6, 8: two without improving
    assert s["best/step"] == 4 and s["best/valid/auc_mean"] == 0.7 and s["best/test/auc_click"] == 11
    assert s["selected_on"] == "valid/auc_mean"
    assert objective == 0.7  # the sweep's value is the best, not the final evaluation's
    assert len(calls) == 5  # four mid-run evaluations and the final one, at the step it stopped at
    assert max(r["step"] for r in rows_of(tmp_path)) == 8


class _Task:
    objective = "valid/ndcg@10"

    def metric_names(self):
        return ["valid/ndcg@10", "valid/hr@10", "test/ndcg@10", "test/hr@10", "popularity/valid/ndcg@10"]


@pytest.mark.parametrize("objective, selected", [
    (None, "valid/ndcg@10"), ("valid/hr@10", "valid/hr@10"), ("test/ndcg@10", "valid/ndcg@10"),
    ("test/hr@10", "valid/ndcg@10"), ("popularity/valid/ndcg@10", "valid/ndcg@10"),
    ("final/train_loss", "valid/ndcg@10")])
def test_selection_and_early_stopping_go_by_a_validation_metric_whatever_the_objective(objective, selected):
    trainer = SimpleNamespace(objective=objective, select_best=True, early_stop_patience=3)
    s = make_selection(_Task(), trainer)
    assert (s.objective, s.select, s.patience) == (selected, True, 3)


@pytest.mark.slow
def test_a_test_objective_returns_the_test_metric_of_the_state_selected_on_validation(tmp_path, monkeypatch,
                                                                                       caplog):
    # valid peaks at the 2nd evaluation (step 4); test peaks at the 3rd and would stop later if selected on
    scripted(monkeypatch, [0.5, 0.7, 0.6, 0.65, 0.9], test_values=[0.4, 0.45, 0.8, 0.85, 0.9])
    with caplog.at_level(logging.INFO, logger="runner"):
        objective = run(compose_config(["trainer.steps=12", "trainer.eval_interval=2", "trainer.select_best=true",
                                        "trainer.early_stop_patience=2", "trainer.objective=test/auc_mean"]),
                        tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["selected_on"] == "valid/auc_mean"
    assert (s["best/step"], s["early_stop/step"], s["best/valid/auc_mean"], s["best/test/auc_mean"]) == (4, 8, 0.7, 0.45)
    assert objective == 0.45  # what the sweep gets: the test metric of the state selected on validation
    text = caplog.text
    assert "stopped early at step 8 of 12: valid/auc_mean had not improved for 2 evaluations" in text
    assert "best valid/auc_mean 0.7000 at step 4 (selected on valid/auc_mean; its test/auc_mean 0.4500;" in text
    assert "step 4, selected on valid/auc_mean)" in text


@pytest.mark.slow
def test_without_selection_the_ranking_task_returns_the_final_value(tmp_path, monkeypatch):
    scripted(monkeypatch, [0.5, 0.7, 0.6, 0.65])
    objective = run(compose_config(["trainer.steps=6", "trainer.eval_interval=2"]), tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert objective == 0.6 and "best/step" not in s and "early_stop/step" not in s


@pytest.mark.slow  # three launches with checkpoints and two restores: ~15 s on shared cores
@pytest.mark.parametrize("async_emb", ["on"])
def test_best_state_and_value_survive_a_resume(tmp_path, async_emb):
    over = [f"async_emb={async_emb}", "trainer.steps=8", "trainer.eval_interval=2", "trainer.log_interval=2",
            "trainer.select_best=true", "checkpoint.interval=4", "optimizer.learning_rate=0.5"]
    straight = compose_config(over + [f"checkpoint.dir={tmp_path / 'ck1'}"])
    run(straight, tmp_path / "straight")
    resumed = compose_config(over + [f"checkpoint.dir={tmp_path / 'ck2'}"])
    run(compose_config(over + [f"checkpoint.dir={tmp_path / 'ck2'}", "trainer.stop_after=4"]), tmp_path / "a")
    run(resumed, tmp_path / "b")
    s1 = json.loads((tmp_path / "straight" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "b" / "summary.json").read_text())
    best = {k: v for k, v in s1.items() if k.startswith("best/")}
    assert best and best == {k: v for k, v in s2.items() if k.startswith("best/")}
    # The saved best state itself (beside the final checkpoint) is the same in both.
    kept = []
    for cfg, name in ((straight, "x"), (resumed, "y")):
        program, _, plan = build(cfg)
        ck = open_checkpoints(cfg, program, plan, tmp_path / name)
        record, arrays = ck.selection_point()
        assert record["step"] == best["best/step"]
        kept.append(jax.tree.map(np.asarray, arrays))
        ck.close()
    jax.tree.map(np.testing.assert_array_equal, kept[0], kept[1])


@pytest.mark.slow  # two launches with checkpoints (at 4 and at the stop, 8): ~10 s on shared cores
def test_a_relaunched_early_stopped_run_trains_no_further(tmp_path, monkeypatch):
    scripted(monkeypatch, [0.5, 0.7, 0.6, 0.65, 0.9, 0.95, 0.99])
    over = ["trainer.steps=12", "trainer.eval_interval=2", "trainer.select_best=true", "trainer.early_stop_patience=2",
            "checkpoint.interval=4", f"checkpoint.dir={tmp_path / 'ck'}"]
    first = run(compose_config(over), tmp_path / "a")
    again = run(compose_config(over), tmp_path / "b")  # the same command: resumes from the early stop's checkpoint
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert first == again == 0.7 and s["early_stop/step"] == 8 and s["best/step"] == 4
    assert max(r["step"] for r in rows_of(tmp_path / "b")) == 8  # nothing trained past the stop
