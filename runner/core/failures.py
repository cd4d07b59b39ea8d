"""A table's embedding optimizer that fails ends the run with one message naming its class (its
``_target_``), the table and what failed, never a traceback through JAX's or Hydra's frames.

- While the step is traced (a Python exception in a per-row rule, a shape it gets wrong, a traced value used
  as a Python bool): ``traced`` wraps each call into an optimizer (``TrainProgram``), so the exception is
  attributed to the table being traced.
- While the step runs: the only user code that runs then is a host callback (``jax.debug.callback``,
  ``jax.pure_callback``, ``io_callback``) traced into a rule. Its exception reaches the host as a
  ``JaxRuntimeError`` holding the callback's traceback as text, wherever the run next waits on the step (the
  step itself, a fetch of its metrics, a checkpoint's copy of the state). ``named`` turns that into the message:
  the tables whose optimizer class is defined in a file the traceback passes through, else the run's own
  (non-built-in) optimizer classes. JAX also logs each failed ``jax.debug.callback`` with its traceback; those
  records are dropped while ``named`` is active (the message carries the callback's exception and frame).

A failed step's state is never saved: its arrays hold the error, so no checkpoint can be written from them, and
the checkpoints already written are left as they are.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import re
from typing import Any, Iterator

from ..errors import TrainingError, causes

BUILT_IN = ("optimizers.", "runner.")  # modules whose classes are the project's own
FIX = "Fix the class, or pick a built-in optimizer, e.g. optimizer=async_adam"


class OptimizerFailed(TrainingError):
    """A table's embedding optimizer raised; the message names its class, its setting, the table, the error."""


def class_path(opt: Any) -> str:
    """``module.QualifiedName`` of ``opt``'s class, as a ``_target_`` names it."""
    cls = type(opt)
    return f"{cls.__module__}.{cls.__qualname__}"


def setting(program: Any, table: str) -> str:
    """The config key naming ``table``'s optimizer class."""
    return f"{getattr(program, 'optimizer_keys', {}).get(table, 'optimizer')}._target_"


def _where(tb: Any) -> str:
    """`` (at file:line in function)`` of an exception's innermost frame, or nothing."""
    frames = inspect.getinnerframes(tb, context=0) if tb is not None else []
    return f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].function})" if frames else ""


@contextlib.contextmanager
def traced(program: Any, table: str, what: str) -> Iterator[None]:
    """Any exception raised inside (tracing ``table``'s optimizer for ``what``) becomes an OptimizerFailed."""
    try:
        yield
    except OptimizerFailed:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a user's rule raises, JAX's tracing errors included
        opt = program.emb_optimizers[table]
        cause = " ".join(str(e).split("\n--------------------")[0].split()) or "(no message)"
        raise OptimizerFailed(
            f"the embedding optimizer {class_path(opt)} ({setting(program, table)}) of table '{table}' failed "
            f"while {what} was traced: {type(e).__name__}: {cause}{_where(e.__traceback__)}. Nothing was trained "
            f"with it and no checkpoint was written. {FIX}.") from None


FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
LAST_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Failure|Exit|Interrupt)\b.*)$", re.M)


def _callback_failure(e: BaseException) -> str | None:
    """The text of a failed host callback's JaxRuntimeError anywhere in ``e``'s chain, or None."""
    for link in causes(e):
        text = str(link)
        if type(link).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and "callback" in text.lower() \
                and "Traceback (most recent call last)" in text:
            return text
    return None


def at_run_time(program: Any, e: BaseException) -> OptimizerFailed | None:
    """The OptimizerFailed for a host callback that failed while the step ran, or None (not one)."""
    text = _callback_failure(e)
    if text is None:
        return None
    frames = [(f, int(n), fn) for f, n, fn in FRAME.findall(text) if "/jax/" not in f and "/jaxlib/" not in f]
    files = {f for f, _, _ in frames}
    tables: dict[str, list[str]] = {}
    for table, opt in sorted(program.emb_optimizers.items()):
        try:
            defined = {inspect.getfile(c) for c in type(opt).__mro__ if c.__module__ not in ("builtins",)}
        except TypeError:
            defined = set()
        if defined & files:
            tables.setdefault(class_path(opt), []).append(table)
    why = ""
    if not tables:  # the callback lives elsewhere: the run's own classes are the ones to look at
        why = " (the callback's traceback names no optimizer's file; this is the run's own, not a built-in, class)"
        for table, opt in sorted(program.emb_optimizers.items()):
            if not class_path(opt).startswith(BUILT_IN):
                tables.setdefault(class_path(opt), []).append(table)
    if not tables:
        return None
    last = LAST_LINE.findall(text)
    cause = " ".join(last[-1].split()) if last else "(no message)"
    at = f" at {frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else ""
    named = "; ".join(f"{path} ({', '.join(sorted({setting(program, t) for t in ts}))}) of table"
                      f"{'s' if len(ts) > 1 else ''} {', '.join(repr(t) for t in ts)}" for path, ts in tables.items())
    return OptimizerFailed(
        f"the embedding optimizer {named}{why} failed while the train step ran, in a host callback{at}: {cause}. "
        f"The failed step's state was not saved; the checkpoints already written are as they were. {FIX}.")


class _DropCallbackEchoes(logging.Filter):
    """Drops JAX's own log record of a failed host callback while ``named`` is active (its message says it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for a record of a failed callback."""
        return "callback failed" not in record.getMessage()


DEBUGGING_LOGGER = "jax._src.debugging"


@contextlib.contextmanager
def named(program: Any) -> Iterator[None]:
    """Around the train loop: a host callback of an optimizer that fails becomes one OptimizerFailed."""
    quiet = _DropCallbackEchoes()
    logger = logging.getLogger(DEBUGGING_LOGGER)
    logger.addFilter(quiet)
    try:
        yield
    except Exception as e:  # noqa: BLE001
        failed = at_run_time(program, e)
        if failed is None:
            raise
        raise failed from None
    finally:
        logger.removeFilter(quiet)
