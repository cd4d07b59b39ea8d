"""Where a Criteo run's examples come from: what ``data.path`` names, and the conversions a run makes once.

``data.path`` names either a folder converted ahead of time by ``python -m runner.prepare criteo`` (it holds
``manifest.json``) or the raw logs themselves:

- one Criteo-format file: Kaggle's ``train.txt``, a Terabyte ``day_<d>``, gzipped or not, under any name;
- a folder of them: its ``day_<d>`` / ``day_<d>.gz`` files, all of them, split by day; else its ``train.txt``
  (Kaggle's archive unpacks to one, beside a ``test.txt`` without labels, which is left alone);
- a glob (``'/data/tb/day_?.gz'``): the files it matches, for several files or a subset of the days.

Raw logs are converted on first use, as ``python -m runner.prepare criteo`` converts them, into
``<data.cache>/logs-<key>``. The key is a hash of each file's resolved path, size and modification time and of
the conversion's settings (``data.max_bad_lines``, ``data.bags``), so later runs reuse the folder and a
changed file gets a new one. Every conversion here (and ``generated``'s in ``task.py``) is written into a
temporary folder and renamed when complete (:func:`once`): concurrent runs and interrupted ones leave no half
folder. A bad input line refuses the run with one message naming the file, the line and the fix, unless
``data.max_bad_lines`` allows it (then it is skipped and counted: ``data/bad_lines``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from glob import glob
from pathlib import Path
from typing import Callable, Sequence

from ...errors import Preempted, PreflightError
from .disk import DiskError, fix, reason
from .prepare import DAY, FORMAT, PrepareError, convert, load_truth
from .tsv import FormatError

SPLIT_SEED = 0  # a single file's seeded 90/5/5 split: python -m runner.prepare criteo's default --seed
DEFAULT_CACHE = Path("outputs") / "criteo_data"
KAGGLE = ("train.txt", "train.txt.gz")
TRUTH = ".p.npy"  # generated logs' click probabilities, beside each file (synthetic.write_logs): not a log
WHAT = ("give data.path a folder converted by python -m runner.prepare criteo, a Criteo-format log (train.txt, "
        "day_<d>, .gz too), a folder of them or a glob such as '/data/day_?.gz'; or unset it to train on "
        "generated logs")

log = logging.getLogger("runner")


def raw_logs(path: str) -> list[Path] | None:
    """The raw log files ``data.path`` names, or None where it names a converted folder (one holding
    ``manifest.json``). A path that is neither is refused with one message."""
    p = Path(path).expanduser()
    if p.is_dir():
        if (p / "manifest.json").exists():
            return None
        days: dict[int, list[Path]] = {}
        for f in p.iterdir():
            m = DAY.match(f.name)
            if m and f.is_file():
                days.setdefault(int(m.group(1)), []).append(f)
        twice = sorted(str(f) for fs in days.values() if len(fs) > 1 for f in fs)
        if twice:
            raise PreflightError(f"data.path={path}: a day twice, plain and gzipped ({', '.join(twice)}); remove "
                                 f"one of each pair, or name the files with a glob")
        if days:
            return [days[d][0] for d in sorted(days)]
        kaggle = [p / n for n in KAGGLE if (p / n).is_file()]
        if len(kaggle) == 1:
            return kaggle
        what = f"both {' and '.join(map(str, kaggle))}" if kaggle else \
            "neither a conversion (manifest.json) nor Criteo logs (day_<d> or day_<d>.gz files, or train.txt)"
        raise PreflightError(f"data.path={path}: the folder holds {what}; {WHAT}")
    if p.is_file():
        return [p]
    if any(c in str(path) for c in "*?["):
        files = sorted(Path(f) for f in glob(str(p)) if Path(f).is_file() and not f.endswith(TRUTH))
        if not files:
            raise PreflightError(f"data.path={path}: the pattern matches no file; {WHAT}")
        return files
    if p.exists():  # a pipe (<(zcat ...) on the command line), a device or a socket
        raise PreflightError(f"data.path={path} is a pipe or a device, not a file: logs are read by name (their path, "
                             f"size and modification time name the conversion, which a later run finds); write them to a file first, "
                             f"or give a .gz as it is (it is read compressed)")
    raise PreflightError(f"data.path={path}: no such file or folder; {WHAT}")


def once(folder: Path, make: Callable[[Path], Path]) -> Path:
    """``folder``, made the first time: ``make(work)`` writes a conversion somewhere under ``work``, a new
    temporary folder beside ``folder``, and returns it; it is renamed into place when complete (a folder
    another process completed first wins), and ``work`` removed whatever happens."""
    if (folder / "manifest.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    main = threading.current_thread() is threading.main_thread()  # only it may handle signals
    previous = signal.signal(signal.SIGTERM, _stopped) if main else None  # SIGTERM unwinds too: work removed
    try:
        done = make(work)
        try:
            os.rename(done, folder)
        except OSError:  # another process made it first
            if not (folder / "manifest.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if main:
            signal.signal(signal.SIGTERM, previous)
    return folder


def _stopped(signum, frame):
    raise Preempted("stopped on SIGTERM while converting the Criteo logs, before training: the partial conversion "
                    "was removed; the same command converts them again", code=128 + signum)


def _stat(p: Path) -> list:
    s = p.stat()
    return [str(p.resolve()), s.st_size, s.st_mtime_ns]


def cache_folder(files: Sequence[Path], cache: str | None, max_bad_lines: int, bags: Sequence[int] | None) -> Path:
    """``<cache>/logs-<key>``: the key a hash of the files (resolved path, size, modification time, and those
    of a generated file's click probabilities beside it) and of the conversion's settings."""
    entries = [_stat(f) + ([_stat(f.with_name(f.name + TRUTH))] if f.with_name(f.name + TRUTH).exists() else [])
               for f in files]
    settings = {"max_bad_lines": int(max_bad_lines), "bags": list(bags) if bags else None, "seed": SPLIT_SEED}
    key = hashlib.sha256(json.dumps([FORMAT, entries, settings], sort_keys=True).encode()).hexdigest()[:12]
    return (Path(cache).expanduser() if cache else DEFAULT_CACHE) / f"logs-{key}"


def converted(path: str, files: Sequence[Path], cache: str | None, max_bad_lines: int,
              bags: Sequence[int] | None) -> Path:
    """The converted folder of the raw logs ``files`` (what ``data.path=path`` names), made the first time.
    A bad input line, an empty file or a truncated ``.gz`` is a :class:`PreflightError` with one message."""
    folder = cache_folder(files, cache, max_bad_lines, bags)
    if (folder / "manifest.json").exists():
        return folder
    for f in files:
        check_truth(f.with_name(f.name + TRUTH))
    size = sum(f.stat().st_size for f in files)
    log.info("converting the Criteo logs of data.path=%s (%d file%s, %s) into %s: once, later runs of the same files "
             "and settings reuse it", path, len(files), "" if len(files) == 1 else "s",
             f"{size / 1e9:,.1f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB", folder)

    def make(work: Path) -> Path:
        convert(files, work / "shards", seed=SPLIT_SEED, max_bad_lines=max_bad_lines, bags=bags)
        return work / "shards"

    try:
        return once(folder, make)
    except FormatError as e:
        raise bad_input(e, max_bad_lines) from None
    except (DiskError, OSError) as e:  # before PrepareError, of which DiskError is one
        raise cache_failed(f"data.path={path}: converting the logs into {folder}", e) from None
    except PrepareError as e:
        raise PreflightError(f"data.path={path}: {e}") from None


def cache_failed(what: str, e: OSError | DiskError) -> PreflightError:
    """The message for a conversion a run could not write (``what``: what it was doing, and where; a
    :class:`DiskError` adds the file it was writing), the fix in terms of ``data.cache``."""
    if isinstance(e, DiskError):
        what, e = f"{what}: {e.doing} {e.path}", e.error
    at = f": {e.filename}" if e.filename and not what.endswith(str(e.filename)) else ""
    return PreflightError(f"{what} failed ({reason(e)}{at}); {fix(e, 'set data.cache to')}")


def check_truth(path: Path) -> None:
    """Refuse a ``<log>.p.npy`` beside a log that is not the click probabilities a conversion reads."""
    problem = load_truth(path)[1]
    if problem:
        raise PreflightError(problem)


def bad_input(e: FormatError, max_bad_lines: int) -> PreflightError:
    """A run's message for input a conversion refused: the file, the line and what is wrong, then the fix in
    the run's terms (``data.max_bad_lines``, not the ``--max-bad-lines`` of ``python -m runner.prepare``)."""
    if e.line is None:  # the whole file: missing, empty, no lines, a truncated or damaged .gz
        return PreflightError(str(e))
    if max_bad_lines:
        fix = (f"it is bad line {e.count} of the file, over data.max_bad_lines={max_bad_lines}: fix or remove the "
               f"bad lines, or raise data.max_bad_lines")
    else:
        fix = "fix or remove the line, or set data.max_bad_lines=N to skip and count up to N bad lines per file"
    return PreflightError(f"{e.path}, line {e.line}: {e.why}; {fix} (a run reports those it skipped as "
                          f"data/bad_lines)")


__all__ = ["bad_input", "cache_failed", "cache_folder", "check_truth", "converted", "once", "raw_logs"]
