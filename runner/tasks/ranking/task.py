"""Multi-action ranking on the synthetic generator: per-action AUC against the Bayes-optimal AUC.

Evaluation scores ``trainer.eval_batches`` fixed batches of each held-out split: ``valid/auc_<action>``,
``valid/auc_mean``, ``valid/loss`` (what runs are selected and tuned on: the objective is ``valid/auc_mean``)
and the same under ``test/`` (reported, never selected on), each beside the Bayes-optimal AUC of its own
labels (``bayes/valid/...``, ``bayes/test/...``). The generator draws fresh training examples every step, so
the run reports its last state unless ``trainer.select_best=true`` keeps the best by ``valid/auc_mean``."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ...errors import PreflightError
from .. import TASKS, refuse_own_widths
from .synthetic import SyntheticRanking, SyntheticSpec, world
from .auc import auc
from .model import RankingModel
from .report import REPORT

SPLITS = ("valid", "test")  # held out: selected and tuned on valid, reported on test


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
    objective: str = "valid/auc_mean"
    report = REPORT  # what python -m runner.report shows of its runs

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "RankingTask":
        if cfg.model.name != "ranking":
            raise PreflightError(f"data=synthetic is the multi-action ranking source, but model={cfg.model.name}; "
                                 f"use model=ranking, or " + ("data=criteo" if cfg.model.name in ("dlrm", "dcn") else
                                                                "data=synthetic_sequences / data=movielens")
                                 + f" for model={cfg.model.name}")
        refuse_own_widths(cfg, "it adds item and author rows and multiplies the user's with them")
        d = OmegaConf.to_container(cfg.data, resolve=True)
        d.pop("name")
        d["actions"] = tuple(d["actions"])
        d["eval_at"] = int(cfg.trainer.get("steps") or 0) if d.get("drift") else 0  # held out: the last step's ids
        task = cls(world(SyntheticSpec(**d)), cfg.trainer.eval_batches)
        problem = task.undefined_auc(int(cfg.trainer.batch_size))
        if problem:
            raise PreflightError(problem)
        return task

    def undefined_auc(self, batch_size: int) -> str | None:
        """Why an evaluation's AUC would be undefined (None: it is not): a held-out split whose
        ``eval_batches x batch_size`` examples hold one label only of some action. Its AUC would be nan, and
        ``auc_mean`` (the objective) the mean of the other actions', or nan when none is left, which
        ``trainer.select_best`` cannot compare. The fix names the fewest batches that hold both labels."""
        limit = max(self.eval_batches, min(1 << 12, (1 << 20) // batch_size))  # batches looked at, at most
        positives = {split: np.zeros(len(self.actions), np.int64) for split in SPLITS}
        first = None  # (split, actions) with one label in eval_batches batches
        for k in range(1, limit + 1):
            for split in SPLITS:
                positives[split] += self.batch(k - 1, batch_size, split=split)["labels"].sum(0).astype(np.int64)
            one = {s: [a for a, p in zip(self.actions, positives[s]) if p in (0, k * batch_size)] for s in SPLITS}
            if k == self.eval_batches:
                if not any(one.values()):
                    return None
                first = next((s, one[s]) for s in SPLITS if one[s])
            elif k > self.eval_batches and not any(one.values()):
                break
        split, actions = first
        n = self.eval_batches * batch_size
        head = (f"trainer.eval_batches={self.eval_batches} x trainer.batch_size={batch_size}: the {split} split's "
                f"{n:,} examples hold one label only of {', '.join(actions)}, so its AUC is undefined")
        if any(one.values()):
            return (f"{head}, and it still is over {limit * batch_size:,} examples: the action is too rare to "
                    f"evaluate; leave it out of data.actions")
        return f"{head}: raise trainer.eval_batches to {k} or more (or trainer.batch_size)"

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.data.spec.actions)

    def tables(self) -> dict[str, tuple[int | None, int]]:
        """Per table: the largest id (None: raw 64-bit ids) and the ids per example."""
        s = self.data.spec
        raw = s.raw_ids  # raw 64-bit ids have no range: their tables are hash or modulo tables
        return {"users": (None if raw else s.num_users, 1), "items": (None if raw else s.num_items, s.history_len + 1),
                "authors": (s.num_authors, s.history_len + 1)}

    def metric_names(self) -> list[str]:
        """The keys ``evaluate`` returns (what ``trainer.objective`` may name)."""
        return ([f"{p}{split}/auc_{a}" for p in ("", "bayes/") for split in SPLITS for a in (*self.actions, "mean")]
                + [f"{split}/loss" for split in SPLITS])

    def make_model(self, specs, model_cfg: DictConfig) -> RankingModel:
        return RankingModel(specs, self.actions, tuple(model_cfg.hidden))

    def batch(self, step: int, batch_size: int, shard: int = 0, num_shards: int = 1, split: str = "train"):
        return self.data.batch(step, batch_size, split=split, shard=shard, num_shards=num_shards)

    def train_metrics(self, host_batch: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> dict[str, float]:
        return auc_metrics("train", self.actions, host_batch["labels"], np.asarray(outputs["probs"]))

    def evaluate(self, predict: Callable, state: Any, put: Callable, batch_size: int) -> dict[str, float]:
        """Per held-out split: AUC per action on its fixed batches, beside the Bayes-optimal AUC of the same
        labels, and the BCE."""
        out: dict[str, float] = {}
        for split in SPLITS:
            labels, scores, truth = [], [], []
            for i in range(self.eval_batches):
                b = self.batch(i, batch_size, split=split)
                scores.append(np.asarray(predict(state, put(b))))
                labels.append(b["labels"])
                truth.append(b["probs"])
            labels, scores, truth = map(np.concatenate, (labels, scores, truth))
            p = np.clip(scores, 1e-7, 1 - 1e-7)
            bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean()
            out.update({**auc_metrics(split, self.actions, labels, scores),
                        **auc_metrics(f"bayes/{split}", self.actions, labels, truth), f"{split}/loss": float(bce)})
        return out

    def summary_lines(self, s: Mapping[str, Any]) -> list[str]:
        def line(p: str) -> str:
            model, bayes = s[f"{p}/auc_mean"], s[f"bayes/{p.split('/')[-1]}/auc_mean"]
            return f"AUC {model:.4f} (Bayes-optimal {bayes:.4f}: {model / bayes:.4f} of it)"

        per_action = " ".join(f"{a}={s[f'test/auc_{a}']:.3f}/{s[f'bayes/test/auc_{a}']:.3f}" for a in self.actions)
        lines = [f"test  {line('test')}   (valid {line('valid')}); per action model/Bayes on test: {per_action}"]
        if "best/step" in s and "best/test/auc_mean" in s:
            lines.insert(0, f"best  test  {line('best/test')}   (valid {line('best/valid')}; step {s['best/step']}, "
                            f"selected on {s.get('selected_on', self.objective)})")
            lines[1] = "final " + lines[1]
        return lines


TASKS.register("synthetic")(RankingTask.from_config)
