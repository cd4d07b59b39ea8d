"""Checks of an Optuna search before its first trial, so that a search that cannot do what was asked stops with
exit code 2 and one line per bad setting (``error: invalid sweep:``), not a traceback some trials in.

``runner.sweeps`` calls the first group from ``SweepSummary.on_multirun_start`` (the composed config, no config
loader): the ``direction`` (``minimize`` or ``maximize``, as written or the plugin's ``Direction`` default; a
one-item list is that direction) and the search ranges Optuna would take otherwise than meant: ``range(...)``
(searched with its end included), an interval whose start is above its end, a log-scale interval starting at or
below 0, and an interval under the grid sampler (it tries listed values only). The plugin subclass
(``hydra_plugins/runner_optuna``) calls the second group from its ``sweep``, which has Hydra's config loader:
each value a trial could be given (every ``choice`` value, both ends of an interval) composed into the config as
that trial would compose it, and a stored study of the same name searched in another direction or over other
values of a parameter. It also marks the trials a search leaves unfinished (Ctrl-C, SIGTERM, a crash) failed in
a stored study, which Optuna would keep ``RUNNING`` for good. The runner's basic sweeper (``-m``,
``hydra_plugins/runner_basic``) calls ``combination_problems`` the same way: every combination of its sweep
composed, those that do not compose refused, also with exit code 2.
"""
from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import OmegaConf


log = logging.getLogger("runner.sweeps")

DIRECTIONS = ("minimize", "maximize")
GRID = "GridSampler"  # the end of the grid sampler's _target_ (hydra/sweeper/sampler=grid)
LISTED = 20  # a fix that lists the values to try lists at most this many


def refuse(problems: list[str]) -> None:
    """Exit code 2 with ``error: invalid sweep:`` and one line per problem, if there is any."""
    if problems:
        print("error: invalid sweep:\n  - " + "\n  - ".join(problems), file=sys.stderr, flush=True)
        raise SystemExit(2)  # not an Exception: Hydra would print it with a traceback


def mask_password(text: str) -> str:
    """``text`` with the password of any database URL in it shown as ``***`` (``mysql://u:***@host/db``)."""
    return re.sub(r"(://[^:/@\s]*:)[^@/\s]*@", r"\1***@", text)


def _direction_name(item: Any) -> Any:
    return getattr(item, "name", item)  # the plugin's default is its enum Direction.minimize


def direction_problem(sweeper: Any) -> str | None:
    """Why ``hydra.sweeper.direction`` cannot work (None: it can, or it is not set and the plugin's default holds).

    Exactly ``minimize`` or ``maximize`` (Optuna takes no other spelling), the plugin's ``Direction`` enum, or a
    list of one of them; several directions need several objectives, and a run returns one."""
    if "direction" not in sweeper:
        return None
    direction = sweeper.get("direction")
    shown = "null" if direction is None else direction
    items = list(direction) if OmegaConf.is_list(direction) or isinstance(direction, (list, tuple)) else [direction]
    if len(items) > 1:
        return (f"hydra.sweeper.direction={shown} must be minimize or maximize: a run's objective "
                f"(trainer.objective) is one number, so a search has one direction")
    name = _direction_name(items[0]) if items else None
    if name in DIRECTIONS:
        return None
    if isinstance(name, str) and name.lower() in DIRECTIONS:
        return (f"hydra.sweeper.direction={shown} must be minimize or maximize, in lower case: write "
                f"hydra.sweeper.direction={name.lower()}")
    if direction is None:
        return ("hydra.sweeper.direction=null must be minimize or maximize: a search needs one (maximize for an "
                "objective such as an AUC, minimize for a loss)")
    return f"hydra.sweeper.direction={shown} must be minimize or maximize"


def is_grid(config: Any) -> bool:
    """Whether the search's sampler (``hydra.sweeper.sampler`` in ``config``) is Optuna's grid sampler."""
    target = OmegaConf.select(config, "hydra.sweeper.sampler._target_", default=None, throw_on_resolution_failure=False)
    return str(target or "").endswith(GRID)


def _choice(values: list[str], key: str) -> str:
    if len(values) > LISTED:
        return f"{key}=choice(...) listing the values to try"
    return f"{key}=choice({', '.join(values)})"


def _range_problem(override: Any, key: str, grid: bool) -> str | None:
    """Why Optuna would not search the values ``range(...)`` lists under ``-m`` (None: it would)."""
    value, values = override.value(), list(override.sweep_string_iterator())
    if not values:
        return "a range with no value: give the values to search, e.g. choice(a, b)"
    start, stop, step, fix = value.start, value.stop, value.step, _choice(values, key)
    if not all(isinstance(v, int) for v in (start, stop, step)):
        return (f"Optuna makes its own steps over a range of real numbers, which can gain or lose a value to "
                f"rounding: write {fix}")
    if step < 0:
        return f"Optuna searches a range upwards only, and this one counts down: write {fix}"
    if grid or (stop - start) % step:  # the grid leaves out the end, as -m does; Optuna never reaches this end
        return None
    if step == 1:
        fix = f"{key}=int(interval({values[0]}, {values[-1]})) or {fix}"
    return f"Optuna searches a range with its end {stop} included (under -m it is left out): write {fix}"


def search_range_problem(override: Any, config: Any) -> str | None:
    """Why Optuna would not search ``override`` (a parsed sweep override) as written, with the form to write
    instead; None when it would (``config``: the composed config with its ``hydra`` node, for the sampler)."""
    key, value, grid = override.get_key_element(), override.value(), is_grid(config)
    if override.is_range_sweep() and not value.shuffle:  # a shuffled range is a choice of its values
        return _range_problem(override, key, grid)
    if not override.is_interval_sweep():
        return None
    start, end, log_scale = value.start, value.end, "log" in value.tags
    if start > end:
        return f"the interval starts above its end ({start:g} > {end:g}): give the lower bound first ({end:g}, {start:g})"
    if log_scale and start <= 0:
        return (f"a log-scale interval must start above 0, and this one starts at {start:g}: give a start above 0, "
                f"or drop tag(log, ...) for a linear scale")
    if not grid:
        return None
    whole = isinstance(start, int) and isinstance(end, int)
    if whole and not log_scale:
        return (f"the grid sampler tries listed values, and the plugin's list of an integer interval leaves out "
                f"its end {end}: write {_choice([str(v) for v in range(start, end + 1)], key)}")
    return (f"the grid sampler tries listed values only, and an interval{' on a log scale' if log_scale else ''} "
            f"lists none: write {key}=choice(...) with the values to try, or use another sampler "
            f"(hydra/sweeper/sampler=tpe)")


# --------------------------------------------------------------------------- checks with the config loader


def search_space(impl: Any, arguments: list[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(the Optuna distribution of each searched key, the fixed overrides, each searched key's override as
    written), built by the plugin's own ``create_params_from_overrides`` from ``hydra.sweeper.params`` and the
    command line, as ``OptunaSweeperImpl.sweep`` builds them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    params = [f"{k!s}={v}" for k, v in (impl.params or {}).items()] + list(arguments)
    space, fixed = create_params_from_overrides(params)
    texts = {o.get_key_element(): o.input_line for o in OverridesParser.create().parse_overrides(params)}
    return {k: d for k, d in space.items() if k not in fixed}, fixed, texts


def _reason(error: BaseException) -> str:
    """Hydra's reason a config did not compose, in one line: its cause's first line for an override it could not
    merge, with the options of a config group it found no option of."""
    text = str(error).strip()
    if text.startswith("Error merging override") and error.__cause__ is not None:
        text = str(error.__cause__).strip()
    lines = text.splitlines() or [type(error).__name__]
    first = re.sub(r"^In '[^']*': ", "", lines[0])
    listed = [i for i, ln in enumerate(lines) if ln.startswith("Available options")]
    if listed:  # a missing group option: Hydra lists the group's options one per line, tab-indented
        options = []
        for ln in lines[listed[0] + 1:]:
            if not ln.startswith("\t"):
                break  # the search path Hydra lists next
            options.append(ln.strip())
        first += f" (options: {', '.join(options)})"
    return first


def compose_reason(error: BaseException) -> str:
    """Hydra's reason a trial's config (a combination of searched values) did not compose, in one line: ``_reason``
    with its cause's first line added where ``_reason`` left it out."""
    from .errors import first_line

    reason, cause = _reason(error), error.__cause__
    if cause is not None and first_line(cause) not in reason:
        reason = f"{reason.rstrip('.')}: {first_line(cause)}"
    return reason


def trial_values(distribution: Any) -> list[Any]:
    """The values of ``distribution`` to try composing: every choice, or both ends of a range."""
    choices = getattr(distribution, "choices", None)
    return list(choices) if choices is not None else [distribution.low, distribution.high]


def value_problems(space: dict[str, Any], fixed: dict[str, Any], texts: dict[str, str],
                   compose: Callable[[list[str]], Any]) -> list[str]:
    """Each value a trial could be given that its config cannot take, named with Hydra's reason.

    ``compose(overrides)`` composes a trial's config (Hydra's ``load_sweep_config``) and raises if it cannot;
    each value is composed with the fixed overrides, as a trial's would be (the other searched keys keep the
    config's values)."""
    out, rest = [], [f"{k}={v}" for k, v in fixed.items()]
    for key, distribution in space.items():
        values, failed = list(dict.fromkeys(trial_values(distribution))), {}
        for value in values:
            try:
                compose([f"{key}={value}", *rest])
            except Exception as e:  # noqa: BLE001 - Hydra's composition errors are of several kinds
                failed[value] = _reason(e)
        if len(values) > 1 and len(failed) == len(values) and len(set(failed.values())) == 1:  # the key itself
            out.append(f"{texts.get(key, key)}: no value of {key} can be applied ({next(iter(failed.values()))}): "
                       f"check the key (python -m runner --cfg job prints the config's keys), or drop it from the "
                       f"search")
            continue
        out += [f"{texts.get(key, key)}: {key}={value} cannot be applied ({why}): drop it from the search, or search "
                f"values {key} takes" for value, why in failed.items()]
    return out


COMBINATIONS_LISTED = 10  # a basic sweep's combinations that do not compose: at most this many named, then a count


def combination_problems(trials: list[list[str]], compose: Callable[[list[str]], Any]) -> list[str]:
    """Each combination of a basic sweep (``trials``: every trial's overrides, in Hydra's job order) whose config
    ``compose`` (Hydra's ``load_sweep_config``) cannot build: its trial number, its values, Hydra's reason in one
    line and the fix. A swept value no combination with which composes, while others do, is named as the value to
    drop, in one line for all its combinations (``optimizer=async_sgd`` in ``optimizer=async_adam,async_sgd
    optimizer.b1=0.8``). Past ``COMBINATIONS_LISTED`` lines, one more counts the trials left unnamed."""
    failed: dict[int, BaseException] = {}
    for num, overrides in enumerate(trials):
        try:
            compose(list(overrides))
        except Exception as e:  # noqa: BLE001 - Hydra's composition errors are of several kinds
            failed[num] = e
    having: dict[str, set[int]] = {}  # each override -> the trials it is in
    for num, overrides in enumerate(trials):
        for override in overrides:
            having.setdefault(override, set()).add(num)
    groups: dict[Any, list[int]] = {}  # the values to drop (or the trial number, when none is to blame alone)
    for num in failed:
        drop = tuple(o for o in trials[num] if len(failed) < len(trials) and having[o] <= failed.keys()
                     and len(having[o]) < len(trials))  # swept, and no combination with it composes
        groups.setdefault(drop or num, []).append(num)
    out, named = [], 0
    for drop, nums in list(groups.items())[:COMBINATIONS_LISTED]:
        more = f" and {len(nums) - 1} more with {' '.join(drop)}" if len(nums) > 1 else ""
        fix = f"drop {' and '.join(drop)} from the sweep" if isinstance(drop, tuple) else (
            "drop the clashing value from the sweep")
        out.append(f"trial #{nums[0]} [{' '.join(trials[nums[0]])}]{more}: its values do not compose into one config "
                   f"({compose_reason(failed[nums[0]])}): {fix}, or sweep keys every choice has")
        named += len(nums)
    if named < len(failed):
        out.append(f"and {len(failed) - named} more of the sweep's {len(trials)} trials whose values do not compose "
                   f"into one config")
    return out


def _shown(distribution: Any) -> str:
    """A distribution as the override that makes it (``choice(a, b)``, ``tag(log, interval(0.1, 1))``)."""
    name = type(distribution).__name__
    if hasattr(distribution, "choices"):
        return f"choice({', '.join(map(str, distribution.choices))})"
    if name in ("UniformDistribution", "LogUniformDistribution", "IntUniformDistribution", "IntLogUniformDistribution"):
        text = f"interval({distribution.low}, {distribution.high})"
        text = f"int({text})" if name.startswith("Int") else text
        return f"tag(log, {text})" if "Log" in name else text
    return repr(distribution)


def stored_study_problems(storage: Any, study_name: Any, directions: list[str], space: dict[str, Any]) -> list[str]:
    """How this search clashes with the study of the same name already in ``storage``, if there is one: another
    direction, or a searched key whose values are not the ones the study searched (Optuna refuses both)."""
    if storage is None or study_name is None:
        return []
    import optuna

    kept = optuna.storages.get_storage(storage)
    try:
        study_id = kept.get_study_id_from_name(study_name)
    except KeyError:
        return []  # a new study
    where = f"hydra.sweeper.study_name={study_name} (in {mask_password(str(storage))})"
    fix = "give another hydra.sweeper.study_name for a new study, or"
    out, searched = [], {}
    for trial in kept.get_all_trials(study_id, deepcopy=False):  # before the directions: optuna 2's cached
        for key, distribution in trial.distributions.items():  # storage reads no trial of a study it has those of
            searched.setdefault(key, distribution)
    stored = [d.name.lower() for d in kept.get_study_directions(study_id)]
    if stored != [d.lower() for d in directions]:
        out.append(f"{where} is a study that searched to {', '.join(stored)}, and this search would "
                   f"{', '.join(directions)}: {fix} hydra.sweeper.direction={stored[0]} to resume it")
    for key, distribution in space.items():
        if key in searched:
            try:
                optuna.distributions.check_distribution_compatibility(searched[key], distribution)
            except ValueError:
                out.append(f"{where} searched {key}={_shown(searched[key])}, and this search gives it "
                           f"{_shown(distribution)}: {fix} search {key}={_shown(searched[key])} to resume it")
    return out


def resumed_seed_note(storage: Any, study_name: Any, seed: Any) -> str | None:
    """A warning when a seeded search resumes a stored study that already holds trials: the sampler's random draws
    start again from the seed, so the new trials' first random draws are the earlier session's again."""
    if storage is None or study_name is None or seed is None:
        return None
    import optuna

    kept = optuna.storages.get_storage(storage)
    try:
        held = len(kept.get_all_trials(kept.get_study_id_from_name(study_name), deepcopy=False))
    except KeyError:
        return None
    if not held:
        return None
    return (f"warning: hydra.sweeper.study_name={study_name} resumes a study of {held} trials, and "
            f"hydra.sweeper.sampler.seed={seed} starts the sampler's random draws again: the new trials' first "
            f"random draws repeat the earlier session's; give another seed (e.g. hydra.sweeper.sampler.seed={held}) "
            f"to draw new ones")


# --------------------------------------------------------------------------- trials left unfinished


def track_asked(impl: Any, on_batch: Callable[[list[Any]], None] | None = None) -> list[Any]:
    """The list that will hold every trial ``impl`` (the plugin's ``OptunaSweeperImpl``) asks its study for: it
    hands each batch to its ``_configure_trials``, wrapped here to note them (and to call ``on_batch`` with them)."""
    asked: list[Any] = []
    configure = getattr(impl, "_configure_trials", None)
    if configure is None:  # another version of the plugin: nothing is noted, nothing marked
        return asked

    def configure_noted(trials: list[Any], *args: Any, **kwargs: Any) -> Any:
        asked.extend(trials)
        if on_batch is not None:
            on_batch(list(trials))
        return configure(trials, *args, **kwargs)

    impl._configure_trials = configure_noted
    return asked


def fail_unfinished(trials: Iterable[Any], warn: bool = True) -> int:
    """Mark ``FAIL`` those of ``trials`` (Optuna trials of one search) their study still holds as ``RUNNING``, as a
    search stopped mid-batch leaves them; return how many. A storage that cannot be written is logged (unless not
    ``warn``: the search is ending on that storage's failure, said already), not raised: this runs while another
    error or exit is on its way out."""
    from optuna.trial import TrialState

    trials, failed = list(trials), 0
    if not trials:
        return 0
    try:
        study = trials[0].study
        running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        for trial in trials:
            if trial.number in running:
                study.tell(trial, state=TrialState.FAIL)
                failed += 1
    except Exception as e:  # noqa: BLE001 - a storage gone away must not hide why the search stopped
        if warn:
            log.warning("could not mark the search's unfinished trials failed: %s: %s", type(e).__name__, e)
    return failed


BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"  # trials in the sweep's process


def processes_problems(config: Any, optuna: bool) -> list[str]:
    """A search whose trials run over several processes (``runner.launch``, SLURM) in the sweep's own processes:
    each process runs the sweep itself, so their trials must be drawn alike, which an unseeded sampler does not
    (the processes' trials would differ and fail in their first collective)."""
    kind = str(getattr(OmegaConf.select(config, "distributed.kind", default="none"), "value",
                       OmegaConf.select(config, "distributed.kind", default="none")))
    launcher = OmegaConf.select(config, "hydra.launcher._target_", default=BASIC_LAUNCHER)
    seeded = OmegaConf.select(config, "hydra.sweeper.sampler.seed", default=None) is not None
    if not optuna or kind == "none" or launcher != BASIC_LAUNCHER or (seeded and not is_grid(config)):
        return []
    if is_grid(config):  # optuna 2's GridSampler takes no seed: it picks each trial's point with Python's random
        return [f"hydra/sweeper/sampler=grid with distributed={kind}: every process runs this search itself, and the "
                f"grid sampler (no seed) would give their trials other points; search with one process "
                f"(distributed=none), or with a seeded sampler (e.g. hydra/sweeper/sampler=tpe "
                f"hydra.sweeper.sampler.seed=0)"]
    return [f"hydra.sweeper.sampler.seed=null with distributed={kind}: every process runs this search itself, and "
            f"unseeded samplers would give their trials other values; set hydra.sweeper.sampler.seed=0 (the "
            f"processes then draw alike), or search with one process (distributed=none)"]
