"""The train loop: one readable function. Feed batches, step, log every ``log_interval``, evaluate every
``eval_interval``, flush the deferred update at the end, evaluate once more, summarise."""
from __future__ import annotations

import math
import time
from typing import Any, Mapping

import jax
import numpy as np

from . import mesh as mesh_lib
from .metrics import auc
from .state import TrainState
from .step import TrainProgram
from .tracking import Tracker

MODEL_KEYS = ("user", "hist_items", "hist_authors", "cand_item", "cand_author", "labels")


def to_device(program: TrainProgram, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    return {k: jax.device_put(batch[k], mesh_lib.batch_sharding(program.mesh, batch[k])) for k in MODEL_KEYS}


def auc_metrics(prefix: str, actions, labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    out = {f"{prefix}/auc_{a}": auc(labels[:, i], scores[:, i]) for i, a in enumerate(actions)}
    vals = [v for v in out.values() if not math.isnan(v)]
    out[f"{prefix}/auc_mean"] = float(np.mean(vals)) if vals else float("nan")
    return out


def evaluate(program: TrainProgram, predict, state: TrainState, data, batch_size: int, num_batches: int,
             actions) -> dict[str, float]:
    """AUC per action on fixed eval batches, beside the Bayes-optimal AUC of the same labels."""
    labels, scores, truth = [], [], []
    for i in range(num_batches):
        b = data.batch(i, batch_size, split="eval")
        scores.append(np.asarray(predict(state, to_device(program, b))))
        labels.append(b["labels"])
        truth.append(b["probs"])
    labels, scores, truth = map(np.concatenate, (labels, scores, truth))
    eps = 1e-7
    p = np.clip(scores, eps, 1 - eps)
    bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean()
    return {**auc_metrics("eval", actions, labels, scores), **auc_metrics("bayes", actions, labels, truth),
            "eval/loss": float(bce)}


def train(program: TrainProgram, data, trainer: Any, tracker: Tracker, log=print) -> dict[str, Any]:
    """Run ``trainer.steps`` steps; returns the summary (also logged to the tracker)."""
    actions = tuple(data.spec.actions)
    B = trainer.batch_size
    state = program.init_state(trainer.seed)
    first = data.batch(0, B)
    step_fn, flush_fn, predict = program.compile(state, to_device(program, first))
    for name in ("eval/auc_mean",):
        tracker.define_summary(name, "maximize")
    tracker.define_summary("train/loss", "minimize")

    history: dict[str, Any] = {}
    t_window, n_window = time.perf_counter(), 0
    next_batch = to_device(program, first)
    for step in range(trainer.steps):
        batch, host = next_batch, (first if step == 0 else host_next)
        state, metrics = step_fn(state, batch)  # dispatch is asynchronous: prepare the next batch meanwhile
        if step + 1 < trainer.steps:
            host_next = data.batch(step + 1, B)
            next_batch = to_device(program, host_next)
        n_window += 1
        done = step + 1 == trainer.steps
        if (step + 1) % trainer.log_interval == 0 or done:
            m = jax.device_get(metrics)
            elapsed = time.perf_counter() - t_window
            probs = m.pop("outputs/probs")
            row = {k: _scalar(v) for k, v in m.items()}
            row.update(auc_metrics("train", actions, host["labels"], probs))
            row["perf/examples_per_s"] = n_window * B / elapsed
            row["perf/step_time_ms"] = 1000 * elapsed / n_window
            for name, opt in program.emb_optimizers.items():
                row[f"emb/learning_rate/{name}"] = float(getattr(opt, "learning_rate", float("nan")))
            if (step + 1) % trainer.eval_interval == 0 and not done:
                row.update(evaluate(program, predict, state, data, B, trainer.eval_batches, actions))
            tracker.log(row, step=step + 1)
            history = row
            log(f"step {step + 1:>6}/{trainer.steps}  loss {row['train/loss']:.4f}  "
                f"auc {row['train/auc_mean']:.3f}  emb|g| {row['emb/grad_norm']:.3g}  "
                f"{row['perf/examples_per_s']:,.0f} ex/s")
            t_window, n_window = time.perf_counter(), 0

    state = flush_fn(state)  # apply the last deferred update: every update lands exactly once
    final = evaluate(program, predict, state, data, B, trainer.eval_batches, actions)
    tracker.log(final, step=trainer.steps)
    summary = {"steps": trainer.steps, "final/train_loss": history.get("train/loss"),
               "perf/examples_per_s": history.get("perf/examples_per_s"), **final}
    tracker.log_summary(summary)
    return {"summary": summary, "state": state}


def _scalar(v: Any) -> Any:
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()
