"""The runner's basic sweeper (a Hydra plugin, so it lives in Hydra's ``hydra_plugins`` namespace):
:class:`RunnerBasicSweeper` is Hydra's ``-m`` sweeper with every combination's config checked before the first trial."""
from .sweeper import RunnerBasicSweeper

__all__ = ["RunnerBasicSweeper"]
