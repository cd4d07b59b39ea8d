"""Hyperparameter checks: what ``optimizers.problems`` says of a value, and ``optimizers.create``, which refuses
what it finds, while building the class itself checks no range (the runner reports the same lines under its
own config keys)."""
from __future__ import annotations

import pytest

import optimizers
from optimizers import problems


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
    ("async_sgd", dict(schedule=optimizers.Schedule("step", step_factor=2.0)),
     "schedule.step_factor=2.0 is outside (0, 1] (the step schedule's multiplier per step)"),
    ("async_adam", dict(b1=1.0, eps=0.0), "b1=1.0 is outside [0, 1) (decay of the first-moment (mean) estimate); "
                                          "eps=0.0 is outside (0, inf) (added to sqrt(second moment): keeps the step "
                                          "finite for a zero gradient)"),
    ("async_sgd", dict(learning_rate=0.5, weight_decay=4.0, weight_decay_mode="decoupled_global"),
     "weight_decay=4.0 with learning_rate=0.5 decays a row by 1 - 2 per update under "
     "weight_decay_mode=decoupled_global: their product must be below 1"),
    ("adam", dict(learning_rate=float("nan")), "learning_rate=nan is outside (0, inf) (step size)"),
], ids=["negative-lr", "momentum", "step_factor", "two-at-once", "across-fields", "dense"])
def test_create_refuses_the_lines_of_problems(name, hparams, message):
    assert refused(name, **hparams) == message
    opt = optimizers.REGISTRY[name](**hparams)  # the class itself builds it: its caller reports the problems
    assert "; ".join(problems(opt)) == message


@pytest.mark.parametrize("name", list(optimizers.REGISTRY))
def test_create_builds_valid_hyperparameters_unchanged(name):
    opt = optimizers.create(name, learning_rate=0.25)
    assert opt == optimizers.REGISTRY[name](learning_rate=0.25) and opt.learning_rate == 0.25


# ---- an unknown hyperparameter -------------------------------------------------------------------------------
def test_an_unknown_hyperparameter_is_named_with_the_ones_the_optimizer_has():
    assert refused("async_sgd", momentum=0.9) == (
        "async_sgd has no hyperparameter 'momentum'; its hyperparameters: learning_rate, weight_decay, "
        "weight_decay_mode, schedule")
    assert refused("async_adam", learnig_rate=0.1, beta1=0.9) == (
        "async_adam has no hyperparameters 'learnig_rate' (did you mean learning_rate?), 'beta1'; its "
        "hyperparameters: learning_rate, b1, b2, eps, weight_decay, bias_correction, weight_decay_mode, schedule")
