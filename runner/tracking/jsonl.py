"""``metrics.jsonl`` + ``summary.json``: the tracker every run writes, read by sweeps and the report."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..outputs import SUMMARY_FILE
from .base import Goal, _check_goal
from .convert import json_safe, to_python


class JsonlTracker:
    """Append ``{"step": step, **metrics}`` to ``path`` per :meth:`log` call.

    ``summary.json`` next to ``path`` holds: the last value of every logged key,
    ``"<name>/best"`` and ``"<name>/best_step"`` for names declared with
    :meth:`define_summary`, everything passed to :meth:`log_summary`, and after
    :meth:`finish` ``"exit_code"`` and ``"status"`` (``"failed"`` for a non-zero
    exit code, otherwise a ``status`` the caller logged, else ``"ok"``).
    The file is rewritten atomically on every :meth:`log_summary` and :meth:`finish`.
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.summary_path = self.path.with_name(SUMMARY_FILE)
        self._last: dict[str, Any] = {}
        self._explicit: dict[str, Any] = {}
        self._goals: dict[str, str] = {}
        self._best: dict[str, tuple[float, int]] = {}
        self._finished = False
        # Rows already in the file (a resumed run's, carried up to its checkpoint): the summary's last and best
        # values count them as if this tracker had logged them.
        text = _text(self.path) if append else ""
        self._history = _rows(text)
        for row in self._history:
            self._last.update({k: v for k, v in row.items() if k != "step"})
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")
        if text and not text.endswith("\n"):
            self._file.write("\n")  # a line cut short (a kill mid-write) stays a line of its own, not this run's first

    def define_summary(self, name: str, goal: Goal = "maximize") -> None:
        self._goals[name] = _check_goal(goal)
        for row in self._history:
            if name in row and isinstance(row.get("step"), int):
                self._track_best(name, row[name], row["step"])

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._finished:
            raise RuntimeError("JsonlTracker.log() after finish()")
        values = to_python(metrics)
        record = {"step": int(step), **{k: v for k, v in values.items() if k != "step"}}
        line = json.dumps(json_safe(record), allow_nan=False) + "\n"
        start = self._file.tell()
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as e:  # a full disk: no half line is left for a reader (or a resume) to trip on
            self._file = _cut_back(self._file, self.path, start)
            raise _write_failed(self.path, e) from None
        for k, v in values.items():
            self._last[k] = v
            self._track_best(k, v, step)

    def _track_best(self, k: str, v: Any, step: int) -> None:
        goal = self._goals.get(k)
        if goal is None or not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return
        prev = self._best.get(k)
        if prev is None or (v > prev[0] if goal == "maximize" else v < prev[0]):
            self._best[k] = (float(v), int(step))

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        self._explicit.update(to_python(metrics))
        self._write_summary()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self._last.items() if not isinstance(v, list)}
        for k, (best, best_step) in self._best.items():
            out[f"{k}/best"] = best
            out[f"{k}/best_step"] = best_step
        out.update(self._explicit)
        return out

    def _write_summary(self) -> None:
        tmp = self.summary_path.with_name(self.summary_path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(json_safe(self.summary()), allow_nan=False, indent=2) + "\n")
            os.replace(tmp, self.summary_path)
        except OSError as e:  # the previous summary.json (if any) stays whole
            tmp.unlink(missing_ok=True)
            raise _write_failed(self.summary_path, e) from None

    def finish(self, exit_code: int = 0) -> None:
        if self._finished:
            return
        self._finished = True
        self._explicit["exit_code"] = int(exit_code)
        if exit_code != 0:
            self._explicit["status"] = "failed"
        else:
            self._explicit.setdefault("status", "ok")
        try:
            self._write_summary()
        finally:
            self._file.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        f = getattr(self, "_file", None)
        if f is not None and not f.closed:
            f.close()


def _text(path: Path) -> str:
    """``path``'s text ("" when there is no file)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a metrics file holds ([] when there is none): what a resumed run carries up to its checkpoint."""
    return _rows(_text(path))


def _rows(text: str) -> list[dict[str, Any]]:
    """The JSON objects of ``text``'s lines (a line that is not one is passed over)."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _write_failed(path: Path, e: OSError):
    from ..errors import TrainingError  # noqa: PLC0415

    return TrainingError(f"writing {path} failed ({e.strerror or e}): free space on that disk, or point hydra.run.dir "
                         f"at another, and re-launch (with checkpoint.interval set, the run resumes from its newest "
                         f"checkpoint)")


def _cut_back(file: Any, path: Path, size: int) -> Any:
    """``file`` (append mode) reopened after cutting ``path`` back to ``size`` bytes: what a failed write left of
    its line is dropped, along with the text the file object still buffers."""
    try:
        file.close()
    except OSError:
        pass  # the buffered rest of the line could not be written either
    try:
        os.truncate(path, size)
    except OSError:
        pass
    return open(path, "a", encoding="utf-8")
