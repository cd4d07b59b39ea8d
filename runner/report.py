"""Summarise a run or a Hydra multirun sweep: ``report.md``, ``report.csv`` and charts.

Usage::

    python -m runner.report multirun/2026-11-29/12-00-00 [--out DIR] [--metric valid/auc_mean]

A *trial* is a directory holding ``metrics.jsonl`` (written by
:class:`runner.tracking.JsonlTracker`), ``.hydra/overrides.yaml`` or a ``FAILED``
marker. ``<dir>`` may be a single run directory or any directory above trials (a
Hydra multirun day/time directory, or the whole ``multirun/`` tree).

Per trial: overrides, last step, final ``train/loss``, best and final value of the
objective metric, and status -- ``failed`` when the trial has a ``FAILED`` file or a
``summary.json`` with ``"status": "failed"``, otherwise ``ok``. Trials are labelled by the
overrides that differ between them; the overrides every trial shares are listed once, in
the report's header (``common: ...``). ``report.csv`` keeps each trial's full overrides.

Charts (matplotlib, Agg): ``loss.png`` (``train/loss`` vs step per trial),
``auc.png`` (one panel per AUC metric key, e.g. ``train/auc_click``,
``valid/auc_mean``, per trial vs step; the Bayes-optimal AUC ``bayes/<metric>`` is a
dotted horizontal line on the ``<metric>`` panel (``bayes/test/auc_mean`` on ``test/auc_mean``;
a run that named its one held-out split ``eval/``: ``bayes/auc_mean`` on ``eval/auc_mean``), not a
panel of its own) and
``final_metric.png`` (final objective per configuration). Malformed lines (such as a
truncated last line of a trial that was killed), ``null`` values and missing keys are
tolerated. A folder without any trial is refused and nothing is written.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .outputs import FAILED_MARKER, METRICS_FILE, OVERRIDES_FILE, SUMMARY_FILE, read_overrides

LOSS_KEY = "train/loss"
DEFAULT_METRIC = "valid/auc_mean"  # the ranking task's objective

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

_AUC_RE = re.compile(r"(^|[_\-.])auc($|[_\-.])", re.IGNORECASE)
_SKIP_DIRS = {"wandb", ".hydra", "__pycache__", "checkpoints", ".git"}
BAYES_PREFIX = "bayes/"  # bayes/<metric>: the best value any model could reach on that metric's labels
EVAL_PREFIX = "eval/"  # runs that named their one held-out split eval/: bayes/<m> belongs to eval/<m>
TRIAL_HOLDS = (f"a trial folder holds {METRICS_FILE}, {OVERRIDES_FILE.as_posix()} or a {FAILED_MARKER} file "
               "(Hydra's run folder outputs/<date>/<time>, or one trial of a sweep multirun/<date>/<time>/<n>)")

__all__ = ["AucPanels", "ReportError", "Trial", "auc_figure", "auc_panels", "build_report", "common_overrides",
           "find_trials", "label_trials", "load_trial", "main", "read_metrics"]


class ReportError(ValueError):
    """The report cannot be made from these arguments; the message says which and what to give instead."""


# --------------------------------------------------------------------------- loading


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


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Parse a ``metrics.jsonl``; returns (records, number of unparseable lines)."""
    records: list[dict[str, Any]] = []
    bad = 0
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return records, 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(obj, dict):
            records.append(obj)
        else:
            bad += 1
    return records, bad


def _read_summary(trial_dir: Path) -> dict[str, Any]:
    path = trial_dir / SUMMARY_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


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

    @property
    def status(self) -> str:
        return "failed" if self.failed else "ok"

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
        out: set[str] = set()
        for r in self.records:
            out.update(k for k, v in r.items() if k != "step" and _to_float(v) is not None)
        return out

    @property
    def last_step(self) -> int | None:
        steps = [s for r in self.records if (s := _to_float(r.get("step"))) is not None]
        steps = [s for s in steps if math.isfinite(s)]
        return int(max(steps)) if steps else None

    def final(self, key: str) -> float | None:
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
    trial_dir = Path(trial_dir)
    records, bad = read_metrics(trial_dir / METRICS_FILE)
    summary = _read_summary(trial_dir)
    failed = (trial_dir / FAILED_MARKER).exists() or str(summary.get("status", "")).lower() == "failed"
    return Trial(
        path=trial_dir,
        label=label if label is not None else trial_dir.name,
        overrides=read_overrides(trial_dir),
        records=records,
        bad_lines=bad,
        summary=summary,
        failed=failed,
    )


def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.as_posix())]


def _is_trial_dir(d: Path) -> bool:
    return (d / METRICS_FILE).is_file() or (d / OVERRIDES_FILE).is_file() or (d / FAILED_MARKER).exists()


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


# --------------------------------------------------------------------------- charts


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _legend(ax, n: int) -> None:
    if 0 < n <= 20:
        ax.legend(fontsize="small" if n <= 8 else "x-small", loc="best")


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", ha="center", va="center", transform=ax.transAxes)


def _trial_label(t: Trial) -> str:
    label = _short(f"{t.label}: {t.config_label}" if t.shown_overrides else t.label)
    return label + " (failed)" if t.failed else label


def common_overrides(trials: Sequence[Trial]) -> list[str]:
    """The overrides every trial has (in the first trial's order); none for a single trial, whose label then
    shows all of its own."""
    if len(trials) < 2:
        return []
    rest = [set(t.overrides) for t in trials[1:]]
    return [o for o in dict.fromkeys(trials[0].overrides) if all(o in r for r in rest)]


def label_trials(trials: Sequence[Trial]) -> list[str]:
    """Label each trial by the overrides that differ between trials (``Trial.distinct``); return the common
    ones, which the report lists once."""
    common = common_overrides(trials)
    shared = set(common)
    for t in trials:
        t.distinct = [o for o in t.overrides if o not in shared]
    return common


def _color(i: int):
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if i < 10 else "tab20"]
    return cmap(i % cmap.N)


def _plot_lines(ax, trials: Sequence[Trial], key: str) -> int:
    """One line per trial; a trial keeps the same colour in every panel and chart."""
    n = 0
    for i, t in enumerate(trials):
        xs, ys = t.series(key)
        if not xs:
            continue
        ax.plot(
            xs, ys, "--" if t.failed else "-", color=_color(i),
            marker="o" if len(xs) <= 30 else None, markersize=3, label=_trial_label(t),
        )
        n += 1
    return n


def _plot_loss(trials: Sequence[Trial], out: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    n = _plot_lines(ax, trials, LOSS_KEY)
    if n == 0:
        _no_data(ax, LOSS_KEY)
    ax.set_xlabel("step")
    ax.set_ylabel(LOSS_KEY)
    ax.set_title(f"{LOSS_KEY} per trial")
    ax.grid(True, alpha=0.3)
    _legend(ax, n)
    fig.tight_layout()
    path = out / "loss.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _auc_keys(trials: Sequence[Trial]) -> list[str]:
    keys: set[str] = set()
    for t in trials:
        keys.update(k for k in t.keys() if _AUC_RE.search(k.rsplit("/", 1)[-1]))
    return sorted(keys)


def _last_finite(t: Trial, key: str) -> float | None:
    _, ys = t.series(key)
    finite = [y for y in ys if math.isfinite(y)]
    if finite:
        return finite[-1]
    v = _to_float(t.summary.get(key))
    return v if v is not None and math.isfinite(v) else None


@dataclass
class AucPanels:
    """What ``auc.png`` shows: one panel per key in ``keys`` (no ``bayes/*`` key), and per ``<metric>`` panel
    the Bayes-optimal value of each trial that logged ``bayes/<metric>`` (``references``: panel key ->
    {trial label: value}). ``unplaced`` holds Bayes values whose metric was never logged."""

    keys: list[str]
    references: dict[str, dict[str, float]] = field(default_factory=dict)
    unplaced: dict[str, dict[str, float]] = field(default_factory=dict)
    bayes_keys: dict[str, str] = field(default_factory=dict)  # panel key -> the bayes/* key drawn on it

    def reference(self, key: str) -> float | None:
        """The one Bayes-optimal value of a panel when every trial agrees on it (the same labels)."""
        values = list(self.references.get(key, {}).values())
        if values and max(values) - min(values) <= 1e-9 * max(1.0, abs(max(values))):
            return values[0]
        return None


def auc_panels(trials: Sequence[Trial]) -> AucPanels:
    keys = _auc_keys(trials)
    panels = AucPanels([k for k in keys if not k.startswith(BAYES_PREFIX)])
    for key in keys:
        if not key.startswith(BAYES_PREFIX):
            continue
        values = {t.label: v for t in trials if (v := _last_finite(t, key)) is not None}
        if not values:
            continue
        target = _panel_of(key, panels.keys)
        if target is not None:
            panels.references[target] = values
            panels.bayes_keys[target] = key
        else:
            panels.unplaced[key] = values
    return panels


def _panel_of(bayes_key: str, keys: Sequence[str]) -> str | None:
    """The panel ``bayes/<metric>`` is drawn on: ``<metric>``, else (a run that named its held-out split
    ``eval/``) ``eval/<metric>``; None when neither was logged."""
    metric = bayes_key[len(BAYES_PREFIX):]
    return next((k for k in (metric, EVAL_PREFIX + metric) if k in keys), None)


def _draw_reference(ax, trials: Sequence[Trial], panels: AucPanels, key: str):
    """The Bayes-optimal value(s) of an eval panel as dotted horizontal lines; returns the legend handle."""
    values = panels.references.get(key)
    if not values:
        return None
    one = panels.reference(key)
    if one is not None:
        ax.set_title(f"{key} (Bayes-optimal {one:.4g})")
        return ax.axhline(one, color="black", linestyle=":", linewidth=1.5, label="Bayes-optimal (same labels)")
    handle = None
    for i, t in enumerate(trials):  # trials disagree (other eval data): one line each, in the trial's colour
        if t.label in values:
            line = ax.axhline(values[t.label], color=_color(i), linestyle=":", linewidth=1.5,
                              label="Bayes-optimal (dotted, per trial)")
            handle = handle or line
    return handle


def auc_figure(trials: Sequence[Trial], panels: AucPanels | None = None):
    """The AUC chart: one panel per AUC key, a line per trial, the Bayes-optimal values as reference lines."""
    plt = _plt()
    panels = auc_panels(trials) if panels is None else panels
    keys = panels.keys
    n_keys = max(1, len(keys))
    ncols = min(3, n_keys)
    nrows = math.ceil(n_keys / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), squeeze=False)
    flat = list(axes.flat)
    if not keys:
        _no_data(flat[0], "AUC metric")
        flat[0].set_title("AUC")
    shown: dict[str, Any] = {}
    reference = None
    for ax, key in zip(flat, keys):
        _plot_lines(ax, trials, key)
        ax.set_title(key)
        reference = _draw_reference(ax, trials, panels, key) or reference
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        for h, lab in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(lab, h)
    for ax in flat[len(keys) if keys else 1 :]:
        ax.set_visible(False)
    order = [_trial_label(t) for t in trials if _trial_label(t) in shown]
    if 0 < len(order) <= 20:
        # One legend for the figure, with every trial that appears in any panel (and the reference line).
        handles = [shown[lab] for lab in order] + ([reference] if reference is not None else [])
        labels = order + ([reference.get_label()] if reference is not None else [])
        fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize="small", frameon=False)
        fig.tight_layout(rect=(0, min(0.5, (0.1 + 0.25 * math.ceil(len(labels) / 3)) / (4 * nrows)), 1, 1))
    else:
        fig.tight_layout()
    return fig


def _plot_auc(trials: Sequence[Trial], out: Path, panels: AucPanels) -> Path:
    plt = _plt()
    fig = auc_figure(trials, panels)
    path = out / "auc.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_final(rows: Sequence[dict[str, Any]], trials: Sequence[Trial], out: Path, metric: str) -> Path:
    plt = _plt()
    labels = [_short(f"{t.label}: {t.config_label}" if t.shown_overrides else t.label, 70) for t in trials]
    values = [r["final_objective"] for r in rows]
    height = max(3.0, 0.45 * len(trials) + 1.5)
    fig, ax = plt.subplots(figsize=(10, height))
    ys = list(range(len(trials)))
    finite = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
    colors = ["tab:red" if t.failed else "tab:blue" for t in trials]
    ax.barh(ys, finite, color=colors)
    lo = min((v for v in values if v is not None and math.isfinite(v)), default=0.0)
    hi = max((v for v in values if v is not None and math.isfinite(v)), default=1.0)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize="small")
    ax.invert_yaxis()
    if lo > 0 and hi > 0 and (hi - lo) < 0.5 * hi:
        # Objective values such as AUCs cluster; start the axis near them so differences show. A single value
        # (one trial ok, the rest failed) still gets a readable axis.
        span = max(hi - lo, 0.02 * hi)
        ax.set_xlim(max(0.0, lo - 0.5 * span), hi + 0.6 * span)
    left = ax.get_xlim()[0]
    for y, v, t in zip(ys, values, trials):
        text = "n/a" if v is None else (f"{v:.4g}" if math.isfinite(v) else str(v))
        if t.failed:
            text += " (failed)"
        # Labels of missing values sit at the axis' left edge: far outside it, text cannot be rasterised.
        ax.text(v if v is not None and math.isfinite(v) and v > left else left, y, " " + text,
                va="center", fontsize="small")
    ax.set_xlabel(f"final {metric}")
    ax.set_title(f"final {metric} per configuration")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = out / "final_metric.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- report


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
    if not root.exists():
        raise ReportError(f"{root} does not exist; give a run folder (outputs/<date>/<time>) or a sweep folder "
                          f"(multirun/<date>/<time>)")
    if not root.is_dir():
        hint = f"; give the folder that holds it: {root.parent}" if root.name in (METRICS_FILE, SUMMARY_FILE) else ""
        raise ReportError(f"{root} is a file, not a folder{hint or '; give a run or sweep folder'}")
    out = out if out is not None else root
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out} is a file; give a folder (it is created if missing)")
    return root, out


def build_report(
    root: Path,
    out: Path | None = None,
    metric: str = DEFAULT_METRIC,
    goal: str = "maximize",
) -> Path:
    """Write ``report.md``, ``report.csv``, ``loss.png``, ``auc.png`` and
    ``final_metric.png`` into ``out`` (default ``root``); return the ``report.md`` path.
    Raises :class:`ReportError`, before writing anything, for a missing folder, a file, or a folder without
    any trial."""
    if goal not in ("maximize", "minimize"):
        raise ReportError(f"goal must be 'maximize' or 'minimize', got {goal!r}")
    root, out = _check_dirs(Path(root), Path(out) if out is not None else None)

    dirs = find_trials(root, exclude=[out] if out != root else [])
    if not dirs:
        raise ReportError(f"{root} holds no trial: {TRIAL_HOLDS}. Nothing was written; point at a run or sweep "
                          f"folder")
    trials = [load_trial(d, label=(d.relative_to(root).as_posix() if d != root else root.name)) for d in dirs]
    common = label_trials(trials)
    rows = [_row(t, metric, goal) for t in trials]
    out.mkdir(parents=True, exist_ok=True)

    with open(out / "report.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r[k]) for k in CSV_COLUMNS})

    _plot_loss(trials, out)
    panels = auc_panels(trials)
    _plot_auc(trials, out, panels)
    _plot_final(rows, trials, out, metric)

    n_failed = sum(t.failed for t in trials)
    candidates = [
        (r["best_objective"], r, t)
        for r, t in zip(rows, trials)
        if not t.failed and r["best_objective"] is not None and math.isfinite(r["best_objective"])
    ]
    lines = [
        f"# Report: {root}",
        "",
        f"- trials: {len(trials)} ({len(trials) - n_failed} ok, {n_failed} failed)",
        f"- objective: `{metric}` ({goal})",
    ]
    if common:
        lines.append(f"- common: `{' '.join(common)}` (every trial; the table shows what differs)")
    if candidates:
        pick = max if goal == "maximize" else min
        best_val, best_row, best_trial = pick(candidates, key=lambda c: c[0])
        lines.append(
            f"- best trial: `{best_row['trial']}` {best_val:.6g} at step {best_row['best_step']}"
            + (f" (`{best_trial.config_label}`)" if best_trial.shown_overrides else "")
        )
    bayes = {key: panels.reference(key) for key in panels.references}
    if any(v is not None for v in bayes.values()):
        lines.append("- Bayes-optimal (dotted lines in auc.png): "
                     + ", ".join(f"`{panels.bayes_keys[k]}` {v:.4g}" for k, v in bayes.items() if v is not None))
    for key, values in panels.unplaced.items():
        lines.append(f"- `{key}` (no `{key[len(BAYES_PREFIX):]}` panel): "
                     + ", ".join(f"`{label}` {v:.4g}" for label, v in values.items()))
    bad = [(t.label, t.bad_lines) for t in trials if t.bad_lines]
    if bad:
        lines.append("- skipped unparseable metrics lines: " + ", ".join(f"`{l}`: {n}" for l, n in bad))
    lines += [
        "",
        f"| trial | status | overrides | steps | final {LOSS_KEY} | best {metric} | best step | final {metric} |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r, t in zip(rows, trials):
        shown = " ".join(t.shown_overrides)
        cells = [r["trial"], r["status"], f"`{shown}`" if shown else None, r["steps"],
                 r["final_loss"], r["best_objective"], r["best_step"], r["final_objective"]]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    lines += [
        "",
        "## Charts",
        "",
        f"![{LOSS_KEY}](loss.png)",
        "",
        "![AUC metrics](auc.png)"
        + (f"\n\nAUC keys: {', '.join(f'`{k}`' for k in panels.keys)}" if panels.keys else ""),
        "",
        f"![final {metric}](final_metric.png)",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runner.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="run directory or Hydra multirun directory")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: DIR)")
    p.add_argument("--metric", default=DEFAULT_METRIC, help=f"objective metric (default {DEFAULT_METRIC})")
    p.add_argument("--goal", choices=["maximize", "minimize"], default="maximize")
    args = p.parse_args(argv)
    try:
        path = build_report(args.dir, args.out, metric=args.metric, goal=args.goal)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
