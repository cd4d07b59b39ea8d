"""SIGTERM (a launcher stopping its processes, SLURM pre-empting a job) as a request to stop at the next step
boundary: the loop asks ``requested(step)`` after each step, saves a checkpoint if checkpoints are on, and the
run ends with its own message and exit code 143 (128 + SIGTERM), so a scheduler sees it was stopped, not done.

- One process: a handler of our own sets a flag (the previous handler is restored at ``close``).
- Several processes: they must stop at the same step, or the survivors would wait in a collective. JAX's
  preemption sync manager (started by ``jax.distributed``) already catches SIGTERM on every process and agrees
  on a step with the others through the coordination service; ``reached_preemption_sync_point`` says when
  that step is reached, on every process alike.
"""
from __future__ import annotations

import signal
import threading

import jax


class Preemption:
    """Whether a SIGTERM asked this run to stop; ``requested(step)`` once per step, in step order."""

    def __init__(self):
        self.multi = jax.process_count() > 1
        self.flag = threading.Event()
        self.previous = None
        if not self.multi and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, lambda signum, frame: self.flag.set())

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
        """Put back the SIGTERM handler that was there before (one process)."""
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None
