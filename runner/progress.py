"""What a run shows while it trains: a live bar on a terminal, plain lines elsewhere.

``make(mode, log=...)`` picks one of three :class:`Progress` kinds (``trainer.progress``):

- ``bar`` (``auto`` when stderr is a terminal): a tqdm bar on stderr with the step, the loss, examples/s,
  the epoch (when the task has one), the last value of the objective and the ETA; a second bar counts the
  batches of an evaluation. The loop's log lines (``step N/M loss ...``) still go to ``log`` (the console
  above the bar, and ``runner.log``).
- ``lines`` (``auto`` otherwise: SLURM logs, CI, pipes, pytest): the loop's plain ``step N/M loss ...`` lines
  every ``trainer.log_interval`` steps, as before, plus one line for the compilation and one for each
  evaluation or checkpoint save that took longer than ``SLOW_S``.
- ``off`` (and every process but process 0): nothing but lines starting with ``warning``.

Every kind takes the same calls from the loop: ``start`` (the run's size), ``compile`` (compiles the step
ahead of its first call, and says so with the time it took), ``step`` (every step), ``logged`` (a
logged row), ``evaluation`` (wraps ``task.evaluate``), ``timed`` (anything that may take a while),
``write`` (a line that does not break the bar) and ``close``.
"""
from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import weakref
from typing import Any, Callable, Iterator, Mapping

MODES = ("auto", "bar", "lines", "off")
SLOW_S = 2.0  # an evaluation, save or flush taking longer than this gets a "... done in X s" line


def check_mode(mode: Any) -> str:
    """``mode`` as one of MODES (the config's enum or a string); ValueError naming the choices otherwise."""
    name = str(getattr(mode, "value", mode))
    if name not in MODES:
        raise ValueError(f"trainer.progress={name!r}: use one of {', '.join(MODES)}")
    return name


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def make(mode: Any = "auto", *, log: Callable[[str], Any] = print, stream: Any = None, enabled: bool = True,
         slow_s: float = SLOW_S, clock: Callable[[], float] = time.perf_counter) -> "Progress":
    """The Progress for ``mode``; ``stream`` (default: sys.stderr, read now) is where a bar goes and what
    ``auto`` asks whether it is a terminal. ``enabled=False`` (processes other than 0) gives a silent one."""
    mode = check_mode(mode)
    stream = sys.stderr if stream is None else stream
    if not enabled or mode == "off":
        return Quiet(log, slow_s=slow_s, clock=clock)
    if mode == "bar" or (mode == "auto" and _isatty(stream)):
        return Bar(log, stream, slow_s=slow_s, clock=clock)
    return Progress(log, slow_s=slow_s, clock=clock)


class Progress:
    """Plain lines (``trainer.progress=lines``), and the interface every kind implements."""

    def __init__(self, log: Callable[[str], Any] = print, *, slow_s: float = SLOW_S,
                 clock: Callable[[], float] = time.perf_counter):
        self._log, self.slow_s, self.clock = log, slow_s, clock
        self.total, self.first, self.current = 0, 0, 0
        self.batch_size, self.steps_per_epoch, self.objective = 1, None, None

    # ----- the run ----------------------------------------------------------------------------------
    def start(self, total: int, first: int = 0, *, batch_size: int = 1, steps_per_epoch: float | None = None,
              objective: str | None = None) -> None:
        """A run of ``total`` steps starting after step ``first`` (a resumed run), ``batch_size`` examples a
        step; ``steps_per_epoch`` when the task's training set is finite; the metric to show when evaluated."""
        self.total, self.first, self.current = int(total), int(first), int(first)
        self.batch_size, self.steps_per_epoch, self.objective = int(batch_size), steps_per_epoch, objective

    def write(self, line: str) -> None:
        """One line of the run's log."""
        self._log(line)

    def step(self, step: int) -> None:
        """Step ``step`` (1-based) was dispatched."""
        self.current = step

    def logged(self, row: Mapping[str, Any]) -> None:
        """The loop logged ``row`` (train/loss, perf/examples_per_s, maybe the objective) at the current step."""

    def close(self) -> None:
        """The run is over (or failed): put the terminal back as it was."""

    # ----- things that take a while ------------------------------------------------------------------
    def compiled(self, what: str, seconds: float) -> None:
        self.write(f"compiling {what} ... done in {seconds:.1f} s")

    def compiling(self, what: str) -> None:
        """Compilation of ``what`` starts (lines mode: a line now, so a long compile is not silence)."""
        self.write(f"compiling {what} ...")

    def compile(self, what: str, make: Callable[[], Any]) -> Any:
        """``make()`` (a compilation of ``what``), announced and timed; returns what it made."""
        self.compiling(what)
        t0 = self.clock()
        out = make()
        self.compiled(what, self.clock() - t0)
        return out

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Time the block; if it took longer than ``slow_s``: ``<what> ... done in X s``."""
        t0 = self.clock()
        yield
        seconds = self.clock() - t0
        if seconds > self.slow_s:
            self.write(f"{what} ... done in {seconds:.1f} s")

    def evaluation(self, evaluate: Callable, batches: int | None = None) -> Callable:
        """``evaluate(predict, state, put, batch_size)`` (a task's), timed; on a terminal a bar counts its
        ``predict`` calls (``batches`` of them, if known)."""

        @functools.wraps(evaluate)
        def run(predict: Callable, *args, **kwargs):
            with self.timed(f"evaluating at step {self.current}"), self._eval_bar(batches) as tick:
                def counted(*a, **k):
                    out = predict(*a, **k)
                    tick()
                    return out
                return evaluate(counted, *args, **kwargs)

        return run

    @contextlib.contextmanager
    def _eval_bar(self, batches: int | None) -> Iterator[Callable[[], None]]:
        yield lambda: None

    # ----- what a bar shows ---------------------------------------------------------------------------
    def epoch(self, step: int) -> float | None:
        return step / self.steps_per_epoch if self.steps_per_epoch else None


class Quiet(Progress):
    """``trainer.progress=off``, and every process but 0: only warnings get through."""

    def write(self, line: str) -> None:
        if line.startswith("warning"):
            self._log(line)

    def compiling(self, what: str) -> None:
        pass

    def compiled(self, what: str, seconds: float) -> None:
        pass


class Bar(Progress):
    """A live tqdm bar on ``stream``: step/total, loss, examples/s, epoch, the objective, ETA."""

    FORMAT = "{percentage:3.0f}%|{bar}| step {n_fmt}/{total_fmt}{postfix}, ETA {remaining}"

    def __init__(self, log: Callable[[str], Any], stream: Any, *, slow_s: float = SLOW_S,
                 clock: Callable[[], float] = time.perf_counter, mininterval: float = 0.2):
        super().__init__(log, slow_s=slow_s, clock=clock)
        self.stream, self.mininterval = stream, mininterval
        self.bar = None
        self.loss: float | None = None
        self.shown: float | None = None  # the objective's last value
        self.examples_per_s: float | None = None
        self._pending_compile: str | None = None

    def _tqdm(self, **kwargs):
        from tqdm import tqdm
        from tqdm.utils import _screen_shape_wrapper

        size = _screen_shape_wrapper()
        width = (size(self.stream) or (None, None))[0] if size else None
        if width and width > 0:  # follow the terminal's width; one that reports none (a bare pty): 100 columns
            return tqdm(file=self.stream, dynamic_ncols=True, mininterval=self.mininterval, **kwargs)
        return tqdm(file=self.stream, ncols=100, nrows=50, mininterval=self.mininterval, **kwargs)

    def write(self, line: str) -> None:
        from tqdm import tqdm

        self._end_compile_line()
        with tqdm.external_write_mode(file=self.stream):
            self._log(line)

    def compiling(self, what: str) -> None:
        # On the terminal only (the finished line goes to the log): "compiling ... " until it is done.
        self._pending_compile = f"compiling {what} ..."
        self.stream.write(self._pending_compile)
        self.stream.flush()

    def _end_compile_line(self) -> None:
        if self._pending_compile is not None:
            self.stream.write("\r" + " " * len(self._pending_compile) + "\r")
            self.stream.flush()
            self._pending_compile = None

    def step(self, step: int) -> None:
        super().step(step)
        if self.bar is None:  # after the first step (and its compilation): the rate and ETA leave it out
            self.bar = self._tqdm(total=self.total, initial=min(step, self.total), bar_format=self.FORMAT,
                                  smoothing=0.1)
            _OPEN.add(self)
            self._show()
            return
        self.bar.set_postfix_str(self.postfix(), refresh=False)  # drawn when tqdm next redraws (mininterval)
        self.bar.update(step - self.bar.n)

    def logged(self, row: Mapping[str, Any]) -> None:
        if "train/loss" in row:
            self.loss = float(row["train/loss"])
        if "perf/examples_per_s" in row:
            self.examples_per_s = float(row["perf/examples_per_s"])
        if self.objective and self.objective in row:
            self.shown = float(row[self.objective])
        if self.bar is not None:
            self._show()

    def postfix(self) -> str:
        parts = []
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.objective and self.shown is not None:
            parts.append(f"{self.objective} {self.shown:.4f}")
        ex_s = self.examples_per_s  # the loop's measure over the last log window (evaluations left out)
        if ex_s is None and self.bar is not None:  # before the first logged row: the bar's own rate
            rate = self.bar.format_dict.get("rate")
            ex_s = rate * self.batch_size if rate else None
        if ex_s is not None and math.isfinite(ex_s):
            parts.append(f"{ex_s:,.0f} ex/s")
        epoch = self.epoch(self.current)
        if epoch is not None:
            parts.append(f"epoch {epoch:.1f}")
        return ", ".join(parts)

    def _show(self) -> None:
        self.bar.set_postfix_str(self.postfix(), refresh=True)

    @contextlib.contextmanager
    def _eval_bar(self, batches: int | None) -> Iterator[Callable[[], None]]:
        bar = self._tqdm(total=batches, desc=f"evaluating at step {self.current}", unit="batch", leave=False)
        try:
            yield lambda: bar.update(1)
        finally:
            bar.close()

    def close(self) -> None:
        self._end_compile_line()
        if self.bar is not None:
            self._show()
            self.bar.close()
            self.bar = None
        _OPEN.discard(self)


_OPEN: "weakref.WeakSet[Bar]" = weakref.WeakSet()  # bars on screen, for close_open


def close_open() -> None:
    """Close every bar still on screen (a run that ended on an error: its traceback starts on a new line)."""
    for bar in list(_OPEN):
        bar.close()
