"""compose -> validate -> build -> train -> return the objective. ``runner.__main__`` calls ``run``."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
from omegaconf import DictConfig, OmegaConf

from .build import build
from .loop import train
from .tracking import make_tracker

log = logging.getLogger("runner")


def run(cfg: DictConfig, output_dir: str | os.PathLike, *, tags: list[str] | None = None) -> float:
    """Train one config; returns ``cfg.trainer.objective`` from the final evaluation (for sweeps)."""
    out = Path(output_dir)
    program, task, plan = build(cfg)  # raises PreflightError before anything compiles
    lg = cfg.logger
    tracker = make_tracker(
        "jsonl" if lg.kind == "none" else "jsonl,wandb", process_index=jax.process_index(), output_dir=out,
        config=OmegaConf.to_container(cfg, resolve=True), project=lg.project, mode=lg.mode, name=lg.name,
        group=lg.group, tags=list(lg.tags) + list(tags or []), entity=lg.entity)
    exit_code = 1
    try:
        log.info("mesh %s, async_emb=%s, optimizers %s", plan.describe(), cfg.async_emb.enabled,
                 {n: type(o).__name__ for n, o in program.emb_optimizers.items()})
        result = train(program, task, cfg.trainer, tracker, log=log.info)
        exit_code = 0
    finally:
        tracker.finish(exit_code)
    s = result["summary"]
    lines = [
        f"done: {s['steps']} steps, final train loss {s['final/train_loss']:.4f}",
        *task.summary_lines(s),
        f"throughput {s['perf/examples_per_s']:,.0f} examples/s",
        f"outputs: {out} (metrics.jsonl, summary.json" + (", wandb/)" if lg.kind == "wandb" else ")"),
    ]
    if jax.process_index() == 0:
        for line in lines:
            log.info(line)
    objective = s.get(cfg.trainer.objective or task.objective)
    return float(objective) if objective is not None else float("nan")
