"""Tasks: a data source, the model trained on it, and how it is evaluated.

The train step and loop know nothing of features or metrics; a task gives them:

- ``tables() -> {name: (id_range, tokens_per_example)}``: the embedding tables the task needs;
- ``make_model(specs, model_cfg)``: a model with ``table_ids(batch)``, ``init(key)``,
  ``loss(params, embs, batch) -> (loss, outputs)`` and ``predict(params, embs, batch, tables)``;
- ``model_keys``: the batch keys the device needs;
- ``batch(step, batch_size, shard=0, num_shards=1)``: host numpy arrays, deterministic in (seed, step);
- ``train_metrics(host_batch, outputs)`` and ``evaluate(predict, state, put, batch_size)``: floats to log;
- ``objective``: the metric a sweep maximises; ``summary_lines(summary)``: what the run prints at the end.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig


def make_task(cfg: DictConfig) -> Any:
    name = cfg.data.name
    if name == "synthetic":
        from .ranking import RankingTask

        if cfg.model.name != "ranking":
            from ..preflight import PreflightError

            raise PreflightError(f"data=synthetic is the multi-action ranking source, but model={cfg.model.name}; "
                                 f"use model=ranking, or data=synthetic_sequences / data=movielens for "
                                 f"model={cfg.model.name}")
        return RankingTask.from_config(cfg)
    if name in ("movielens", "synthetic_sequences"):
        from .sequential import SequentialTask

        return SequentialTask.from_config(cfg)
    raise ValueError(f"unknown data source {name!r}")
