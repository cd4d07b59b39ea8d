"""Tracking: JSONL output, array conversion, W&B offline runs, process-0-only factory."""
import json
import math
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from runner.tracking import (
    JsonlTracker,
    MultiTracker,
    NoopTracker,
    Tracker,
    WandbTracker,
    json_safe,
    make_tracker,
    to_python,
)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_to_python_converts_jax_and_numpy():
    out = to_python(
        {
            "a": jnp.float32(0.5),
            "b": jnp.arange(3, dtype=jnp.int32),
            "c": np.float64(1.25),
            "d": np.int64(7),
            "e": np.array([[1.0, 2.0]], dtype=np.float32),
            "f": jnp.asarray(1.5, dtype=jnp.bfloat16),
            "g": np.bool_(True),
            "h": jnp.asarray(float("nan")),
            "i": {"nested": jnp.ones(2)},
            "s": "text",
            "n": None,
        }
    )
    assert out["a"] == 0.5 and type(out["a"]) is float
    assert out["b"] == [0, 1, 2] and all(type(x) is int for x in out["b"])
    assert out["c"] == 1.25 and type(out["c"]) is float
    assert out["d"] == 7 and type(out["d"]) is int
    assert out["e"] == [[1.0, 2.0]]
    assert out["f"] == 1.5 and type(out["f"]) is float
    assert out["g"] is True
    assert type(out["h"]) is float and math.isnan(out["h"])  # kept as NaN for W&B
    assert out["i"] == {"nested": [1.0, 1.0]}
    assert out["s"] == "text" and out["n"] is None
    json.dumps(out)  # only builtin types left


def test_json_safe_is_strict_json():
    obj = json_safe({"nan": float("nan"), "inf": float("inf"), "ninf": -np.inf, "arr": np.array([1.0, np.nan])})
    text = json.dumps(obj, allow_nan=False)
    back = json.loads(text)
    assert back == {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "arr": [1.0, "NaN"]}
    assert math.isnan(float(back["nan"])) and float(back["ninf"]) == -math.inf


def test_jsonl_tracker(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    t = JsonlTracker(path)
    assert isinstance(t, Tracker)
    t.define_summary("eval/auc_mean", goal="maximize")
    t.define_summary("train/loss", goal="minimize")
    t.log({"train/loss": jnp.float32(0.75), "eval/auc_mean": np.float32(0.5)}, step=10)
    t.log({"train/loss": 0.5, "eval/auc_mean": 0.75, "train/auc_click": jnp.asarray(0.625)}, step=20)
    t.log({"train/loss": float("nan"), "eval/auc_mean": 0.625, "g": float("inf")}, step=30)
    t.log_summary({"wall_s": np.float64(1.5)})
    t.finish()
    t.finish()  # idempotent

    lines = path.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:  # strict JSON: no bare NaN / Infinity tokens
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    recs = _lines(path)
    assert recs[0] == {"step": 10, "train/loss": 0.75, "eval/auc_mean": 0.5}
    assert recs[1] == {"step": 20, "train/loss": 0.5, "eval/auc_mean": 0.75, "train/auc_click": 0.625}
    assert recs[2] == {"step": 30, "train/loss": "NaN", "eval/auc_mean": 0.625, "g": "Infinity"}
    assert list(recs[0])[0] == "step"

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval/auc_mean"] == 0.625  # last
    assert summary["eval/auc_mean/best"] == 0.75 and summary["eval/auc_mean/best_step"] == 20
    assert summary["train/loss/best"] == 0.5 and summary["train/loss/best_step"] == 20  # NaN ignored
    assert summary["wall_s"] == 1.5
    assert summary["status"] == "ok" and summary["exit_code"] == 0


def test_jsonl_tracker_appends_and_records_failure(tmp_path):
    path = tmp_path / "metrics.jsonl"
    t = JsonlTracker(path)
    t.log({"x": 1}, step=1)
    t.finish()
    t2 = JsonlTracker(path)  # resumed run appends
    t2.log({"x": 2}, step=2)
    t2.finish(exit_code=1)
    assert [r["step"] for r in _lines(path)] == [1, 2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 1


def test_multi_tracker_fans_out(tmp_path):
    a, b = JsonlTracker(tmp_path / "a" / "metrics.jsonl"), JsonlTracker(tmp_path / "b" / "metrics.jsonl")
    m = MultiTracker([a, b, NoopTracker()])
    m.log({"loss": jnp.float32(2.0)}, step=3)
    m.log_summary({"k": 1})
    m.finish()
    for d in ("a", "b"):
        assert _lines(tmp_path / d / "metrics.jsonl") == [{"step": 3, "loss": 2.0}]
        assert json.loads((tmp_path / d / "summary.json").read_text())["k"] == 1


def test_make_tracker_only_process_zero(tmp_path):
    t1 = make_tracker("jsonl,wandb", process_index=1, output_dir=tmp_path)
    assert isinstance(t1, NoopTracker)
    t1.log({"x": 1}, step=0)
    t1.finish()
    assert list(tmp_path.iterdir()) == []
    assert isinstance(make_tracker("none", process_index=0, output_dir=tmp_path), NoopTracker)
    t0 = make_tracker("jsonl", process_index=0, output_dir=tmp_path)
    assert isinstance(t0, JsonlTracker)
    t0.log({"x": 1}, step=0)
    t0.finish()
    assert (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(ValueError):
        make_tracker("tensorboard", process_index=0, output_dir=tmp_path)


@pytest.fixture
def offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_RESUME", raising=False)


def _offline_runs(d: Path) -> list[Path]:
    return sorted((d / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_wandb_tracker_offline_two_runs(tmp_path, offline_wandb):
    d1, d2 = tmp_path / "trial0", tmp_path / "trial1"
    t1 = WandbTracker(
        {"optimizer": {"lr": 0.1}, "seed": 0},
        project="test-project", mode="offline", dir=str(d1), name="trial0", group="sweep",
        tags=["test"], run_id=None, resume=None, job_type="train",
    )
    assert isinstance(t1, Tracker)
    t1.define_summary("eval/auc_mean", goal="maximize")
    t1.define_summary("train/loss", goal="minimize")
    for step in range(3):
        t1.log({"train/loss": jnp.float32(1.0 / (step + 1)), "eval/auc_mean": np.float32(0.5 + 0.1 * step)}, step=step)
    t1.log({"eval/auc_mean": float("nan"), "grad_norm": float("inf")}, step=3)  # must not raise
    t1.log_summary({"final/auc": 0.7})
    id1 = t1.run.id
    t1.finish()

    t2 = WandbTracker({"seed": 1}, project="test-project", dir=str(d2), name="trial1",
                      group=None, tags=[], run_id=None, resume=None, job_type=None)
    t2.log({"train/loss": 0.3}, step=5)
    id2 = t2.run.id
    t2.finish(exit_code=1)
    t2.finish(exit_code=1)  # idempotent

    assert id1 != id2
    runs1, runs2 = _offline_runs(d1), _offline_runs(d2)
    assert len(runs1) == 1 and len(runs2) == 1
    assert runs1[0] != runs2[0]
    assert runs1[0].name.endswith(id1) and runs2[0].name.endswith(id2)
    for run_dir, rid in ((runs1[0], id1), (runs2[0], id2)):
        wandb_file = run_dir / f"run-{rid}.wandb"
        assert wandb_file.is_file() and wandb_file.stat().st_size > 0
        assert wandb_file.read_bytes()[:4] == b":W&B"
    assert t1.run_dir == runs1[0]


@pytest.mark.slow
def test_wandb_reinit_finishes_leaked_run(tmp_path, offline_wandb):
    """A trial that forgot finish() must not leak into the next one in the same process."""
    import wandb

    t1 = WandbTracker({}, project="p", dir=str(tmp_path / "a"))
    t2 = WandbTracker({}, project="p", dir=str(tmp_path / "b"))
    try:
        assert t1.run.id != t2.run.id
        assert t1.run._is_finished  # finished by reinit="finish_previous"
        assert wandb.run is t2.run
        t1.finish()  # no-op, no error
    finally:
        t2.finish()
    assert len(_offline_runs(tmp_path / "a")) == 1 and len(_offline_runs(tmp_path / "b")) == 1


def test_a_full_disk_is_one_error_naming_the_file_and_leaves_whole_lines_and_the_last_summary(tmp_path, monkeypatch):
    """A write that fails halfway (no space left) leaves no half line in metrics.jsonl, no summary.json.tmp, and
    the summary.json written before; the error names the file and the fix."""
    import errno

    from runner.errors import TrainingError

    t = JsonlTracker(tmp_path / "metrics.jsonl")
    t.log({"train/loss": 0.5}, step=1)
    t.log_summary({"note": 1})

    class Full:  # writes part of what it is given, then fails as a full disk does
        def __init__(self, f):
            self.f = f

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    t._file = Full(t._file)
    with pytest.raises(TrainingError) as e:
        t.log({"train/loss": 0.4}, step=2)
    assert str(e.value).startswith(f"writing {tmp_path / 'metrics.jsonl'} failed (No space left on device): free "
                                   f"space on that disk, or point hydra.run.dir at another, and re-launch")
    assert _lines(tmp_path / "metrics.jsonl") == [{"step": 1, "train/loss": 0.5}]
    t.log({"train/loss": 0.3}, step=3)  # space again: the file goes on from its last whole line
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 3]

    def no_space(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", no_space)
    with pytest.raises(TrainingError, match=r"^writing .*summary.json failed \(No space left on device\)"):
        t.finish(0)
    monkeypatch.undo()
    assert json.loads((tmp_path / "summary.json").read_text())["note"] == 1  # the one written before, whole
    assert not (tmp_path / "summary.json.tmp").exists()


def test_rows_already_in_the_file_count_in_the_summary_as_if_logged_here(tmp_path):
    """A resumed run's metrics.jsonl holds the rows carried up to its checkpoint: the best valid AUC may be among
    them, and summary.json must say so, as the run that was never stopped does."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 0.7, "valid/auc": 0.71}\n{"step": 2, "train/loss": 0.6}\n'
                    '{"step": 3, "valid/auc": 0.75, "train/loss": "NaN"}\n{"step": 4, "vali')  # a cut last line
    t = JsonlTracker(path)
    t.define_summary("valid/auc", "maximize")
    t.define_summary("train/loss", "minimize")
    t.log({"train/loss": 0.65, "valid/auc": 0.73}, step=5)
    t.finish(0)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["valid/auc/best"] == 0.75 and summary["valid/auc/best_step"] == 3
    assert summary["train/loss/best"] == 0.6 and summary["train/loss/best_step"] == 2
    assert summary["valid/auc"] == 0.73 and summary["train/loss"] == 0.65
    assert path.read_text().splitlines()[-2:] == ['{"step": 4, "vali', '{"step": 5, "train/loss": 0.65, "valid/auc": 0.73}']
    fresh = JsonlTracker(tmp_path / "new.jsonl", append=False)
    fresh.define_summary("valid/auc")
    assert fresh.summary() == {}


@pytest.mark.slow
def test_a_resumed_wandb_run_keeps_the_best_objective_and_lowest_loss_from_before_its_checkpoint(tmp_path,
                                                                                                 offline_wandb):
    """W&B's summary max/min counts only what one launch logs: a resumed run's W&B summary must still hold the
    best objective and the lowest loss of the rows metrics.jsonl carries up to the checkpoint, as summary.json
    does; a later value replaces them only if it is better."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.6, "valid/auc": 0.75}\n'
                                            '{"step": 2, "train/loss": "NaN", "valid/auc": 0.7}\n')
    t = make_tracker("jsonl,wandb", process_index=0, output_dir=tmp_path, run_id="resumed", resume="allow")
    w = t.trackers[1]
    try:
        t.define_summary("valid/auc", "maximize")
        t.define_summary("train/loss", "minimize")
        summary = lambda: {k: dict(w.run.summary[k]) for k in ("valid/auc", "train/loss")}  # noqa: E731
        assert summary() == {"valid/auc": {"max": 0.75, "last": 0.7}, "train/loss": {"min": 0.6, "last": 0.6}}
        t.log({"train/loss": 0.65, "valid/auc": 0.73}, step=3)
        assert summary() == {"valid/auc": {"max": 0.75, "last": 0.73}, "train/loss": {"min": 0.6, "last": 0.65}}
        t.log({"train/loss": 0.5, "valid/auc": float("nan")}, step=4)
        t.log({"valid/auc": 0.8}, step=5)
        assert summary() == {"valid/auc": {"max": 0.8, "last": 0.8}, "train/loss": {"min": 0.5, "last": 0.5}}
    finally:
        t.finish(0)
    assert _offline_runs(tmp_path)[0].name.endswith("-resumed")
