"""``hydra-optuna-sweeper``'s sweeper, ending the searches it would end in a traceback with one message.

The plugin's own sweeper stops with a Python traceback when a search cannot go on: every trial failed (Optuna's
"No trials are completed yet"), a batch of trials failed more often than ``hydra.sweeper.max_failure_rate``
allows (the first failed trial's exception, re-raised), or ``hydra.sweeper.storage`` names a database Optuna
cannot open. This subclass checks the storage before the first trial (exit code 2) and turns the other two
into the end-of-sweep summary (one line per failed trial) plus one line naming the cause and the fix (exit code
1). The runner's ``sweep_summary`` callback (``runner.sweeps.SweepSummary``) swaps it in for the plugin's class,
so ``hydra/sweeper=optuna`` gets it too.
"""
from __future__ import annotations

from typing import Any, List

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper


class RunnerOptunaSweeper(OptunaSweeper):
    """The Optuna sweeper, with a bad storage refused before the first trial and a failed search summarised."""

    def sweep(self, arguments: List[str]) -> Any:
        from runner import sweeps

        impl = self.sweeper
        sweeps.refuse_bad_storage(impl.storage)
        try:
            return super().sweep(arguments)
        except Exception as error:  # noqa: BLE001 - sorted out (or re-raised) by sweeps.optuna_stopped
            sweeps.optuna_stopped(impl.config.hydra.sweep.dir, error, impl.max_failure_rate)
