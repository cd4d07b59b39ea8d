"""The train loop: one readable function. Feed batches, step, log every ``log_interval``, evaluate every
``eval_interval``, flush the deferred update at the end, evaluate once more, summarise."""
from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import numpy as np

from .. import distributed
from .step import TrainProgram, is_log_step
from ..tracking import Tracker


def to_device(program: TrainProgram, batch: Mapping[str, np.ndarray], keys=None) -> dict[str, jax.Array]:
    """Put a whole host batch (the same on every process) on the mesh, its leading dim split over every device."""
    keys = program.model_keys if keys is None else keys
    return distributed.put_global(program.mesh, {k: batch[k] for k in keys})


def train(program: TrainProgram, task: Any, trainer: Any, tracker: Tracker, log=print,
          checkpoints: Any = None) -> dict[str, Any]:
    """Run ``trainer.steps`` steps; returns {"summary": ..., "state": final state}. With ``checkpoints``
    (runner.checkpoint.Checkpoints): start from its restored state and save as it says."""
    B = trainer.batch_size
    put = lambda b: to_device(program, b)  # noqa: E731
    # Several processes: each generates and feeds only the rows of the global batch its devices hold.
    shard, num_shards = distributed.batch_shard(program.mesh, B)
    rows = {"shard": shard, "num_shards": num_shards} if num_shards > 1 else {}
    put_rows = lambda b: distributed.put_local(program.mesh, {k: b[k] for k in program.model_keys}, B)  # noqa: E731
    predict_host = lambda s, b: distributed.fetch(predict(s, b))  # noqa: E731
    state, start, last = checkpoints.resume_point() if checkpoints is not None else (None, 0, {})
    state = program.init_state(trainer.seed) if state is None else state
    stop = max(getattr(trainer, "stop_after", None) or trainer.steps, start)  # stop_after: pre-emption drill
    host = task.batch(start, B, **rows)
    step_fn, flush_fn, predict = program.compile(state, put_rows(host))
    tracker.define_summary(task.objective, "maximize")
    tracker.define_summary("train/loss", "minimize")

    t_window, n_window = time.perf_counter(), 0
    batch = put_rows(host)
    # XLA:CPU runs a multi-device step's collectives on a shared thread pool; two steps in flight at once
    # can starve each other's rendezvous on few cores (seen as a 40 s collective timeout). On a CPU mesh,
    # finish each step (after the next batch is ready) before dispatching the next computation.
    one_at_a_time = jax.default_backend() == "cpu" and program.mesh.devices.size > 1
    for step in range(start, stop):
        state, metrics = step_fn(state, batch)  # dispatch is asynchronous: prepare the next batch meanwhile
        done = step + 1 == trainer.steps
        logged_host = host
        if step + 1 < stop:
            host = task.batch(step + 1, B, **rows)
            batch = put_rows(host)
        if one_at_a_time:
            jax.block_until_ready(metrics["train/loss"])
        n_window += 1
        if is_log_step(step + 1, trainer.log_interval, trainer.steps):
            m = distributed.fetch(metrics)
            elapsed = time.perf_counter() - t_window
            row = {k: _scalar(v) for k, v in m.items() if k != "outputs"}
            row.update(task.train_metrics(distributed.gather_rows(program.mesh, logged_host, B), m["outputs"]))
            row["perf/examples_per_s"] = n_window * B / elapsed
            row["perf/step_time_ms"] = 1000 * elapsed / n_window
            for name, opt in program.emb_optimizers.items():
                row[f"emb/learning_rate/{name}"] = float(getattr(opt, "learning_rate", float("nan")))
            if (step + 1) % trainer.eval_interval == 0 and not done:
                row.update(task.evaluate(predict_host, state, put, B))
            tracker.log(row, step=step + 1)
            last = row
            shown = f"  {task.objective} {row[task.objective]:.4f}" if task.objective in row else ""
            log(f"step {step + 1:>6}/{trainer.steps}  loss {row['train/loss']:.4f}{shown}  "
                f"emb|g| {row['emb/grad_norm']:.3g}  {row['perf/examples_per_s']:,.0f} ex/s")
            t_window, n_window = time.perf_counter(), 0
        if checkpoints is not None:
            checkpoints.step_done(step + 1, state)

    if stop < trainer.steps:  # stopped as a pre-empted job would be, its checkpoint written: resume later
        if checkpoints is not None:
            checkpoints.wait()
        return {"summary": {"steps": stop, "stopped_at": stop, "final/train_loss": last.get("train/loss")},
                "state": state}
    state = flush_fn(state)  # apply the last deferred update: every update lands exactly once
    if checkpoints is not None:
        checkpoints.save_final(state)
    final = task.evaluate(predict_host, state, put, B)
    tracker.log(final, step=trainer.steps)
    summary = {"steps": trainer.steps, "final/train_loss": last.get("train/loss"),
               "perf/examples_per_s": last.get("perf/examples_per_s"), **final}
    tracker.log_summary(summary)
    if checkpoints is not None:
        checkpoints.wait()  # the last save is committed, or its failure raised, before the run ends
    return {"summary": summary, "state": state}


def _scalar(v: Any) -> Any:
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()
