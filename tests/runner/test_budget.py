"""The run's budget (runner/budget.py): trainer.steps or trainer.epochs, the model YAML's default, precedence of
the command line, refusals, the > MAX_EPOCHS warning and the epochs in the summary line."""
import logging
import math

import numpy as np
import pytest
from hydra.errors import ConfigCompositionException

from runner import budget
from runner.app import run
from runner.build import build
from runner.errors import PreflightError
from runner.tasks.sequential.synthetic import SequenceSpec, SequenceWorld
from tests.runner.support import compose_config, seq_config

SEQ = ["model=sequential", "data=synthetic_sequences"]  # the model's own budget, nothing shrunk


def hand_count_training_users(d) -> int:
    """Users the sequential task trains on, counted from the raw interactions: kept users (>= min_interactions
    rows) whose training prefix (all but the last two) has >= 2 items, i.e. >= 4 rows."""
    spec = SequenceSpec(**{k: d[k] for k in ("num_users", "num_items", "num_clusters", "min_length", "max_length",
                                             "noise", "zipf_a", "seed")})
    _, counts = np.unique(SequenceWorld(spec).interactions().user, return_counts=True)
    return int(np.sum((counts >= d.min_interactions) & (counts - 2 >= 2)))


def test_epochs_become_steps_from_the_data_size():
    cfg = seq_config("trainer.steps=null", "trainer.epochs=2.5")  # debug=tiny_sequences: 600 users, batch 64
    n = hand_count_training_users(cfg.data)
    _, task, _ = build(cfg)
    assert task.num_train_examples == n
    assert cfg.trainer.steps == math.ceil(2.5 * n / 64)
    b = budget.of(cfg, task)
    assert b.epochs == pytest.approx(cfg.trainer.steps * 64 / n) and b.source == "trainer.epochs=2.5"


def test_budget_arithmetic():
    assert budget.Budget.steps_for(50, 943, 128) == 369  # 50 * 943 / 128 = 368.4: rounded up
    b = budget.Budget(369, 128, 943)
    assert b.steps_per_epoch == pytest.approx(943 / 128) and b.epochs_at(0) == 0
    assert b.epochs == pytest.approx(369 * 128 / 943)
    assert budget.Budget(2000, 1024).epochs is None  # no finite training set: no epochs
    assert budget.derived_eval_interval(782, 25) == 100  # ceil(78.2) = 79, up to a multiple of 25
    assert budget.derived_eval_interval(24, 50) == 3  # a log interval longer than the eval interval is ignored


@pytest.mark.slow
def test_model_sequential_brings_an_epoch_budget_and_the_command_line_wins():
    cfg = compose_config(SEQ, tiny=False)
    assert cfg.trainer.steps is None and cfg.trainer.default_epochs == 50 and cfg.trainer.batch_size == 128
    _, task, _ = build(cfg)
    n = task.num_train_examples
    assert n == hand_count_training_users(cfg.data) == 2000
    assert cfg.trainer.steps == math.ceil(50 * n / 128) == 782  # not the ranking task's 3000 x 2048
    assert cfg.trainer.eval_interval == 100  # derived: at most 10 evaluations, on logged rows (every 25)
    assert budget.of(cfg, task).source == "trainer.default_epochs=50"

    cfg = compose_config(SEQ + ["trainer.steps=7"], tiny=False)
    build(cfg)
    assert cfg.trainer.steps == 7

    cfg = compose_config(SEQ + ["trainer.epochs=3", "trainer.eval_interval=13"], tiny=False)
    build(cfg)
    assert cfg.trainer.steps == math.ceil(3 * 2000 / 128) and cfg.trainer.eval_interval == 13

    # The ranking model keeps its budget in steps; an experiment's trainer.steps wins over the model's epochs.
    ranking = compose_config(tiny=False)
    assert ranking.trainer.steps == 3000 and ranking.trainer.batch_size == 2048
    assert compose_config(["experiment=ml100k_sasrec"], tiny=False).trainer.steps == 600


def test_steps_and_epochs_together_are_refused():
    with pytest.raises(PreflightError, match=r"trainer.steps=7 and trainer.epochs=3 are both set: give one"):
        build(compose_config(SEQ + ["trainer.steps=7", "trainer.epochs=3"], tiny=False))


def test_a_resolved_config_builds_again():
    cfg = seq_config("trainer.steps=null", "trainer.epochs=2")
    build(cfg)
    steps = cfg.trainer.steps
    build(cfg)  # steps and epochs are both set now, and agree
    assert cfg.trainer.steps == steps


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_bad_epochs_are_refused(value):
    with pytest.raises(PreflightError, match=rf"trainer.epochs={value.lstrip('-')}|trainer.epochs=-1"):
        build(seq_config("trainer.steps=null", f"trainer.epochs={value}"))


def test_bad_steps_and_no_budget_are_refused():
    with pytest.raises(PreflightError, match=r"trainer.steps=0"):
        build(seq_config("trainer.steps=0"))
    with pytest.raises(PreflightError, match=r"no training budget: set trainer.steps or trainer.epochs"):
        build(compose_config(["trainer.steps=null"]))


def test_epochs_are_refused_on_the_endless_synthetic_ranking_data():
    with pytest.raises(PreflightError, match=r"trainer.epochs=3.0: data=synthetic has no finite training set"):
        build(compose_config(["trainer.epochs=3"]))


def test_bad_progress_mode_is_refused_at_composition():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["trainer.progress=fancy"])
    assert "auto" in str(e.value.__cause__) and "lines" in str(e.value.__cause__)


@pytest.mark.slow
def test_a_budget_far_beyond_the_data_warns_once_and_the_summary_counts_epochs(tmp_path, caplog):
    # 20 users, batches of 64: 70 steps are 224 passes over the data.
    cfg = seq_config("data.num_users=20", "trainer.steps=70", "trainer.log_interval=35",
                     "trainer.eval_interval=1000", "trainer.progress=lines")
    caplog.set_level(logging.INFO, logger="runner")
    run(cfg, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "runner"]
    warnings = [ln for ln in lines if ln.startswith("warning:")]
    assert len(warnings) == 1 and f"more than {budget.MAX_EPOCHS} passes" in warnings[0], lines
    assert "70 steps of 64 = 224.0 epochs of 20 training examples" in warnings[0]
    assert any(ln.startswith("budget: 70 steps of 64 = 224.0 epochs") for ln in lines), lines
    assert any(ln.startswith("done: 70 steps (224.0 epochs), final train loss") for ln in lines), lines


def test_a_fitting_budget_does_not_warn():
    assert budget.Budget(369, 128, 943).warnings() == []
    assert budget.Budget(10**6, 1024).warnings() == []  # no epochs: nothing to compare with
