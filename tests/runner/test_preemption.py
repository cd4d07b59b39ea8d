"""SIGTERM (a launcher stopping its processes, SLURM pre-empting a job) stops a run at the next step boundary:
a checkpoint of that step when checkpoints are on, one message, exit code 143; the same command resumes it.
With several processes, every process stops at the same step (JAX's preemption sync point). Ctrl-C (SIGINT) on
one process does the same with exit code 130; one that cannot wait (a second Ctrl-C) is one line and 130."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runner.support import TINY

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
LONG = TINY + ["trainer.steps=100000", "trainer.log_interval=20", "trainer.eval_interval=100000"]


def _until_training(proc: subprocess.Popen, pattern: str, limit_s: float = 300) -> str:
    """Read the process's output until a train log line shows (it is past compiling, in the loop)."""
    seen, deadline = "", time.monotonic() + limit_s
    for line in proc.stdout:
        seen += line
        if re.search(pattern, line) or time.monotonic() > deadline:
            return seen
    return seen


def _terminate(proc: subprocess.Popen, pattern: str, signum=signal.SIGTERM) -> tuple[int, str, float]:
    seen = _until_training(proc, pattern)
    assert proc.poll() is None, seen[-3000:]
    proc.send_signal(signum)
    t0 = time.monotonic()
    try:
        rest, _ = proc.communicate(timeout=120)  # a run that ignored SIGTERM would train on for hours
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, seen + rest, time.monotonic() - t0


# `python -m runner` with SIGINT handled as in a terminal: a process started in the background of a
# non-interactive shell inherits SIGINT ignored, and Python then installs no handler of its own (no preexec_fn:
# forking a multithreaded JAX process to run Python before exec can deadlock)
RUNNER = [sys.executable, "-c", "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "runpy.run_module('runner', run_name='__main__', alter_sys=True)"]


def _runner(tmp: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*RUNNER, *LONG, *extra, f"hydra.run.dir={tmp / 'run'}"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sigterm_stops_a_run_at_a_step_boundary_with_a_checkpoint_and_the_same_command_resumes(tmp_path):
    ck = tmp_path / "ck"
    code, out, took = _terminate(_runner(tmp_path, "checkpoint.interval=100000", f"checkpoint.dir={ck}"),
                                 r"step +\d+/100000 +loss")
    assert code == 143, out[-3000:]
    stopped = re.search(rf"runner: stopped on SIGTERM at step (\d+) of 100000: its checkpoint is in {ck}; the same "
                        r"command resumes the run", out)
    assert stopped, out[-3000:]
    assert "Traceback" not in out
    step = int(stopped.group(1))
    assert [p.name for p in ck.iterdir() if p.name.isdigit()] == [str(step)]  # that very step, committed
    again = _runner(tmp_path, "checkpoint.interval=100000", f"checkpoint.dir={ck}", "trainer.stop_after=1")
    text = again.communicate(timeout=300)[0]
    assert f"resuming from {ck / str(step)}: step {step} of 100000" in text, text[-3000:]


@pytest.mark.slow
def test_ctrl_c_stops_a_run_at_a_step_boundary_with_a_checkpoint_and_exit_code_130(tmp_path):
    ck = tmp_path / "ck"
    code, out, _ = _terminate(_runner(tmp_path, "checkpoint.interval=100000", f"checkpoint.dir={ck}"),
                              r"step +\d+/100000 +loss", signal.SIGINT)
    assert code == 130, out[-3000:]
    assert ("runner: Ctrl-C: stopping after this step (with a checkpoint if checkpoints are on); Ctrl-C again stops "
            "at once") in out
    stopped = re.search(rf"runner: stopped on SIGINT at step (\d+) of 100000: its checkpoint is in {ck}; the same "
                        r"command resumes the run", out)
    assert stopped, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    assert [p.name for p in ck.iterdir() if p.name.isdigit()] == [stopped.group(1)]


def test_a_ctrl_c_that_cannot_wait_is_one_line_and_exit_code_130(monkeypatch, capsys):
    import runner.__main__ as cli

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_or_trial", interrupted)
    with pytest.raises(SystemExit) as e:
        cli.main.__wrapped__(None)
    assert e.value.code == 130
    assert capsys.readouterr().err == ("\nrunner: interrupted (Ctrl-C): stopped at once; checkpoints already committed "
                                       "stay usable\n")


def test_a_signal_after_a_trials_last_step_stops_the_sweep_once_the_trial_is_recorded(monkeypatch, capsys):
    """The loop checks for a stop request after each step; one that comes later (the final flush, evaluation or
    save) finishes the trial, and the sweep used to go on to the next trial as if none came."""
    from types import SimpleNamespace

    from hydra.types import RunMode
    from omegaconf import OmegaConf

    import runner.__main__ as cli
    from runner import app, sweeps
    from runner.core.preemption import Preemption

    def trial(cfg, out, tags):
        with Preemption():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only asks; the run goes on to its end
        return 0.75

    hc = OmegaConf.create({"mode": RunMode.MULTIRUN, "job": {"num": 4}, "runtime": {"output_dir": "x"},
                           "sweeper": {"_target_": sweeps.BASIC}})
    monkeypatch.setattr(cli, "HydraConfig", SimpleNamespace(get=lambda: hc))
    monkeypatch.setattr(sweeps, "trial_tags", lambda hc: [])
    monkeypatch.setattr(sweeps, "name_trial", lambda cfg, hc: None)
    monkeypatch.setattr(app, "run", trial)
    with pytest.raises(SystemExit) as e:
        cli.run_or_trial(None)
    assert e.value.code == 143
    assert capsys.readouterr().err == ("runner: SIGTERM came as trial #4 was ending: it finished and is recorded; the "
                                       "sweep stops here\n")
    monkeypatch.setattr(app, "run", lambda cfg, out, tags: Preemption().close() or 0.5)  # no signal: the sweep goes on
    assert cli.run_or_trial(None) == 0.5


def test_outside_the_train_loop_ctrl_c_and_sigterm_are_one_line(monkeypatch, capsys):
    """Between a sweep's trials (Hydra's launcher) a Ctrl-C used to end in a KeyboardInterrupt traceback, and a
    SIGTERM in Python's default: the process killed without a word."""
    import runner.__main__ as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            cli.entry()
        assert signal.getsignal(signal.SIGTERM) is cli._terminated
    finally:
        signal.signal(signal.SIGTERM, before)
    assert e.value.code == 130
    assert capsys.readouterr().err == ("\nrunner: interrupted (Ctrl-C): stopped at once; checkpoints already "
                                       "committed stay usable\n")
    with pytest.raises(SystemExit) as e:
        cli._terminated(signal.SIGTERM, None)
    assert e.value.code == 143
    assert capsys.readouterr().err == ("\nrunner: SIGTERM: stopped at once (the train loop would have stopped at a "
                                       "step boundary); checkpoints already committed stay usable\n")


@pytest.mark.slow
def test_sigterm_without_checkpoints_says_the_progress_is_lost(tmp_path):
    code, out, _ = _terminate(_runner(tmp_path), r"step +\d+/100000 +loss")
    assert code == 143, out[-3000:]
    assert re.search(r"runner: stopped on SIGTERM at step \d+ of 100000: no checkpoint is configured "
                     r"\(checkpoint.interval=0\), so the progress is lost; set checkpoint.interval", out), out[-3000:]


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_both_processes_at_the_same_step_with_one_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "runner.launch", "-n", "2", "--", *LONG, "mesh=data",
                             "mesh.cpu_devices=1", "checkpoint.interval=100000", f"checkpoint.dir={ck}",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    code, out, took = _terminate(proc, r"\[p0\].*step +\d+/100000 +loss")
    assert code == 143, out[-3000:]
    assert took < 30, out[-3000:]  # each stopped on its own, before the launcher's grace ran out into SIGKILL
    steps = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
        r"\[p(\d)\] runner: stopped on SIGTERM at step (\d+) of 100000", out)}
    assert sorted(steps) == [0, 1] and steps[0] == steps[1], out[-3000:]
    assert [p.name for p in ck.iterdir() if p.name.isdigit()] == [str(steps[0])]
    assert not any(w in out for w in ("Traceback", "Check failure stack trace", "SIGKILL")), out[-3000:]


@pytest.mark.slow
def test_ctrl_c_on_the_launcher_stops_both_processes_at_the_same_step_with_one_checkpoint(tmp_path):
    """A terminal's Ctrl-C reaches the launcher and its children (one process group): the children ignore it and
    the launcher turns it into SIGTERM, so they stop together at one step with one checkpoint; exit code 130."""
    ck = tmp_path / "ck"
    launcher = [sys.executable, "-c", "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "runpy.run_module('runner.launch', run_name='__main__', alter_sys=True)"]
    proc = subprocess.Popen([*launcher, "-n", "2", "--", *LONG, "mesh=data", "mesh.cpu_devices=1",
                             "checkpoint.interval=100000", f"checkpoint.dir={ck}", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group, as a terminal's foreground job
    seen = _until_training(proc, r"\[p0\].*step +\d+/100000 +loss")
    assert proc.poll() is None, seen[-3000:]
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole group
    try:
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = seen + rest
    assert proc.returncode == 130, out[-3000:]
    assert "[launch] Ctrl-C: every process stops after its current step" in out, out[-3000:]
    steps = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
        r"\[p(\d)\] runner: stopped on SIGTERM at step (\d+) of 100000", out)}
    assert sorted(steps) == [0, 1] and steps[0] == steps[1], out[-3000:]
    assert [p.name for p in ck.iterdir() if p.name.isdigit()] == [str(steps[0])]
    assert not any(w in out for w in ("Traceback", "KeyboardInterrupt", "interrupted (Ctrl-C)")), out[-3000:]
