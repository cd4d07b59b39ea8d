"""Every option of every config group composes, and bad types or unknown keys fail at composition."""
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from tests.runner.support import CONF, compose_config

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "hparams_search",
                                                                                 "experiment", "debug"))
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def test_groups_exist():
    assert {"optimizer", "async_emb", "mesh", "model", "data", "logger"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS)
def test_every_option_composes(group, option):
    cfg = compose_config([f"{group}={option}"], tiny=False)
    assert cfg[group] is not None
    assert cfg.trainer.steps > 0


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "debug").glob("*.yaml")))
def test_every_debug_option_shrinks_the_run_and_yields_to_the_command_line(option):
    full = compose_config(tiny=False)
    cfg = compose_config([f"debug={option}"], tiny=False)
    assert cfg.trainer.steps < full.trainer.steps and cfg.logger.kind == "none"
    cfg = compose_config([f"debug={option}", "trainer.steps=7", "logger=wandb"], tiny=False)
    assert cfg.trainer.steps == 7 and cfg.logger.kind == "wandb"


def test_defaults():
    cfg = compose_config(tiny=False)
    assert cfg.optimizer._target_ == "optimizers.AsyncAdam"
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
