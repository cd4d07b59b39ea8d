"""Weights & Biases, offline by default; ``trainer/step`` is every metric's x-axis."""
from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import first_line
from .base import STEP_METRIC, Goal, _check_goal
from .convert import to_python

logger = logging.getLogger("runner.tracking")


class TrackerStartError(RuntimeError):
    """A W&B run could not start (a bad ``WANDB_*`` variable; online: no key, no network, a refused key): the
    message names the setting and the ways out."""


def _bad_environment(e: Exception) -> list[tuple[str, str]]:
    """``(WANDB_<SETTING>, why)`` for each W&B setting ``e`` (W&B's settings validation, a pydantic error) refused
    whose value came from that environment variable."""
    errors = getattr(e, "errors", None)
    found = []
    for err in errors() if callable(errors) else []:
        name = f"WANDB_{str((err.get('loc') or ('',))[0]).upper()}"
        if name in os.environ:
            found.append((name, err.get("msg", "invalid")))
    run_id = os.environ.get("WANDB_RUN_ID")
    if not found and run_id is not None and not re.fullmatch(r"[\w-]+", run_id):  # W&B's own message names no variable
        found.append(("WANDB_RUN_ID", "a run id holds letters, digits, _ and - only"))
    if not found:  # W&B's other refusals quote the value (``Invalid project name 'a/b'``), not where it came from
        reason = first_line(e)
        found = [(n, reason[:300]) for n, v in sorted(os.environ.items())
                 if n.startswith("WANDB_") and v.strip() and f"'{v}'" in reason]
    return found


def _start_error(e: Exception, mode: str, init_timeout: float | None) -> str:
    """The one message for a W&B run that could not start: a bad ``WANDB_*`` variable, an online run with no key,
    server or network, or any other failure of ``wandb.init``, each with its ways out."""
    reason = first_line(e)
    bad = _bad_environment(e)
    if bad:
        values = "; ".join(f"{n}={os.environ[n]!r}: {why}" for n, why in bad)
        names = [n for n, _ in bad]
        return (f"W&B refused a setting from the environment ({values}): fix or unset {' and '.join(names)} "
                f"(`unset {' '.join(names)}`; logger.mode={mode} sets the run's mode), or use logger=none")
    if mode == "online":
        return (f"logger.mode=online: W&B could not start the run ({type(e).__name__}: {reason[:300]}): check "
                f"WANDB_API_KEY and the network (logger.init_timeout={init_timeout} s), or use logger.mode=offline "
                f"(the default; `wandb sync` uploads the run later) or logger=none")
    return (f"logger.mode={mode}: W&B could not start the run ({type(e).__name__}: {reason[:300]}): check the "
            f"WANDB_* environment variables and that the output directory is writable, or use logger=none")


def _finite(v: Any) -> bool:
    """A real number, not NaN or infinite (metrics.jsonl writes those as strings)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class WandbTracker:
    """Weights & Biases run; ``mode="offline"`` (default) writes
    ``<dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`` for a later ``wandb sync``.

    ``reinit="finish_previous"`` makes a second tracker in the same process (the next
    trial of an in-process sweep) finish any run the previous one left open.

    ``history``: the rows a resumed run logged before its checkpoint (its carried ``metrics.jsonl``). W&B's
    ``summary="max"/"min"`` counts only what this launch logs (offline, each launch even writes its own run
    folder, wandb/wandb#4624), so the summary of a goal metric those rows hold is written by this tracker
    instead, counting them (:meth:`_write_kept`).
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
        init_timeout: float | None = None,
        history: Sequence[Mapping[str, Any]] = (),
    ):
        import wandb

        self._wandb = wandb
        Path(dir).mkdir(parents=True, exist_ok=True)
        if init_timeout is not None:  # how long an online start may wait for the server (W&B's default: 90 s)
            settings = wandb.Settings(init_timeout=float(init_timeout)) if settings is None else settings
        try:
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
        except Exception as e:  # noqa: BLE001 - wandb's own errors (no key, no network, a bad key) vary by version
            raise TrackerStartError(_start_error(e, mode, init_timeout)) from None
        # Define on the run object (not the module-level wandb.define_metric) so the
        # definitions cannot land on some other active run.
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)
        self._goal_metrics: set[str] = set()
        self._history = list(history)
        self._kept: dict[str, tuple[str, float]] = {}  # name -> ("max"/"min", best): summaries this tracker writes
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
        values = [float(row[name]) for row in self._history if _finite(row.get(name))]
        if values:
            self._kept[name] = (op, max(values) if op == "max" else min(values))
            self._write_kept(name, values[-1])

    def _write_kept(self, name: str, last: float) -> None:
        """Summary ``{op: best, "last": last}`` of a goal metric the resumed history holds. Setting a summary value
        stops W&B aggregating that metric (its summary is then the last value logged), so once kept it is rewritten
        after every value logged; a value replaces the best only if it is better."""
        op, best = self._kept[name]
        self._kept[name] = op, max(best, last) if op == "max" else min(best, last)
        self.run.summary[name] = {op: self._kept[name][1], "last": last}

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
        for k in (k for k in self._kept.keys() & data.keys() if _finite(data[k])):
            self._write_kept(k, float(data[k]))

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
