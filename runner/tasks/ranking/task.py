"""Multi-action ranking on the synthetic generator: per-action AUC against the Bayes-optimal AUC."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ...preflight import PreflightError
from .. import TASKS
from .synthetic import SyntheticRanking, SyntheticSpec, world
from .auc import auc
from .model import RankingModel


def auc_metrics(prefix: str, actions, labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    out = {f"{prefix}/auc_{a}": auc(labels[:, i], scores[:, i]) for i, a in enumerate(actions)}
    vals = [v for v in out.values() if not math.isnan(v)]
    out[f"{prefix}/auc_mean"] = float(np.mean(vals)) if vals else float("nan")
    return out


@dataclasses.dataclass
class RankingTask:
    data: SyntheticRanking
    eval_batches: int
    model_keys: tuple[str, ...] = ("user", "hist_items", "hist_authors", "cand_item", "cand_author", "labels")
    objective: str = "eval/auc_mean"

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "RankingTask":
        if cfg.model.name != "ranking":
            raise PreflightError(f"data=synthetic is the multi-action ranking source, but model={cfg.model.name}; "
                                 f"use model=ranking, or data=synthetic_sequences / data=movielens for "
                                 f"model={cfg.model.name}")
        d = OmegaConf.to_container(cfg.data, resolve=True)
        d.pop("name")
        d["actions"] = tuple(d["actions"])
        return cls(world(SyntheticSpec(**d)), cfg.trainer.eval_batches)

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.data.spec.actions)

    def tables(self) -> dict[str, tuple[int, int]]:
        s = self.data.spec
        return {"users": (s.num_users, 1), "items": (s.num_items, s.history_len + 1),
                "authors": (s.num_authors, s.history_len + 1)}

    def metric_names(self) -> list[str]:
        """The keys ``evaluate`` returns (what ``trainer.objective`` may name)."""
        return [f"{p}/auc_{a}" for p in ("eval", "bayes") for a in (*self.actions, "mean")] + ["eval/loss"]

    def make_model(self, specs, model_cfg: DictConfig) -> RankingModel:
        return RankingModel(specs, self.actions, tuple(model_cfg.hidden))

    def batch(self, step: int, batch_size: int, shard: int = 0, num_shards: int = 1, split: str = "train"):
        return self.data.batch(step, batch_size, split=split, shard=shard, num_shards=num_shards)

    def train_metrics(self, host_batch: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> dict[str, float]:
        return auc_metrics("train", self.actions, host_batch["labels"], np.asarray(outputs["probs"]))

    def evaluate(self, predict: Callable, state: Any, put: Callable, batch_size: int) -> dict[str, float]:
        """AUC per action on fixed eval batches, beside the Bayes-optimal AUC of the same labels."""
        labels, scores, truth = [], [], []
        for i in range(self.eval_batches):
            b = self.batch(i, batch_size, split="eval")
            scores.append(np.asarray(predict(state, put(b))))
            labels.append(b["labels"])
            truth.append(b["probs"])
        labels, scores, truth = map(np.concatenate, (labels, scores, truth))
        p = np.clip(scores, 1e-7, 1 - 1e-7)
        bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean()
        return {**auc_metrics("eval", self.actions, labels, scores),
                **auc_metrics("bayes", self.actions, labels, truth), "eval/loss": float(bce)}

    def summary_lines(self, s: Mapping[str, Any]) -> list[str]:
        per_action = " ".join(f"{a}={s[f'eval/auc_{a}']:.3f}/{s[f'bayes/auc_{a}']:.3f}" for a in self.actions)
        return [f"eval AUC {s['eval/auc_mean']:.4f} (Bayes-optimal {s['bayes/auc_mean']:.4f}; "
                f"per action model/Bayes: {per_action})"]


TASKS.register("synthetic")(RankingTask.from_config)
