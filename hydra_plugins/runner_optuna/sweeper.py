"""``hydra-optuna-sweeper``'s sweeper, refusing before the first trial what the plugin would stop on some trials
in, and ending the searches it would end in a traceback with one message.

The plugin's own sweeper stops with a Python traceback when a search cannot go on: every trial failed (Optuna's "No
trials are completed yet"), a batch of trials failed more often than ``hydra.sweeper.max_failure_rate`` allows (the
first failed trial's exception, re-raised), ``hydra.sweeper.storage`` names a database Optuna cannot open, a stored
study of the same ``study_name`` was searched in another direction or over other values of a parameter, or a trial
is given a value its config cannot take (Hydra composes each trial's config as it launches it, so one bad ``choice``
value ends the whole search there). This subclass checks the storage, the stored study and every value a trial could
be given (``runner.sweep_checks``) before the first trial (exit code 2, one line each), refuses alone a trial whose
values clash (each fine, their config not composing: ``runner.sweep_launch``, which also leaves out Hydra's lines
repeating a failed trial's), and turns the first two into the end-of-sweep summary (one line per failed trial) plus
one line naming the cause and the fix (exit code 1); a search whose storage fails as a trial is written into it (the
database file deleted or read-only, the disk full) ends with one line naming the storage, the failure and the fix
(exit code 1). Trials a search leaves unfinished (Ctrl-C, SIGTERM, a crash) are marked failed in the stored study,
where Optuna would keep them running for good; those a search killed outright left (SIGKILL, a machine gone) are
marked failed by the next search of the study, which finds them by their heartbeat (``runner.sweep_storage``; the
storage is opened once, for the checks and the search). A SQLite database the search created is removed again when
it is refused before its first trial (one that existed stays). The plugin's own ``Storage: <URL>`` log line shows a
database URL's password as ``***``. The runner's ``sweep_summary`` callback (``runner.sweeps.SweepSummary``) swaps
it in for the plugin's class, so ``hydra/sweeper=optuna`` gets it too.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, List

from omegaconf import OmegaConf

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper


class RunnerOptunaSweeper(OptunaSweeper):
    """The Optuna sweeper, with a search that cannot work refused before the first trial, a failed search
    summarised and the trials it leaves unfinished marked failed."""

    def sweep(self, arguments: List[str]) -> Any:
        """The plugin's search over ``arguments`` (the command line's overrides), after the checks that refuse one
        that cannot work (exit code 2); a search it stops is summarised (exit code 1), and the trials it leaves
        unfinished are marked failed."""
        from runner import outputs, sweep_checks, sweep_launch, sweep_storage, sweeps

        impl = self.sweeper
        plugin_log = logging.getLogger(type(impl).__module__)
        _hide_passwords(plugin_log, sweep_checks.mask_password)
        if not any(isinstance(f, sweep_launch.DropFailedExperiment) for f in plugin_log.filters):
            plugin_log.addFilter(sweep_launch.DropFailedExperiment())
        given = {a.split("=", 1)[0] for a in arguments}  # the command line's keys replace hydra.sweeper.params's: the
        if impl.params:  # plugin would grid the replaced interval anyway (GridSampler only supports discrete ...)
            impl.params = OmegaConf.create({k: v for k, v in impl.params.items() if str(k) not in given})
        url = impl.storage
        storage = sweep_storage.opened_or_refused(url)  # opened once, for the checks and the search
        if isinstance(storage, sweep_storage.RunnerStorage):
            impl.storage = storage
        space, fixed, texts = sweep_checks.search_space(impl, arguments)
        loader = impl.hydra_context.config_loader

        def compose(overrides: list[str]) -> Any:  # a trial's config, as the launcher will compose it
            return loader.load_sweep_config(impl.config, overrides)

        sweep_checks.refuse(sweep_checks.value_problems(space, fixed, texts, compose) +
                            sweep_checks.stored_study_problems(storage, impl.study_name,
                                                               impl._get_directions(), space))
        sweep_launch.refused.clear()
        impl.launcher.launch = sweep_launch.composed_launch(impl.launcher.launch, compose)  # a clash: that trial
        seed = OmegaConf.select(impl.config, "hydra.sweeper.sampler.seed", default=None)
        note = sweep_checks.resumed_seed_note(storage, impl.study_name, seed)
        if note:
            print(note, file=sys.stderr, flush=True)
        with sweep_storage.Heartbeat(storage) as heartbeat:  # a killed search's trials: failed as a batch starts
            def batch(trials: list) -> None:  # the plugin builds the sampler (a grid's) as the search starts
                outputs.keep_created()  # trials start: a database this search created is its record now
                sweep_launch.told_without_stop(trials[0].study.sampler)  # a grid's failed last trial: no traceback
                heartbeat.batch(trials)

            asked = sweep_checks.track_asked(impl, batch)
            try:
                return super().sweep(arguments)
            except Exception as error:  # noqa: BLE001 - sorted out (or re-raised) by sweeps.optuna_stopped
                sweep_dir = impl.config.hydra.sweep.dir
                failed = sweep_storage.failed_during_search(error, url, sweep_dir)
                if failed is None:
                    sweeps.optuna_stopped(sweep_dir, error, impl.max_failure_rate)
                sweep_checks.fail_unfinished(asked, warn=False)  # marked if the storage works again
                asked.clear()
                print(failed, file=sys.stderr, flush=True)
                raise SystemExit(1) from None  # not an Exception: Hydra would print it with a traceback
            finally:  # normally a no-op: every trial asked for was told its end
                sweep_checks.fail_unfinished(asked)


class _PasswordMask(logging.Filter):
    """Shows the password of a database URL in a log record as ``***`` (the plugin logs ``Storage: <URL>``)."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        masked = self.mask(text)
        if masked != text:
            record.msg, record.args = masked, None
        return True


def _hide_passwords(logger: logging.Logger, mask) -> None:
    if not any(isinstance(f, _PasswordMask) for f in logger.filters):
        logger.addFilter(_PasswordMask(mask))
