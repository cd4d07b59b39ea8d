from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from runner.config import register

CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = ["data.num_users=300", "data.num_items=500", "data.num_authors=50", "data.history_len=4",
        "model.emb_width=8", "model.hidden=[16]", "trainer.batch_size=32", "trainer.steps=6",
        "trainer.log_interval=3", "trainer.eval_interval=3", "trainer.eval_batches=1", "logger=none"]


def compose_config(overrides=(), tiny: bool = True):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
        return compose("config", overrides=(TINY if tiny else []) + list(overrides))


@pytest.fixture
def cfg_of():
    return compose_config
