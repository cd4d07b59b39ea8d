"""Checks of an Optuna search before its first trial, so that a search that cannot do what was asked stops with
exit code 2 and one line per bad setting (``error: invalid sweep:``), not a traceback some trials in.

``runner.sweeps`` calls these from ``SweepSummary.on_multirun_start`` (the composed config): the ``direction``
(``minimize`` or ``maximize``, as written or the plugin's ``Direction`` default; a one-item list is that
direction) and the search ranges Optuna would take otherwise than meant: ``range(...)`` (searched with its end
included), an interval whose start is above its end, a log-scale interval starting at or below 0, and an interval
under the grid sampler (it tries listed values only).
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

DIRECTIONS = ("minimize", "maximize")
GRID = "GridSampler"  # the end of the grid sampler's _target_ (hydra/sweeper/sampler=grid)
LISTED = 20  # a fix that lists the values to try lists at most this many


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
