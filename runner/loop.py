"""The train loop: one readable function. Feed batches, step, log every ``log_interval``, evaluate every
``eval_interval``, flush the deferred update at the end, evaluate once more, summarise."""
from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import numpy as np

from . import mesh as mesh_lib
from .step import TrainProgram
from .tracking import Tracker


def to_device(program: TrainProgram, batch: Mapping[str, np.ndarray], keys=None) -> dict[str, jax.Array]:
    """Put a host batch on the mesh, its leading dim split over every device."""
    keys = program.model_keys if keys is None else keys
    return {k: jax.device_put(batch[k], mesh_lib.batch_sharding(program.mesh, batch[k])) for k in keys}


def train(program: TrainProgram, task: Any, trainer: Any, tracker: Tracker, log=print) -> dict[str, Any]:
    """Run ``trainer.steps`` steps; returns {"summary": ..., "state": final state}."""
    B = trainer.batch_size
    put = lambda b: to_device(program, b)  # noqa: E731
    state = program.init_state(trainer.seed)
    host = task.batch(0, B)
    step_fn, flush_fn, predict = program.compile(state, put(host))
    tracker.define_summary(task.objective, "maximize")
    tracker.define_summary("train/loss", "minimize")

    last: dict[str, Any] = {}
    t_window, n_window = time.perf_counter(), 0
    batch = put(host)
    for step in range(trainer.steps):
        state, metrics = step_fn(state, batch)  # dispatch is asynchronous: prepare the next batch meanwhile
        done = step + 1 == trainer.steps
        logged_host = host
        if not done:
            host = task.batch(step + 1, B)
            batch = put(host)
        n_window += 1
        if (step + 1) % trainer.log_interval == 0 or done:
            m = jax.device_get(metrics)
            elapsed = time.perf_counter() - t_window
            row = {k: _scalar(v) for k, v in m.items() if k != "outputs"}
            row.update(task.train_metrics(logged_host, m["outputs"]))
            row["perf/examples_per_s"] = n_window * B / elapsed
            row["perf/step_time_ms"] = 1000 * elapsed / n_window
            for name, opt in program.emb_optimizers.items():
                row[f"emb/learning_rate/{name}"] = float(getattr(opt, "learning_rate", float("nan")))
            if (step + 1) % trainer.eval_interval == 0 and not done:
                row.update(task.evaluate(predict, state, put, B))
            tracker.log(row, step=step + 1)
            last = row
            shown = f"  {task.objective} {row[task.objective]:.4f}" if task.objective in row else ""
            log(f"step {step + 1:>6}/{trainer.steps}  loss {row['train/loss']:.4f}{shown}  "
                f"emb|g| {row['emb/grad_norm']:.3g}  {row['perf/examples_per_s']:,.0f} ex/s")
            t_window, n_window = time.perf_counter(), 0

    state = flush_fn(state)  # apply the last deferred update: every update lands exactly once
    final = task.evaluate(predict, state, put, B)
    tracker.log(final, step=trainer.steps)
    summary = {"steps": trainer.steps, "final/train_loss": last.get("train/loss"),
               "perf/examples_per_s": last.get("perf/examples_per_s"), **final}
    tracker.log_summary(summary)
    return {"summary": summary, "state": state}


def _scalar(v: Any) -> Any:
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()
