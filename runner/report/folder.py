"""Whose report a folder holds. ``report.md`` records the folder it reports (a comment line under its title), so
a report of the same run or sweep updates it in place, and one of another folder does not silently replace it
(or files of the report's names it did not write) unless ``--overwrite`` says so."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..tasks import PACKAGES, report_metrics
from .trials import ReportError, open_regular

REPORT_MD = "report.md"
TITLE = "# Report: "
RECORD = "<!-- runner.report "  # report.md's second line: <!-- runner.report {"dir": ..., "from_out": ...} -->


def report_files() -> list[str]:
    """Every file name a report writes, each task's metrics chart included."""
    charts = {report_metrics(name).chart_file for name in PACKAGES}
    return sorted({REPORT_MD, "report.csv", "loss.png", "final_metric.png", *charts})


def record_line(root: Path, out: Path) -> str:
    """The line of ``report.md`` that names the folder it reports: its absolute path, and its path from the
    report's folder (a tree moved or copied whole keeps its report's)."""
    root_r, out_r = Path(root).resolve(), Path(out).resolve()
    text = json.dumps({"dir": str(root_r), "from_out": os.path.relpath(root_r, out_r)})  # ASCII: a name not UTF-8 too
    return RECORD + text.replace(">", "\\u003e") + " -->"  # a path holding "-->" does not end the comment


def recorded(md: Path) -> dict[str, Any] | None:
    """What ``md`` says of the folder it reports: its record (``dir``, ``from_out``); of a report written before
    reports recorded their folder, the folder its title names as it was given (``title``); None without a
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
    where = f"--out {out}" if given else f"{out} (where the report goes without --out)"
    record = recorded(out / REPORT_MD)
    if record is not None and _same(record, root, out):
        return
    if record is not None and "dir" in record:
        own = "another --out (a folder of its own)" if given else "--out a folder of its own"
        raise ReportError(f"{where} holds the report of {record['dir']}; the report of {root} would replace it. "
                          f"Give {own}, or add --overwrite to replace it. Nothing was written")
    new = "another --out (a new folder)" if given else "--out a new folder"
    raise ReportError(f"{where} holds {', '.join(present)}, not known to be a report of {root}; give {new}, or add "
                      f"--overwrite to replace {'it' if len(present) == 1 else 'them'}. Nothing was written")
