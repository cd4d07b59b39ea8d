"""Entry point: ``python -m runner [overrides]`` or the ``runner`` console script (Hydra tab completion)."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import register

register()


def conf_dir() -> str:
    """The config groups: ``runner/conf`` in an installed wheel (setup.py ships the repository's ``conf/`` there),
    else ``conf/`` at the top of the source tree (a checkout, or the editable install). Absolute, so the console
    script finds it from any working directory."""
    here = Path(__file__).resolve().parent
    candidates = (here / "conf", here.parent / "conf")
    for d in candidates:
        if (d / "config.yaml").is_file():
            return str(d)
    return str(candidates[-1])  # neither: Hydra's error names the folder it looked for


CONF_DIR = conf_dir()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    try:
        return run_or_trial(cfg)
    except KeyboardInterrupt:  # Ctrl-C before the train loop, or a second one in it: one line, exit 130 (128 + SIGINT)
        multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
        sweep = "; the sweep stops here" if multirun else ""
        print(f"\nrunner: interrupted (Ctrl-C): stopped at once; checkpoints already committed stay usable{sweep}",
              file=sys.stderr)
        sys.exit(130)


def run_or_trial(cfg: DictConfig) -> float:
    """One run, or one trial of a sweep (a failed trial is recorded and the sweep goes on)."""
    from . import sweeps
    from .app import run, run_tracker  # imported here (with JAX) so `--help`, completion and --cfg stay fast
    from .core.preemption import unanswered
    from .errors import Preempted, RunnerError, exit_code, out_of_memory

    hc = HydraConfig.get()
    tags = sweeps.trial_tags(hc)
    if hc.mode != RunMode.MULTIRUN:
        try:
            return run(cfg, hc.runtime.output_dir, tags=tags)
        except Preempted as e:  # SIGTERM or Ctrl-C: stopped at a step boundary, checkpoint written if configured
            print(f"runner: {e}", file=sys.stderr)
            sys.exit(e.code)
        except RunnerError as e:  # a config that cannot work, training that went wrong, a save that failed, ...
            print(f"error: {e}", file=sys.stderr)
            sys.exit(exit_code(e))
        except Exception as e:  # an allocation XLA could not make mid-run: one message; anything else as it is
            oom = out_of_memory(e)
            if oom is None:
                raise
            print(f"error: {oom}", file=sys.stderr)
            sys.exit(1)  # as the run's summary records it (a failure mid-run)
    # A sweep: one W&B run per trial in the sweep's group; a failed trial is recorded and the sweep goes on.
    clash = sweeps.name_trial(cfg, hc)
    if clash is not None:  # the sweep's own setting: every further trial would meet it too
        print(f"error: {clash}; the sweep stops here", file=sys.stderr)
        sys.exit(2)

    def record():  # a tracker to record a trial that failed before its own existed
        return run_tracker(cfg, Path(hc.runtime.output_dir), tags, process_index=0)

    try:
        objective = run(cfg, hc.runtime.output_dir, tags=tags)
    except Preempted as e:  # SIGTERM (or Ctrl-C) stops the sweep, not only this trial
        print(f"runner: {e}; the sweep stops here", file=sys.stderr)
        sys.exit(e.code)
    except Exception as e:  # noqa: BLE001 - any failure of one trial, bad input included
        return sweeps.trial_failed(cfg, hc, e, record)
    late = unanswered()  # it came after the last step: the trial finished; the sweep still stops
    if late is not None:
        print(f"runner: {late} came as trial #{hc.job.num} was ending: it finished and is recorded; the sweep stops "
              f"here", file=sys.stderr)
        sys.exit(128 + getattr(signal, late))
    return sweeps.checked_objective(cfg, hc, objective, record)


def entry() -> None:
    """``python -m runner`` and the console script: ``main``, with Hydra's own errors outside a run (``--help``
    or ``--hydra-help`` beside an override that cannot be applied) one message instead of a traceback."""
    from hydra.errors import HydraException

    _hide_schema_groups()
    signal.signal(signal.SIGTERM, _terminated)  # the train loop answers it at a step boundary; elsewhere: this
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside a run: between a sweep's trials, in Hydra's launcher
        print("\nrunner: interrupted (Ctrl-C): stopped at once; checkpoints already committed stay usable",
              file=sys.stderr)
        sys.exit(130)
    except HydraException as e:  # a run's own are reported by Hydra before they get here
        cause = e.__cause__ or e.__context__
        lines = [str(e).strip()] + ([str(cause).strip()] if cause is not None and str(cause).strip() else [])
        print("error: " + "\n".join(lines), file=sys.stderr)
        sys.exit(2)


def _terminated(signum, frame) -> None:
    """SIGTERM outside the train loop (starting up, compiling, between a sweep's trials): one line, exit 143."""
    print("\nrunner: SIGTERM: stopped at once (the train loop would have stopped at a step boundary); checkpoints "
          "already committed stay usable", file=sys.stderr, flush=True)
    raise SystemExit(128 + signal.SIGTERM)


def _hide_schema_groups() -> None:
    """``--help`` lists the option groups a user picks from, not ``schema/*``, where the dataclass schemas the
    options extend are stored (``runner.config.register``). Hydra filters only its own ``hydra/*`` groups, through
    the predicate ``Hydra.format_config_groups`` takes; this narrows that predicate."""
    from hydra._internal.hydra import Hydra

    listed = Hydra.format_config_groups
    if getattr(listed, "hides_schemas", False):
        return

    def format_config_groups(self, predicate, compact=True):
        return listed(self, lambda g: predicate(g) and g.split("/")[0] != "schema", compact)

    format_config_groups.hides_schemas = True
    Hydra.format_config_groups = format_config_groups


if __name__ == "__main__":
    entry()
