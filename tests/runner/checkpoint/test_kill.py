"""A process killed (SIGKILL) in the middle of a save: the partial checkpoint is never committed, the next
launch of the same command breaks the dead run's lock, resumes from the previous complete one and ends
bit-identical to a straight run (in this process, as ``python -m runner`` runs it: ``runner.app.run``).

``RUNNER_TEST_KILL_BEFORE_COMMIT=4`` makes the runner kill itself once every array of step 4 is written
but before Orbax's rename commits it: the latest point a crash can hit, with the most partial data on disk.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.app import run
from runner.checkpoint.lock import LOCK_FILE
from runner.checkpoint.manager import KILL_ENV, TMP_SUFFIX
from tests.runner.support import TINY, compose_config
from tests.runner.checkpoint.test_resume import BASE, assert_same_arrays, metric_rows, saved_arrays, steps_in


def runner(tmp: Path, run_dir: str, ckpt: str, env: dict | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "runner", *TINY, *BASE, f"checkpoint.dir={tmp / ckpt}",
            f"hydra.run.dir={tmp / run_dir}"]
    return subprocess.run(args, cwd=tmp, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_killed_mid_save_resumes_from_the_previous_checkpoint(tmp_path):
    run(compose_config(BASE + [f"checkpoint.dir={tmp_path / 'ck_straight'}"]), tmp_path / "straight")

    killed = runner(tmp_path, "run", "ck", env={KILL_ENV: "4"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    partial = [p for p in (tmp_path / "ck").iterdir() if p.name.startswith("4" + TMP_SUFFIX)]
    assert len(partial) == 1 and any(f.is_file() for f in (partial[0] / "state").rglob("*"))  # written, not committed
    assert steps_in(tmp_path / "ck") == [2]
    assert (tmp_path / "ck" / LOCK_FILE).exists()  # the killed run could not release checkpoint.dir
    logged = [r["step"] for r in metric_rows(tmp_path / "run")]
    assert logged[:4] == [1, 2, 3, 4]  # training went on while step 4 was being written; all of it is redone

    again = runner(tmp_path, "run", "ck")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from {tmp_path / 'ck' / '2'}: step 2 of 6" in again.stdout + again.stderr
    assert f"checkpoint.dir lock {tmp_path / 'ck' / LOCK_FILE} was left by a run that is no longer running (pid " \
        in again.stdout + again.stderr  # same host, dead pid: broken, with a warning
    assert not (tmp_path / "ck" / LOCK_FILE).exists()
    assert not any(TMP_SUFFIX in p.name for p in (tmp_path / "ck").iterdir())  # the partial one is cleaned up
    assert steps_in(tmp_path / "ck") == [2, 4, 6]
    assert_same_arrays(saved_arrays(tmp_path / "ck_straight", 6), saved_arrays(tmp_path / "ck", 6))
    assert metric_rows(tmp_path / "run") == metric_rows(tmp_path / "straight")  # rows 3-4 re-logged once


def test_a_fresh_start_sets_aside_the_rows_of_a_launch_killed_before_its_first_checkpoint(tmp_path, caplog):
    """Killed before any checkpoint committed, the relaunch starts from step 0 in the same output dir: the rows
    the dead launch logged must not stay in metrics.jsonl, or steps 1.. would be there twice."""
    from runner.build import build
    from runner.checkpoint import open_checkpoints

    out = tmp_path / "run"
    out.mkdir()
    dead = '{"step": 1, "train/loss": 0.7}\n{"step": 2, "train/loss": 0.6}\n'
    (out / "metrics.jsonl").write_text(dead)
    cfg = compose_config(BASE + [f"checkpoint.dir={tmp_path / 'ck'}"])
    program, _, plan = build(cfg)
    with caplog.at_level("WARNING", logger="runner"):
        ck = open_checkpoints(cfg, program, plan, out)
    ck.close()
    assert ck.resume_point()[1] == 0
    assert not (out / "metrics.jsonl").exists()
    assert (out / "metrics.jsonl.before-restart").read_text() == dead
    assert f"{out / 'metrics.jsonl'} holds 2 rows of an earlier launch that committed no checkpoint; moved to " \
        f"{out / 'metrics.jsonl.before-restart'}" in caplog.text
