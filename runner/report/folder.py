"""Whose report a folder holds, and putting a report in it. ``report.md`` records the folder it reports and the
files the report wrote (a comment line under its title), so a report of the same run or sweep updates it in
place, and one of another folder does not silently replace it (or files of the report's names it did not write)
unless ``--overwrite`` says so; a report that replaces one removes the files of the one before it does not write
itself (a chart of another task). One report at a time writes a folder (``writing``)."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..tasks import PACKAGES, report_metrics
from .trials import ReportError, open_regular

REPORT_MD = "report.md"
TITLE = "# Report: "
RECORD = "<!-- runner.report "  # report.md's second line: <!-- runner.report {"dir": ..., "files": ...} -->
LOCK = ".report.lock"  # held (flock) by the report writing the folder


def report_files() -> list[str]:
    """Every file name a report writes, each task's metrics chart included."""
    charts = {report_metrics(name).chart_file for name in PACKAGES}
    return sorted({REPORT_MD, "report.csv", "loss.png", "final_metric.png", *charts})


def record_line(root: Path, out: Path, files: Iterable[str] = ()) -> str:
    """The line of ``report.md`` that names the folder it reports: its absolute path, and its path from the
    report's folder (a tree moved or copied whole keeps its report's); and the ``files`` the report wrote."""
    root_r, out_r = Path(root).resolve(), Path(out).resolve()
    text = json.dumps({"dir": str(root_r), "from_out": os.path.relpath(root_r, out_r),  # ASCII: a name not UTF-8 too
                       "files": sorted(files)})
    return RECORD + text.replace(">", "\\u003e") + " -->"  # a path holding "-->" does not end the comment


def recorded(md: Path) -> dict[str, Any] | None:
    """What ``md`` says of the folder it reports: its record (``dir``, ``from_out``, ``files``); of a report
    written before reports recorded their folder, the folder its title names as it was given (``title``); None without a
    report.md or of one the report did not write."""
    try:
        with open_regular(md) as f:
            head = f.read(1 << 16).splitlines()
    except OSError:  # missing, unreadable, a folder or a FIFO (which would block the report until a writer came)
        return None
    for line in head[1:]:  # the line under the title (further down where the title's path held a line break)
        if line.startswith(RECORD) and line.endswith(" -->"):
            try:
                record = json.loads(line[len(RECORD):-len(" -->")])
            except ValueError:
                return None
            return record if isinstance(record, dict) and isinstance(record.get("dir"), str) else None
    return {"title": head[0][len(TITLE):]} if head and head[0].startswith(TITLE) else None


def _same(record: dict[str, Any], root: Path, out: Path) -> bool:
    """Whether ``record`` is of ``root``: the same absolute path, or the same path from the report's folder; a
    report of before records is its own folder's, or the title's folder's (from the current folder)."""
    root_r, out_r = root.resolve(), out.resolve()
    if "dir" not in record:
        try:
            return out_r == root_r or Path(record["title"]).resolve() == root_r
        except (OSError, ValueError):  # a title that is no path (a NUL in it)
            return False
    relative = record.get("from_out")
    return record["dir"] == str(root_r) or (isinstance(relative, str) and (out_r / relative).resolve() == root_r)


def check_out(root: Path, out: Path, given: bool, overwrite: bool) -> None:
    """Refuse, before anything is written, an ``out`` holding the report of another folder than ``root``, or
    files of the report's names not known to be a report of ``root`` (``_same``); ``overwrite`` replaces them."""
    if overwrite:
        return
    # a folder of one of those names is refused as the report is written: no flag replaces it
    present = [name for name in report_files() if os.path.lexists(out / name) and not (out / name).is_dir()]
    if not present:
        return
    record = recorded(out / REPORT_MD)
    if record is not None and _same(record, root, out):
        return
    if record is not None and "dir" in record:
        own = "another --out (a folder of its own)" if given else "--out a folder of its own"
        raise ReportError(f"{where(out, given)} holds the report of {record['dir']}; the report of {root} would "
                          f"replace it. Give {own}, or add --overwrite to replace it. Nothing was written")
    new = "another --out (a new folder)" if given else "--out a new folder"
    raise ReportError(f"{where(out, given)} holds {', '.join(present)}, not known to be a report of {root}; give "
                      f"{new}, or add --overwrite to replace {'it' if len(present) == 1 else 'them'}. Nothing was "
                      f"written")


def where(out: Path, given: bool) -> str:
    """``out`` as messages name it: the option, or the folder a report goes to without it."""
    return f"--out {out}" if given else f"{out} (where the report goes without --out)"


def written(out: Path) -> set[str]:
    """The files the report in ``out`` recorded it wrote, of the names a report writes (never another file);
    none for a report that recorded no list (written before reports did) or a report.md that is no report."""
    files = (recorded(out / REPORT_MD) or {}).get("files")
    return set(files) & set(report_files()) if isinstance(files, list) else set()


@contextmanager
def writing(out: Path, given: bool) -> Iterator[None]:
    """Hold ``out``'s lock for the block: a second report into the same folder meanwhile is refused (two at once
    mixed their files: one's report.md beside the other's charts). The lock is ``flock`` on ``out/.report.lock``,
    released by the system when its process ends, so a report killed midway blocks none after it; the file is
    removed as the block ends (checked to be the one locked, so two waiting reports never both hold it).

    Raises:
        ReportError: another report holds the lock.
        OSError: the lock file cannot be made (a folder that cannot be written).
    """
    path = out / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ReportError(f"{where(out, given)} is being written by another report (it holds {path}); wait for "
                              f"it to end, then run the command again. Nothing was written") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the report before removed the file between this one's open and lock: lock the one now there
            held = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            held = False
        if held:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:  # removed by hand meanwhile
            pass
        finally:
            os.close(fd)


def place(stage: Path, out: Path, before: set[str]) -> None:
    """Move the report written whole into ``stage`` into ``out`` (``report.md`` first: a report stopped midway is
    its own folder's, which the same command then completes), then remove the files of the report ``out`` held
    (``before``: ``written``) that this one does not write -- the chart of another task, say."""
    made = sorted((p.name for p in stage.iterdir()), key=lambda name: (name != REPORT_MD, name))
    blocked = [out / name for name in made if (out / name).is_dir()]
    if blocked:
        raise ReportError(f"{blocked[0]} is a folder where the report writes a file; move it away or give "
                          f"another --out. Nothing was written")
    for name in made:
        os.replace(stage / name, out / name)
    for name in sorted(before - set(made)):
        if not (out / name).is_dir():
            try:
                os.unlink(out / name)
            except FileNotFoundError:
                pass
