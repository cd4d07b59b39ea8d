"""A process killed (SIGKILL) in the middle of a save: the partial checkpoint is never committed, the next
launch of the same command breaks the dead run's lock, resumes from the previous complete one and ends
bit-identical to a straight run (in this process, as ``python -m runner`` runs it: ``runner.app.run``).

``RUNNER_TEST_KILL_BEFORE_COMMIT=4`` makes the runner kill itself once every array of step 4 is written
but before Orbax's rename commits it: the latest point a crash can hit, with the most partial data on disk.
"""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.app import run
from runner.checkpoint.lock import LOCK_FILE
from runner.checkpoint.drills import KILL_CLEANUP_ENV, KILL_ENV
from runner.checkpoint.manager import TMP_SUFFIX
from runner.checkpoint.trash import TRASH, half_deleted
from runner.errors import PreflightError
from tests.runner.support import TINY, compose_config
from tests.runner.checkpoint.test_resume import BASE, assert_same_arrays, metric_rows, saved_arrays, steps_in


def runner(tmp: Path, run_dir: str, ckpt: str, env: dict | None = None,
           extra: list[str] = ()) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "runner", *TINY, *BASE, *extra, f"checkpoint.dir={tmp / ckpt}",
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
    (out / "summary.json").write_text('{"status": "ok"}')  # another run's, finished in this folder (hydra.run.dir)
    cfg = compose_config(BASE + [f"checkpoint.dir={tmp_path / 'ck'}"])
    program, _, plan = build(cfg)
    with caplog.at_level("WARNING", logger="runner"):
        ck = open_checkpoints(cfg, program, plan, out)
    ck.close()
    assert ck.resume_point()[1] == 0
    assert not (out / "metrics.jsonl").exists()
    assert (out / "metrics.jsonl.before-restart").read_text() == dead
    assert (out / "summary.json.before-restart").read_text() == '{"status": "ok"}' and not (out / "summary.json").exists()
    assert (f"{out} holds the record of an earlier run that this one does not continue (2 metric rows; no checkpoint "
            f"of it in this checkpoint.dir): moved to metrics.jsonl.before-restart, summary.json.before-restart; this "
            f"run starts from step 0 and writes its own") in caplog.text


@pytest.mark.slow
def test_killed_while_removing_an_old_checkpoint_leaves_only_readable_steps(tmp_path):
    """checkpoint.keep=1: saving step 4 retires step 2, whose files are removed before the save of step 6. Killed
    halfway through that removal, the half-removed step is already out of the checkpoint directory (Orbax renamed
    it into _deleting/); the relaunch finishes removing it, says so, resumes from step 4 and ends bit-identical."""
    keep = ["checkpoint.keep=1"]
    run(compose_config(BASE + keep + [f"checkpoint.dir={tmp_path / 'ck_straight'}"]), tmp_path / "straight")

    killed = runner(tmp_path, "run", "ck", env={KILL_CLEANUP_ENV: "2"}, extra=keep)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert f"{KILL_CLEANUP_ENV}: SIGKILL after removing " in killed.stderr
    left = tmp_path / "ck" / TRASH / "2"
    assert any(f.is_file() for f in left.rglob("*"))  # half removed ...
    assert steps_in(tmp_path / "ck") == [4]  # ... and not a step of the directory: only whole steps are
    assert half_deleted(tmp_path / "ck" / "4") == []

    again = runner(tmp_path, "run", "ck", extra=keep)
    assert again.returncode == 0, again.stderr[-2000:]
    out = again.stdout + again.stderr
    assert f"{tmp_path / 'ck' / TRASH} held old checkpoints ['2'] whose removal was interrupted" in out
    assert f"resuming from {tmp_path / 'ck' / '4'}: step 4 of 6" in out
    assert not left.exists() and list((tmp_path / "ck" / TRASH).iterdir()) == []
    assert steps_in(tmp_path / "ck") == [6]
    assert_same_arrays(saved_arrays(tmp_path / "ck_straight", 6), saved_arrays(tmp_path / "ck", 6))
    assert metric_rows(tmp_path / "run") == metric_rows(tmp_path / "straight")


@pytest.mark.slow
def test_a_step_half_deleted_in_place_is_skipped_and_reported(tmp_path, caplog):
    """What an in-place removal killed halfway leaves (a runner before the atomic one): a step folder without
    its metadata. When every newer step is unreadable too, the restore skips it by name, removes it (this run's
    own directory) and says what it is, instead of trying to read it."""
    from runner.build import build
    from runner.checkpoint import open_checkpoints

    cfg = compose_config(BASE + [f"checkpoint.dir={tmp_path / 'ck'}", "checkpoint.keep=5"])
    program, _, plan = build(cfg)
    ck = open_checkpoints(cfg, program, plan, tmp_path / "run")
    state = program.init_state(0)
    for step in (1, 2, 3):
        state = state._replace(step=state.step + 1)
        ck.save(step, state)
    ck.wait()
    ck.close()
    (tmp_path / "ck" / "1" / "_CHECKPOINT_METADATA").unlink()
    shutil.rmtree(tmp_path / "ck" / "1" / "meta")  # step 1: half-deleted
    for f in (tmp_path / "ck" / "2" / "state").rglob("*"):  # step 2: damaged, not half-deleted
        if f.is_file() and f.stat().st_size > 64:
            f.write_bytes(b"\0" * f.stat().st_size)
    shutil.rmtree(tmp_path / "ck" / "3" / "state")  # step 3: half-deleted

    with caplog.at_level("WARNING", logger="runner"), pytest.raises(PreflightError) as e:
        open_checkpoints(cfg, program, plan, tmp_path / "run")
    assert str(e.value).startswith(f"no readable checkpoint in {tmp_path / 'ck'}: step 3 (half-deleted: no state); "
                                   f"step 2 (")
    assert "; step 1 (half-deleted: no _CHECKPOINT_METADATA, meta). They were moved aside" in str(e.value)
    assert f"checkpoint {tmp_path / 'ck' / '3'} is half-deleted (it has no state: a kill interrupted the removal " \
        f"of old checkpoints); removed, falling back to the one before it" in caplog.text
    assert steps_in(tmp_path / "ck") == []
    assert [p.name for p in (tmp_path / "ck" / "_corrupt").iterdir()] == ["2"]  # the damaged one is kept to look at
    assert list((tmp_path / "ck" / TRASH).iterdir()) == []


@pytest.mark.parametrize("name, value, kind", [(KILL_ENV, "four", "step"), (KILL_CLEANUP_ENV, "-2", "step"),
                                               ("RUNNER_TEST_KILL_IN_RESTORE", "soon", "number of seconds"),
                                               ("RUNNER_TEST_KILL_IN_RESTORE", "nan", "number of seconds")])
def test_a_kill_drill_set_to_something_else_than_a_number_stops_the_run_by_name(monkeypatch, name, value, kind):
    from runner.checkpoint import drills

    monkeypatch.setenv(name, value)
    with pytest.raises(PreflightError, match=rf"^{name}='{value}' is not a {kind} \(an integer >= 0.*\); it is a "
                                             r"kill drill of the tests: unset it for a normal run$"):
        drills.check()
