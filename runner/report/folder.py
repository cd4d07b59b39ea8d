"""Whose report a folder holds. ``report.md`` records the folder it reports (a comment line under its title), so
a report of the same run or sweep updates it in place, and one of another folder does not silently replace it
(or files of the report's names it did not write) unless ``--overwrite`` says so."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..tasks import PACKAGES, report_metrics
from .trials import ReportError

REPORT_MD = "report.md"
TITLE = "# Report: "
RECORD = "<!-- runner.report "  # report.md's second line: <!-- runner.report {"dir": ..., "from_out": ...} -->
_LEGACY = "legacy"  # a report.md with a title but no record: written before reports recorded their folder


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


def recorded(md: Path) -> dict[str, Any] | str | None:
    """What ``md`` says of the folder it reports: its record, ``"legacy"`` (a report's title, no record), or
    None (no report.md, or not one the report wrote)."""
    try:
        with open(md, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16).splitlines()[:3]
    except OSError:  # missing, a folder, unreadable
        return None
    for line in head[1:]:
        if line.startswith(RECORD) and line.endswith(" -->"):
            try:
                record = json.loads(line[len(RECORD):-len(" -->")])
            except ValueError:
                return None
            return record if isinstance(record, dict) and isinstance(record.get("dir"), str) else None
    return _LEGACY if head and head[0].startswith(TITLE) else None


def _same(record: dict[str, Any], root: Path, out: Path) -> bool:
    root_r = root.resolve()
    relative = record.get("from_out")
    return record["dir"] == str(root_r) or (isinstance(relative, str) and (out.resolve() / relative).resolve() == root_r)


def check_out(root: Path, out: Path, given: bool, overwrite: bool) -> None:
    """Refuse, before anything is written, an ``out`` holding the report of another folder than ``root``, or
    files of the report's names not known to be a report of ``root`` (a report written before reports recorded
    their folder is taken as its own folder's, in the folder itself); ``overwrite`` replaces them."""
    if overwrite:
        return
    # a folder of one of those names is refused as the report is written: no flag replaces it
    present = [name for name in report_files() if os.path.lexists(out / name) and not (out / name).is_dir()]
    if not present:
        return
    where = f"--out {out}" if given else f"{out} (where the report goes without --out)"
    record = recorded(out / REPORT_MD)
    if isinstance(record, dict):
        if _same(record, root, out):
            return
        own = "another --out (a folder of its own)" if given else "--out a folder of its own"
        raise ReportError(f"{where} holds the report of {record['dir']}; the report of {root} would replace it. "
                          f"Give {own}, or add --overwrite to replace it. Nothing was written")
    if record == _LEGACY and out.resolve() == root.resolve():
        return
    new = "another --out (a new folder)" if given else "--out a new folder"
    raise ReportError(f"{where} holds {', '.join(present)}, not known to be a report of {root}; give {new}, or add "
                      f"--overwrite to replace {'it' if len(present) == 1 else 'them'}. Nothing was written")
