"""SIGTERM (a launcher stopping its processes, SLURM pre-empting a job) as a request to stop at the next step
boundary: the loop asks ``requested(step)`` after each step, saves a checkpoint if checkpoints are on, and the
run ends with its own message and exit code 143 (128 + SIGTERM), so a scheduler sees it was stopped, not done.

- One process: a handler of our own sets a flag (the previous handler is restored at ``close``).
- Several processes: they must stop at the same step, or the survivors would wait in a collective. JAX's
  preemption sync manager (started by ``jax.distributed``) already catches SIGTERM on every process and agrees
  on a step with the others through the coordination service; ``reached_preemption_sync_point`` says when
  that step is reached, on every process alike.

Ctrl-C (SIGINT) on a one-process run asks the same: the first stops the run at the next step boundary, with a
checkpoint and exit code 130 (128 + SIGINT); it says so on the terminal and gives SIGINT back to Python, so a
second Ctrl-C stops the process at once (``KeyboardInterrupt``, one line from the command line, exit 130;
the checkpoints already committed stay usable). With several processes Ctrl-C stops at once.
"""
from __future__ import annotations

import signal
import sys
import threading

import jax


_UNANSWERED: list[str] = []  # the signal that asked the last run to stop after its last step was checked


def unanswered() -> str | None:
    """The signal (``SIGTERM``/``SIGINT``) that asked the last finished run to stop too late for it to stop early:
    after its last step boundary, during the final flush, evaluation or save (None: none did). A sweep stops
    before its next trial on it."""
    return _UNANSWERED[-1] if _UNANSWERED else None


class Preemption:
    """Whether a SIGTERM (or on one process a Ctrl-C) asked this run to stop; ``requested(step)`` once per step,
    in step order; ``signal`` names the signal that asked."""

    def __init__(self):
        _UNANSWERED.clear()
        self.multi = jax.process_count() > 1
        self.flag = threading.Event()
        self.signal = "SIGTERM"  # what the message and the exit code name: SIGINT once a Ctrl-C asked first
        self.previous = {}
        if not self.multi and threading.current_thread() is threading.main_thread():
            self.previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda signum, frame: self._ask("SIGTERM"))
            self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)

    def _ask(self, name: str) -> None:
        if not self.flag.is_set():
            self.signal = name
        self.flag.set()

    def _interrupt(self, signum, frame) -> None:
        """The first Ctrl-C: stop at the next step boundary; the next one is Python's own (stop at once)."""
        self._ask("SIGINT")
        signal.signal(signal.SIGINT, self.previous.pop(signal.SIGINT))
        print("\nrunner: Ctrl-C: stopping after this step (with a checkpoint if checkpoints are on); Ctrl-C again "
              "stops at once", file=sys.stderr, flush=True)

    def requested(self, step: int) -> bool:
        """Whether the run stops after ``step``: every process gives the same answer for the same step."""
        if self.multi:
            from jax.experimental import multihost_utils  # noqa: PLC0415

            return bool(multihost_utils.reached_preemption_sync_point(step))
        return self.flag.is_set()

    def __enter__(self) -> "Preemption":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Put back the SIGTERM and SIGINT handlers that were there before (one process), noting a signal that
        asked to stop (``unanswered``: a run that stopped on it raised ``Preempted`` instead of finishing)."""
        if self.flag.is_set():
            _UNANSWERED[:] = [self.signal]
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}
