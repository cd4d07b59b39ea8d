"""A report's charts (matplotlib, Agg): ``train/loss`` per trial, the task's metrics chart (one panel per
charted key, its reference values as dotted lines) and the final objective per configuration."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tasks import ReportMetrics
from .trials import LOSS_KEY, Trial, _to_float, shown_metrics

EVAL_PREFIX = "eval/"  # runs that named their one held-out split eval/: <reference><m> belongs to eval/<m>


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    # labels are folder names, overrides and metric keys, not TeX: a=${x}_${y} stopped the report with a ParseError
    matplotlib.rcParams["text.parse_math"] = False
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


def _charted_keys(trials: Sequence[Trial], metrics: ReportMetrics) -> list[str]:
    """Every logged key the task's chart shows, its references' keys included."""
    keys: set[str] = set()
    for t in trials:
        keys.update(k for k in t.keys() if metrics.is_charted(k))
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
    """What the task's metrics chart (``metrics.chart_file``, ``auc.png`` for ranking) shows: one panel per key
    in ``keys`` (no reference key), and per ``<metric>`` panel the reference value (``metrics.reference``,
    e.g. the Bayes-optimal AUC ``bayes/<metric>``) of each trial that logged it (``references``: panel key ->
    {trial label: value}). ``unplaced`` holds reference values whose metric was never logged."""

    keys: list[str]
    references: dict[str, dict[str, float]] = field(default_factory=dict)
    unplaced: dict[str, dict[str, float]] = field(default_factory=dict)
    reference_keys: dict[str, str] = field(default_factory=dict)  # panel key -> the reference key drawn on it
    metrics: ReportMetrics | None = None  # the task's declaration (runner.tasks.ReportMetrics)

    def reference(self, key: str) -> float | None:
        """The one reference value of a panel when every trial agrees on it (the same labels)."""
        values = list(self.references.get(key, {}).values())
        if values and max(values) - min(values) <= 1e-9 * max(1.0, abs(max(values))):
            return values[0]
        return None


def auc_panels(trials: Sequence[Trial], metrics: ReportMetrics | None = None) -> AucPanels:
    """The panels of the task's metrics chart for ``trials`` (``metrics``: the task's declaration, by default
    that of the trials, ``shown_metrics``)."""
    metrics = shown_metrics(trials) if metrics is None else metrics
    prefix = metrics.reference
    keys = _charted_keys(trials, metrics)
    panels = AucPanels([k for k in keys if not k.startswith(prefix)], metrics=metrics)
    for key in keys:
        if not key.startswith(prefix):
            continue
        values = {t.label: v for t in trials if (v := _last_finite(t, key)) is not None}
        if not values:
            continue
        target = _panel_of(key[len(prefix):], panels.keys)
        if target is not None:
            panels.references[target] = values
            panels.reference_keys[target] = key
        else:
            panels.unplaced[key] = values
    return panels


def _panel_of(metric: str, keys: Sequence[str]) -> str | None:
    """The panel the reference of ``metric`` is drawn on: ``<metric>``, else (a run that named its held-out
    split ``eval/``) ``eval/<metric>``; None when neither was logged."""
    return next((k for k in (metric, EVAL_PREFIX + metric) if k in keys), None)


def _draw_reference(ax, trials: Sequence[Trial], panels: AucPanels, key: str):
    """The reference value(s) of an eval panel as dotted horizontal lines; returns the legend handle."""
    name = panels.metrics.reference_name
    values = panels.references.get(key)
    if not values:
        return None
    one = panels.reference(key)
    if one is not None:
        ax.set_title(f"{key} ({name} {one:.4g})")
        return ax.axhline(one, color="black", linestyle=":", linewidth=1.5, label=f"{name} (same labels)")
    handle = None
    for i, t in enumerate(trials):  # trials disagree (other eval data): one line each, in the trial's colour
        if t.label in values:
            line = ax.axhline(values[t.label], color=_color(i), linestyle=":", linewidth=1.5,
                              label=f"{name} (dotted, per trial)")
            handle = handle or line
    return handle


def auc_figure(trials: Sequence[Trial], panels: AucPanels | None = None):
    """The task's metrics chart (AUC for ranking): one panel per charted key, a line per trial, the reference
    values (the Bayes-optimal AUC) as dotted lines."""
    plt = _plt()
    panels = auc_panels(trials) if panels is None else panels
    chart = panels.metrics.chart
    keys = panels.keys
    n_keys = max(1, len(keys))
    ncols = min(3, n_keys)
    nrows = math.ceil(n_keys / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), squeeze=False)
    flat = list(axes.flat)
    if not keys:
        _no_data(flat[0], f"{chart} metric")
        flat[0].set_title(chart)
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


def _plot_metrics(trials: Sequence[Trial], out: Path, panels: AucPanels) -> Path:
    plt = _plt()
    fig = auc_figure(trials, panels)
    path = out / panels.metrics.chart_file
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
