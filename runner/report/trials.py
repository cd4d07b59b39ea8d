"""A report's trials: find the run folders below a directory, read each one's metrics, summary and overrides,
and label them by what differs between them."""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..outputs import (FAILED_MARKER, METRICS_FILE, OVERRIDES_FILE, SUMMARY_FILE, NotRegularFile, open_regular,
                       read_overrides)
from ..tasks import ReportMetrics, report_metrics

LOSS_KEY = "train/loss"
CONFIG_FILE = Path(".hydra") / "config.yaml"  # the trial's composed config: its data.name says the task
_SKIP_DIRS = {"wandb", ".hydra", "__pycache__", "checkpoints", ".git"}


class ReportError(ValueError):
    """The report cannot be made from these arguments; the message says which and what to give instead."""


def _to_float(v: Any) -> float | None:
    """Numbers and the strings "NaN"/"Infinity"/"-Infinity" -> float; anything else None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def printable(text: str) -> str:
    """``text`` with what a UTF-8 file and the charts' fonts cannot hold escaped: a folder name that is not UTF-8
    (bytes Python keeps as surrogates) shows as ``\\xff``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _unreadable(path: Path, e: BaseException, name: Path | str | None = None) -> str:
    """What the report says of a file that is there but cannot be read or parsed; ``name``: how to call it when
    its file name alone is not clear (``.hydra/config.yaml``)."""
    why = getattr(e, "strerror", None) or ("nested too deeply" if isinstance(e, RecursionError) else
                                           "not UTF-8" if isinstance(e, UnicodeDecodeError) else "not JSON")
    return f"{name or path.name} ({why})"


def read_metrics(path: Path, problems: list[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Parse a ``metrics.jsonl`` line by line; returns (records, number of unparseable lines). A file that is
    there but cannot be read is named in ``problems`` (with the records of the lines read before a read error)."""
    records: list[dict[str, Any]] = []
    bad = 0
    try:
        with open_regular(path) as f:
            for chunk in f:  # line by line: a long run's log is never held whole as text
                # split as str.splitlines splits (at \x0b, \x1c, \u2028 too), as the whole file's text was before
                for line in chunk.splitlines():
                    bad += _parse_line(line.strip(), records)
    except FileNotFoundError:
        return records, 0
    except OSError as e:  # the lines read before a read error are kept, the file named
        if problems is not None:
            problems.append(_unreadable(path, e))
    return records, bad


def _parse_line(line: str, records: list[dict[str, Any]]) -> int:
    """Append the record ``line`` holds to ``records``; returns 1 when it holds none (it is cut short, nested
    past what the parser recurses or no JSON object), else 0. A blank line is no record and nothing bad."""
    if not line:
        return 0
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return 1
    if not isinstance(obj, dict):
        return 1
    if "\\u" in line:  # a key of a lone surrogate escape ("\ud800") that no chart's font can draw
        obj = {printable(k): v for k, v in obj.items()}
    records.append(obj)
    return 0


def _read_summary(trial_dir: Path, problems: list[str]) -> dict[str, Any]:
    path = trial_dir / SUMMARY_FILE
    try:
        with open_regular(path, errors="strict") as f:  # a summary not UTF-8 is named, not guessed at
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # unreadable, cut short, not UTF-8, nested too deeply
        problems.append(_unreadable(path, e))
        return {}
    if not isinstance(data, dict):
        problems.append(f"{path.name} (not a JSON object)")
        return {}
    return data




def _read_data_name(trial_dir: Path, problems: list[str]) -> str | None:
    """``data.name`` of the trial's composed config (which task it ran); None without a readable one (then the
    default task's report). A config that is there but cannot be read (a FIFO, a folder, no permission) is named
    in ``problems``, as the trial's other files are."""
    path = trial_dir / CONFIG_FILE
    try:
        with open_regular(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        problems.append(_unreadable(path, e, CONFIG_FILE))
        return None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - a config that is no YAML: the default task's report
        return None
    name = data.get("data", {}).get("name") if isinstance(data, dict) and isinstance(data.get("data"), dict) else None
    return str(name) if name is not None else None


@dataclass
class Trial:
    path: Path
    label: str
    overrides: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0
    summary: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    distinct: list[str] | None = None  # the overrides that tell it from the other trials (label_trials)
    data: str | None = None  # the data source its config names (which task it ran); None: not recorded
    unreadable: list[str] = field(default_factory=list)  # its files that are there but cannot be read, and why

    @property
    def finished(self) -> bool:
        """Whether the run ended: its ``summary.json`` records a status (a run still going, or killed, has none)."""
        return "status" in self.summary

    @property
    def status(self) -> str:
        """``failed`` first (it is known how the run ended), then ``unreadable`` -- a file that is there but cannot
        be read, even beside a readable summary.json: what the report shows of it is incomplete, so it is not
        called ``ok`` (its readable metrics are still shown) -- then ``ok`` or ``unfinished``."""
        return ("failed" if self.failed else "unreadable" if self.unreadable else
                "ok" if self.finished else "unfinished")

    @property
    def shown_overrides(self) -> list[str]:
        """What the report shows of its overrides: those other trials do not share (all before label_trials)."""
        return self.overrides if self.distinct is None else self.distinct

    @property
    def config_label(self) -> str:
        return " ".join(self.shown_overrides) if self.shown_overrides else self.label

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(steps, values) for ``key``; records without a numeric step or value are skipped.
        Non-finite values are kept (as float nan/inf)."""
        xs: list[float] = []
        ys: list[float] = []
        for r in self.records:
            step = _to_float(r.get("step"))
            val = _to_float(r.get(key))
            if step is None or val is None or not math.isfinite(step):
                continue
            xs.append(step)
            ys.append(val)
        return xs, ys

    def keys(self) -> set[str]:
        """The keys its metrics.jsonl logged as numbers (what the charts draw)."""
        out: set[str] = set()
        for r in self.records:
            out.update(k for k, v in r.items() if k != "step" and _to_float(v) is not None)
        return out

    def ranked_keys(self) -> set[str]:
        """The keys ``--metric`` can rank it by: those it logged as numbers and the numbers of its summary.json
        (the keys only a run's end writes: ``final/*``, ``<key>/best``, ``steps``)."""
        return self.keys() | {k for k, v in self.summary.items() if _to_float(v) is not None}

    @property
    def last_step(self) -> int | None:
        steps = [s for r in self.records if (s := _to_float(r.get("step"))) is not None]
        steps = [s for s in steps if math.isfinite(s)]
        return int(max(steps)) if steps else None

    def final(self, key: str) -> float | None:
        """The run's last value of ``key``: its summary.json's, written as it ended (metrics.jsonl's last row can be
        an earlier step's, when the file's end was cut off), else the last one logged."""
        ended = _to_float(self.summary.get(key)) if self.finished else None
        if ended is not None:
            return ended
        _, ys = self.series(key)
        if ys:
            return ys[-1]
        return _to_float(self.summary.get(key))

    def best(self, key: str, goal: str = "maximize") -> tuple[float | None, int | None]:
        xs, ys = self.series(key)
        pairs = [(y, x) for x, y in zip(xs, ys) if math.isfinite(y)]
        if pairs:
            pick = max if goal == "maximize" else min
            y, x = pick(pairs, key=lambda p: p[0])
            return y, int(x)
        best = _to_float(self.summary.get(f"{key}/best"))
        best_step = _to_float(self.summary.get(f"{key}/best_step"))
        if best is None:
            best = _to_float(self.summary.get(key))
        return best, (int(best_step) if best_step is not None and math.isfinite(best_step) else None)


def load_trial(trial_dir: Path, label: str | None = None) -> Trial:
    trial_dir, problems = Path(trial_dir), []
    if not os.access(trial_dir, os.R_OK | os.X_OK):
        problems.append("the folder itself (permission denied)")
    records, bad = read_metrics(trial_dir / METRICS_FILE, problems)
    summary = _read_summary(trial_dir, problems)
    try:
        overrides = read_overrides(trial_dir, errors="strict")  # not UTF-8: named, not read as no overrides
    except (OSError, ValueError) as e:
        overrides = []
        problems.append(_unreadable(trial_dir / OVERRIDES_FILE, e))
    try:
        failed = (trial_dir / FAILED_MARKER).exists()
    except OSError:
        failed = False
    failed = failed or str(summary.get("status", "")).lower() == "failed"
    label = label if label is not None else trial_dir.name
    return Trial(
        path=trial_dir,
        label=printable(label),
        overrides=overrides,
        records=records,
        bad_lines=bad,
        summary=summary,
        failed=failed,
        data=_read_data_name(trial_dir, problems),
        unreadable=problems,
    )




def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.as_posix())]


def _is_trial_dir(d: Path) -> bool:
    """A trial's folder (a folder that cannot be looked into is reported as one, marked unreadable, rather
    than passed over)."""
    try:
        return (d / METRICS_FILE).is_file() or (d / OVERRIDES_FILE).is_file() or (d / FAILED_MARKER).exists()
    except PermissionError:
        return True


def find_trials(root: Path, exclude: Iterable[Path] = ()) -> list[Path]:
    """Trial directories at or below ``root``, in natural order (0, 1, 2, ..., 10)."""
    root = Path(root)
    excluded = {Path(p).resolve() for p in exclude}
    found: list[Path] = []

    def walk(d: Path) -> None:
        if d.resolve() in excluded and d != root:
            return
        if _is_trial_dir(d):
            found.append(d)
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:
            return
        for c in children:
            if c.name in _SKIP_DIRS:
                continue
            walk(c)

    walk(root)
    return sorted(found, key=lambda p: _natural_key(p.relative_to(root)))


def shared_overrides(overrides: Sequence[Sequence[str]]) -> list[str]:
    """The overrides every one of several trials has (in the first trial's order), given each trial's list;
    none for a single trial, which is then shown by all of its own. What a trial shows of its overrides is the
    rest: the values that tell it from the others (the report's labels, a sweep's ``FAILED`` lines)."""
    if len(overrides) < 2:
        return []
    rest = [set(o) for o in overrides[1:]]
    return [o for o in dict.fromkeys(overrides[0]) if all(o in r for r in rest)]


def common_overrides(trials: Sequence[Trial]) -> list[str]:
    """The overrides every trial has (``shared_overrides``)."""
    return shared_overrides([t.overrides for t in trials])


def label_trials(trials: Sequence[Trial]) -> list[str]:
    """Label each trial by the overrides that differ between trials (``Trial.distinct``); return the common
    ones, which the report lists once."""
    common = common_overrides(trials)
    shared = set(common)
    for t in trials:
        t.distinct = [o for o in t.overrides if o not in shared]
    return common


def other_task(trial: Trial, shown: ReportMetrics) -> bool:
    """Whether ``trial``'s config names a data source of another task than ``shown`` (a trial without a
    readable config is not known to be of another one)."""
    return trial.data is not None and report_metrics(trial.data) is not shown


def shown_metrics(trials: Sequence[Trial]) -> ReportMetrics:
    """What the report shows of these trials: the task's declaration (``runner.tasks.report_metrics``) of the
    first trial whose config names its data source, else the default data source's."""
    return report_metrics(next((t.data for t in trials if t.data is not None), None))
