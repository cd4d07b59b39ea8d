"""Experiment tracking behind a tiny interface (after levanter's ``tracker/``).

Every tracker implements :class:`Tracker`::

    tracker.define_summary("eval/auc_mean", goal="maximize")  # optional
    tracker.log({"train/loss": loss, "eval/auc_mean": auc}, step=step)
    tracker.log_summary({"best_step": 120})
    tracker.finish(exit_code=0)

Implementations:

* :class:`NoopTracker` -- does nothing (non-zero processes, tests, ``tracker=none``).
* :class:`JsonlTracker` -- appends one JSON object per :meth:`log` call to
  ``metrics.jsonl`` (``{"step": step, **metrics}``) and keeps ``summary.json``
  next to it. Output is strict JSON: non-finite floats are written as the strings
  ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (``float(s)`` parses them back).
* :class:`WandbTracker` -- Weights & Biases, offline by default. ``trainer/step`` is
  the x-axis of every metric (``define_metric("*", step_metric="trainer/step")``),
  so W&B's own monotonic ``_step`` never rejects a log line after a resume.
* :class:`MultiTracker` -- fans every call out to several trackers.

Use :func:`make_tracker` to build one; it hands every process but process 0 a
:class:`NoopTracker`, so only one process writes files or talks to W&B.
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

Goal = Literal["maximize", "minimize"]

STEP_METRIC = "trainer/step"

__all__ = [
    "Goal",
    "JsonlTracker",
    "MultiTracker",
    "NoopTracker",
    "STEP_METRIC",
    "Tracker",
    "WandbTracker",
    "json_safe",
    "make_tracker",
    "to_python",
]


# --------------------------------------------------------------------------- conversion


def _array_to_python(a: np.ndarray) -> Any:
    kind = a.dtype.kind
    if kind not in "biufc":
        # bfloat16 / float8 (ml_dtypes) and other exotic dtypes: go through float64.
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            return a.tolist()
    elif kind == "c":
        a = np.abs(a)
    if a.ndim == 0:
        return a.item()
    return a.tolist()


def _value_to_python(v: Any) -> Any:
    if isinstance(v, np.generic):  # before the builtin check: np.float64 subclasses float
        return _array_to_python(np.asarray(v))
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.ndarray):
        return _array_to_python(v)
    if isinstance(v, Mapping):
        return {str(k): _value_to_python(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_value_to_python(x) for x in v]
    # jax.Array (and anything else array-like with a shape): np.asarray fetches it to host.
    if hasattr(v, "__array__") and hasattr(v, "shape"):
        try:
            return _array_to_python(np.asarray(v))
        except Exception:  # noqa: BLE001 - e.g. non-addressable shards; leave it to the backend
            return v
    return v  # wandb.Image, Table, ... pass through untouched


def to_python(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Convert jax/numpy arrays and numpy scalars to Python floats/ints/bools/lists.

    0-d arrays become scalars, n-d arrays nested lists, nested mappings are converted
    recursively. Non-finite floats stay ``float('nan')`` / ``float('inf')`` (W&B takes
    them); use :func:`json_safe` before ``json.dumps(..., allow_nan=False)``.
    Unknown objects (``wandb.Image`` ...) pass through unchanged.
    """
    return {str(k): _value_to_python(v) for k, v in metrics.items()}


def _float_token(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats by "NaN"/"Infinity"/"-Infinity" and other non-JSON
    values by their ``str``, recursively, so ``json.dumps(obj, allow_nan=False)`` works."""
    if isinstance(obj, np.generic):
        return json_safe(_value_to_python(obj))
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return _float_token(float(obj))
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    converted = _value_to_python(obj)
    if converted is not obj:
        return json_safe(converted)
    return str(obj)


# --------------------------------------------------------------------------- interface


@runtime_checkable
class Tracker(Protocol):
    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def log_summary(self, metrics: Mapping[str, Any]) -> None: ...

    def define_summary(self, name: str, goal: Goal = "maximize") -> None: ...

    def finish(self, exit_code: int = 0) -> None: ...


def _check_goal(goal: str) -> str:
    if goal not in ("maximize", "minimize"):
        raise ValueError(f"goal must be 'maximize' or 'minimize', got {goal!r}")
    return goal


class NoopTracker:
    """Tracker that drops everything."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass

    def define_summary(self, name: str, goal: Goal = "maximize") -> None:
        _check_goal(goal)

    def finish(self, exit_code: int = 0) -> None:
        pass


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
        self.summary_path = self.path.with_name("summary.json")
        self._last: dict[str, Any] = {}
        self._explicit: dict[str, Any] = {}
        self._goals: dict[str, str] = {}
        self._best: dict[str, tuple[float, int]] = {}
        self._finished = False
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")

    def define_summary(self, name: str, goal: Goal = "maximize") -> None:
        self._goals[name] = _check_goal(goal)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._finished:
            raise RuntimeError("JsonlTracker.log() after finish()")
        values = to_python(metrics)
        record = {"step": int(step), **{k: v for k, v in values.items() if k != "step"}}
        self._file.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
        self._file.flush()
        for k, v in values.items():
            self._last[k] = v
            goal = self._goals.get(k)
            if goal is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
                if not math.isfinite(v):
                    continue
                prev = self._best.get(k)
                better = prev is None or (v > prev[0] if goal == "maximize" else v < prev[0])
                if better:
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
        tmp.write_text(json.dumps(json_safe(self.summary()), allow_nan=False, indent=2) + "\n")
        os.replace(tmp, self.summary_path)

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


class WandbTracker:
    """Weights & Biases run; ``mode="offline"`` (default) writes
    ``<dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`` for a later ``wandb sync``.

    ``reinit="finish_previous"`` makes a second tracker in the same process (the next
    trial of an in-process sweep) finish any run the previous one left open.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        project: str,
        mode: str = "offline",
        dir: str | os.PathLike[str],
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        run_id: str | None = None,
        resume: str | None = None,
        job_type: str | None = None,
        entity: str | None = None,
        settings: Any = None,
    ):
        import wandb

        self._wandb = wandb
        Path(dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            entity=entity,
            mode=mode,
            dir=str(dir),
            name=name,
            group=group,
            tags=list(tags) if tags else None,
            config=dict(config) if config is not None else None,
            id=run_id,
            resume=resume,
            job_type=job_type,
            reinit="finish_previous",
            settings=settings,
        )
        # Define on the run object (not the module-level wandb.define_metric) so the
        # definitions cannot land on some other active run.
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)
        self._goal_metrics: set[str] = set()
        self._finished = False

    @property
    def run_dir(self) -> Path:
        """The run's directory (``.../wandb/offline-run-*`` in offline mode)."""
        return Path(self.run.dir).parent

    def define_summary(self, name: str, goal: Goal = "maximize") -> None:
        op = "max" if _check_goal(goal) == "maximize" else "min"
        # Summary then keeps both the best and the last value:
        # summary[name] == {"max": best, "last": latest}.
        self.run.define_metric(name, step_metric=STEP_METRIC, summary=f"{op},last", overwrite=False)
        self._goal_metrics.add(name)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        data = to_python(metrics)
        # W&B's min/max summary aggregation propagates NaN: one NaN and the "best" stays
        # NaN for the rest of the run. Non-finite values of goal metrics are therefore not
        # sent (other metrics keep their NaN/inf so divergence is visible in the charts).
        for k in self._goal_metrics.intersection(data):
            v = data[k]
            if isinstance(v, float) and not math.isfinite(v):
                logger.warning("not logging non-finite %s=%r at step %d to W&B", k, v, step)
                del data[k]
        data[STEP_METRIC] = int(step)
        self.run.log(data)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        """Set summary values; a name declared with :meth:`define_summary` keeps W&B's ``{"max"/"min": best,
        "last": latest}`` of its logged values instead of being overwritten by a plain number."""
        for k, v in to_python(metrics).items():
            if k not in self._goal_metrics:
                self.run.summary[k] = v

    def finish(self, exit_code: int = 0) -> None:
        """``run.finish(exit_code)``; non-zero marks the run "failed" in W&B.

        No-op when already finished -- including when a later ``wandb.init`` (the next
        tracker, ``reinit="finish_previous"``) finished this run first, in which case
        W&B recorded exit code 0: finish trackers explicitly before starting the next.
        """
        if self._finished:
            return
        self._finished = True
        self.run.finish(exit_code=int(exit_code))


class MultiTracker:
    """Sends every call to each tracker in turn; :meth:`finish` finishes all of them even
    if one raises (the first error is re-raised afterwards)."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def define_summary(self, name: str, goal: Goal = "maximize") -> None:
        for t in self.trackers:
            t.define_summary(name, goal)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        metrics = to_python(metrics)  # fetch device arrays once, not once per tracker
        for t in self.trackers:
            t.log(metrics, step)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        metrics = to_python(metrics)
        for t in self.trackers:
            t.log_summary(metrics)

    def finish(self, exit_code: int = 0) -> None:
        error: BaseException | None = None
        for t in self.trackers:
            try:
                t.finish(exit_code)
            except Exception as e:  # noqa: BLE001
                logger.exception("tracker %r failed to finish", t)
                error = error or e
        if error is not None:
            raise error


# --------------------------------------------------------------------------- factory


def _kinds(kind: str | Sequence[str] | None) -> list[str]:
    if kind is None:
        return []
    parts = kind.replace("+", ",").split(",") if isinstance(kind, str) else list(kind)
    out = [p.strip().lower() for p in parts if p and p.strip()]
    return [p for p in out if p not in ("none", "noop", "null", "off")]


def make_tracker(
    kind: str | Sequence[str] | None,
    *,
    process_index: int,
    output_dir: str | os.PathLike[str] = ".",
    config: Mapping[str, Any] | None = None,
    metrics_file: str = "metrics.jsonl",
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
) -> Tracker:
    """Build the tracker named by ``kind``: ``"none"``, ``"jsonl"``, ``"wandb"``, or a
    combination such as ``"jsonl,wandb"`` / ``"jsonl+wandb"`` / ``["jsonl", "wandb"]``.

    Processes other than 0 always get a :class:`NoopTracker`. ``jsonl`` writes
    ``<output_dir>/<metrics_file>``; ``wandb`` writes under ``wandb_dir`` (default
    ``output_dir``).
    """
    if process_index != 0:
        return NoopTracker()
    trackers: list[Tracker] = []
    for k in _kinds(kind):
        if k == "jsonl":
            trackers.append(JsonlTracker(Path(output_dir) / metrics_file))
        elif k == "wandb":
            trackers.append(
                WandbTracker(
                    config,
                    project=project,
                    mode=mode,
                    dir=wandb_dir if wandb_dir is not None else output_dir,
                    name=name,
                    group=group,
                    tags=tags,
                    run_id=run_id,
                    resume=resume,
                    job_type=job_type,
                    entity=entity,
                )
            )
        else:
            raise ValueError(f"unknown tracker kind {k!r} (expected none, jsonl, wandb)")
    if not trackers:
        return NoopTracker()
    if len(trackers) == 1:
        return trackers[0]
    return MultiTracker(trackers)
