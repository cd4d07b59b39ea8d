"""The tracker interface, and the trackers that only forward: no-op and fan-out."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from .convert import to_python

logger = logging.getLogger("runner.tracking")

Goal = Literal["maximize", "minimize"]

STEP_METRIC = "trainer/step"



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
