"""Hyperparameter checks: what ``optimizers.problems`` says of a value, and ``optimizers.create``, which refuses
what it finds, while building the class itself checks no range (the runner reports the same lines under its
own config keys)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import optimizers
from optimizers import problems

SCHEDULE_DOC = "the learning rate's schedule over this table's updates (optimizers.schedules)"
TINY = "is below float32's smallest normal number (1.18e-38), the precision the update runs in: it would be 0 there"


def refused(name: str, **hparams) -> str:
    """The message of the ValueError ``create(name, **hparams)`` raises."""
    with pytest.raises(ValueError) as err:
        optimizers.create(name, **hparams)
    return str(err.value)


# ---- create refuses what problems finds ---------------------------------------------------------------------
@pytest.mark.parametrize("name, hparams, message", [
    ("async_sgd", dict(learning_rate=-1.0), "learning_rate=-1.0 is outside (0, inf) (step size)"),
    ("async_rowwise_adagrad_momentum", dict(momentum=1.5),
     "momentum=1.5 is outside [0, 1) (decay of the momentum buffer per touch; 0 = row-wise Adagrad)"),
    ("async_ftrl", dict(lr_power=0.5), "lr_power=0.5 is outside [-4, 0] (the per-coordinate step is learning_rate "
                                       "/ n**(-lr_power); -0.5 is the paper's 1/sqrt(n), 0 a constant step; at "
                                       "least -4, where n**4 stays finite in float32 for every accumulator n below "
                                       "2**32)"),
    ("async_sgd", dict(schedule=optimizers.Schedule("step", step_factor=2.0)),
     "schedule.step_factor=2.0 is outside (0, 1] (the step schedule's multiplier per step)"),
    ("async_adam", dict(b1=1.0, eps=0.0), "b1=1.0 is outside [0, 1) (decay of the first-moment (mean) estimate); "
                                          "eps=0.0 is outside (0, inf) (added to sqrt(second moment): keeps the step "
                                          "finite for a zero gradient)"),
    ("async_sgd", dict(learning_rate=0.5, weight_decay=4.0, weight_decay_mode="decoupled_global"),
     "weight_decay=4.0 with learning_rate=0.5 decays a row by 1 - 2 per update under "
     "weight_decay_mode=decoupled_global: their product must be below 1"),
    ("adam", dict(learning_rate=float("nan")), "learning_rate=nan is outside (0, inf) (step size)"),
], ids=["negative-lr", "momentum", "lr_power", "step_factor", "two-at-once", "across-fields", "dense"])
def test_create_refuses_the_lines_of_problems(name, hparams, message):
    assert refused(name, **hparams) == message
    opt = optimizers.REGISTRY[name](**hparams)  # the class itself builds it: its caller reports the problems
    assert "; ".join(problems(opt)) == message


@pytest.mark.parametrize("name", list(optimizers.REGISTRY))
def test_create_builds_valid_hyperparameters_unchanged(name):
    opt = optimizers.create(name, learning_rate=0.25)
    assert opt == optimizers.REGISTRY[name](learning_rate=0.25) and opt.learning_rate == 0.25


def test_a_numpy_number_is_a_number():
    opt = optimizers.create("async_sgd", learning_rate=np.float32(0.5), weight_decay=np.int64(0))
    assert opt.learning_rate == 0.5 and problems(opt) == []


# ---- an unknown hyperparameter -------------------------------------------------------------------------------
def test_an_unknown_hyperparameter_is_named_with_the_ones_the_optimizer_has():
    assert refused("async_sgd", momentum=0.9) == (
        "async_sgd has no hyperparameter 'momentum'; its hyperparameters: learning_rate, weight_decay, "
        "weight_decay_mode, schedule")
    assert refused("async_adam", learnig_rate=0.1, beta1=0.9) == (
        "async_adam has no hyperparameters 'learnig_rate' (did you mean learning_rate?), 'beta1'; its "
        "hyperparameters: learning_rate, b1, b2, eps, weight_decay, bias_correction, weight_decay_mode, schedule")


# ---- values that are not numbers, and a schedule that is not a Schedule -------------------------------------
@pytest.mark.parametrize("name", optimizers.FUSED)
@pytest.mark.parametrize("value", ["0.1", None, True, [0.1]], ids=["str", "None", "bool", "list"])
def test_a_learning_rate_that_is_not_a_number_is_named(name, value):
    """Not "outside": the value is no number at all (it used to fail at the first update, naming nothing)."""
    assert refused(name, learning_rate=value).startswith(f"learning_rate={value!r} is not a number (step size")


def test_a_weight_decay_given_as_a_word_is_not_a_number():
    assert refused("async_adam", weight_decay="0.1") == (
        "weight_decay='0.1' is not a number (decoupled (AdamW) decay of a row, times the learning rate, applied "
        "lazily: only to the rows an update touches, once per update (untouched rows do not decay))")


@pytest.mark.parametrize("name", optimizers.FUSED)
@pytest.mark.parametrize("value, kind", [({"kind": "cosine", "decay_steps": 10}, "dict"), ("cosine", "str")],
                         ids=["dict", "word"])
def test_a_schedule_that_is_not_a_schedule_is_named(name, value, kind):
    assert refused(name, schedule=value) == f"schedule={value!r} is a {kind}, not a Schedule ({SCHEDULE_DOC})"


def test_a_step_count_that_is_not_a_number_is_named_under_schedule():
    schedule = optimizers.Schedule("cosine", decay_steps="100")
    assert refused("async_sgd", schedule=schedule) == (
        "schedule.decay_steps='100' is not a number (updates the cosine takes from 1 to end_ratio (cosine, "
        "warmup_cosine); 0 = the whole run)")


# ---- numbers float32 cannot hold ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(optimizers.REGISTRY))
def test_a_learning_rate_below_float32s_smallest_normal_is_refused(name):
    """1e-50 is 0 in float32 (and a denormal is flushed to 0): the rows would never move."""
    assert problems(optimizers.REGISTRY[name](learning_rate=1e-50)) == [f"learning_rate=1e-50 {TINY}"]
    assert refused(name, learning_rate=1e-50) == f"learning_rate=1e-50 {TINY}"


def test_the_smallest_normal_float32_and_zero_are_not_below_it():
    assert problems(optimizers.AsyncSGD(learning_rate=1.1754943508222875e-38)) == []
    assert problems(optimizers.AsyncSGD(weight_decay=1e-45)) == [f"weight_decay=1e-45 {TINY}"]  # any hparam
    assert problems(optimizers.AsyncSGD(weight_decay=0.0)) == []  # 0 itself is exact in float32
    assert problems(optimizers.AsyncSGD(learning_rate=1e39)) == [
        "learning_rate=1e+39 is beyond float32's largest number (3.4e+38), the precision the update runs in: it "
        "would be inf there"]


# ---- words ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in optimizers.FUSED if "weight_decay_mode" in
                                  {f.name for f in dataclasses.fields(optimizers.REGISTRY[n])}])
def test_an_unknown_weight_decay_mode_lists_the_modes(name):
    assert refused(name, weight_decay_mode="bogus") == (
        "weight_decay_mode 'bogus' is not one of decoupled, l2, decoupled_global")
    assert optimizers.create(name, weight_decay_mode="l2").weight_decay_mode is optimizers.WeightDecayMode.l2
