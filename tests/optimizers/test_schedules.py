"""Learning-rate schedules: each kind's multiplier against the documented formula (``reference.schedule_multiplier``,
written from the docs), the run-length default, and the bad values a schedule refuses."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
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
    (dict(kind="step", step_every=0), "schedule.step_every=0 is outside [1, 2147483647]"),
    (dict(kind="cosine", decay_steps=10, end_ratio=-0.1), "schedule.end_ratio=-0.1 is outside [0, 1]"),
    (dict(warmup_steps=-2), "schedule.warmup_steps=-2 is outside [0, 2147483647]"),
    # a step count the traced int32 update count cannot be compared with (an OverflowError as the step compiles)
    (dict(kind="cosine", decay_steps=2**31), "schedule.decay_steps=2147483648 is outside [0, 2147483647] (updates "
                                             "the cosine takes from 1 to end_ratio (cosine, warmup_cosine); 0 = the "
                                             "whole run)"),
    (dict(kind="warmup", warmup_steps=2**31), "schedule.warmup_steps=2147483648 is outside [0, 2147483647]"),
    (dict(kind="step", step_every=2**40), "schedule.step_every=1099511627776 is outside [1, 2147483647]"),
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


@pytest.mark.parametrize("schedule", [Schedule("warmup", warmup_steps=2**31 - 1),
                                      Schedule("cosine", decay_steps=2**31 - 1),
                                      Schedule("step", step_every=2**31 - 1),
                                      Schedule("warmup_cosine", warmup_steps=2**31 - 1, decay_steps=2**31 - 1)],
                         ids=["warmup", "cosine", "step", "warmup_cosine"])
def test_the_longest_step_counts_compile_against_a_traced_count(schedule):
    """The largest count ``problems`` lets through (2**31 - 1) still enters the compiled step, where one more
    would overflow int32; the multiplier at update 5 is what the formula gives."""
    assert problems(optimizers.AsyncSGD(schedule=schedule)) == []
    got = float(jax.jit(schedule)(jnp.int32(5)))
    want = schedule_multiplier(**{**dataclasses.asdict(schedule), "kind": schedule.kind.value})(5)
    assert got == pytest.approx(want, rel=1e-6)
