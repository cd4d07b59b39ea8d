"""The runner's Optuna sweeper (a Hydra plugin, so it lives in Hydra's ``hydra_plugins`` namespace):
:class:`RunnerOptunaSweeper` is ``hydra-optuna-sweeper``'s sweeper with the runner's endings."""
from .sweeper import RunnerOptunaSweeper

__all__ = ["RunnerOptunaSweeper"]
