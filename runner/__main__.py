"""Entry point: ``python -m runner [overrides]`` or the ``runner`` console script (Hydra tab completion)."""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

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
    """``python -m runner`` and the console script: ``main``, with Hydra's own errors for an override it cannot
    apply (a run's, or ``--help`` beside one) one line, exit code 2 (``override_errors``), not its report. A
    ``-m`` sweep that ends before its first trial (refused by its checks, none to run, Ctrl-C) removes the sweep
    folder it created (``outputs.remove_unused_sweep_dir``), so a corrected command starts clean."""
    from hydra.errors import HydraException

    from . import override_errors

    _hide_schema_groups()
    override_errors.raised()
    clash = debug_preset_clash(sys.argv[1:])
    if clash is not None:
        print(f"error: {clash}", file=sys.stderr)
        sys.exit(2)
    signal.signal(signal.SIGTERM, _terminated)  # the train loop answers it at a step boundary; elsewhere: this
    try:
        try:
            main()
        except KeyboardInterrupt:  # Ctrl-C outside a run: between a sweep's trials, in Hydra's launcher
            print("\nrunner: interrupted (Ctrl-C): stopped at once; checkpoints already committed stay usable",
                  file=sys.stderr)
            sys.exit(130)
        except HydraException as e:  # composing the config (override_errors.raised); a run's are reported by Hydra
            if override_errors.full_error():
                raise
            print(f"error: {override_errors.message(sweep_error(e, _overrides()), searches())}", file=sys.stderr)
            sys.exit(2)
    except BaseException as e:  # a sweep that ended before its first trial leaves no folder it made
        if not (isinstance(e, SystemExit) and e.code in (0, None)):
            from .outputs import remove_unused_sweep_dir

            remove_unused_sweep_dir()
        raise


def refusal(overrides: list[str]) -> str | None:
    """The line (without ``error: ``) with which ``entry`` would refuse a run given ``overrides`` before the run
    starts: a debug preset written for another model or data (``debug_preset_clash``), or an override Hydra cannot
    apply (``override_errors.message``); None when the config composes. It composes the config as ``main`` does
    (Hydra's config loader over ``CONF_DIR`` and the schemas ``register`` stored; in the mode the config sets, so a
    search's is composed as a search's), in a fraction of a second, and starts and writes nothing.
    ``runner.launch`` asks it once for the overrides it hands every process, so that a bad one is said once,
    before any process starts. An error of another kind is left to the run to report."""
    from hydra.errors import HydraException

    from . import override_errors

    clash = debug_preset_clash(overrides)
    if clash is not None:
        return clash
    loader = _loader()
    overrides = given = list(overrides)
    try:  # the mode the config sets (hparams_search: MULTIRUN), found first as Hydra's main does (Hydra.get_mode)
        mode = loader.load_configuration("config", overrides, RunMode.MULTIRUN, validate_sweep_overrides=False)
        mode = mode.hydra.mode
    except Exception:  # noqa: BLE001 - as get_mode: a config that does not compose is run, and says why there
        mode = None
    if mode is None:  # as Hydra's _run_app
        mode, overrides = RunMode.RUN, [*overrides, "hydra.mode=RUN"]
    try:  # a search's own config; its trials' values are checked by the runner's sweepers as the search starts
        loader.load_configuration("config", overrides, mode)
    except HydraException as e:
        return override_errors.message(sweep_error(e, given), searches())
    except Exception:  # noqa: BLE001 - not an override's: each process meets it and reports it as a run does
        return None
    return None


def sweep_error(error: BaseException, overrides: list[str]) -> BaseException:
    """The error to name for Hydra's ``error`` composing the config of ``overrides`` (the command line's): ``error``
    itself, unless it is Hydra's "Sweep parameters ... requires --multirun" for a command whose config does not
    compose as a sweep's. Hydra reads whether a command is a sweep from its composed config (``hparams_search=...``
    sets ``hydra.mode=MULTIRUN``); when another override keeps that config from composing (``trainer.steps=abc``),
    Hydra runs the command as a single run, whose first complaint is the search's swept value
    (``model.emb_width=choice(8,16)``), not the value that is wrong. The error of composing it as a sweep is
    returned then: it names that value."""
    from hydra.errors import HydraException

    if "requires --multirun" not in str(error):
        return error
    loader = _loader()
    try:
        loader.load_configuration("config", list(overrides), RunMode.MULTIRUN, validate_sweep_overrides=False)
    except HydraException as e:
        return e
    except Exception:  # noqa: BLE001 - not an override's: Hydra's own error stands
        return error
    return error  # it composes as a sweep: a swept value given to a single run (no -m, no search)


def _loader() -> Any:
    """Hydra's config loader over the runner's ``conf/`` (``CONF_DIR``), as ``hydra.main`` builds it: the checks
    that compose a command's config before Hydra does (``refusal``, ``sweep_error``, ``debug_preset_clash``)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    return ConfigLoaderImpl(config_search_path=create_config_search_path(CONF_DIR))


def searches() -> list[str]:
    """The Optuna searches a swept value can be given to: the options of the ``hparams_search`` config group."""
    return sorted(p.stem for p in (Path(CONF_DIR) / "hparams_search").glob("*.yaml"))


def _overrides() -> list[str]:
    """The command line's overrides, as ``hydra.main`` reads them (its flags left out)."""
    from hydra._internal.utils import get_args_parser

    try:
        return list(get_args_parser().parse_known_args(sys.argv[1:])[0].overrides)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra parsed them already: this does not fail
        return [a for a in sys.argv[1:] if not a.startswith("-")]


# The debug presets (conf/debug/) and the models and data sources each one's settings are written for: another's
# schema lacks its keys, and Hydra stopped inside composition ("Key 'hidden' not in 'DLRMModelConfig'", exit 1)
DEBUG_PRESETS = {"tiny": (("ranking",), ("synthetic",)), "tiny_criteo": (("dlrm", "dcn"), ("criteo",)),
                 "tiny_sequences": (("sequential",), ("synthetic_sequences",))}
GROUPS = ("debug", "model", "data", "experiment")  # the groups that decide whether a preset fits


def debug_preset_clash(args: list[str]) -> str | None:
    """Why the command line ``args`` pick a debug preset for a model or data source it is not written for
    (``debug=tiny model=dlrm``, ``debug=tiny experiment=criteo_synthetic``, any trial of a sweep), naming the
    preset that is; None otherwise, and for anything Hydra reports itself. The choices are Hydra's own (its
    defaults list, the experiment's and the preset's overrides applied), worked out only when ``debug`` is set."""
    if not any("debug" in a for a in args):
        return None
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
        chosen = [o for o in parsed if o.key_or_group in GROUPS]
        sweeps = [o for o in chosen if o.is_sweep_override()]  # each value a trial's; without -m, Hydra's error
        if (not any(o.key_or_group == "debug" for o in chosen) or not all(o.is_choice_sweep() for o in sweeps)
                or sweeps and not {"-m", "--multirun"} & set(args)):
            return None
        if all(o.key_or_group == "debug" for o in chosen):  # a preset alone picks its own model and data
            return None
        lines = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
                 else [o.input_line] for o in chosen]
        loader = _loader()
        for trial in itertools.product(*lines):
            c = loader.compute_defaults_list("config", list(trial), RunMode.RUN).overrides.known_choices
            models, datas = DEBUG_PRESETS.get(c.get("debug"), ((c.get("model"),), (c.get("data"),)))
            if c.get("model") not in models or c.get("data") not in datas:
                return _clash(c["debug"], c.get("model"), c.get("data"), c.get("experiment"), bool(sweeps))
    except Exception:  # noqa: BLE001 - an override Hydra cannot apply: its own message follows
        return None
    return None


def _clash(debug: str, model: str, data: str, experiment: str | None, trial: bool) -> str:
    """The message: what the preset is for, what the run (or a ``trial`` of a sweep) has, and the preset for that
    (by its model, else by its data)."""
    models, datas = DEBUG_PRESETS[debug]
    others = {p: v for p, v in DEBUG_PRESETS.items() if p != debug}
    fit = next((p for p, (ms, ds) in others.items() if model in ms and data in ds), None)
    near = (next((p for p, (ms, _) in others.items() if model in ms), None)
            or next((p for p, (_, ds) in others.items() if data in ds), None))
    fix = (f"use debug={fit} in its place" if fit else
           f"use debug={near} in its place (model={'/'.join(others[near][0])} on data={'/'.join(others[near][1])})"
           if near else f"no debug preset shrinks model={model} on data={data}: leave debug out and shrink the run by "
           f"hand (trainer.steps, trainer.batch_size, model.emb_width)")
    run = "the sweep trial's" if trial else "this run's"
    return (f"debug={debug} is written for model={'/'.join(models)} on data={'/'.join(datas)}, not for {run} "
            f"model={model} on data={data}" + (f" (experiment={experiment})" if experiment else "") + f"; {fix}")


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
