"""The runner's error types, one home for all of them.

Each is a :class:`RunnerError`, which ``python -m runner`` reports as one line, ``error: <message>``, and a
non-zero exit code, never a traceback: exit code 1 for a :class:`CheckpointError` (a save failed mid-run),
2 for every other. They are siblings: a training or a distributed error is not a preflight error.
"""
from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class RunnerError(Exception):
    """What the command line reports as one message; the message says what was wrong and how to fix it."""


class PreflightError(RunnerError, ValueError):
    """A config that cannot work, refused before anything compiles; the message says why and how to fix it."""


class TrainingError(RunnerError):
    """Training stopped because it went wrong (updates keep being refused, an id outside its table with
    ``trainer.strict_ids``, an embedding optimizer that raised); the message names the table, the step and
    the likely causes."""


class MemoryBudgetError(RunnerError):
    """The compiled train step needs more memory than the devices have left (``runner.core.memory_budget``);
    refused before the first step, naming ``trainer.batch_size`` and a batch that fits."""


class DistributedError(RunnerError):
    """The processes could not form a run (bad settings, unreachable coordinator, started too late)."""


class CheckpointError(RunnerError, RuntimeError):
    """A checkpoint could not be written; the run stops rather than train on without one."""


def exit_code(e: RunnerError) -> int:
    """The exit code ``python -m runner`` ends with for ``e`` (and records in summary.json): 1 for a failed save,
    2 for every other runner error."""
    return 1 if isinstance(e, CheckpointError) else 2


class Preempted(Exception):
    """Not an error: the run stopped on SIGTERM (or Ctrl-C) at a step boundary, its checkpoint written if
    checkpoints are on (``core/preemption.py``). The command line says so in one line and exits with ``code``:
    143 (128 + SIGTERM) or 130 (128 + SIGINT)."""

    def __init__(self, message: str, code: int = 143):
        super().__init__(message)
        self.code = code


class Terminated(BaseException):
    """SIGTERM inside :func:`sigterm_unwinds`: raised like Ctrl-C's ``KeyboardInterrupt`` (not an ``Exception``,
    so no ``except Exception`` swallows it), so ``finally`` blocks remove what a command had half written and the
    command can say so in one line and exit 143, where the default action would kill it on the spot."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """For the block, SIGTERM raises :class:`Terminated` (main thread only: Python runs handlers there); the
    previous handler is put back after it. The commands that write files (``runner.prepare``,
    ``runner.report``) use it to stop cleanly when a scheduler or ``kill`` ends them."""
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame):
    raise Terminated()


def stopped(command: str, e: BaseException, then: str) -> int:
    """Say on stderr that ``command`` was stopped by ``e`` (``KeyboardInterrupt`` or :class:`Terminated`), then
    ``then`` (what it left and how to go on); returns the exit code, 130 or 143 (128 + the signal)."""
    how, code = ("SIGTERM", 143) if isinstance(e, Terminated) else ("Ctrl-C", 130)
    print(f"{command}: stopped ({how}){then}", file=sys.stderr)
    return code


def said_by_process_0(e: RunnerError, process: int | str, what: str) -> RunnerError:
    """What process ``process`` (not 0) of a multi-process run raises in place of ``e``, a refusal process 0 gives
    as well: one line, ``<what> is refused (process <process>): process 0's output says why``, where n copies of the
    message said nothing more. The same type as ``e``, so the process exits with the same code."""
    return type(e)(f"{what} is refused (process {process}): process 0's output says why")


def causes(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and the exceptions behind it (``__cause__``, else ``__context__``), each once, outermost first."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def first_line(error: BaseException) -> str:
    """An error's message in one line: its first (the type's name when it has none)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def out_of_memory(error: BaseException) -> str | None:
    """The one-line message for a device or host allocation XLA could not make mid-run (its ``JaxRuntimeError``
    saying ``RESOURCE_EXHAUSTED`` or ``Out of memory``), which the memory checks before the run did not foresee;
    None for any other error. Matched by name: this module imports no JAX."""
    text = str(error)
    if type(error).__name__ not in ("JaxRuntimeError", "XlaRuntimeError") or not (
            "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()):
        return None
    return (f"out of memory: {first_line(error).rstrip('.')}. Lower trainer.batch_size, make the tables smaller "
            f"(their vocab or capacity, model.emb_width, model.tables.<name>.dtype=bfloat16), pick an embedding "
            f"optimizer with less state a row (optimizer=async_rowwise_adagrad keeps one number a row), or shard the "
            f"tables over more devices (mesh=data_table)")


__all__ = ["CheckpointError", "DistributedError", "Preempted", "PreflightError", "RunnerError", "Terminated",
           "TrainingError", "exit_code", "first_line", "out_of_memory", "said_by_process_0", "sigterm_unwinds",
           "stopped"]
