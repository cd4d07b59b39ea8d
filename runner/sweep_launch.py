"""How the runner's Optuna sweeper (``hydra_plugins/runner_optuna``) launches a batch of trials: each trial's config
composed first, a trial whose values clash refused alone, and a failed trial told to Optuna without Hydra's noise.

The checks before the first trial (``runner.sweep_checks.value_problems``) compose each searched value alone; two
values that are each fine can still clash in one trial (``optimizer=choice(async_adam,async_sgd)`` with
``optimizer.b1=choice(0.8,0.9)``: ``async_sgd`` has no ``b1``). Hydra composes a trial's config only as its launcher
runs it, and a config that does not compose there ends the whole search in Hydra's multi-line error. Here such a
trial is refused alone: one line naming its values and Hydra's reason, the trial ``FAIL`` in the study, the search
going on with the next (within ``hydra.sweeper.max_failure_rate``, as any failed trial), and the trial counted
among the failed ones in the sweep's summary (``refused``; it has no folder: Hydra makes one only for a trial it
runs). A trial that fails as it runs (a preflight refusal, an error mid-run) has logged its own line
(``runner.sweeps.trial_failed``); Hydra's ``Error executing job with overrides`` lines for it (written each time
the plugin reads its result) and the plugin's ``Failed experiment`` warning are left out.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from optuna.samplers import GridSampler

from .sweep_checks import compose_reason

log = logging.getLogger("runner.sweeps")

FAILED_EXPERIMENT = "Failed experiment: "  # the plugin's warning for each failed trial


class TrialRefused(RuntimeError):
    """A trial whose values do not compose into one config (Hydra's reason in the message)."""


# (job number, overrides, error) of each trial refused in this process's sweep, for the summary
refused: list[tuple[int, list[str], TrialRefused]] = []


def one_line(text: str) -> str:
    """``text`` in one line: its lines joined by spaces, the items of a list (``- ...``) by ``; ``
    (``invalid config:`` then ``- a`` and ``- b`` reads ``invalid config: a; b``)."""
    out = ""
    for line in (ln.strip() for ln in str(text).strip().splitlines()):
        if line.startswith("- "):
            out += (" " if out.endswith(":") or not out else "; ") + line[2:]
        elif line:
            out += (" " if out else "") + line
    return out.strip()


def failure_line(num: Any, overrides: Any, error: BaseException) -> str:
    """The one line a failed trial ends with: its number, its values (the trial's overrides) and the error."""
    return f"trial #{num} [{' '.join(map(str, overrides))}] failed: {type(error).__name__}: {one_line(str(error))}"


class QuietReturn(JobReturn):
    """A failed trial's ``JobReturn`` that raises its error when read, without Hydra's ``Error executing job``
    line on stderr (the plugin reads it up to three times; the trial has said why it failed)."""

    @property
    def return_value(self) -> Any:
        if self.status == JobStatus.COMPLETED:
            return self._return_value
        raise self._return_value

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


def quiet(ret: JobReturn) -> JobReturn:
    if ret.status == JobStatus.FAILED and type(ret) is JobReturn:
        ret.__class__ = QuietReturn
    return ret


def refused_return(overrides: Sequence[str], num: int, error: BaseException) -> JobReturn:
    """The failed result of trial ``num``, refused before it ran: logged, noted for the summary."""
    why = TrialRefused(f"its values do not compose into one config ({compose_reason(error)}): drop the clashing "
                       f"values from the search, or search keys every choice has")
    refused.append((num, list(overrides), why))
    log.error("%s", failure_line(num, overrides, why))
    ret = QuietReturn(overrides=list(overrides), status=JobStatus.FAILED)
    ret.return_value = why
    return ret


def composed_launch(launch: Callable[..., Sequence[JobReturn]],
                    compose: Callable[[list[str]], Any]) -> Callable[..., list[JobReturn]]:
    """``launch`` (a launcher's), launching only the trials of a batch whose config ``compose`` (Hydra's
    ``load_sweep_config``) builds; each other is refused alone, keeping its job number."""

    def launch_composed(job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        problems = {}
        for i, overrides in enumerate(job_overrides):
            try:
                compose(list(overrides))
            except Exception as e:  # noqa: BLE001 - Hydra's composition errors are of several kinds
                problems[i] = e
        if not problems:
            return [quiet(r) for r in launch(job_overrides, initial_job_idx=initial_job_idx)]
        returns: list[JobReturn] = []
        for i, overrides in enumerate(job_overrides):  # one at a time, each with its own job number
            if i in problems:
                returns.append(refused_return(overrides, initial_job_idx + i, problems[i]))
            else:
                returns += [quiet(r) for r in launch([overrides], initial_job_idx=initial_job_idx + i)]
        return returns

    return launch_composed


class DropFailedExperiment(logging.Filter):
    """Leaves out the plugin's ``Failed experiment: <error>`` warning: the trial has logged its own line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(FAILED_EXPERIMENT)


GRID_STOP = "`Study.stop` is supposed to be invoked inside an objective function or a callback."


def told_without_stop(sampler: Any) -> None:
    """Let ``sampler`` (the search's) be told a failed trial at the end of a grid. Optuna's grid sampler stops the
    study once its grid is visited, and ``study.stop()`` raises outside ``study.optimize``, which the plugin's
    ask-and-tell loop never runs: the plugin lets that error pass for a completed trial, not for a failed one, so a
    grid search whose last trial failed ended in a traceback (the trial stored ``FAIL``). The plugin bounds the
    search by the grid's size itself, so the stop is not needed."""
    after_trial = getattr(sampler, "after_trial", None)
    if not isinstance(sampler, GridSampler) or getattr(after_trial, "told_without_stop", False):
        return

    def after_trial_no_stop(*args: Any, **kwargs: Any) -> None:
        try:
            after_trial(*args, **kwargs)
        except RuntimeError as e:
            if GRID_STOP not in str(e):
                raise

    after_trial_no_stop.told_without_stop = True  # type: ignore[attr-defined]
    sampler.after_trial = after_trial_no_stop
