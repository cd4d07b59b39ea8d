"""compose -> validate -> build -> train -> return the objective. ``runner.__main__`` calls ``run``."""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import jax
from omegaconf import DictConfig, OmegaConf

from . import budget, distributed, errors, notices, preflight, progress
from .build import build_run
from .checkpoint import open_checkpoints
from .core import failures, memory_budget
from .core.loop import train
from .core.preemption import Preemption
from .errors import Preempted, PreflightError, RunnerError
from .outputs import METRICS_FILE, listed, set_aside
from .sweeps import write_run_info
from .tracking import JsonlTracker, make_tracker
from .tracking.wandb import TrackerStartError

log = logging.getLogger("runner")


def stopped_code(signal_name: str) -> int:
    """A run stopped by a signal exits with 128 + its number: 143 for SIGTERM, 130 for SIGINT (Ctrl-C)."""
    return 128 + signal.Signals[signal_name]


def run_tracker(cfg: DictConfig, out: Path, tags: list[str] | None = None, *, process_index: int,
                run_id: str | None = None) -> Any:
    """metrics.jsonl + summary.json, and a W&B run unless ``logger=none`` (its id/group/tags: wandb_run.json).
    With ``run_id`` (a checkpointed run) the W&B run has that id and a re-launch resumes it."""
    lg = cfg.logger
    names = ["jsonl"] + ([] if lg.kind == "none" else [lg.kind])  # metrics.jsonl always: sweeps and report read it
    try:
        tracker = make_tracker(
            names, process_index=process_index, output_dir=out,
            config=OmegaConf.to_container(cfg, resolve=True), project=lg.project, mode=lg.mode, name=lg.name,
            group=lg.group, tags=list(lg.tags) + list(tags or []), entity=lg.entity, run_id=run_id,
            resume="allow" if run_id else None, init_timeout=lg.get("init_timeout"))
    except TrackerStartError as e:  # a W&B run that cannot start: one message (exit 2), not wandb's trace
        if process_index == 0:  # the folder records the failure, as any failed run's does
            record = JsonlTracker(out / METRICS_FILE)
            record.log_summary({"error": f"PreflightError: {e}"})
            record.finish(2)
        raise PreflightError(str(e)) from None
    write_run_info(tracker, out)
    return tracker


def outputs_line(out: Path, lg: Any) -> str:
    """What the run wrote where: W&B's folder only when it wrote one (``logger.mode=disabled`` writes none)."""
    wandb = lg.kind == "wandb" and lg.get("mode") != "disabled"
    return f"outputs: {out} (metrics.jsonl, summary.json" + (", wandb/)" if wandb else ")")


def _or_nan(value: Any) -> float:
    """A summary number to print: nan where there is none (a loss of exactly 0.0 is a number, not missing)."""
    return float("nan") if value is None else float(value)


def _check_before_joining(cfg: DictConfig) -> None:
    """The config's own checks (every value's range, steps or epochs), before the processes of a multi-process run
    join: each refuses a bad config at once instead of after waiting for every peer. Every process holds the same
    config, so process 0 alone gives the message; the others point at it (n copies of it said nothing more)."""
    try:
        preflight.check_config(cfg)
        budget.check(cfg.trainer)
    except PreflightError as e:
        d = cfg.distributed
        index = os.environ.get("SLURM_PROCID", "0") if d.kind == "slurm" else d.get("process_id") or 0
        if d.kind == "none" or str(index).strip() in ("0", ""):
            raise
        raise errors.said_by_process_0(e, index, "the config") from None


def run(cfg: DictConfig, output_dir: str | os.PathLike, *, tags: list[str] | None = None) -> float:
    """Train one config; returns ``cfg.trainer.objective`` (for sweeps; null: the task's validation objective):
    its value at the state selected on validation when the run selects (``trainer.select_best``; selection
    always goes by a validation metric, ``runner.core.selection.selection_metric``), else the final
    evaluation's."""
    out = Path(output_dir)
    _check_before_joining(cfg)
    distributed.initialize(cfg.distributed)  # joins the other processes, before anything starts JAX
    with distributed.one_refusal():  # a refusal every process meets: process 0 gives it, the others point at it
        program, task, plan, run_budget = build_run(cfg)  # raises PreflightError before anything compiles
        distributed.check_plan(plan)
        shapes = program.state_shapes(int(cfg.trainer.seed))  # refused before it is built if it cannot fit
        memory_budget.check_state(shapes, program.state_shardings(shapes), list(program.mesh.local_devices))
        # checks, then restores per checkpoint.resume (refused on another data file than it recorded); None = off
        ckpt = open_checkpoints(cfg, program, plan, out, data_file=getattr(task, "data_file", None))
    say = log.info if jax.process_index() == 0 else (lambda *a, **k: None)  # process 0 speaks for the run
    lg = cfg.logger
    if ckpt is None and jax.process_index() == 0:  # an earlier run's record in this directory: kept, not appended to
        moved = set_aside(out)
        if moved:
            log.warning("%s already held an earlier run's %s: moved to %s; this run writes its own", out,
                        listed(moved), ", ".join(p.name for p in moved.values()))
    try:
        tracker = run_tracker(cfg, out, tags, process_index=jax.process_index(), run_id=ckpt and ckpt.run_id)
    except BaseException:
        if ckpt is not None:
            ckpt.close()  # releases checkpoint.dir's lock
        raise
    tracker = ckpt.track(tracker) if ckpt is not None else tracker
    exit_code = 1
    try:
        say("mesh %s (%d processes x %d devices), async_emb=%s, optimizers %s", plan.describe(),
            jax.process_count(), jax.local_device_count(), cfg.async_emb.enabled, {n: type(o).__name__ for n, o in program.emb_optimizers.items()})
        say(f"budget: {run_budget.describe()}, evaluation every {cfg.trainer.eval_interval:,} steps")
        # e.g. far more epochs than the data can use; a bfloat16 table under a plain optax optimizer; a table
        # whose width makes a TPU copy it every step; a staleness that defers every update past the last step;
        # mesh settings this mesh does not use
        for warning in (run_budget.warnings() + notices.rounding_warnings(program.emb_optimizers, program.tables)
                        + notices.hash_count_warnings(program.emb_optimizers, program.tables)
                        + notices.layout_warnings(program.tables, jax.default_backend())
                        + notices.staleness_warnings(program.staleness, run_budget.steps, run_budget.source)
                        + notices.passes_warnings(run_budget, task)
                        + notices.mesh_warnings(cfg.mesh, plan, jax.device_count())
                        + notices.kernel_warnings(jax.default_backend(), jax.device_count())
                        + notices.unused_settings(cfg, run_budget.steps, _typed())):
            say(warning)
        for note in getattr(task, "warnings", list)():  # e.g. duplicate rows dropped from the data file
            say(note)
        # Several processes: a failure ends this one now, clearly; an embedding optimizer's failure is one message.
        with distributed.fail_fast(tracker, saves=ckpt is not None), failures.named(program), Preemption() as preemption:
            result = train(program, task, cfg.trainer, tracker, log=say, checkpoints=ckpt, preemption=preemption)
            if cfg.distributed.dump_state:
                distributed.dump_state(result["state"], out / "final_state.npz")
        stopped_by = result["summary"].get("terminated")
        exit_code = stopped_code(stopped_by) if stopped_by else 0  # stopped, not done
        distributed.finished()  # this process's exit is no longer a death that must stop the others
    except RunnerError as e:  # the exit code the process ends with (runner.__main__), recorded alike
        exit_code = errors.exit_code(e)
        raise
    finally:
        progress.close_open()  # a bar still on screen (the run failed): the error starts on a line of its own
        if ckpt is not None:
            ckpt.close()  # an in-flight save still commits when the run ends on an error
        tracker.finish(exit_code)
    s = result["summary"]
    if "terminated" in s:
        saved = (f"its checkpoint is in {ckpt.directory}; the same command resumes the run" if ckpt is not None
                 and ckpt.manager is not None else "no checkpoint is configured (checkpoint.interval=0), so the "
                 "progress is lost; set checkpoint.interval to make a stopped run resumable")
        raise Preempted(f"stopped on {s['terminated']} at step {s['stopped_at']} of {cfg.trainer.steps}: {saved}",
                        code=stopped_code(s["terminated"]))
    if "stopped_at" in s:  # trainer.stop_after: the pre-emption drill
        say(f"stopped at step {s['stopped_at']} of {cfg.trainer.steps} (trainer.stop_after), checkpoint in "
            f"{ckpt.directory}; the same command without stop_after resumes the run")
        return float("nan")
    lines = [
        f"done: {s['steps']} steps{_epochs(run_budget, s['steps'])}, "
        f"final train loss {_or_nan(s['final/train_loss']):.4f}",
        *task.summary_lines(s),
        f"throughput {_or_nan(s['perf/examples_per_s']):,.0f} examples/s",
        outputs_line(out, lg),
    ]
    name = cfg.trainer.objective or task.objective
    selected = s.get("selected_on", name)  # a validation metric: selection never goes by another
    if "early_stop/step" in s:
        lines.insert(1, f"stopped early at step {s['early_stop/step']} of {cfg.trainer.steps}: {selected} had not "
                        f"improved for {cfg.trainer.early_stop_patience} evaluations (trainer.early_stop_patience)")
    if "best/step" in s:
        returned = f"; its {name} {s[f'best/{name}']:.4f}" if name != selected and f"best/{name}" in s else ""
        lines.insert(1, f"best {selected} {s[f'best/{selected}']:.4f} at step {s['best/step']} (selected on "
                        f"{selected}{returned}; its state is what best/* reports; final/* is the last state's)")
    for line in lines:
        say(line)
    # A sweep gets the objective of the state selected on validation when the run selects, else the final one's.
    objective = s.get(f"best/{name}", s.get(name))
    return float(objective) if objective is not None else float("nan")


def _typed() -> set[str] | None:
    """The keys this run's command line set (Hydra's task overrides, ``+``/``~`` prefixes dropped), None without
    Hydra (a run started from Python)."""
    from hydra.core.hydra_config import HydraConfig

    from .launch import override_key

    if not HydraConfig.initialized():
        return None
    return {override_key(o) for o in HydraConfig.get().overrides.task}


def _epochs(b: budget.Budget, steps: int) -> str:
    """`` (12.3 epochs)`` when the task's training set is finite, else nothing."""
    epochs = b.epochs_at(steps)
    return f" ({epochs:.1f} epochs)" if epochs is not None else ""
