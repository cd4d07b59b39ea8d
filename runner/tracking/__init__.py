"""Experiment tracking behind a tiny interface (after levanter's ``tracker/``).

Every tracker implements :class:`Tracker`::

    tracker.define_summary("valid/auc_mean", goal="maximize")  # optional
    tracker.log({"train/loss": loss, "valid/auc_mean": auc}, step=step)
    tracker.log_summary({"best_step": 120})
    tracker.finish(exit_code=0)

Implementations:

* :class:`NoopTracker` -- does nothing (non-zero processes, tests, ``logger=none``).
* :class:`JsonlTracker` -- appends one JSON object per :meth:`log` call to
  ``metrics.jsonl`` (``{"step": step, **metrics}``) and keeps ``summary.json``
  next to it. Output is strict JSON: non-finite floats are written as the strings
  ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (``float(s)`` parses them back).
* :class:`WandbTracker` -- Weights & Biases, offline by default. ``trainer/step`` is
  the x-axis of every metric (``define_metric("*", step_metric="trainer/step")``),
  so W&B's own monotonic ``_step`` never rejects a log line after a resume; with ``resume`` set, the rows
  already in ``metrics.jsonl`` count in its summary's best objective and lowest loss.
* :class:`MultiTracker` -- fans every call out to several trackers.

Trackers are registered by name in :data:`TRACKERS` (``jsonl``, ``wandb``, ``none``); :func:`make_tracker`
builds the named ones and hands every process but process 0 a :class:`NoopTracker`, so only one process
writes files or talks to W&B. Files: ``base.py`` (interface, no-op, fan-out), ``convert.py`` (arrays to
Python numbers), ``jsonl.py``, ``wandb.py``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..outputs import METRICS_FILE
from ..registry import Registry, UnknownName
from .base import STEP_METRIC, Goal, MultiTracker, NoopTracker, Tracker
from .convert import json_safe, to_python
from .jsonl import JsonlTracker, read_rows
from .wandb import WandbTracker

__all__ = ["Goal", "JsonlTracker", "MultiTracker", "NoopTracker", "STEP_METRIC", "TRACKERS", "Tracker",
           "WandbTracker", "json_safe", "make_tracker", "to_python"]



TRACKERS: Registry[Any] = Registry("tracker", "logger.kind")


@TRACKERS.register("jsonl")
def _jsonl(o: Mapping[str, Any]) -> Tracker:
    return JsonlTracker(Path(o["output_dir"]) / o["metrics_file"])


@TRACKERS.register("wandb")
def _wandb(o: Mapping[str, Any]) -> Tracker:
    # A run that may resume: the rows its metrics.jsonl carries up to the checkpoint, which W&B's summary must count.
    history = read_rows(Path(o["output_dir"]) / o["metrics_file"]) if o["resume"] else []
    return WandbTracker(o["config"], project=o["project"], mode=o["mode"],
                        dir=o["wandb_dir"] if o["wandb_dir"] is not None else o["output_dir"], name=o["name"],
                        group=o["group"], tags=o["tags"], run_id=o["run_id"], resume=o["resume"],
                        job_type=o["job_type"], entity=o["entity"], init_timeout=o["init_timeout"], history=history)


@TRACKERS.register("none")
def _none(o: Mapping[str, Any]) -> Tracker:
    return NoopTracker()


def _names(kind: str | Sequence[str] | None) -> list[str]:
    if kind is None:
        return []
    parts = kind.replace("+", ",").split(",") if isinstance(kind, str) else list(kind)
    return [p.strip().lower() for p in parts if p and p.strip()]


def make_tracker(
    kind: str | Sequence[str] | None,
    *,
    process_index: int,
    output_dir: str | os.PathLike[str] = ".",
    config: Mapping[str, Any] | None = None,
    metrics_file: str = METRICS_FILE,
    project: str = "recsys-runner",
    mode: str = "offline",
    wandb_dir: str | os.PathLike[str] | None = None,
    name: str | None = None,
    group: str | None = None,
    tags: Sequence[str] = (),
    run_id: str | None = None,
    resume: str | None = None,
    job_type: str | None = None,
    entity: str | None = None,
    init_timeout: float | None = None,
) -> Tracker:
    """Build the trackers named by ``kind`` (names registered in :data:`TRACKERS`: ``"jsonl"``, ``"wandb"``,
    ``"none"``), one name or several: ``["jsonl", "wandb"]`` or ``"jsonl,wandb"``.

    Processes other than 0 always get a :class:`NoopTracker`. ``jsonl`` writes
    ``<output_dir>/<metrics_file>``; ``wandb`` writes under ``wandb_dir`` (default ``output_dir``).
    """
    options = dict(output_dir=output_dir, config=config, metrics_file=metrics_file, project=project, mode=mode,
                   wandb_dir=wandb_dir, name=name, group=group, tags=tags, run_id=run_id, resume=resume,
                   job_type=job_type, entity=entity, init_timeout=init_timeout)
    try:
        factories = [TRACKERS.get(n) for n in _names(kind)]
    except UnknownName as e:
        raise ValueError(str(e)) from None
    if process_index != 0:
        return NoopTracker()
    trackers = [t for t in (f(options) for f in factories) if not isinstance(t, NoopTracker)]
    if not trackers:
        return NoopTracker()
    return trackers[0] if len(trackers) == 1 else MultiTracker(trackers)
