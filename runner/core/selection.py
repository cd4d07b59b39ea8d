"""Model selection on validation: keep the best evaluated state by the objective, stop early.

Every evaluation the loop runs (mid-run and final) goes through :meth:`Selection.update`. When the objective
improves, the record (value, step, the whole evaluation row) is replaced and, with selection on, a copy of
the state's dense parameters and embedding tables is taken (a :class:`BestState`: what ``predict`` needs).
The step donates the live tables, so the copy is a fresh buffer, never an alias; it is taken only when the
objective improves. ``trainer.early_stop_patience`` stops the run after that many evaluations in a row
without an improvement. The record and the copy travel with the checkpoints (``runner/checkpoint``), so a
resumed run reports the same ``best/*`` as one that never stopped.

Selection and early stopping always use a validation metric (:func:`selection_metric`), whatever
``trainer.objective`` names. Summary keys: ``selected_on`` (that metric), ``best/step``, ``best/<metric>``
for every metric of the best evaluation (``best/test/ndcg@10``, ...); ``early_stop/step`` when the run
stopped early.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import jax


class BestState(NamedTuple):
    """The part of a TrainState an evaluation reads: dense parameters and embedding tables."""

    params: Any
    tables: dict[str, jax.Array]


def copy_best(state: Any) -> BestState:
    """Fresh on-device buffers (same shardings) of ``state``'s params and tables: safe from donation."""
    return BestState(jax.tree.map(lambda x: x.copy(), state.params),
                     {n: t.copy() for n, t in state.tables.items()})


VALID_PREFIX = "valid/"  # a task's validation metrics: the only ones selection and early stopping use


def selection_metric(objective: str | None, task: Any) -> str:
    """What best-state selection and early stopping use: ``objective`` (``trainer.objective``) when it is one
    of the task's validation metrics (``valid/...``), else the task's own objective (a validation metric).
    A test metric (or any other reported metric) may be what a run returns to a sweep; it is never selected
    on: the run then returns that metric of the state selected on validation."""
    if objective and objective.startswith(VALID_PREFIX) and objective in set(task.metric_names()):
        return objective
    return task.objective


def minimizes(objective: str) -> bool:
    """Whether lower is better for ``objective``: a loss; every other metric is maximised."""
    return objective.endswith("loss")


class Selection:
    """Tracks the best evaluation by ``objective``; ``select`` keeps its state (``best``) and reports it."""

    def __init__(self, objective: str, *, select: bool, patience: int | None):
        self.objective, self.select, self.patience = objective, bool(select), patience
        self.maximize = not minimizes(objective)
        self.value: float | None = None
        self.step: int | None = None
        self.metrics: dict[str, Any] = {}
        self.best: BestState | None = None
        self.stale = 0  # evaluations since the last improvement
        self.stopped_at: int | None = None  # early stop: the step training stopped at
        self.evaluated_at: int | None = None  # the step of the last evaluation counted

    @property
    def active(self) -> bool:
        """Whether evaluations should score the flushed state (what is kept and reported)."""
        return self.select or self.patience is not None

    def better(self, value: Any) -> bool:
        """Whether ``value`` improves on the best so far; a non-finite or non-numeric value never does."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        return self.value is None or (value > self.value if self.maximize else value < self.value)

    def update(self, step: int, metrics: Mapping[str, Any], state: Any) -> bool:
        """One evaluation of ``state`` at ``step``; True when it is the new best."""
        value = metrics.get(self.objective)
        if self.evaluated_at == step:  # the same state evaluated again (the final evaluation after an early stop)
            return False
        self.evaluated_at = step
        if not self.better(value):
            self.stale += 1
            return False
        self.value, self.step, self.metrics, self.stale = float(value), int(step), dict(metrics), 0
        if self.select:
            self.best = copy_best(state)
        return True

    def should_stop(self) -> bool:
        """Early stopping: ``patience`` evaluations in a row without improvement."""
        return self.patience is not None and self.stale >= self.patience

    def summary(self) -> dict[str, Any]:
        """``best/*`` (with selection on and a finite best) and ``early_stop/step``."""
        out: dict[str, Any] = {}
        if self.select and self.step is not None:
            out["best/step"] = self.step
            out.update({f"best/{k}": v for k, v in self.metrics.items()})
            out[f"best/{self.objective}"] = self.value
        if self.stopped_at is not None:
            out["early_stop/step"] = self.stopped_at
        return out

    # ----- checkpoints -------------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """JSON for a checkpoint's metadata (the arrays of ``best`` are saved beside the state)."""
        return {"objective": self.objective, "value": self.value, "step": self.step, "metrics": self.metrics,
                "stale": self.stale, "stopped_at": self.stopped_at, "evaluated_at": self.evaluated_at,
                "has_state": self.best is not None}

    def restore(self, record: Mapping[str, Any] | None, best: BestState | None) -> None:
        """Continue from a checkpoint's ``record`` (and its saved ``best`` state); a record of another
        objective, or none, starts selection over."""
        if not record or record.get("objective") != self.objective:
            return  # another objective (or an old checkpoint): selection starts over from here
        self.value, self.step = record["value"], record["step"]
        self.metrics, self.stale = dict(record["metrics"]), int(record["stale"])
        self.stopped_at, self.evaluated_at = record.get("stopped_at"), record.get("evaluated_at")
        self.best = best if self.select else None
