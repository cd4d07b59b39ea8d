"""Keeping Orbax's echoes out of what a user reads: a failed restore or save is reported once, by the
manager, with the path and the fix; the tracebacks Orbax's abandoned reads and background threads would add
(each a copy of that one failure) are dropped here. Anything else passes through.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import sys
from typing import Any

log = logging.getLogger("runner")


def _from_orbax(obj: Any) -> bool:
    """A coroutine or task of Orbax's (or a message naming one)."""
    coro = obj.get_coro() if hasattr(obj, "get_coro") else obj
    code = getattr(coro, "cr_code", None)
    return "orbax" in (code.co_filename if code is not None else str(obj))


def _abandoned(u: Any) -> bool:
    """An echo of an abandoned checkpoint read (see ``abandoned_reads_dropped``): a failed Orbax read
    coroutine or task, or a TensorStore completion posted to the event loop Orbax has already closed."""
    if u.object is not None and _from_orbax(u.object):
        return True
    return u.exc_type is RuntimeError and str(u.exc_value) == "Event loop is closed"


STORAGE_WORDS = ("orbax", "tensorstore", "OCDBT", "zarr")  # in the repr of a read's task or its TensorStore error


class _DropAbandonedReads(logging.Filter):
    """asyncio's "Task/Future exception was never retrieved" (and "destroyed but it is pending") records of
    abandoned checkpoint reads; any other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not ("never retrieved" in text or "destroyed but it is pending" in text):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return not any(w.lower() in f"{text} {exc!r}".lower() for w in STORAGE_WORDS)


class _DropSaveFailureEchoes(logging.Filter):
    """Orbax logs a failed background save from each of its threads, each with a traceback; the failure also
    reaches the main thread, where the run reports it once, as the CheckpointError of ``Checkpoints._failed``
    (path, cause and fix)."""

    ECHOES = ("in background save thread", "Save Finalize thread", "_SignalingThread.run() raised an exception")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and any(e in record.getMessage() for e in self.ECHOES))


class _DropReadOnlyNote(logging.Filter):
    """Orbax warns "Given directory is read only=<dir>" whenever a manager is opened read-only, which the runner
    does on purpose to read a checkpoint named by ``checkpoint.resume`` (the directory itself may well be
    writable): the line would only mislead, above the run's own message when it then refuses the checkpoint."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Given directory is read only")


_QUIET = _DropAbandonedReads()
_QUIET_SAVES = _DropSaveFailureEchoes()
_QUIET_READ_ONLY = _DropReadOnlyNote()


def _quiet_hook(previous: Any) -> Any:
    def hook(u: Any) -> None:
        if _abandoned(u):
            log.debug("dropped the failure of an abandoned checkpoint read: %s: %s", u.exc_type.__name__,
                      u.exc_value)
        else:
            previous(u)

    hook.quiet_abandoned_reads = True
    return hook


def install_quiet_hooks() -> None:
    """For the whole process: the echoes of a failed restore can arrive later, from TensorStore's threads."""
    if not getattr(sys.unraisablehook, "quiet_abandoned_reads", False):
        sys.unraisablehook = _quiet_hook(sys.unraisablehook)
    if _QUIET not in logging.getLogger("asyncio").filters:
        logging.getLogger("asyncio").addFilter(_QUIET)
    for quiet in (_QUIET_SAVES, _QUIET_READ_ONLY):
        if quiet not in logging.getLogger("absl").filters:
            logging.getLogger("absl").addFilter(quiet)


@contextlib.contextmanager
def abandoned_reads_dropped():
    """Orbax reads a checkpoint's arrays concurrently; when one read fails (a truncated or missing file) it
    raises that error and abandons the other reads, whose own failures then surface as one traceback each
    ("Task exception was never retrieved", "Exception ignored in: <coroutine ...>", "Event loop is closed")
    when they are garbage-collected or complete. The failed checkpoint is reported once, by ``_unreadable``;
    these echoes are collected here, on the way out of the restore, and dropped (later ones by the hooks of
    ``install_quiet_hooks``). Anything else passes through."""
    previous = sys.unraisablehook
    sys.unraisablehook = _quiet_hook(previous)  # also under a test runner that swaps the process's hook
    try:
        yield
    except BaseException as e:  # a restore that succeeds abandoned no read: nothing to collect
        chain, seen = e, set()  # the tracebacks hold Orbax's frames, and through them the abandoned reads
        while chain is not None and id(chain) not in seen:
            seen.add(id(chain))
            chain.__traceback__, chain = None, chain.__cause__ or chain.__context__
        gc.collect()  # the abandoned reads and their event loop go now, inside the filters
        raise
    finally:
        sys.unraisablehook = previous
