"""Every option of every config group composes, and bad types or unknown keys fail at composition."""
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tests.runner.support import CONF, TINY, compose_config, hydra_compose

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "hparams_search",
                                                                                 "experiment", "debug"))
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def test_groups_exist():
    assert {"optimizer", "async_emb", "mesh", "model", "data", "logger"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS)
def test_every_option_composes(group, option):
    cfg = compose_config([f"{group}={option}"], tiny=False)
    assert cfg[group] is not None
    t = cfg.trainer  # a budget: steps, or (model=sequential) epochs resolved from the data (runner/budget.py)
    assert (t.steps or 0) > 0 or (t.epochs or t.default_epochs or 0) > 0


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "debug").glob("*.yaml")))
def test_every_debug_option_shrinks_the_run_and_yields_to_the_command_line(option):
    full = compose_config(tiny=False)
    cfg = compose_config([f"debug={option}"], tiny=False)
    assert cfg.trainer.steps < full.trainer.steps and cfg.logger.kind == "none"
    cfg = compose_config([f"debug={option}", "trainer.steps=7", "logger=wandb"], tiny=False)
    assert cfg.trainer.steps == 7 and cfg.logger.kind == "wandb"


def test_defaults():
    cfg = compose_config(tiny=False)
    # the root config's embedding optimizer is async_adam; model=ranking (the default) picks its recipe's
    assert cfg.optimizer._target_ == "optimizers.AsyncRowwiseAdagrad" and cfg.optimizer.learning_rate == 0.1
    assert cfg.model.emb_width == 32
    assert compose_config(["model=sequential"], tiny=False).optimizer._target_ == "optimizers.AsyncAdam"
    assert compose_config(["optimizer=async_adam"], tiny=False).optimizer._target_ == "optimizers.AsyncAdam"
    assert compose_config(tiny=True).optimizer._target_ == "optimizers.AsyncAdam"  # debug=tiny keeps async_adam
    assert cfg.async_emb.enabled is True
    assert cfg.logger.mode == "offline"


@pytest.mark.parametrize("override", ["trainer.steps=abc", "optimizer.learning_rate=fast", "async_emb.enabled=maybe"])
def test_bad_type_fails_at_composition(override):
    with pytest.raises(Exception, match="Value .* could not be converted|Error merging|ValidationError|"
                                        "Invalid value"):
        compose_config([override])


@pytest.mark.parametrize("override", ["trainer.stepz=3", "optimizer.momentum=0.9", "mesh.axes_=1"])
def test_unknown_key_fails_at_composition(override):
    with pytest.raises(ConfigCompositionException, match="Could not override|Key .* not in"):
        compose_config([override])


# Settings that take one of a few words are Enum fields of the schemas (runner/config.py): another word fails
# when the config is composed, with the key, the value and the valid words. checkpoint.resume is not one of
# them (auto | never | a path).
CHOICES = [
    ([], "mesh.table_layout=diagonal", "mesh.table_layout", "diagonal", "[row, column]"),
    ([], "logger.mode=offlne", "logger.mode", "offlne", "[offline, online, disabled]"),
    ([], "logger.kind=tensorboard", "logger.kind", "tensorboard", "[wandb, none]"),
    ([], "distributed.kind=mpi", "distributed.kind", "mpi", "[none, local, slurm, manual]"),
    ([], "model.tables.items.dtype=float16", "model.tables.items.dtype", "float16", "[float32, bfloat16]"),
    ([], "model.tables.items.kind=cuckoo", "model.tables.items.kind", "cuckoo", "[dense, hash, modulo]"),
    ([], "model.tables.items.evict=fifo", "model.tables.items.evict", "fifo", "[lru, lfu, ttl]"),
    ([], "model.tables.items.default=mean", "model.tables.items.default", "mean", "[zeros, shared]"),
    (["model=sequential", "data=synthetic_sequences"], "model.loss=bpr", "model.loss", "bpr",
     "[sampled_softmax, full_softmax]"),
    (["model=sequential", "data=synthetic_sequences"], "model.negatives=hard", "model.negatives", "hard",
     "[uniform, popularity, in_batch]"),
    (["model=sequential", "data=synthetic_sequences"], "data.train_windows=some", "data.train_windows", "some",
     "[last, all]"),
]


@pytest.mark.parametrize("base, override, key, value, valid", CHOICES, ids=[c[1] for c in CHOICES])
def test_wrong_choice_fails_at_composition_with_the_valid_words(base, override, key, value, valid):
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(base + [override], tiny=False)
    message = f"{e.value}\n{e.value.__cause__}"
    assert f"Invalid value '{value}', expected one of {valid}" in message, message
    assert f"full_key: {key}" in message and override in message, message


@pytest.mark.parametrize("base, override, key, value, valid", CHOICES, ids=[c[1] for c in CHOICES])
def test_valid_choices_compose_and_compare_as_words(base, override, key, value, valid):
    for word in valid.strip("[]").split(", "):
        cfg = compose_config(base + [override.replace(f"={value}", f"={word}")], tiny=False)
        got = cfg
        for part in key.split("."):
            got = got[part]
        assert got == word and str(got) == word and f"{got}" == word and isinstance(got, str)


def test_choice_yaml_values_are_checked_too(tmp_path):
    """A wrong word in a config file (here an option of the mesh group) fails the same way."""
    import shutil

    from hydra import compose, initialize_config_dir

    from runner.config import register

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "mesh" / "diagonal.yaml").write_text("defaults:\n  - /schema/mesh@_here_: mesh\ntable_layout: diag\n")
    register()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises(Exception, match=r"Invalid value 'diag', expected one of \[row, column\]"):
            compose("config", overrides=["mesh=diagonal"])


def test_checkpoint_resume_takes_a_path():
    cfg = compose_config(["checkpoint.resume=/tmp/some/checkpoint"], tiny=False)
    assert cfg.checkpoint.resume == "/tmp/some/checkpoint"


@pytest.mark.parametrize("overrides", [
    TINY + ["model.emb_width=0", "data.zipf_a=nan", "model.hidden=[16,0]", "logger.project=''"],
    TINY + ["mesh.axes={data:0}", "optimizer.learning_rate=inf", "trainer.objective=nope/metric"],
    TINY + ["optimizer=async_sgd", "mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column",
            "trainer.steps=6", "model.tables.items.vocab=null", "logger=wandb", "logger.tags=[a,b]"],
    ["debug=tiny_sequences", "model.loss=full_softmax", "data.ks=[0]", "trainer.steps=3", "model.seen_bias=true"],
    ["experiment=ml100k_sasrec", "trainer.seed=2", "++model.tables.items.dtype=bfloat16", "data.max_len=20"],
])
def test_the_tests_compose_is_hydras(overrides):
    """tests.runner.support.compose_config composes the choices with Hydra once and applies plain values after
    it, as Hydra does: the same config, value for value."""
    want = OmegaConf.to_yaml(hydra_compose(tuple(overrides)))  # Hydra's compose of the whole list
    assert OmegaConf.to_yaml(compose_config(overrides, tiny=False)) == want


def test_the_tests_compose_raises_hydras_error_for_a_bad_value():
    with pytest.raises(ConfigCompositionException, match="Error merging override trainer.steps=many"):
        compose_config(["trainer.steps=many"])


@pytest.mark.slow
def test_composes_share_the_config_store_and_each_gets_its_own_nodes():
    """Hydra copies its repository for every compose and every group ``--help`` lists; the ConfigStore in it is
    shared (runner.config_store.share_config_store), and each compose still gets nodes of its own: a composed
    config or a loaded schema changed in place leaves the next compose as it was."""
    import copy

    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from runner.config import register

    register()
    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store
    store.load("schema/optimizer/async_sgd.yaml").node.learning_rate = 123.0  # a loaded node is a copy
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
        first = compose("config", overrides=["optimizer=async_sgd"])
        learning_rate = first.optimizer.learning_rate
        assert learning_rate != 123.0
        first.optimizer.learning_rate = 7.0
        again = compose("config", overrides=["optimizer=async_sgd"])
    assert again.optimizer.learning_rate == learning_rate
    assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(hydra_compose(("optimizer=async_sgd",)))
