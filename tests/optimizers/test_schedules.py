"""Learning-rate schedules: each kind's multiplier against the documented formula (``reference.schedule_multiplier``,
written from the docs), the run-length default, and the bad values a schedule refuses."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import optimizers
from optimizers import Schedule, problems
from tests.optimizers.reference import schedule_multiplier

KINDS = [Schedule("constant"), Schedule("warmup", warmup_steps=10), Schedule("cosine", decay_steps=40, end_ratio=0.2),
         Schedule("step", step_every=7, step_factor=0.3),
         Schedule("warmup_cosine", warmup_steps=5, decay_steps=30, end_ratio=0.05)]


@pytest.mark.parametrize("schedule", KINDS, ids=[s.kind.value for s in KINDS])
def test_multiplier_matches_the_documented_formula(schedule):
    counts = np.arange(1, 61)
    want = schedule_multiplier(**{**dataclasses.asdict(schedule), "kind": schedule.kind.value})
    got = np.asarray(schedule(counts))
    np.testing.assert_allclose(got, [want(int(t)) for t in counts], rtol=1e-6, atol=1e-7)


def test_the_whole_run_fills_decay_steps_after_the_warmup():
    assert Schedule("cosine").over(1000).decay_steps == 1000
    assert Schedule("warmup_cosine", warmup_steps=100).over(1000).decay_steps == 900
    assert Schedule("cosine", decay_steps=50).over(1000).decay_steps == 50  # an explicit length stays
    assert Schedule("warmup", warmup_steps=3).over(1000) == Schedule("warmup", warmup_steps=3)


def test_a_constant_schedule_leaves_the_learning_rate_a_python_float():
    """The default: the rule multiplies by the same constant as before schedules existed (the same program)."""
    opt = optimizers.AsyncAdam(learning_rate=0.02)
    assert opt.learning_rate_at(5) == 0.02 and isinstance(opt.learning_rate_at(5), float)
    scheduled = optimizers.AsyncAdam(learning_rate=0.02, schedule=Schedule("warmup", warmup_steps=4))
    assert float(scheduled.learning_rate_at(1)) == pytest.approx(0.005)


@pytest.mark.parametrize("kwargs, line", [
    (dict(kind="warmup"), "schedule.warmup_steps=0 must be at least 1 for kind=warmup"),
    (dict(kind="warmup_cosine", warmup_steps=0, decay_steps=5), "schedule.warmup_steps=0 must be at least 1"),
    (dict(kind="cosine"), "schedule.decay_steps=0 must be at least 1 for kind=cosine (0 = the whole run"),
    (dict(kind="step", step_factor=1.5), "schedule.step_factor=1.5 is outside (0, 1]"),
    (dict(kind="step", step_every=0), "schedule.step_every=0 is outside [1, inf)"),
    (dict(kind="cosine", decay_steps=10, end_ratio=-0.1), "schedule.end_ratio=-0.1 is outside [0, 1]"),
    (dict(warmup_steps=-2), "schedule.warmup_steps=-2 is outside [0, inf)"),
])
def test_bad_values_are_named_by_the_optimizers_problems(kwargs, line):
    opt = optimizers.AsyncSGD(schedule=Schedule(**kwargs))
    assert any(line in p for p in problems(opt)), problems(opt)


def test_an_unknown_kind_and_an_unresolved_length_are_errors():
    with pytest.raises(ValueError, match="schedule kind 'linear' is not one of constant, warmup, cosine, step, "
                                         "warmup_cosine"):
        Schedule("linear")
    with pytest.raises(ValueError, match="decay_steps=0 must be at least 1 for kind=cosine"):
        Schedule("cosine")(3)
