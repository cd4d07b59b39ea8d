"""Hostile inputs: every bad config value, mesh shape, data file and command-line argument ends with one clear
message that names the bad key and value and the fix, and a non-zero exit; never a bare traceback, never a
silent success.

In-process wherever possible (``build(compose_config(...))`` raises ``PreflightError``, which the CLI prints as
``error: ...`` with exit code 2; ``runner.report.main`` and ``runner.launch.main`` parse their arguments); a few
``slow`` subprocess cases prove the command line itself gives exit 2, one message and no traceback.
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import OmegaConf

from runner import launch, override_errors, report
from runner.__main__ import CONF_DIR, DEBUG_PRESETS, debug_preset_clash, refusal, searches
from runner.build import build
from runner.config import TrainerConfig
from runner.errors import PreflightError
from runner.preflight import check_selection
from tests.runner.support import ROOT, compose_config, seq_config


def refused(cfg) -> str:
    """The preflight message ``build`` refuses ``cfg`` with (and it is a message, not a traceback)."""
    with pytest.raises(PreflightError) as e:
        build(cfg)
    text = str(e.value)
    assert text.strip() and "Traceback" not in text
    return text


# ---- config values: each setting against the range declared beside its field ---------------------------

RANKING = [
    ("model.emb_width=0", "model.emb_width=0 is outside [1, 65536] (width of every table without its own)"),
    ("model.emb_width=-8", "model.emb_width=-8 is outside [1, 65536]"),
    ("model.hidden=[16,0]", "model.hidden=[16, 0] must list integers in [1, 65536], e.g. model.hidden=[128,64]"),
    ("model.tables.users.width=0", "model.tables.users.width=0 is outside [1, 65536]"),
    ("optimizer.learning_rate=1e39", "optimizer.learning_rate=1e+39 is beyond float32's largest number (3.4e+38), "
                                     "the precision the update runs in: it would be inf there"),
    ("dense_optimizer.learning_rate=-1e39", "dense_optimizer.learning_rate=-1e+39 is outside (0, inf)"),
    ("dense_optimizer.clip_norm=1e39", "dense_optimizer.clip_norm=1e+39 is beyond float32's largest number"),
    ("model.tables.items.width=16", "model.tables.<name>.width={'items': 16}: model=ranking's tables all have "
                                    "model.emb_width=8 (it adds item and author rows and multiplies the user's with "
                                    "them); unset them, or set model.emb_width"),
    ("model.tables.items.init_scale=-1", "model.tables.items.init_scale=-1.0 is outside [0, inf)"),
    ("model.tables.users.vocab=5", "model.tables.users.vocab=5 is too small: the data's users ids go up to 300, "
                                   "so the table needs >= 301 rows"),
    ("data.num_users=0", "data.num_users=0 is outside [1, 100000000] (user ids 1..num_users)"),
    ("data.num_items=-5", "data.num_items=-5 is outside [1, 100000000]"),
    ("data.num_authors=1000000000", "data.num_authors=1000000000 is outside [1, 100000000]"),
    ("data.history_len=0", "data.history_len=0 is outside [1, 4096]"),
    ("data.latent_dim=0", "data.latent_dim=0 is outside [1, 4096]"),
    ("data.zipf_a=nan", "data.zipf_a=nan is outside [0, 20]"),
    ("data.zipf_a=-1", "data.zipf_a=-1.0 is outside [0, 20]"),
    ("data.seed=-1", "data.seed=-1 is outside [0, 4294967295]"),
    ("data.actions=[]", "data.actions=[] must list one or more distinct non-empty action names"),
    ("data.actions=[click,click]", "data.actions=['click', 'click'] must list one or more distinct"),
    ("trainer.steps=0", "trainer.steps=0 is outside [1, inf)"),
    ("trainer.batch_size=0", "trainer.batch_size=0 is outside [1, 16777216]"),
    ("trainer.batch_size=1000000000", "trainer.batch_size=1000000000 is outside [1, 16777216]"),
    ("trainer.seed=-1", "trainer.seed=-1 is outside [0, 4294967295]"),
    ("trainer.log_interval=0", "trainer.log_interval=0 is outside [1, inf)"),
    ("trainer.eval_interval=-1", "trainer.eval_interval=-1 is outside [1, inf)"),
    ("trainer.early_stop_patience=0", "trainer.early_stop_patience=0 is outside [1, inf) (stop after this many "
                                      "evaluations in a row without an improvement"),
    ("trainer.eval_batches=0", "trainer.eval_batches=0 is outside [1, 1000000]"),
    ("dense_optimizer.learning_rate=0", "dense_optimizer.learning_rate=0.0 is outside (0, inf)"),
    ("dense_optimizer.learning_rate=inf", "dense_optimizer.learning_rate=inf is outside (0, inf)"),
    ("dense_optimizer.learning_rate=nan", "dense_optimizer.learning_rate=nan is outside (0, inf)"),
    ("dense_optimizer.b1=1.0", "dense_optimizer.b1=1.0 is outside [0, 1) (decay of the first-moment estimate)"),
    ("dense_optimizer.b2=-0.1", "dense_optimizer.b2=-0.1 is outside [0, 1)"),
    ("dense_optimizer.weight_decay=-1e-4", "dense_optimizer.weight_decay=-0.0001 is outside [0, inf)"),
    ("dense_optimizer.clip_norm=0", "dense_optimizer.clip_norm=0.0 is outside (0, inf)"),
    ("dense_optimizer.warmup_steps=-1", "dense_optimizer.warmup_steps=-1 is outside [0, inf)"),
    ("dense_optimizer.end_learning_rate_ratio=2", "dense_optimizer.end_learning_rate_ratio=2.0 is outside [0, 1]"),
    ("async_emb.staleness=0", "async_emb.staleness=0 is outside [1, 64] (steps a deferred embedding update waits"),
    ("async_emb.staleness=65", "async_emb.staleness=65 is outside [1, 64]"),
    ("async_emb.dc_lambda=0", "async_emb.dc_lambda=0.0 is outside (0, inf) (delay compensation's lambda"),
    ("async_emb.dc_lambda=nan", "async_emb.dc_lambda=nan is outside (0, inf)"),
    ("async_emb.dc_lambda=inf", "async_emb.dc_lambda=inf is outside (0, inf)"),
    ("logger.project=a/b", "logger.project='a/b' must be a non-empty name of at most 128 characters"),
    ("logger.project=''", "logger.project='' must be a non-empty name"),
    ("logger.tags=['']", "logger.tags has '': each tag must be non-empty and at most 64 characters"),
    ("logger.group=''", "logger.group='' must be null or a non-empty name"),
    ("logger.entity=a/b", "logger.entity='a/b' must be null or a non-empty name of at most 128 characters without "
                          "any of / \\ # ? % :"),
]


@pytest.mark.parametrize("override, needle", RANKING, ids=[o for o, _ in RANKING])
@pytest.mark.slow
def test_ranking_config_value_is_refused_by_name(override, needle):
    assert needle in refused(compose_config([override]))


def test_all_problems_are_reported_together():
    text = refused(compose_config(["model.emb_width=0", "data.num_users=0", "dense_optimizer.b1=1.0"]))
    assert text.startswith("invalid config:\n  - ")
    assert "model.emb_width=0" in text and "data.num_users=0" in text and "dense_optimizer.b1=1.0" in text


SEQUENTIAL = [
    ("model.emb_width=0", "model.emb_width=0 is outside [1, 65536] (item embedding and hidden width)"),
    ("model.num_blocks=-1", "model.num_blocks=-1 is outside [0, 1024]"),
    ("model.num_heads=0", "model.num_heads=0 is outside [1, 65536]"),
    ("model.num_heads=3", "model.num_heads=3 must divide model.emb_width=16"),
    ("model.ffn_mult=0", "model.ffn_mult=0 is outside [1, 1024]"),
    ("model.dropout=1.0", "model.dropout=1.0 is outside [0, 1) (dropout rate)"),
    ("model.temperature=0", "model.temperature=0.0 is outside (0, inf) (logits are divided by this)"),
    ("model.num_negatives=0", "model.num_negatives=0 is outside [1, 100000000]"),
    ("data.max_len=0", "data.max_len=0 is outside [1, 65536]"),
    ("data.min_interactions=2", "data.min_interactions=2 is outside [3, inf)"),
    ("data.ks=[0]", "data.ks=[0] must list one or more integers in [1, 65536], e.g. data.ks=[10]"),
    ("data.ks=[]", "data.ks=[] must list one or more integers"),
    ("data.ks=[10,5,10]", "data.ks=[10, 5, 10] lists a cutoff twice: list each once, e.g. [5, 10]"),
    ("data.num_users=0", "data.num_users=0 is outside [1, 100000000]"),
    ("data.num_items=0", "data.num_items=0 is outside [1, 100000000]"),
    ("data.num_clusters=0", "data.num_clusters=0 is outside [1, 100000000]"),
    ("data.num_clusters=500", "data.num_clusters=500 must be in 1..num_items=200"),
    ("data.min_length=2", "data.min_length=2 is outside [3, 65536]"),
    ("data.max_length=3", "data.max_length=3 is outside [4, 65536] (longest sequence, >= min_length; training "
                          "needs sequences of >= 4 items)"),
    ("data.noise=1.5", "data.noise=1.5 is outside [0, 1]"),
    ("data.zipf_a=-1", "data.zipf_a=-1.0 is outside [0, 20]"),
    ("data.seed=-3", "data.seed=-3 is outside [0, 4294967295]"),
]


@pytest.mark.parametrize("override, needle", SEQUENTIAL, ids=[o for o, _ in SEQUENTIAL])
def test_sequential_config_value_is_refused_by_name(override, needle):
    assert needle in refused(seq_config(override))


def test_a_cutoff_that_reaches_the_whole_catalogue_is_warned_about():
    """HR@k is 1 for every model and baseline when k reaches the number of items (NDCG@k still ranks them)."""
    _, task, _ = build(seq_config("data.ks=[500,10]"))
    assert task.warnings() == [
        "warning: data.ks=[500, 10]: a cutoff of 500 reaches every one of the data's 200 items, so HR@500 is 1 for "
        "every model and baseline (NDCG and MRR still rank them); cutoffs below 200 tell them apart"]
    assert build(seq_config())[1].warnings() == []


def test_in_batch_negatives_over_one_training_sequence_are_refused():
    """Every row of a batch is then the same sequence, masked as a hit: the run trained nothing and ended ok."""
    assert ("model.negatives=in_batch takes the other sequences of a batch as negatives, and the data has 1 training "
            "sequence (a batch holds copies of it, masked as hits: the loss would be 0 and nothing trained): use "
            "model.negatives=uniform, or data with more users") in refused(
        seq_config("data.num_users=1", "model.negatives=in_batch"))


@pytest.mark.parametrize("overrides, needle", [
    (["async_emb=off", "async_emb.compensation=dc"],
     "async_emb.compensation=dc corrects a deferred update for its delay, and with async_emb.enabled=false no update "
     "is deferred: use async_emb=on, or async_emb.compensation=none"),
    (["async_emb=off", "async_emb.staleness=2"],
     "async_emb.staleness=2 needs async mode (async_emb.enabled=false applies each step's update in its own step): "
     "use async_emb=on, or leave staleness at 1"),
], ids=["compensation-with-async-off", "staleness-with-async-off"])
def test_async_settings_without_async_mode_are_refused(overrides, needle):
    assert needle in refused(compose_config(overrides))


def test_wrong_type_is_refused_when_composing():
    with pytest.raises(ConfigCompositionException, match="async_emb.compensation"):
        compose_config(["async_emb.compensation=later"])
    with pytest.raises(ConfigCompositionException, match="async_emb.staleness=1.5"):
        compose_config(["async_emb.staleness=1.5"])
    with pytest.raises(ConfigCompositionException, match="model.emb_width=abc"):
        compose_config(["model.emb_width=abc"])


# ---- debug presets: each with the models and data sources it is written for ------------------------------

FOR_RANKING = "debug=tiny is written for model=ranking on data=synthetic, not for "
PRESET_CLASHES = [
    (["debug=tiny", "model=dlrm"], FOR_RANKING + "this run's model=dlrm on data=synthetic; use debug=tiny_criteo in "
                                                 "its place (model=dlrm/dcn on data=criteo)"),
    (["debug=tiny", "model=dcn"], FOR_RANKING + "this run's model=dcn on data=synthetic; use debug=tiny_criteo in its "
                                                "place (model=dlrm/dcn on data=criteo)"),
    (["debug=tiny", "model=sequential"], FOR_RANKING + "this run's model=sequential on data=synthetic; use "
                                                       "debug=tiny_sequences in its place (model=sequential on "
                                                       "data=synthetic_sequences)"),
    (["debug=tiny", "experiment=criteo_synthetic"],
     FOR_RANKING + "this run's model=dlrm on data=criteo (experiment=criteo_synthetic); use debug=tiny_criteo in its "
                   "place"),
    (["-m", "debug=tiny", "model=ranking,dcn"], FOR_RANKING + "the sweep trial's model=dcn on data=synthetic; use "
                                                              "debug=tiny_criteo in its place (model=dlrm/dcn on "
                                                              "data=criteo)"),
    (["debug=tiny_sequences", "model=dlrm"], "debug=tiny_sequences is written for model=sequential on "
                                             "data=synthetic_sequences, not for this run's model=dlrm on "
                                             "data=synthetic_sequences; use debug=tiny_criteo in its place "
                                             "(model=dlrm/dcn on data=criteo)"),
    (["debug=tiny_sequences", "data=movielens"], "debug=tiny_sequences is written for model=sequential on "
                                                 "data=synthetic_sequences, not for this run's model=sequential on "
                                                 "data=movielens; no debug preset shrinks model=sequential on "
                                                 "data=movielens: leave debug out and shrink the run by hand "
                                                 "(trainer.steps, trainer.batch_size, model.emb_width)"),
]


@pytest.mark.parametrize("args, message", PRESET_CLASHES, ids=[" ".join(a) for a, _ in PRESET_CLASHES])
def test_a_debug_preset_for_another_model_or_data_is_refused_naming_the_one_for_them(args, message):
    """Hydra stopped inside composition with "Key 'hidden' not in 'DLRMModelConfig'" (exit 1); the choices are
    Hydra's own, so a model an experiment picks, or one trial of a sweep, is named too."""
    assert debug_preset_clash(args) == message


@pytest.mark.parametrize("args", [["debug=tiny"], ["debug=tiny_criteo"], ["debug=tiny_criteo", "model=dcn"],
                                  ["debug=tiny_sequences"], ["debug=tiny_sequences", "experiment=ml1m_sasrec"],
                                  ["model=dlrm", "data=criteo"], ["debug=tiny", "model=ranking,dcn"],
                                  ["debug=tiny", "model=nope"], ["--cfg", "job", "debug=tiny", "model=ranking"]])
def test_a_debug_preset_for_its_own_model_and_data_or_an_error_of_hydras_passes(args):
    """The presets' own (the experiment's data replaced by the preset's), and what Hydra reports itself: a sweep
    without -m, a model that does not exist."""
    assert debug_preset_clash(args) is None


@pytest.mark.slow
def test_the_presets_table_is_conf_debug_and_names_a_preset_for_every_model():
    """Each preset composes with each model and data source it lists, every model has one, and any other model
    with it is refused (a new preset or model must be added to runner.__main__.DEBUG_PRESETS)."""
    assert set(DEBUG_PRESETS) == {p.stem for p in (ROOT / "conf" / "debug").glob("*.yaml")}
    models = {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")}
    assert set().union(*(m for m, _ in DEBUG_PRESETS.values())) == models
    for preset, (theirs, datas) in DEBUG_PRESETS.items():
        for model in theirs:
            for data in datas:
                compose_config([f"debug={preset}", f"model={model}", f"data={data}"], tiny=False)
        for model in models - set(theirs):
            assert debug_preset_clash([f"debug={preset}", f"model={model}"]).startswith(f"debug={preset} is written ")


# ---- embedding optimizer hyperparameters: the ranges each optimizer class declares ---------------------

@dataclasses.dataclass(frozen=True)
class PlainSGD:
    """A user's optimizer class that declares no ranges (plain fields): its learning rate is still checked."""

    learning_rate: float = 0.1
    weight_decay: float = 0.0


OPTIMIZER = [
    (["optimizer.learning_rate=inf"], "optimizer.learning_rate=inf is outside (0, inf) (step size)"),
    (["optimizer.learning_rate=nan"], "optimizer.learning_rate=nan is outside (0, inf)"),
    (["optimizer.learning_rate=-0.1"], "optimizer.learning_rate=-0.1 is outside (0, inf)"),
    (["optimizer.learning_rate=1e-50"], "optimizer.learning_rate=1e-50 is below float32's smallest normal number "
                                        "(1.18e-38), the precision the update runs in: it would be 0 there"),
    (["optimizer.eps=0"], "optimizer.eps=0.0 is outside (0, inf) (added to sqrt(second moment)"),
    (["optimizer.b2=1.0"], "optimizer.b2=1.0 is outside [0, 1)"),
    (["optimizer.weight_decay=-1"], "optimizer.weight_decay=-1.0 is outside [0, inf)"),
    (["optimizer=async_rowwise_adagrad", "optimizer.learning_rate=0"], "optimizer.learning_rate=0.0 is outside"),
    (["optimizer=async_ftrl", "optimizer.lr_power=0.5"], "optimizer.lr_power=0.5 is outside [-4, 0] (the "
                                                             "per-coordinate step is learning_rate / n**(-lr_power)"),
    (["optimizer=async_ftrl", "optimizer.lr_power=-100"], "optimizer.lr_power=-100.0 is outside [-4, 0]"),
    (["optimizer=async_ftrl", "optimizer.initial_accumulator=0"], "optimizer.initial_accumulator=0.0 is outside "
                                                                  "(0, inf)"),
    (["optimizer=async_ftrl", "optimizer.l1=-0.1"], "optimizer.l1=-0.1 is outside [0, inf) (L1 strength"),
    (["optimizer=async_ftrl", "optimizer.l2=nan"], "optimizer.l2=nan is outside [0, inf)"),
    (["optimizer=async_ftrl", "optimizer.beta=-1"], "optimizer.beta=-1.0 is outside [0, inf)"),
    (["optimizer=async_rowwise_adagrad_momentum", "optimizer.momentum=1"],
     "optimizer.momentum=1.0 is outside [0, 1) (decay of the momentum buffer per touch"),
    (["optimizer=async_partial_rowwise_adam", "optimizer.b2=1"], "optimizer.b2=1.0 is outside [0, 1) (decay of the "
                                                                  "per-row second-moment estimate)"),
    (["optimizer.schedule.kind=warmup"], "optimizer.schedule.warmup_steps=0 must be at least 1 for kind=warmup"),
    (["optimizer=async_sgd", f"optimizer._target_={__name__}.PlainSGD", "optimizer.weight_decay_mode=l2"],
     "got an unexpected keyword argument 'weight_decay_mode'"),  # a value it was asked for is never dropped
    (["optimizer.weight_decay=100", "optimizer.weight_decay_mode=decoupled_global"],
     "optimizer.weight_decay=100.0 with learning_rate=0.02 decays a row by 1 - 2 per update under "
     "weight_decay_mode=decoupled_global: their product must be below 1"),
    (["optimizer.schedule.kind=warmup_cosine", "optimizer.schedule.warmup_steps=7"],
     "optimizer.schedule.warmup_steps=7 is longer than the run (trainer.steps=6): the learning rate would never "
     "reach optimizer.learning_rate; shorten the warmup or lengthen the run"),
    (["optimizer=async_sgd", f"optimizer._target_={__name__}.PlainSGD", "optimizer.schedule.kind=cosine"],
     "optimizer.schedule.kind=cosine: PlainSGD has no learning-rate schedule (no 'schedule' field); use a fused "
     "optimizer (e.g. optimizer=async_adam)"),
    (["optimizer.schedule.kind=step", "optimizer.schedule.step_factor=2"],
     "optimizer.schedule.step_factor=2.0 is outside (0, 1] (the step schedule's multiplier per step)"),
    (["+optimizer@table_optimizers.users=async_sgd", "table_optimizers.users.schedule.end_ratio=1.5"],
     "table_optimizers.users.schedule.end_ratio=1.5 is outside [0, 1]"),
    (["optimizer=adam", "async_emb=off", "optimizer.learning_rate=inf"], "optimizer.learning_rate=inf is outside"),
    (["+optimizer@table_optimizers.items=async_adam", "table_optimizers.items.b1=1.0"],
     "table_optimizers.items.b1=1.0 is outside [0, 1) (decay of the first-moment (mean) estimate)"),
    (["optimizer=async_sgd", f"optimizer._target_={__name__}.PlainSGD", "optimizer.learning_rate=inf"],
     "optimizer.learning_rate=inf is outside (0, inf) (step size of PlainSGD: a finite number > 0)"),
    (["optimizer._target_=nope.Nope"], "optimizer._target_='nope.Nope' cannot be built: Error locating target "
                                       "'nope.Nope'"),
    (["+optimizer@table_optimizers.users=async_sgd", "table_optimizers.users._target_=optimizers.Missing"],
     "table_optimizers.users._target_='optimizers.Missing' cannot be built"),
    (["+table_optimizers.items={learning_rate:0.1}"], "table_optimizers.items={'learning_rate': 0.1} names no "
                                                      "optimizer class (_target_); pick one with "
                                                      "+optimizer@table_optimizers.items=async_adam"),
    (["optimizer._target_=optimizers.AsyncSGD", "optimizer.eps=1e-7"],  # async_adam's group, eps not its default
     "optimizer._target_='optimizers.AsyncSGD' cannot be built: Error in call to target "
     "'optimizers.async_sgd.AsyncSGD': TypeError(\"AsyncSGD.__init__() got an unexpected keyword argument 'eps'\")"),
    (["+table_optimizers.items={_target_:optimizers.AsyncSGD,lr:0.1}"],
     "table_optimizers.items._target_='optimizers.AsyncSGD' cannot be built: Error in call to target "
     "'optimizers.async_sgd.AsyncSGD': TypeError(\"AsyncSGD.__init__() got an unexpected keyword argument 'lr'\")"),
]


@pytest.mark.parametrize("overrides, needle", OPTIMIZER, ids=[" ".join(o) for o, _ in OPTIMIZER])
def test_optimizer_hyperparameter_is_refused_by_name(overrides, needle):
    assert needle in refused(compose_config(list(overrides)))


@pytest.mark.parametrize("group", ["async_adam", "async_rowwise_adagrad", "async_ftrl"])
def test_another_class_in_an_optimizer_group_is_built_without_the_groups_untouched_defaults(group):
    """The group's own defaults the class does not take are left out, whichever group it is: each group's, not
    one merged over every optimizer (where async_adagrad's eps differs from async_adam's and was not dropped)."""
    from optimizers import AsyncSGD

    program = build(compose_config([f"optimizer={group}", "optimizer._target_=optimizers.AsyncSGD",
                                    "optimizer.learning_rate=0.3"]))[0]
    opt = program.emb_optimizers["users"]
    assert type(opt) is AsyncSGD and opt.learning_rate == 0.3


# ---- the objective: a metric the task reports, checked before compiling --------------------------------

def test_unknown_objective_is_refused_with_the_task_metrics():
    text = refused(compose_config(["trainer.objective=nope/metric"]))
    assert text.startswith("trainer.objective='nope/metric' is not a metric this run reports; use one of "
                           "valid/auc_click, ")
    assert "(or trainer.objective=null for the task's own, valid/auc_mean)" in text
    text = refused(seq_config("trainer.objective=valid/ndcg@20"))
    assert "trainer.objective='valid/ndcg@20' is not a metric" in text and "valid/ndcg@10" in text


def test_selection_with_an_objective_no_evaluation_reports_goes_by_the_validation_metric():
    build(compose_config(["trainer.objective=final/train_loss", "trainer.early_stop_patience=3"]))  # not refused
    task = SimpleNamespace(objective="eval/x", metric_names=lambda: ["valid/x"])  # a task whose own is not evaluated
    with pytest.raises(PreflightError) as info:
        check_selection(OmegaConf.create({"objective": None, "early_stop_patience": 3}), task)
    assert str(info.value) == ("trainer.early_stop_patience=3 select on a validation metric each evaluation reports "
                               "(trainer.objective when it is one, else the task's own), but 'eval/x' is not an "
                               "evaluation metric; set trainer.objective to one of valid/x, or drop "
                               "trainer.early_stop_patience")


@pytest.mark.parametrize("cfg, objective", [
    (lambda o: compose_config([o]), "test/auc_like"),
    (lambda o: compose_config([o]), "final/train_loss"),
    (lambda o: seq_config(o), "test/ndcg@10"),
    (lambda o: seq_config(o, "data.ks=[5,20]"), "valid/hr@20"),
])
def test_known_objectives_pass(cfg, objective):
    build(cfg(f"trainer.objective={objective}"))


def test_a_reference_metric_as_the_objective_is_refused():
    text = refused(compose_config(["trainer.objective=bayes/valid/auc_mean"]))
    assert text.startswith("trainer.objective='bayes/valid/auc_mean' is a reference the model is compared with (the "
                           "same whatever it learns), so a sweep would compare constants; use one of the model's: "
                           "valid/auc_click, ")
    assert "bayes/" not in text.split("model's: ")[1]
    for reference in ("oracle/valid/hr@10", "popularity/test/ndcg@10"):
        assert refused(seq_config(f"trainer.objective={reference}")).startswith(
            f"trainer.objective='{reference}' is a reference the model is compared with")


def test_metric_names_are_what_evaluate_returns():
    """The objective check trusts ``metric_names``: it must list exactly ``evaluate``'s keys."""
    _, task, _ = build(compose_config())
    got = task.evaluate(lambda s, b: np.full((len(b["user"]), len(task.actions)), 0.5), None, lambda b: b, 32)
    assert sorted(got) == sorted(task.metric_names())
    _, task, _ = build(seq_config("data.ks=[5,10]"))
    n = task.data.num_items + 1
    got = task.evaluate(lambda s, b: np.zeros((b["inputs"].shape[0], n), np.float32), None, lambda b: b, 64)
    assert sorted(got) == sorted(task.metric_names())


# ---- mesh shapes: refused before any device is created ---------------------------------------------------

MESH = [
    (["mesh.cpu_devices=0"], "mesh.cpu_devices=0 is outside [1, 4096]"),
    (["mesh.cpu_devices=-1"], "mesh.cpu_devices=-1 is outside [1, 4096]"),
    (["mesh.cpu_devices=100000"], "mesh.cpu_devices=100000 is outside [1, 4096] (virtual CPU devices to create "
                                  "before JAX starts; CPU only)"),
    (["mesh=data", "mesh.cpu_devices=5"], "trainer.batch_size=32 does not divide over the 5 devices of "
                                          "mesh.axes={'data': -1} with mesh.cpu_devices=5; use a multiple of 5"),
    (["mesh=data_table", "mesh.cpu_devices=6", "mesh.axes.table=4"],
     "6 devices do not divide by the fixed axes' product 4"),
    (["mesh=data_table", "mesh.cpu_devices=2", "mesh.axes={data:2,table:2}"],
     "mesh.axes={'data': 2, 'table': 2} needs 4 devices but mesh.cpu_devices=2"),
    (["mesh.axes={data:0}"], "mesh.axes {'data': 0}: axis sizes must be positive or -1"),
    (["mesh=data_table", "mesh.axes={data:-1,table:3}"], "8 devices do not divide by the fixed axes' product 3"),
    (["mesh.axes={data:100000}"], "mesh data=100000 needs 100000 devices but only 8 exist; shrink mesh.axes"),
]


@pytest.mark.parametrize("overrides, needle", MESH, ids=[" ".join(o) for o, _ in MESH])
def test_mesh_shape_is_refused_by_name(overrides, needle):
    assert needle in refused(compose_config(list(overrides)))


# ---- data files ------------------------------------------------------------------------------------------

def udata(rows) -> str:
    return "".join(f"{u}\t{i}\t5\t{t}\n" for u, i, t in rows)


def users(n_users: int, length: int, first_item=lambda u: 1):
    return [(u, first_item(u) + k, k) for u in range(1, n_users + 1) for k in range(length)]


def write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def bad_line_file() -> str:
    lines = udata(users(20, 6)).splitlines(True)
    lines[40] = "7\tabc\t5\t9\n"
    return "".join(lines)


DATA = {
    "missing": (None, "interaction data not found: {path}"),
    "empty": ("", "{path}: file is empty"),
    "binary": (b"\x00\x01\x02binary\x00" * 100, "{path}: unknown interaction file format (binary content, not UTF-8 text)"),
    "binary_no_nul": (bytes(np.random.default_rng(0).integers(1, 256, 5000, dtype=np.uint8)),
                      "{path}: unknown interaction file format (binary content, not UTF-8 text)"),
    "gzip": (gzip.compress(b"1::2::5::100\n" * 100), "{path}: a compressed file or archive (gzip/zip/bz2/xz/zstd): "
                                                     "extract it first"),
    "wrong_columns": ("a,b,c\n1,2,3\n", "{path}: unknown interaction file format (no user or item column among "
                                        "a, b, c)"),
    "one_column": ("user\n1\n2\n", "{path}: unknown interaction file format (first line has no tab, comma, "
                                   "semicolon or '::' separator: 'user')"),
    "bad_line": (bad_line_file(), "{path}:41: malformed ml-100k line (column 'item' must be an integer, got 'abc'): "
                                  "'7\\tabc\\t5\\t9'"),
    "id_beyond_int64": (udata([(u, i + 2**64, t) for u, i, t in users(10, 5)]),
                        "{path}:1: malformed ml-100k line (column 'item' must be an integer, got "
                        "'18446744073709551617')"),
    "too_few": (udata(users(30, 2)), "{path}: no user has >= 3 interactions (data.min_interactions; the longest "
                                     "sequence has 2)"),
    "exactly_three": (udata(users(30, 3, first_item=lambda u: u)),
                      "{path}: no user can be trained on: the longest kept sequence has 3 interactions, and "
                      "leave-one-out training needs a user with >= 4"),
    "empty_dir": ("DIR", "{path}: directory holds no interaction file"),
    "header_only": ("user,item,timestamp\n", "{path}: file is empty (no interactions after the header)"),
    "float_ids": ("user,item\n1,2\n1,2.5\n", "{path}:3: malformed csv line (item id must be an integer, got 2.5)"),
    "empty_field": ("user,item\n1,2\n,3\n", "{path}:3: malformed csv line (user id is empty): ',3'"),
    # one decimal makes pyarrow read the whole column as float64, which would merge ids past 2**53
    "ids_read_as_floats": ("user,item\n9007199254740993,2\n9007199254740994.0,3\n",
                           "{path}:2: malformed csv line (user id 9007199254740992 cannot be read exactly: the user "
                           "column holds a value that is not a plain integer (a decimal such as '1.0', or one outside "
                           "int64), so the whole column is read as 64-bit floats"),
    "corrupt_parquet": (b"PAR1" + b"garbage" * 50, "{path}: cannot read Parquet file: Parquet magic bytes not found"),
}
SUFFIX = {"wrong_columns": ".csv", "one_column": ".csv", "binary_no_nul": ".csv", "header_only": ".csv",
          "float_ids": ".csv", "empty_field": ".csv", "corrupt_parquet": ".parquet", "ids_read_as_floats": ".csv"}


@pytest.mark.parametrize("case", list(DATA))
def test_bad_data_file_is_refused_naming_the_file(tmp_path, case):
    content, needle = DATA[case]
    path = tmp_path / f"{case}{SUFFIX.get(case, '.data')}"
    if content == "DIR":
        path.mkdir()
    elif content is not None:
        write(tmp_path, path.name, content)
    text = refused(seq_config(data=["data=movielens", f"data.path={path}"]))
    assert text.startswith(f"data.path='{path}' cannot be used: ")
    assert needle.format(path=path) in text
    assert text.count("Fix data.path") == 1 and ".." not in text.replace("...", "")
    assert "\ufffd" not in text and "\x00" not in text  # no binary garbage echoed to the terminal


@pytest.mark.parametrize("layout", ["top", "subfolders"])
def test_a_folder_holding_several_interaction_files_is_refused_naming_them(tmp_path, layout):
    """Two files the loader recognises by name (a MovieLens ratings.dat beside a converted ratings.csv): which
    one is meant is not guessed, in the folder or in its subfolders."""
    data = tmp_path / "data"
    where = (data, data) if layout == "top" else (data / "a", data / "b")
    for d in where:
        d.mkdir(parents=True, exist_ok=True)
    write(where[0], "ratings.dat", "".join(f"{u}::{i}::5::{t}\n" for u, i, t in users(10, 5)))
    write(where[1], "ratings.csv", "userId,movieId,rating,timestamp\n1,2,5,3\n")
    text = refused(seq_config(data=["data=movielens", f"data.path={data}"]))
    names = ("ratings.dat, ratings.csv" if layout == "top" else "a/ratings.dat, b/ratings.csv")
    assert f"{data}: directory holds several interaction files ({names}); pass one of them" in text


@pytest.mark.parametrize("offset", [-(2**40), 2**40], ids=["negative_ids", "ids_beyond_int32"])
def test_negative_and_huge_raw_ids_are_remapped_not_refused(tmp_path, offset):
    """Raw ids are only labels: the loader maps users to 0..U-1 and items to 1..N, so ids that are negative or
    do not fit int32 train like any others (the tables never see them)."""
    path = write(tmp_path, "u.data", udata([(u + offset, i + offset, t) for u, i, t in users(40, 6)]))
    _, task, _ = build(seq_config(data=["data=movielens", f"data.path={path}"]))
    assert task.data.num_users == 40 and task.data.num_items == 6
    assert task.data.item_ids[1] == 1 + offset
    b = task.batch(0, 64)
    assert b["inputs"].dtype == np.int32 and 0 <= b["inputs"].min() and b["inputs"].max() <= 6


# ---- python -m runner.report / runner.launch arguments ------------------------------------------------------

def test_report_refuses_an_empty_folder_and_writes_nothing(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} holds no trial")
    assert "metrics.jsonl" in err and ".hydra/overrides.yaml" in err  # what it expected
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "out"
    assert report.main([str(tmp_path), "--out", str(out)]) == 2 and not out.exists()


@pytest.mark.parametrize("kind", ["missing", "file", "out_is_file"])
def test_report_bad_arguments(tmp_path, capsys, kind):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')
    (tmp_path / "f.txt").write_text("x")
    argv, needle = {
        "missing": ([str(tmp_path / "nope")], f"error: {tmp_path / 'nope'} does not exist"),
        "file": ([str(tmp_path / "f.txt")], f"error: {tmp_path / 'f.txt'} is a file, not a folder"),
        "out_is_file": ([str(tmp_path / "run"), "--out", str(tmp_path / "f.txt")],
                        f"error: --out {tmp_path / 'f.txt'} is a file"),
    }[kind]
    assert report.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(needle) and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run" / "report.md").exists()


@pytest.mark.parametrize("argv, needle", [
    (["-n", "0"], "error: -n 0: need at least one process"),
    (["-n", "-3", "--", "trainer.steps=1"], "error: -n -3: need at least one process"),
    (["-n", "100000"], "error: -n 100000: at most 256 processes on one machine (for more, use distributed=slurm"),
    (["-n", "abc"], "error: argument -n/--num-processes: invalid int value: 'abc'"),
    ([], "error: the following arguments are required: -n/--num-processes"),
    (["-n", "2", "trainer.steps=3"], "error: runner overrides go after --, e.g. python -m runner.launch -n 2 -- "
                                     "trainer.steps=3"),
    (["-n", "2", "--port", "70000", "--"], "error: --port 70000: a TCP port must be in 1..65535"),
    (["-n", "2", "--grace", "nan"], "error: --grace nan: must be a finite number of seconds >= 0"),
    # two independent trainings writing one folder's records, or processes that cannot meet
    (["-n", "2", "--", "debug=tiny", "distributed=none"], "error: distributed=none: runner.launch sets "
                                                          "distributed=local and each process's id, their count"),
    (["-n", "2", "--", "distributed.process_id=0"], "error: distributed.process_id=0: runner.launch sets"),
    (["-n", "2", "--", "+distributed.num_processes=3"], "error: +distributed.num_processes=3: runner.launch sets"),
])
def test_launch_bad_arguments(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        launch.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err  # one line, no usage block above it


def test_a_key_added_with_plus_that_no_section_declares_is_refused_naming_the_closest_setting():
    message = refused(compose_config(["+trainer.eval_intervals=5", "+model.tables.items.qux=1", "+baz=1"]))
    assert message.splitlines()[1:] == [
        "  - baz is not a setting of the config (added with +baz=...), so nothing would read it: remove it; `runner "
        "--cfg job` lists the settings",
        "  - model.tables.items.qux is not a setting of model.tables.items (added with +model.tables.items.qux=...), so "
        "nothing would read it: remove it; `runner --cfg job` lists the settings",
        "  - trainer.eval_intervals is not a setting of trainer (added with +trainer.eval_intervals=...), so nothing "
        "would read it: remove it (or set trainer.eval_interval, the closest setting); `runner --cfg job` lists the "
        "settings"]
    # an optimizer's keys are its class's keyword arguments (a user's class takes its own): the class checks them
    from runner.preflight import unknown_keys

    assert unknown_keys(compose_config(["+optimizer.fail_at=1"])) == []


def test_launch_refuses_a_port_already_taken_before_starting_a_process(capsys):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            launch.main(["-n", "2", "--port", str(port), "--", "debug=tiny"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m runner.launch: error: --port {port}: the coordinator cannot listen there (Address already in use; "
        f"another run may hold it); pick another, or leave --port out for a free one; see python -m runner.launch "
        f"--help\n")
    assert launch.port_problem(port) is None  # free again


@pytest.fixture
def started(monkeypatch):
    """The command lines ``launch.main`` hands ``supervise`` (which starts the processes); none is started."""
    calls: list = []
    monkeypatch.setattr(launch, "supervise", lambda cmds, **kw: calls.append(cmds) or 0)
    return calls


@pytest.mark.parametrize("overrides, said", [
    (["debug=tiny", "trainer.steps=abc"], "trainer.steps=abc: trainer.steps takes an integer in [1, inf), or null, "
                                          "not 'abc'"),
    (["trainer.stpes=3"], "trainer.stpes=3: trainer has no key 'stpes'; did you mean trainer.steps? (`python -m "
                          "runner --cfg job` lists the settings)"),
    (["optimizer=adamm"], "optimizer=adamm: the config group optimizer has no option 'adamm'; did you mean "
                          "optimizer=adam? its options: "),
    (["trainer.steps"], "override 'trainer.steps' has no '=': give it a value (trainer.steps=<value>)"),
    (["debug=tiny", "model=dlrm"], "debug=tiny is written for model=ranking on data=synthetic, not for this run's "
                                   "model=dlrm on data=synthetic; use debug=tiny_criteo in its place"),
])
def test_launch_says_a_bad_override_once_and_starts_no_process(capsys, monkeypatch, started, overrides, said):
    """Each process refused it on its own before: the same line twice, ``[p0] error: ...`` and ``[p1] error: ...``."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert launch.main(["-n", "2", "--", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and err.count("\n") == 1, err
    assert started == []


@pytest.mark.slow
def test_launch_checks_the_overrides_as_the_runner_composes_them_and_starts_a_good_launch_unchanged(
        tmp_path, monkeypatch, started):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    port, good = launch.free_port(), ["debug=tiny", "mesh=data", f"hydra.run.dir={tmp_path / 'run'}"]
    assert launch.main(["-n", "2", "--port", str(port), "--", *good]) == 0
    assert started == [launch.child_commands(2, good, port)] and list(tmp_path.iterdir()) == []
    # what the runner's entry refuses, it refuses in the same words; the processes' own settings compose
    assert launch.refusal(started[0][1]) is None
    # a search (hparams_search sets hydra.mode=MULTIRUN) composes as one: its swept values are its trials'
    search = ["hparams_search=optuna_emb_lr", "debug=tiny", "model.emb_width=choice(8,16)"]
    assert launch.refusal(launch.child_commands(2, search, port)[-1]) is None
    assert launch.refusal(launch.child_commands(2, [*search[:2], "trainer.steps=abc"], port)[-1]) == (
        "trainer.steps=abc: trainer.steps takes an integer in [1, inf), or null, not 'abc'")
    assert launch.refusal(launch.child_commands(2, [*search, "trainer.stpes=3"], port)[-1]).startswith(
        "trainer.stpes=3: trainer has no key 'stpes'; did you mean trainer.steps?")  # not "requires --multirun"
    assert launch.refusal(["python", "-m", "runner", "trainer.steps=abc"]) == (
        "trainer.steps=abc: trainer.steps takes an integer in [1, inf), or null, not 'abc'")
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra's full report is asked for: each process gives it
    assert launch.main(["-n", "2", "--", "trainer.steps=abc"]) == 0 and len(started) == 2


# ---- the command line itself: exit 2, one message, no traceback (a few subprocess runs) ---------------------

def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "runner", *args, f"hydra.run.dir={cwd}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_the_launch_command_says_a_bad_override_once_before_starting_a_process(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "runner.launch", "-n", "2", "--", "trainer.steps=abc"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "error: trainer.steps=abc: trainer.steps takes an integer in [1, inf), or null, not 'abc'\n")
    assert list(tmp_path.iterdir()) == []  # no run folder: no process started


@pytest.mark.slow
def test_help_beside_an_override_that_cannot_apply_is_one_message():
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "-m", "runner", "--help", "model.emb_width=abc"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr == "error: model.emb_width=abc: model.emb_width takes an integer in [1, 65536], not 'abc'\n"


SWEPT_FIXES = ("a swept value needs a sweep: sweep it with -m (--multirun: one run per value, Hydra's basic sweeper), "
               "search it with hparams_search=<one of optuna_emb_lr, optuna_ml100k, optuna_ranking> (an Optuna "
               "search), or give one value")
TRAINER_KEYS = ", ".join(f.name for f in dataclasses.fields(TrainerConfig))
OPTIMIZERS = ", ".join(sorted(p.stem for p in (ROOT / "conf" / "optimizer").glob("*.yaml")))


@pytest.mark.slow
@pytest.mark.parametrize("args, said", [
    (["trainer.steps=abc"], "trainer.steps=abc: trainer.steps takes an integer in [1, inf), or null, not 'abc'"),
    (["trainer.nosuchkey=1"], f"trainer.nosuchkey=1: trainer has no key 'nosuchkey'; its keys: {TRAINER_KEYS} "
                              f"(`python -m runner --cfg job` lists the settings)"),
    (["optimizer=nosuch"], f"optimizer=nosuch: the config group optimizer has no option 'nosuch'; its options: "
                           f"{OPTIMIZERS}"),
    (["trainer.steps"], "override 'trainer.steps' has no '=': give it a value (trainer.steps=<value>), or remove a "
                        "key with ~trainer.steps; `python -m runner --cfg job` lists the settings"),
    # a search's swept value beside a bad one: Hydra found no search (its config did not compose) and said the swept
    # value "requires --multirun"; the bad value is named
    (["hparams_search=optuna_emb_lr", "model.emb_width=choice(8,16)", "trainer.steps=abc"],
     "trainer.steps=abc: trainer.steps takes an integer in [1, inf), or null, not 'abc'"),
    (["hparams_search=optuna_ranking", "trainer.seed=choice(1,2)", "optimizer=nosuch"],
     f"optimizer=nosuch: the config group optimizer has no option 'nosuch'; its options: {OPTIMIZERS}"),
    # a swept value with no -m and no search: Hydra said it "requires --multirun", with no fix
    (["model.emb_width=choice(8,16)"], f"model.emb_width=choice(8,16): {SWEPT_FIXES} (model.emb_width=8)"),
    # under -m the sweep composes every trial first (hydra_plugins/runner_basic) and names the trial and its value
    (["-m", "trainer.steps=abc,2"], "invalid sweep:\n  - trial #0 [trainer.steps=abc]: its values do not compose into "
                                    "one config (Value 'abc' of type 'str' could not be converted to Integer): drop "
                                    "trainer.steps=abc from the sweep, or sweep keys every choice has"),
])
def test_an_override_hydra_cannot_apply_is_one_line_naming_it_and_the_fix_with_exit_2(tmp_path, args, said):
    """Hydra reported these in 4 to 20 lines ending "Set the environment variable HYDRA_FULL_ERROR=1 ...", exit 1."""
    proc = run_cli(*args, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path / "run")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {said}\n")
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()  # none made, or made and removed


@pytest.mark.parametrize("override, said", [
    ("trainer.stpes=3", "trainer.stpes=3: trainer has no key 'stpes'; did you mean trainer.steps? (`python -m runner "
                        "--cfg job` lists the settings)"),
    ("nosuch=1", "nosuch=1: the config has no key 'nosuch'; its keys: hydra, optimizer, table_optimizers, async_emb, "
                 "mesh, distributed, model, data, logger, dense_optimizer, trainer, checkpoint (`python -m runner "
                 "--cfg job` lists the settings)"),
    ("optimizer=adamm", f"optimizer=adamm: the config group optimizer has no option 'adamm'; did you mean "
                        f"optimizer=adam? its options: {OPTIMIZERS}"),
    ("trainer.batch_size=1.5", "trainer.batch_size=1.5: trainer.batch_size takes an integer in [1, 16777216], not "
                               "'1.5'"),
    ("optimizer.learning_rate=fast", "optimizer.learning_rate=fast: optimizer.learning_rate takes a number in "
                                     "(0, inf), not 'fast'"),
    ("trainer.select_best=maybe", "trainer.select_best=maybe: trainer.select_best takes true or false, or null, not "
                                  "'maybe'"),
    ("model.tables.users.kind=nope", "model.tables.users.kind=nope: model.tables.users.kind takes one of dense, "
                                     "hash, modulo, not 'nope'"),
    ("trainer.steps=[1,", "override 'trainer.steps=[1,' cannot be parsed (no viable alternative at input '[1,'): "
                          "quote a value holding , [ ] { } ( ) or = (https://hydra.cc/docs/1.2/advanced/"
                          "override_grammar/basic)"),
    ("trainer.steps=1,2", "trainer.steps=1,2: a value with a comma is a sweep or a list: sweep it with -m "
                          "(--multirun), give a list as trainer.steps=[1,2], or a string as trainer.steps='1,2' "
                          "(quoted for the shell: \"trainer.steps='1,2'\")"),
])
def test_hydras_error_for_an_override_is_said_in_one_line(override, said):
    """``override_errors.message`` on the error Hydra's composition raises (as ``python -m runner`` meets it)."""
    with initialize_config_dir(CONF_DIR, version_base="1.3"), pytest.raises(HydraException) as e:
        compose("config", [override])
    assert override_errors.message(e.value) == said


@pytest.mark.parametrize("override, one", [("model.emb_width=choice(8,16)", "model.emb_width=8"),
                                           ("trainer.seed=range(3,5)", "trainer.seed=3")])
def test_a_swept_value_without_a_sweep_is_one_line_naming_the_sweeps_that_take_it(override, one):
    """Hydra said only "Sweep parameters '...' requires --multirun"; the runner and ``runner.launch``'s check say the
    fixes: -m, an Optuna search (each of conf/hparams_search/), or one value."""
    said = f"{override}: {SWEPT_FIXES} ({one})"
    assert searches() == sorted(p.stem for p in (ROOT / "conf" / "hparams_search").glob("*.yaml"))
    with initialize_config_dir(CONF_DIR, version_base="1.3"), pytest.raises(HydraException) as e:
        compose("config", [override, "debug=tiny"])
    assert "requires --multirun" in str(e.value)
    assert override_errors.message(e.value, searches()) == said
    assert refusal([override, "debug=tiny"]) == said  # what runner.launch refuses, before any process starts
    interval = "optimizer.learning_rate=interval(0.01,0.1)"  # Hydra's basic sweeper cannot sweep an interval
    assert refusal([interval]) == (
        f"{interval}: a swept value needs a sweep: search it with hparams_search=<one of optuna_emb_lr, "
        f"optuna_ml100k, optuna_ranking> (an Optuna search), or give one value (optimizer.learning_rate=<value>)")


@pytest.mark.slow
@pytest.mark.parametrize("args", [["debug=tiny", "model=dlrm"], ["-m", "debug=tiny", "model=ranking,dcn"]])
def test_a_debug_preset_for_another_model_is_refused_by_the_command_with_exit_2_before_any_trial(tmp_path, args):
    proc = run_cli(*args, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path / "run")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == f"error: {debug_preset_clash(args)}\n" and "use debug=tiny_criteo in its place" in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["emb_width", "objective", "cpu_devices", "mesh", "binary_data", "three_interactions",
                                  "target"])
def test_cli_refuses_with_exit_2_and_one_message(tmp_path, case):
    data = tmp_path / "data"
    data.mkdir()
    binary = write(data, "ratings.dat", b"\x00\x01binary" * 200)
    three = write(data, "u.data", udata(users(30, 3, first_item=lambda u: u)))
    seq = ["model=sequential", "model.emb_width=16", "model.num_blocks=1", "model.num_negatives=8",
           "logger=none", "trainer.batch_size=16", "trainer.steps=2", "data=movielens"]
    args, needle = {
        "emb_width": (["debug=tiny", "model.emb_width=0"], "model.emb_width=0 is outside [1, 65536]"),
        "objective": (["debug=tiny", "trainer.objective=nope/metric"], "trainer.objective='nope/metric' is not"),
        "cpu_devices": (["debug=tiny", "mesh.cpu_devices=100000"], "mesh.cpu_devices=100000 is outside [1, 4096]"),
        "mesh": (["debug=tiny", "mesh=data_table", "mesh.axes={data:3,table:3}"],
                 "mesh data=3xtable=3 needs 9 devices but only 1 exist"),
        "binary_data": (seq + [f"data.path={binary}"], "binary content, not UTF-8 text"),
        "three_interactions": (seq + [f"data.path={three}"], "no user can be trained on"),
        "target": (["debug=tiny", "optimizer._target_=nosuch.Class"], "optimizer._target_='nosuch.Class' cannot be "
                                                                       "built: Error locating target 'nosuch.Class'"),
    }[case]
    proc = run_cli(*args, cwd=tmp_path / "run")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    assert proc.stderr.count("error: ") == 1 and needle in proc.stderr
    assert "[ERROR]" not in out  # no logger's error line beside the message (hydra.utils' on a missing class)
    assert "[jax." not in out  # no INFO line of JAX's (a CPU machine's "Unable to initialize backend 'tpu'")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
