"""Hydra's basic sweeper (``-m a=1,2 b=3,4``: one trial per combination), refusing before the first trial every
combination whose config does not compose.

Values that are each fine can clash in one combination: ``optimizer=async_adam,async_sgd`` with
``optimizer.b1=0.8`` (``async_sgd`` has no ``b1``). Hydra's own sweeper composes each batch's configs before
launching it (``validate_batch_is_legal``) and stops at the first that fails, with its multi-line error, exit code
1 and no word of which combination it was; with ``hydra.sweeper.max_batch_size`` set, only after the earlier
batches' trials have run. This subclass composes every combination before Hydra writes the sweep's
``multirun.yaml`` and refuses those that fail (``runner.sweep_checks.combination_problems``): exit code 2,
``error: invalid sweep:`` and one line per combination naming its trial number, its values, Hydra's reason and
the fix, or one line for all the combinations of a value that composes with none. A sweep whose combinations all
compose runs as Hydra's does, without composing them again batch by batch. A sweep with no combination (an empty
range) launches nothing and writes no ``multirun.yaml``; one that ends before its first trial starts (Ctrl-C,
SIGTERM) puts back the ``multirun.yaml`` an earlier sweep into its folder left (``runner.outputs.kept_sweep_file``),
so a sweep that ran no trial never writes over an earlier one's record. The runner's ``sweep_summary`` callback
(``runner.sweeps.SweepSummary``) swaps it in for Hydra's class, so every ``-m`` sweep gets it.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, List

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser


class RunnerBasicSweeper(BasicSweeper):
    """Hydra's basic sweeper, with the combinations whose config does not compose refused before the first trial."""

    _all_composed = False  # every combination of this sweep composed before it started: no batch to check again

    def combinations(self, arguments: List[str]) -> list[list[str]]:
        """Every trial's overrides, in Hydra's job order (``hydra.sweeper.params`` then ``arguments``, the command
        line's overrides), as ``BasicSweeper.sweep`` splits them into batches."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        return [list(trial) for batch in self.split_arguments(overrides, None) for trial in batch]

    def sweep(self, arguments: List[str]) -> Any:
        """Hydra's sweep over ``arguments``, after refusing every combination whose config does not compose
        (exit code 2, one line each)."""
        from runner import outputs, sweep_checks

        assert self.hydra_context is not None and self.config is not None
        loader, config = self.hydra_context.config_loader, self.config

        def compose(overrides: list[str]) -> Any:  # a trial's config, as the launcher will compose it
            return loader.load_sweep_config(master_config=config, sweep_overrides=overrides)

        trials = self.combinations(arguments)
        sweep_checks.refuse(sweep_checks.combination_problems(trials, compose))
        self._all_composed = True
        if not trials:  # Hydra would write multirun.yaml (over an earlier sweep's there) and launch an empty batch
            return []
        with outputs.kept_sweep_file(Path(str(config.hydra.sweep.dir))) as kept:
            launch = self.launcher.launch

            def launch_noted(batch: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
                kept.started = True  # a trial starts: its multirun.yaml is this sweep's record
                return launch(batch, initial_job_idx=initial_job_idx)

            self.launcher.launch = launch_noted
            try:
                return super().sweep(arguments)
            finally:
                self.launcher.launch = launch

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Hydra's check that ``batch``'s configs compose, unless ``sweep`` has composed every combination."""
        if not self._all_composed:
            super().validate_batch_is_legal(batch)
