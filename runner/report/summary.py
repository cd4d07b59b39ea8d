"""A report's files: ``report.md`` (the summary and a table per trial), ``report.csv`` and the charts."""
from __future__ import annotations

import csv
import difflib
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..outputs import FAILED_MARKER, METRICS_FILE, OVERRIDES_FILE, SUMMARY_FILE
from ..tasks import ReportMetrics, report_metrics
from .charts import AucPanels, _plot_final, _plot_loss, _plot_metrics, auc_panels
from .folder import REPORT_MD, TITLE, check_out, place, record_line, writing, written
from .trials import (LOSS_KEY, ReportError, Trial, _is_trial_dir, find_trials, label_trials, load_trial, other_task,
                     printable, shown_metrics)

CSV_COLUMNS = [
    "trial",
    "status",
    "overrides",
    "steps",
    "records",
    "final_loss",
    "objective",
    "best_objective",
    "best_step",
    "final_objective",
]
TRIAL_HOLDS = (f"a trial folder holds {METRICS_FILE}, {OVERRIDES_FILE.as_posix()} or a {FAILED_MARKER} file "
               "(Hydra's run folder outputs/<date>/<time>, or one trial of a sweep multirun/<date>/<time>/<n>)")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _md_cell(v: Any) -> str:
    return _fmt(v).replace("|", "\\|").replace("\n", " ") or "–"


def _row(t: Trial, metric: str, goal: str) -> dict[str, Any]:
    best, best_step = t.best(metric, goal)
    return {
        "trial": t.label,
        "status": t.status,
        "overrides": " ".join(t.overrides),
        "steps": t.last_step,
        "records": len(t.records),
        "final_loss": t.final(LOSS_KEY),
        "objective": metric,
        "best_objective": best,
        "best_step": best_step,
        "final_objective": t.final(metric),
    }


def _check_dirs(root: Path, out: Path | None) -> tuple[Path, Path]:
    try:
        if not root.exists():
            raise ReportError(f"{root} does not exist; give a run folder (outputs/<date>/<time>) or a sweep folder "
                              f"(multirun/<date>/<time>)")
        is_dir = root.is_dir()
    except OSError as e:  # a folder above it that cannot be entered, a name too long
        raise ReportError(f"{root} cannot be looked at ({e.strerror or e}); give a run or sweep folder that can be "
                          f"read") from None
    if not is_dir:
        hint = f"; give the folder that holds it: {root.parent}" if root.name in (METRICS_FILE, SUMMARY_FILE) else ""
        raise ReportError(f"{root} is a file, not a folder{hint or '; give a run or sweep folder'}")
    try:
        _check_out_place(root, out)
    except OSError as e:
        raise ReportError(f"--out {out} cannot be looked at ({e.strerror or e}); give a folder that can be written. "
                          f"Nothing was written") from None
    return root, out if out is not None else root


def _check_out_place(root: Path, out: Path | None) -> None:
    """Refuse an ``out`` that is a file, or inside a trial (of ``root``'s, or another run's folder)."""
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out} is a file; give a folder (it is created if missing)")
    root_r = root.resolve()
    inside = next((d for d in (out.resolve(), *out.resolve().parents) if d != root_r and d not in root_r.parents
                   and _is_trial_dir(d)), None)
    if inside is not None and root_r in inside.parents:
        raise ReportError(f"--out {out} is inside the trial {inside} of {root}: the report would be written among "
                          f"that trial's files and the trial left out of it. Give a folder outside the trials (the "
                          f"default, {root}, or any other)")
    if inside is not None:
        raise ReportError(f"--out {out} is {'' if inside == out.resolve() else 'inside '}the run folder {inside}, "
                          f"not {root}'s: the report of {root} would be written among another run's files. Give a "
                          f"folder of its own (or leave --out out to write it into {root})")


def build_report(
    root: Path,
    out: Path | None = None,
    metric: str | None = None,
    goal: str = "maximize",
    notes: list[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``report.md``, ``report.csv``, ``loss.png``, the task's metrics chart (``auc.png`` for ranking) and
    ``final_metric.png`` into ``out`` (default ``root``); return the ``report.md`` path.

    Args:
        root: a run folder or any folder above trials.
        out: where the files go (default ``root``).
        metric: the objective trials are ranked by (default: the task's, ``ReportMetrics.objective``).
        goal: ``maximize`` or ``minimize`` the objective.
        notes: where the warnings the report's header carries are also appended (trials of another task), for
            the command line to print: a mixed report is written, but not without a word.
        overwrite: replace the report of another folder in ``out``, or files of the report's names it did not
            write (refused without it: ``folder.check_out``); a report of ``root`` there is always updated.

    Raises:
        ReportError: before writing anything, for a missing folder, a file, a folder without any trial, or an
            ``out`` inside another run's folder or holding another folder's report.
    """
    if goal not in ("maximize", "minimize"):
        raise ReportError(f"goal must be 'maximize' or 'minimize', got {goal!r}")
    given = out is not None
    root, out = _check_dirs(Path(root), Path(out) if given else None)
    # Nothing below --out is passed over: a report writes only files there (and its own .report-* folder,
    # which holds none of a trial's), so an --out that is a sweep folder inside DIR keeps that sweep's trials.
    dirs = find_trials(root)
    if not dirs:
        raise ReportError(f"{root} holds no trial: {TRIAL_HOLDS}. Nothing was written; point at a run or sweep "
                          f"folder")
    trials = [load_trial(d, label=(d.relative_to(root).as_posix() if d != root else root.name)) for d in dirs]
    shown = shown_metrics(trials)
    known = {k for t in trials for k in t.ranked_keys()}  # numbers: a flag such as emb/valid_step ranks nothing
    if metric is not None and metric not in known:
        raise ReportError(unknown_metric(metric, known, shown.objective))
    metric = shown.objective if metric is None else metric
    warnings = _mixed_tasks(root, trials, shown, metric)
    if notes is not None:
        notes.extend(warnings)
    common = label_trials(trials)
    rows = [_row(t, metric, goal) for t in trials]
    check_out(root, out, given, overwrite)  # before --out is made: a refused report makes nothing
    with ExitStack() as held:
        try:
            out.mkdir(parents=True, exist_ok=True)
            held.enter_context(writing(out, given))  # one report at a time: another one into out is refused
            check_out(root, out, given, overwrite)  # again, now that no other report changes out meanwhile
            stage = Path(tempfile.mkdtemp(prefix=".report-", dir=out))  # written whole, then moved into place
        except OSError as e:
            what = (f"--out {out} cannot be made or written ({e.strerror or e}); give a folder that can be written"
                    if given else f"{out}, the run or sweep folder the report is written into without --out, cannot "
                    f"be written ({e.strerror or e}); give --out a folder that can be written")
            raise ReportError(f"{what}. Nothing was written") from None
        try:
            before = written(out)  # the files of the report out holds, which this one replaces
            _write_csv(stage / "report.csv", rows)
            _plot_loss(trials, stage)
            panels = auc_panels(trials, shown)
            _plot_metrics(trials, stage, panels)
            _plot_final(rows, trials, stage, metric)
            lines = (_header(root, trials, rows, common, metric, goal, panels, warnings)
                     + _table(trials, rows, metric) + _charts(panels, shown, metric))
            files = [p.name for p in stage.iterdir()] + [REPORT_MD]
            lines.insert(1, record_line(root, out, files))  # under the title: its folder and files (folder.py)
            (stage / REPORT_MD).write_text(printable("\n".join(lines)), encoding="utf-8")
            place(stage, out, before)
        except OSError as e:
            raise ReportError(f"writing the report into {out} failed ({e.strerror or e}); give --out "
                              f"{'another' if given else 'a'} folder that can be written") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return out / "report.md"


def unknown_metric(metric: str, known: set[str], objective: str) -> str:
    """Why ``--metric`` ranks nothing: the keys the trials logged as numbers, in metrics.jsonl or summary.json
    (``known``, ``Trial.ranked_keys``), closest to it first (the same name
    under a prefix, then the most alike), then the rest by name, those of a prefix of more than 3 keys counted
    (a ranking run logs 60 and more, 26 of them ``emb/dropped_ids/cat_NN``), and the default objective if
    they logged it."""
    names = sorted(known)
    name = metric.lower().strip("/")
    close = sorted((k for k in names if k.lower().endswith("/" + name)), key=lambda k: (k.count("/"), k))
    by_lower = {k.lower(): k for k in names}
    close += [by_lower[k] for k in difflib.get_close_matches(metric.lower(), list(by_lower), n=5, cutoff=0.6)]
    close = list(dict.fromkeys(close))[:5]
    rest = [k for k in names if k not in close]
    groups: dict[str, list[str]] = {}
    for k in rest:
        groups.setdefault(k.split("/", 1)[0] + ("/*" if "/" in k else ""), []).append(k)
    items = [x for g, ks in groups.items() for x in (ks if len(ks) <= 3 or len(rest) <= 8 else [f"{g} ({len(ks)})"])]
    if len(items) > 16:
        items = [f"{g} ({len(ks)})" if len(ks) > 1 else ks[0] for g, ks in groups.items()]
        items = items[:16] + [f"and {len(items) - 16} more prefixes"] if len(items) > 16 else items
    listed = ", ".join(items)
    if not names:
        return f"--metric {metric}: no trial logged it as a number; they logged no number yet. Nothing was written"
    what = (f"the closest they logged: {', '.join(close)}" + (f"; the {len(rest)} others: {listed}" if rest else "")
            if close else f"they logged {len(rest)} {'key' if len(rest) == 1 else 'keys'}: {listed}")
    default = f", or leave --metric out to rank by {objective}, the task's objective" if objective in known else ""
    return f"--metric {metric}: no trial logged it as a number; {what}. Give one of those{default}. Nothing was written"


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``report.csv``: one row per trial, its full overrides included."""
    with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:  # a folder name not UTF-8
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r[k]) for k in CSV_COLUMNS})


def _mixed_tasks(root: Path, trials: Sequence[Trial], shown: ReportMetrics, metric: str) -> list[str]:
    """A warning naming the trials of another task than the one the report is for (``shown``, the first trial's
    whose config names its data): they are ranked by ``metric`` and charted as that task's runs, so what they
    logged under their own task's names shows ``–``. Said, with how to report them apart, not refused: a folder
    of old runs of several tasks still gets its report."""
    others = [t for t in trials if other_task(t, shown)]
    if not others:
        return []
    first = next(t.data for t in trials if t.data is not None)
    names = ", ".join(f"`{t.label}`" for t in others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    theirs = sorted({f"data.name={t.data} (objective {report_metrics(t.data).objective})" for t in others})
    folder = Path(os.path.commonpath([t.path for t in others]))
    ranked = [t for t in trials if not other_task(t, shown)]
    alone = folder != root and not any(t.path == folder or folder in t.path.parents for t in ranked)
    how = f"python -m runner.report {folder}" if alone else "give the folder of one task's trials"
    return [f"{len(others)} of {len(trials)} trials ran another task than data.name={first}, the one this report "
            f"ranks (by `{metric}`) and charts: {names}, of {', '.join(theirs)}; what they did not log under this "
            f"task's names shows –. Report each task apart: {how}"]


def _header(root: Path, trials: Sequence[Trial], rows: Sequence[dict[str, Any]], common: list[str], metric: str,
            goal: str, panels: AucPanels, warnings: Sequence[str] = ()) -> list[str]:
    """The report's title and summary: trials, objective, warnings, common overrides, the best trial, the
    references."""
    n_failed = sum(t.failed for t in trials)
    n_unfinished = sum(t.status == "unfinished" for t in trials)
    unreadable = [t for t in trials if t.status == "unreadable"]
    candidates = [
        (r["best_objective"], r, t)
        for r, t in zip(rows, trials)
        if not t.failed and r["best_objective"] is not None and math.isfinite(r["best_objective"])
    ]
    lines = [
        TITLE + str(root).replace("\r", "\\r").replace("\n", "\\n"),  # one line, whatever the name holds
        "",
        f"- trials: {len(trials)} ({len(trials) - n_failed - n_unfinished - len(unreadable)} ok, {n_failed} failed"
        + (f", {n_unfinished} unfinished: no summary.json status, still running or stopped" if n_unfinished else "")
        + (f", {len(unreadable)} unreadable" if unreadable else "") + ")",
        f"- objective: `{metric}` ({goal})",
    ]
    lines += [f"- warning: {w}" for w in warnings]
    lines += [f"- unreadable: `{t.label}`: {', '.join(t.unreadable)}" for t in trials if t.unreadable]
    if common:
        lines.append(f"- common: `{' '.join(common)}` (every trial; the table shows what differs)")
    if candidates:
        pick = max if goal == "maximize" else min
        best_val, best_row, best_trial = pick(candidates, key=lambda c: c[0])
        lines.append(
            f"- best trial: `{best_row['trial']}` {best_val:.6g} at step {best_row['best_step']}"
            + (f" (`{best_trial.config_label}`)" if best_trial.shown_overrides else "")
        )
    shown = panels.metrics
    references = {key: panels.reference(key) for key in panels.references}
    if any(v is not None for v in references.values()):
        lines.append(f"- {shown.reference_name} (dotted lines in {shown.chart_file}): "
                     + ", ".join(f"`{panels.reference_keys[k]}` {v:.4g}" for k, v in references.items()
                                 if v is not None))
    for key, values in panels.unplaced.items():
        lines.append(f"- `{key}` (no `{key[len(shown.reference):]}` panel): "
                     + ", ".join(f"`{label}` {v:.4g}" for label, v in values.items()))
    bad = [(t.label, t.bad_lines) for t in trials if t.bad_lines]
    if bad:
        lines.append("- skipped unparseable metrics lines: " + ", ".join(f"`{l}`: {n}" for l, n in bad))
    return lines


def _table(trials: Sequence[Trial], rows: Sequence[dict[str, Any]], metric: str) -> list[str]:
    """One table row per trial: what differs, steps, final loss, best and final objective."""
    lines = [
        "",
        f"| trial | status | overrides | steps | final {LOSS_KEY} | best {metric} | best step | final {metric} |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r, t in zip(rows, trials):
        shown = " ".join(t.shown_overrides)
        cells = [r["trial"], r["status"], f"`{shown}`" if shown else None, r["steps"],
                 r["final_loss"], r["best_objective"], r["best_step"], r["final_objective"]]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return lines


def _charts(panels: AucPanels, shown: ReportMetrics, metric: str) -> list[str]:
    """The charts' section: the loss, the task's metrics chart and its keys, the final objective."""
    return [
        "",
        "## Charts",
        "",
        f"![{LOSS_KEY}](loss.png)",
        "",
        f"![{shown.chart} metrics]({shown.chart_file})"
        + (f"\n\n{shown.chart} keys: {', '.join(f'`{k}`' for k in panels.keys)}" if panels.keys else ""),
        "",
        f"![final {metric}](final_metric.png)",
        "",
    ]
