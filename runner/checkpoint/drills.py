"""The kill drills of the tests and of ``benchmarks/kills.py``: environment variables that make a run SIGKILL
itself at the moment a pre-emption hurts most. Unset (always, outside the drills) they change nothing.

- ``RUNNER_TEST_KILL_BEFORE_COMMIT=<step>``: every array of that step is written, then the process dies
  before the rename that would commit it.
- ``RUNNER_TEST_KILL_IN_RESTORE=<seconds>``: the process dies that long into the restore, or as the restore
  ends if it ends sooner.
- ``RUNNER_TEST_KILL_IN_CLEANUP=<step>``: the process dies halfway through removing that (old) step's files,
  after it was moved out of the checkpoint directory (``trash.py``).
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time

import orbax.checkpoint as ocp

from ..errors import PreflightError

KILL_ENV = "RUNNER_TEST_KILL_BEFORE_COMMIT"
KILL_RESTORE_ENV = "RUNNER_TEST_KILL_IN_RESTORE"
KILL_CLEANUP_ENV = "RUNNER_TEST_KILL_IN_CLEANUP"


def _number(name: str, kind: type) -> float | int | None:
    """The drill's value, or None when it is unset; a value that is not a number stops the run."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        raise PreflightError(f"{name}={raw!r} is not a {'step' if kind is int else 'number of seconds'} "
                             f"(an integer >= 0{'' if kind is int else ', or a decimal'}); it is a kill drill of "
                             f"the tests: unset it for a normal run")
    return value


def check() -> None:
    """Stop before the run starts if a drill variable is set to something that is not a number."""
    _number(KILL_ENV, int), _number(KILL_RESTORE_ENV, float), _number(KILL_CLEANUP_ENV, int)


def die(why: str) -> None:
    print(why, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class KillBeforeCommit(ocp.path.atomicity.AtomicRenameTemporaryPath):
    """Orbax's temporary path with the ``RUNNER_TEST_KILL_BEFORE_COMMIT`` drill in its commit."""

    async def finalize(self, *args, **kwargs):
        if self.get_final().name == str(_number(KILL_ENV, int)):
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().finalize(*args, **kwargs)


def kills_before_commit() -> bool:
    return _number(KILL_ENV, int) is not None


@contextlib.contextmanager
def killed_in_restore():
    """The ``RUNNER_TEST_KILL_IN_RESTORE`` drill around a restore (nothing when it is unset)."""
    delay = _number(KILL_RESTORE_ENV, float)
    if delay is None:
        yield
        return
    t0 = time.monotonic()

    def kill(when: str) -> None:
        die(f"{KILL_RESTORE_ENV}: SIGKILL {when}, {time.monotonic() - t0:.4f} s into the restore")

    timer = threading.Timer(delay, kill, args=("from the timer",))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        kill("at its end")


def in_cleanup(step_name: str, removed: int, total: int) -> None:
    """Called as the files of an old step are removed: the ``RUNNER_TEST_KILL_IN_CLEANUP`` drill kills the
    process once half of that step's files are gone."""
    if total and str(_number(KILL_CLEANUP_ENV, int)) == step_name.split(".")[0] and removed >= total // 2:
        die(f"{KILL_CLEANUP_ENV}: SIGKILL after removing {removed} of {total} files of step {step_name}")
