"""Hydra's ConfigStore as the runner shares it (``runner.config.register`` stores the schemas in it)."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore


def share_config_store() -> None:
    """Let Hydra's copies of its config repository share the one ``ConfigStore`` instead of copying it.

    Hydra 1.3 deep-copies its repository for every compose (twice a run) and once for each config group that
    ``--help`` lists, and the repository holds the ``ConfigStore`` with every schema stored in it: about a
    million OmegaConf node copies for ``--help`` (5.8-7.1 s on 2 CPU cores with them over four runs, 0.65-0.93 s
    without over five). The copies only guard the repository's search path, and ``ConfigStore.load`` hands
    out a deep copy of each node it returns, so sharing the store changes no config; Hydra 1.4 does the same
    by reading ``ConfigStore.instance()`` on every use (facebookresearch/hydra pull request 2928)."""
    if "__deepcopy__" not in vars(ConfigStore):
        ConfigStore.__deepcopy__ = lambda self, memo: self
