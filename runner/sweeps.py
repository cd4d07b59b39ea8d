"""Sweeps: one W&B run per trial in a group named after the sweep, failed trials recorded without stopping
the others, and one summary line per failed trial when the sweep ends.

What a trial gets (``runner.__main__`` calls these; ``python -m runner -m a=1,2`` or an Optuna search):

* W&B tags: ``group=option`` for every config-group choice plus the trial's own overrides (deduplicated,
  each cut to W&B's 64 characters); in a multirun, unless ``logger.group`` / ``logger.name`` are set, the
  group ``<job name>[-<experiment or hparams_search>]-<last two parts of the sweep dir>`` (for Hydra's
  default ``multirun/<date>/<time>``: ``runner-2026-11-29_12-00-00``) and the name ``#<job num> <overrides>``.
* ``wandb_run.json`` in its directory: the W&B run's id, name, group, tags, project, mode and directory.
* On failure (any exception, a :class:`~runner.errors.PreflightError` from bad input included): a
  ``FAILED`` file holding the error and its traceback, ``summary.json`` with ``"status": "failed"`` and a
  W&B run finished with exit code 1 -- built just for the record when the trial failed before its tracker
  existed. Then the sweep goes on: the basic sweeper gets ``nan`` back; Optuna gets the exception
  re-raised, which marks the trial ``FAIL`` (``hydra-optuna-sweeper`` 1.3.0 crashes on a ``nan`` value,
  so a trial whose objective is not finite is failed the same way for Optuna).

:class:`SweepSummary` (a Hydra callback, ``conf/hydra/callbacks/sweep_summary.yaml``) prints, when the sweep
ends, ``sweep: N trials, M ok, K failed`` and one line per failed trial with the overrides that tell it from the
others, of the trials this sweep launched (not those an earlier sweep into the same folder left there). The process
exits non-zero only when every trial failed or none ran (an empty range). It runs a ``-m`` sweep with the runner's
subclass of Hydra's basic sweeper (``hydra_plugins/runner_basic``), which refuses before the first trial, exit
code 2, every combination whose config does not compose. Before an Optuna search it refuses
settings that cannot work (``n_trials`` or ``n_jobs`` below 1, a direction other than minimize or maximize,
several directions for the one objective a run returns, a search range Optuna would read otherwise than
meant, an unseeded search run by several processes; ``runner.sweep_checks``), exit code 2, and runs the search
with the runner's subclass of the plugin's sweeper (``hydra_plugins/runner_optuna``), which refuses what only
composing a trial's config shows and a stored study of other settings, ends a search that cannot go on (no
trial completed; a batch failed beyond ``max_failure_rate``) with the same summary and one line naming the
cause, exit code 1, where the plugin's own would end in a traceback, and marks the trials a stopped search
leaves unfinished failed.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from .outputs import (FAILED_MARKER, METRICS_FILE, OVERRIDES_FILE, RUN_INFO_FILE, SUMMARY_FILE, read_overrides,
                      set_aside)

log = logging.getLogger("runner.sweeps")

MAX_TAG = 64  # W&B rejects longer tags
MAX_NAME = 128  # the longest logger.group / logger.name the preflight takes (runner.preflight)
PLUGIN_OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
RUNNER_OPTUNA = "hydra_plugins.runner_optuna.sweeper.RunnerOptunaSweeper"
BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"  # Hydra's default sweeper
RUNNER_BASIC = "hydra_plugins.runner_basic.sweeper.RunnerBasicSweeper"
RUNNERS = {PLUGIN_OPTUNA: RUNNER_OPTUNA, BASIC: RUNNER_BASIC}  # the runner's subclass run in place of each sweeper
# Optuna's errors for a study with no completed trial: kept in memory, kept in a database
NO_TRIAL_COMPLETED = ("No trials are completed yet", "Record does not exist")


class TrialFailed(RuntimeError):
    """A trial finished but cannot be scored (its objective is not a finite number)."""


def is_optuna(hc: Any) -> bool:
    return "optuna" in str(OmegaConf.select(hc, "sweeper._target_", default=""))


def trial_tags(hc: Any) -> list[str]:
    """``group=option`` for every chosen config-group option, then the trial's overrides."""
    tags = [f"{k}={v}" for k, v in hc.runtime.choices.items()  # not Hydra's own, nor the schemas options extend
            if not k.startswith(("hydra", "schema/")) and v is not None]
    tags += [str(o) for o in hc.overrides.task]
    return list(dict.fromkeys(t[:MAX_TAG] for t in tags))


def fit_name(text: str) -> str:
    """``text`` within ``MAX_NAME`` characters: a long one keeps its start and its end (the sweep dir's stamp, the
    trial's last overrides), joined by ``...``."""
    if len(text) <= MAX_NAME:
        return text
    head = (MAX_NAME - 3) // 2
    return text[:head] + "..." + text[len(text) - (MAX_NAME - 3 - head):]


def sweep_group(hc: Any) -> str:
    choices = hc.runtime.choices
    named = choices.get("experiment") or choices.get("hparams_search")
    stamp = "_".join(Path(str(hc.sweep.dir)).parts[-2:])
    return fit_name("-".join(str(p) for p in (hc.job.name, named, stamp) if p))


_LAUNCHED: dict[str, int] = {}  # this sweep's trial folders (this process's): folder -> the trial that had it


def name_trial(cfg: DictConfig, hc: Any) -> str | None:
    """In a multirun with W&B, fill in ``logger.group`` (the sweep) and ``logger.name`` (the trial) unless set (with
    ``logger=none``, where they would be warned about as settings without effect, they stay unset); and drop a
    ``FAILED`` record an earlier sweep into the same directory left in this trial's (it would mark this trial
    failed in the summary and the report), and note its summary.json, if any, as it was: if this trial fails
    before its run sets that record aside, ``record_failure`` does (its numbers are not this trial's). Returns
    why the trial cannot run (its folder is an earlier trial's of this sweep), or None."""
    out, num = str(hc.runtime.output_dir), int(hc.job.num)
    if _LAUNCHED.setdefault(out, num) != num:
        raw = OmegaConf.to_container(hc.sweep, resolve=False).get("subdir") if OmegaConf.is_config(hc.sweep) else None
        return (f"hydra.sweep.subdir={raw or hc.sweep.subdir} gives trials #{_LAUNCHED[out]} and #{num} the same "
                f"folder {out}: #{num} would write over #{_LAUNCHED[out]}'s record; name each trial's folder apart, "
                f"e.g. with ${{hydra.job.num}} (Hydra's default subdir)")
    wandb = str(getattr(cfg.logger.kind, "value", cfg.logger.kind)) != "none"  # no W&B run: nothing to name
    if wandb and cfg.logger.group is None:
        cfg.logger.group = sweep_group(hc)
    if wandb and cfg.logger.name is None:
        cfg.logger.name = fit_name(" ".join([f"#{hc.job.num}", *map(str, hc.overrides.task)]))
    if _lead_process(cfg):
        (Path(hc.runtime.output_dir) / FAILED_MARKER).unlink(missing_ok=True)
        summary = Path(hc.runtime.output_dir) / SUMMARY_FILE
        _FOUND[str(summary)] = summary.stat().st_mtime_ns if summary.is_file() else None
    return None


_FOUND: dict[str, int | None] = {}  # a trial's summary.json as it started: an earlier sweep's, if any (its time)


def _earlier_record(out: Path) -> bool:
    """Whether ``out``'s summary.json is the one an earlier sweep's trial left there, untouched by this trial."""
    summary = out / SUMMARY_FILE
    found = _FOUND.get(str(summary))
    return found is not None and summary.is_file() and summary.stat().st_mtime_ns == found


def write_run_info(tracker: Any, output_dir: str | os.PathLike) -> Path | None:
    """``wandb_run.json`` for the W&B run inside ``tracker`` (alone or in a MultiTracker); None if none (or
    ``logger.mode=disabled``, which starts none)."""
    from .tracking import WandbTracker

    found = [t for t in getattr(tracker, "trackers", [tracker]) if isinstance(t, WandbTracker)]
    if not found:
        return None
    run = found[0].run
    if run.settings.mode == "disabled":  # no W&B run: its id and folder are placeholders that name nothing
        return None
    info = {"id": run.id, "name": run.name, "group": run.group or None, "tags": list(run.tags or ()),
            "project": run.project, "mode": run.settings.mode, "dir": str(found[0].run_dir)}
    path = Path(output_dir) / RUN_INFO_FILE
    path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return path


def _lead_process(cfg: DictConfig) -> bool:
    import jax

    if jax.distributed.is_initialized():
        return jax.process_index() == 0
    return not OmegaConf.select(cfg, "distributed.process_id", default=None)  # before initialize: as configured


def record_failure(cfg: DictConfig, output_dir: str | os.PathLike, error: BaseException,
                   make_tracker: Callable[[], Any]) -> None:
    """``FAILED`` + ``summary.json`` status failed + a W&B run finished with exit code 1.

    The trial's own tracker, if it was built, has already been finished with exit code 1 by
    ``runner.app.run``; otherwise ``make_tracker()`` builds one to carry the record."""
    if not _lead_process(cfg):
        return
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    message = f"{type(error).__name__}: {error}"
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    (out / FAILED_MARKER).write_text(f"{message}\n\n{trace}", encoding="utf-8")
    if _earlier_record(out):  # failed before its run set an earlier sweep's record aside: its numbers are not ours
        set_aside(out, (METRICS_FILE, SUMMARY_FILE, RUN_INFO_FILE))
    if not (out / SUMMARY_FILE).is_file():  # failed before the run's tracker existed
        tracker = make_tracker()
        try:
            tracker.log_summary({"error": message[:1000]})
        finally:
            tracker.finish(1)
    else:
        summary = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
        if summary.get("status") != "failed":  # e.g. a run that finished but whose objective is unusable
            summary.update(status="failed", error=message[:1000])
            (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:  # nothing may leak into the next trial
        wandb.run.finish(exit_code=1)


def trial_failed(cfg: DictConfig, hc: Any, error: Exception, make_tracker: Callable[[], Any]) -> float:
    """Record the failure (one line naming the trial's values and the error); return ``nan`` for the basic
    sweeper, re-raise for Optuna (trial state FAIL)."""
    from .sweep_launch import failure_line

    log.error("%s", failure_line(hc.job.num, hc.overrides.task, error))
    record_failure(cfg, hc.runtime.output_dir, error, make_tracker)
    if is_optuna(hc):
        raise error
    return float("nan")


def checked_objective(cfg: DictConfig, hc: Any, objective: float, make_tracker: Callable[[], Any]) -> float:
    """Optuna cannot take a non-finite objective: such a trial is failed for it (see the module doc)."""
    if is_optuna(hc) and not math.isfinite(objective):
        name = cfg.trainer.objective or "the task's objective"
        return trial_failed(cfg, hc, TrialFailed(f"{name} is {objective}: nothing to compare"), make_tracker)
    return objective


# --------------------------------------------------------------------------- the end-of-sweep summary


def _first_line(path: Path) -> str:
    """The error's first line; a first line that only announces a list (``invalid config:``) with the list's
    first item, so the line names the bad value."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").strip().splitlines()]
    if not lines or not lines[0]:
        return "(no message)"
    if lines[0].endswith(":") and len(lines) > 1 and lines[1]:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


_EARLIER: dict[str, int] = {}  # trial dir -> its overrides file's mtime when this sweep started (an earlier sweep's)


def _trial_dirs(root: Path) -> list[Path]:
    """The trial folders under ``root``, found as the report finds them (at any depth: ``hydra.sweep.subdir`` may
    nest them, e.g. ``t/${hydra.job.num}``; not inside ``wandb/`` or ``checkpoints/``) that hold Hydra's overrides
    file, in trial-number order."""
    from .report.trials import find_trials

    return [d for d in find_trials(root) if (d / OVERRIDES_FILE).is_file()]


def note_earlier_trials(sweep_dir: str | os.PathLike) -> None:
    """Remember the trials an earlier sweep into ``sweep_dir`` left there: Hydra writes a trial's overrides file
    when it launches it, so one this sweep has not launched keeps its time, and the summary leaves it out."""
    from .sweep_launch import refused

    _EARLIER.clear()
    _LAUNCHED.clear()
    refused.clear()
    root = Path(sweep_dir) if str(sweep_dir) else None
    if root is not None and root.is_dir():
        _EARLIER.update({str(d): (d / OVERRIDES_FILE).stat().st_mtime_ns for d in _trial_dirs(root)})


def _earlier(d: Path) -> bool:
    return _EARLIER.get(str(d)) == (d / OVERRIDES_FILE).stat().st_mtime_ns


def sweep_failures(sweep_dir: str | os.PathLike) -> tuple[list[Path], list[tuple[Path, str, str]], int]:
    """(trial dirs, [(dir, overrides, first line of FAILED)], earlier) for the trials under ``sweep_dir`` that this
    sweep launched; ``earlier``: how many more an earlier sweep into it left there (``note_earlier_trials``). A
    failed trial's overrides are those that differ between the trials (``shared_overrides``; all of a lone one's)."""
    from .report.trials import shared_overrides
    from .sweep_launch import refused

    found = _trial_dirs(Path(sweep_dir)) if Path(sweep_dir).is_dir() else []
    trials = [d for d in found if not _earlier(d)]
    ran = {d: read_overrides(d) for d in trials}
    common = set(shared_overrides([*ran.values(), *(overrides for _, overrides, _ in refused)]))
    failed = [(d, " ".join(o for o in ran[d] if o not in common), _first_line(d / FAILED_MARKER)) for d in trials
              if (d / FAILED_MARKER).is_file()]
    gone = [(Path(sweep_dir) / str(num), " ".join(o for o in overrides if o not in common), f"{type(e).__name__}: {e}")
            for num, overrides, e in refused]  # no folder: it never ran
    return trials + [d for d, _, _ in gone], failed + gone, len(found) - len(trials)


def summary_lines(sweep_dir: str | os.PathLike,
                  found: tuple[list, list, int] | None = None) -> tuple[list[str], bool]:
    """The lines to print at the end of a sweep, and whether the sweep failed: every trial failed, or none ran.
    ``found``: ``sweep_failures(sweep_dir)`` when the caller has read it already."""
    trials, failed, earlier = found or sweep_failures(sweep_dir)
    left = (f"; {earlier} more trial folders there are an earlier sweep's, left as they were, not counted"
            if earlier else "")
    if not trials:
        return [f"sweep: no trial ran ({sweep_dir}{left}): the sweep's overrides gave none (e.g. an empty range or "
                f"choice); give each swept key at least one value"], True
    lines = [f"sweep: {len(trials)} trials, {len(trials) - len(failed)} ok, {len(failed)} failed ({sweep_dir}{left})"]
    lines += [f"  FAILED #{d.name} [{overrides}]: {msg}" for d, overrides, msg in failed]
    return lines, len(failed) == len(trials)


def optuna_problems(sweeper: Any) -> list[str]:
    """The Optuna sweeper's settings that cannot work, each named with its valid values (a run's objective is
    one number, so one direction: ``sweep_checks.direction_problem``)."""
    from .sweep_checks import direction_problem

    out = []
    for key in ("n_trials", "n_jobs"):
        v = sweeper.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            out.append(f"hydra.sweeper.{key}={v} must be an integer >= 1")
    direction = direction_problem(sweeper)
    if direction:
        out.append(direction)
    rate = sweeper.get("max_failure_rate")
    if rate is not None and not (isinstance(rate, (int, float)) and 0 <= rate <= 1):
        out.append(f"hydra.sweeper.max_failure_rate={rate} must be in [0, 1]")
    return out


def override_problems(overrides: list[str], config: Any, *, optuna: bool, basic: bool = False) -> list[str]:
    """The sweep overrides that cannot make trials, each named with the reason: one Hydra cannot expand (e.g.
    ``range(1, 2, 0)``); for Hydra's basic sweeper an ``interval`` (a search range: it lists values only); for
    Optuna a range it would search otherwise than meant (``sweep_checks.search_range_problem``) and an
    ``interval`` over an integer key (Optuna then draws real numbers, which the key refuses in every trial), with
    the form to use instead. ``config``: the composed config (with its ``hydra`` node, for the sampler)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from .errors import first_line
    from .sweep_checks import search_range_problem

    parser, out = OverridesParser.create(), []
    for text in overrides:
        try:
            override = parser.parse_override(text)
            if override.is_sweep_override() and not override.is_interval_sweep():
                list(override.sweep_string_iterator())
        except Exception as e:  # noqa: BLE001 - Hydra's parser and sweep types raise several kinds
            out.append(f"{text}: {first_line(e)}")
            continue
        if basic and override.is_interval_sweep():
            out.append(f"{text}: an interval is a range to search, and the basic sweeper (-m) runs listed values "
                       f"only: list them (a,b,c), or use range(...) or choice(...), or search it with Optuna "
                       f"(hydra/sweeper=optuna, as the hparams_search configs do)")
            continue
        problem = search_range_problem(override, config) if optuna else None
        if problem:
            out.append(f"{text}: {problem}")
            continue
        if not (optuna and override.is_interval_sweep()):
            continue
        value, key = override.value(), override.get_key_element()
        current = OmegaConf.select(config, key, default=None, throw_on_resolution_failure=False)
        if isinstance(value.start, float) and isinstance(current, int) and not isinstance(current, bool):
            bounds = f"{value.start:g}, {value.end:g}"
            out.append(f"{text}: an interval of real numbers, but {key} is an integer (now {current}): use "
                       f"{key}=int(interval({bounds})) (tag(log, int(interval({bounds}))) on a log scale)")
    return out


def optuna_stopped(sweep_dir: str | os.PathLike, error: Exception, max_failure_rate: float) -> NoReturn:
    """End an Optuna search the plugin stopped with ``error``: the summary, one line naming why it stopped and the
    fix, exit code 1. An error that is neither Optuna's "no trial completed" nor a failed trial's is re-raised."""
    from .sweep_launch import refused

    found = sweep_failures(sweep_dir)
    failed = found[1]
    text = f"{type(error).__name__}: {error}"
    if any(m in str(error) for m in NO_TRIAL_COMPLETED) and failed:
        why = ("sweep: no trial completed, so there is no best one (optimization_results.yaml not written): fix "
               "what the failed trials name and run the search again")
    elif any(e is error for _, _, e in refused) or any(
            (d / FAILED_MARKER).read_text(encoding="utf-8", errors="replace").startswith(text)
            for d, _, _ in failed if (d / FAILED_MARKER).is_file()):
        why = (f"sweep: stopped early: a batch of trials failed more often than hydra.sweeper.max_failure_rate="
               f"{max_failure_rate} allows (the share of a batch that may fail); fix what they name, or set "
               f"hydra.sweeper.max_failure_rate=1.0 to record failed trials and go on")
    else:
        raise error
    lines, _ = summary_lines(sweep_dir, found)
    print("\n".join([*lines, why]), file=sys.stderr, flush=True)
    raise SystemExit(1)  # not an Exception: Hydra would print it with a traceback


class SweepSummary(Callback):
    """Before a sweep, refuses Optuna settings that cannot work (exit 2); at its end, prints how many trials
    failed and why, and exits 1 if every trial failed or the sweep had none."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from . import sweep_checks

        note_earlier_trials(str(OmegaConf.select(config, "hydra.sweep.dir", default="")))
        sweeper = config.hydra.get("sweeper") or {}
        overrides = [str(o) for o in OmegaConf.select(config, "hydra.overrides.task", default=None) or []]
        optuna = "optuna" in str(sweeper.get("_target_", "")).lower()
        problems = optuna_problems(sweeper) if optuna else []
        if optuna:  # a key given on the command line is searched as given there, not as hydra.sweeper.params says
            given = {o.split("=", 1)[0] for o in overrides}
            overrides += [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items() if str(k) not in given]
        problems += override_problems(overrides, config, optuna=optuna, basic=sweeper.get("_target_") == BASIC)
        problems += sweep_checks.processes_problems(config, optuna)
        sweep_checks.refuse(problems)  # SystemExit, not an Exception: Hydra's callback runner would only warn
        ours = RUNNERS.get(str(sweeper.get("_target_")))
        if ours:  # Hydra instantiates the sweeper from this config next
            with read_write(config.hydra.sweeper), open_dict(config.hydra.sweeper):
                config.hydra.sweeper._target_ = ours

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        lines, failed = summary_lines(Path(str(config.hydra.sweep.dir)))
        print("\n".join(lines), file=sys.stderr if failed else sys.stdout, flush=True)
        if failed:
            raise SystemExit(1)  # not an Exception: Hydra's callback runner would only warn about one
