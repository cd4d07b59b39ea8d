"""Next-item prediction on leave-one-out sequences, ranked over every item (HR@k, NDCG@k, MRR).

Data: ``data=movielens`` (``data.path``: any file ``runner.tasks.sequential.interactions`` reads) or
``data=synthetic_sequences`` (``runner.tasks.sequential.synthetic``: a planted pattern, with its Bayes-optimal
scores as an oracle). Both become a ``SequenceDataset``: per user, the last item is the test target, the
second last the validation target, the rest the training prefix.

Evaluation (every ``trainer.eval_interval`` steps and at the end): for every user, the model scores all
N items after its input sequence (validation: the training prefix; test: the prefix plus the validation
item); the target's rank among the N-1 other items (ties count against it; nothing excluded unless
``data.exclude_seen``) gives ``{valid,test}/hr@k``, ``/ndcg@k`` and ``/mrr``. The popularity baseline
(item counts in the training prefixes) is ranked the same way (``popularity/...``), and on synthetic
data so is the oracle (``oracle/...``). The objective a sweep maximises is ``valid/ndcg@10``: models are
selected on validation and the test metrics are reported beside them (``trainer.objective=test/ndcg@10``
returns the test metric of the state selected on validation instead; selection never goes by a test metric).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np
from omegaconf import DictConfig

from ...errors import PreflightError
from .. import TASKS
from .dataset import SequenceDataset, cold_targets, popularity_scores
from .interactions import DataError, Interactions, data_line, drop_duplicates, load_interactions
from .metrics import rank_of_target, ranking_report
from .model import SequentialModel
from .report import REPORT
from .synthetic import SequenceSpec, SequenceWorld

SPLITS = ("valid", "test")


def check(cfg: DictConfig) -> None:
    """The sequence data and model settings, all problems at once, before any data is read."""
    d, m = cfg.data, cfg.model
    if m.name != "sequential":
        raise PreflightError(f"data={d.name} is a next-item sequence source, but model={m.name}; "
                             f"use model=sequential")
    errors = []
    if d.name == "movielens" and not d.path:
        errors.append("data.path is not set: point it at an interaction file or the folder holding one, "
                      "e.g. data.path=$HOME/data/ml-1m (ratings.dat), $HOME/data/ml-100k/u.data or a .csv/.parquet "
                      "(MovieLens: ml-100k.zip and ml-1m.zip from https://grouplens.org/datasets/movielens/, unzipped)")
    if d.max_len < 1:
        errors.append(f"data.max_len={d.max_len} must be >= 1")
    if d.min_interactions < 3:
        errors.append(f"data.min_interactions={d.min_interactions} must be >= 3 (a test target, a "
                      f"validation target and one training item)")
    if not d.ks or min(d.ks) < 1:
        errors.append(f"data.ks={list(d.ks)} must list positive cutoffs, e.g. [10]")
    elif len(set(d.ks)) < len(d.ks):
        errors.append(f"data.ks={list(d.ks)} lists a cutoff twice: list each once, e.g. {sorted(set(d.ks))}")
    if d.get("random_crop") and str(d.get("train_windows", "last")) == "all":
        errors.append("data.random_crop=true crops the one window per user of data.train_windows=last; with "
                      "data.train_windows=all every target is trained on already: set one of them back")
    if m.loss == "sampled_softmax" and m.num_negatives < 1:
        errors.append(f"model.num_negatives={m.num_negatives} must be >= 1 with sampled_softmax")
    if m.num_blocks < 0 or m.ffn_mult < 1:
        errors.append(f"model.num_blocks={m.num_blocks} must be >= 0 and model.ffn_mult={m.ffn_mult} >= 1")
    width = (m.tables.get("items") or {}).get("width") or m.emb_width  # the item table's: the model's width
    if m.num_heads < 1 or width % m.num_heads:
        where = (f"the item table's width {width} (model.tables.items.width, which sets the model's width in place "
                 f"of model.emb_width={m.emb_width})" if width != m.emb_width else f"model.emb_width={m.emb_width}")
        errors.append(f"model.num_heads={m.num_heads} must divide {where}")
    if not 0.0 <= m.dropout < 1.0:
        errors.append(f"model.dropout={m.dropout} must be in [0, 1)")
    if not m.temperature > 0:
        errors.append(f"model.temperature={m.temperature} must be positive")
    keyed = sorted(n for n, t in m.tables.items() if str(getattr(t.get("kind"), "value", t.get("kind"))) not in
                   ("dense", "None"))
    if keyed:  # before what a hash or modulo table itself needs (a capacity, a vocab): none would make it usable here
        errors.append(f"model=sequential scores whole item catalogues by row, which tables of kind hash or modulo "
                      f"({', '.join(keyed)}) do not have; use kind=dense for its tables")
    elif sorted(m.tables) != ["items"] or m.tables["items"].vocab is not None:
        errors.append("model.tables must only configure 'items', without a vocab: full ranking needs one row "
                      "per item (the vocab is the number of items + 1)")
    if d.name == "synthetic_sequences":
        errors += [f"data.{p}" for p in _spec(d).problems()]
        if d.get("path"):
            errors.append(f"data.path={d.path} names an interaction file, and data=synthetic_sequences generates "
                          f"its sequences: use data=movielens data.path={d.path} to train on the file, or drop "
                          f"data.path")
    if m.loss == "sampled_softmax" and str(m.get("negatives")) == "in_batch" and cfg.trainer.batch_size < 2:
        errors.append(f"model.negatives=in_batch takes the other sequences of a batch as negatives, and "
                      f"trainer.batch_size={cfg.trainer.batch_size} leaves none (the loss would be 0 and nothing "
                      f"trained): use a batch of 2 or more, or model.negatives=uniform")
    if errors:
        raise PreflightError("invalid config:\n  - " + "\n  - ".join(errors))


def _spec(d: DictConfig) -> SequenceSpec:
    return SequenceSpec(**{f.name: d[f.name] for f in dataclasses.fields(SequenceSpec)})


def load_dataset(d: DictConfig) -> tuple[SequenceDataset, SequenceWorld | None, int]:
    """The data source's sequences, the synthetic world (whose oracle the evaluation reports) and the exact
    duplicate rows dropped from ``data.path`` (``data.duplicates``; a generated world has none)."""
    if d.name == "synthetic_sequences":
        world = SequenceWorld(_spec(d))
        try:
            return SequenceDataset.from_interactions(world.interactions(), d.max_len, d.min_interactions), world, 0
        except DataError as e:
            raise PreflightError(f"data=synthetic_sequences cannot be used: {e}. Fix data.max_length (and "
                                 f"data.min_length, data.min_interactions).") from None
    try:
        raw = load_interactions(d.path)
        inter, dropped = drop_duplicates(raw)
        if dropped.size and str(d.get("duplicates", "drop")) == "refuse":
            raise PreflightError(f"data.path={d.path!r} cannot be used: {duplicates_refused(raw, dropped)}. Remove "
                                 f"them from the file, or set data.duplicates=drop to drop them (and count them in "
                                 f"data/duplicate_rows).")
        return SequenceDataset.from_interactions(inter, d.max_len, d.min_interactions), None, int(dropped.size)
    except DataError as e:
        why = str(e).rstrip(".")
        fix = ("Fix data.path." if "supported:" in why else
               "Fix data.path (a MovieLens u.data, ratings.dat or ratings.csv, a RecBole .inter, a csv/parquet file "
               "with user and item columns, or a folder holding one of them).")
        raise PreflightError(f"data.path={d.path!r} cannot be used: {why}. {fix}") from None


def duplicates_refused(raw: Interactions, dropped: np.ndarray) -> str:
    """data.duplicates=refuse: the file, how many rows repeat an earlier one, the first of them, the way out."""
    r = int(dropped[0])
    user = raw.user[r] if raw.user_vocab is None else raw.user_vocab[raw.user[r]]  # as the file writes it
    item = raw.item[r] if raw.item_vocab is None else raw.item_vocab[raw.item[r]]
    return (f"{raw.source}: {dropped.size:,} of its {len(raw):,} rows repeat an earlier row exactly (the same "
            f"user, item and timestamp; the first at {data_line(raw, r)}: user {user}, item {item}, "
            f"timestamp {raw.timestamp[r]}), e.g. the file appended to itself. A duplicate sits next to its original "
            f"in the user's sequence, so an item would follow itself and inflate the test metrics; "
            f"data.duplicates=refuse stops on them")


@dataclasses.dataclass
class SequentialTask:
    data: SequenceDataset
    world: SequenceWorld | None
    seed: int
    num_negatives: int  # 0 with full_softmax
    catalog_per_example: int  # full_softmax: catalog ids per example; 0 otherwise
    random_crop: bool
    exclude_seen: bool
    ks: tuple[int, ...]
    model_keys: tuple[str, ...]
    objective: str = "valid/ndcg@10"
    report = REPORT  # what python -m runner.report shows of its runs
    negatives: str = "uniform"  # full (full_softmax) | uniform | popularity | in_batch
    windows: str = "last"  # data.train_windows: last (one window per user) | all (every training target)
    selects_on_validation = True  # trainer.select_best=null: keep the best state by valid/..., report its test/...
    _baselines: dict | None = None
    _sampling: tuple | None = None
    data_file: str | None = None  # the interaction file read (data.path resolved); None for generated data
    duplicate_rows: int = 0  # exact duplicates dropped from it (data.duplicates=drop)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "SequentialTask":
        check(cfg)
        d, m = cfg.data, cfg.model
        data, world, dropped = load_dataset(d)
        full = m.loss == "full_softmax"
        negatives = "full" if full else str(m.get("negatives", "uniform"))
        extra = {"full": (), "uniform": ("negatives",), "popularity": ("negatives", "negatives_logq"),
                 "in_batch": ("targets_logq",)}[negatives]
        keys = ("inputs", "targets") + extra + (("seed",) if m.dropout > 0 else ())
        task = cls(data, world, cfg.trainer.seed, 0 if negatives in ("full", "in_batch") else m.num_negatives,
                   -(-data.num_items // cfg.trainer.batch_size) if full else 0, d.random_crop, d.exclude_seen,
                   tuple(d.ks), keys, objective=f"valid/ndcg@{d.ks[0]}", negatives=negatives,
                   windows=str(d.get("train_windows", "last")),
                   data_file=None if world is not None else data.source, duplicate_rows=dropped)
        task.check_loaded()
        return task

    def check_loaded(self) -> None:
        """What only the data shows and no run could use: in-batch negatives with fewer than two training
        sequences (no other to contrast with)."""
        errors = []
        if self.negatives == "in_batch" and self.num_train_examples < 2:
            errors.append(f"model.negatives=in_batch takes the other sequences of a batch as negatives, and the data "
                          f"has {self.num_train_examples} training sequence (a batch holds copies of it, masked as "
                          f"hits: the loss would be 0 and nothing trained): use model.negatives=uniform, or data "
                          f"with more users")
        if errors:
            raise PreflightError("invalid config:\n  - " + "\n  - ".join(errors))

    # ----- what the trainer needs --------------------------------------------------------------------
    @property
    def num_train_examples(self) -> int:
        """What one epoch passes over (``trainer.epochs``, runner/budget.py): what a training batch draws from,
        the users whose training prefix has >= 2 items (an input and a target), or with
        ``data.train_windows=all`` their windows."""
        if self.windows == "all":
            return int(self.data.train_windows()[0].size)
        return int(np.count_nonzero(self.data.train_lengths >= 2))

    def num_eval_batches(self, batch_size: int) -> int:
        """Model predictions one evaluation makes: every user once per split (for the progress bar)."""
        return len(SPLITS) * -(-self.data.num_users // batch_size)

    def tables(self) -> dict[str, tuple[int, int]]:
        L = self.data.max_len
        tokens = L + self.catalog_per_example if self.catalog_per_example else 2 * L + self.num_negatives
        return {"items": (self.data.num_items, tokens)}

    def metric_names(self) -> list[str]:
        """The keys ``evaluate`` returns (what ``trainer.objective`` may name)."""
        per = [f"{m}@{k}" for k in self.ks for m in ("hr", "ndcg")] + ["mrr"]
        models = ("", "popularity/") + (("oracle/",) if self.world is not None else ())
        return [f"{p}{split}/{m}" for p in models for split in SPLITS for m in per]

    def make_model(self, specs, m: DictConfig) -> SequentialModel:
        return SequentialModel(specs["items"], self.data.num_items, self.data.max_len, m.num_blocks, m.num_heads,
                               m.ffn_mult, m.dropout, m.loss, negatives=self.negatives,
                               catalog_per_example=self.catalog_per_example,
                               l2_norm=m.l2_norm, temperature=m.temperature, seen_bias=m.seen_bias)

    def batch(self, step: int, batch_size: int, shard: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        """Rows [shard*B/n, (shard+1)*B/n) of the global batch of ``step``: a pure function of (seed, step)."""
        b = self.data.train_batch(step, batch_size, self.seed, random_crop=self.random_crop, windows=self.windows)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, step, 0x5E9]))
        shape = (batch_size, max(self.num_negatives, 1))
        if self.negatives == "popularity":  # ids ~ training-prefix counts, by inverting the CDF
            cdf, logq = self.sampling()
            b["negatives"] = (np.searchsorted(cdf, rng.random(shape), side="right") + 1).astype(np.int32)
            b["negatives_logq"] = logq[b["negatives"]]
        else:
            b["negatives"] = rng.integers(1, self.data.num_items + 1, shape, dtype=np.int32)
        if self.negatives == "in_batch":
            b["targets_logq"] = self.sampling()[1][b["targets"]]
        b["seed"] = rng.integers(0, 2**31 - 1, batch_size, dtype=np.int32)
        n = batch_size // num_shards
        return {k: v[shard * n:(shard + 1) * n] for k, v in b.items()}

    def sampling(self) -> tuple[np.ndarray, np.ndarray]:
        """(CDF over items 1..N, float32 log q [N+1]) of q_j = item j's share of the training-prefix counts:
        popularity negatives are drawn from it and logQ-corrected by it; in-batch negatives are corrected by it.
        An item never in a training prefix has q = 0 (never drawn; log q = 0 where it is padding or unused)."""
        if self._sampling is None:
            counts = popularity_scores(self.data).astype(np.float64)
            q = counts / counts.sum()
            logq = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)), 0.0).astype(np.float32)
            cdf = np.cumsum(q[1:])
            cdf[-1] = 1.0
            self._sampling = (cdf, logq)
        return self._sampling

    def train_metrics(self, host_batch: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> dict[str, float]:
        name = "train/top1_full" if self.catalog_per_example else "train/top1_sampled"
        return {name: float(np.asarray(outputs["top1"]))}

    # ----- evaluation --------------------------------------------------------------------------------
    def _eval_batches(self, split: str, batch_size: int):
        B, L = batch_size, self.data.max_len
        zeros = {"targets": np.zeros((B, L), np.int32), "negatives": np.zeros((B, max(self.num_negatives, 1)),
                                                                              np.int32),
                 "seed": np.zeros((B,), np.int32), "targets_logq": np.zeros((B, L), np.float32),
                 "negatives_logq": np.zeros((B, max(self.num_negatives, 1)), np.float32)}
        for b in self.data.eval_batches(split, B, history=self.exclude_seen, pad_last=True):
            yield b, {**zeros, "inputs": b["inputs"]}

    def _ranks(self, split: str, batch_size: int, scores_of: Callable) -> np.ndarray:
        out = []
        for b, dev in self._eval_batches(split, batch_size):
            scores = np.asarray(scores_of(b, dev))[:, : self.data.num_items + 1]
            out.append(rank_of_target(scores, b["target"], b.get("history"))[b["mask"]])
        return np.concatenate(out)

    def _report(self, prefix: str, ranks: np.ndarray) -> dict[str, float]:
        return {f"{prefix}/{k}": v for k, v in ranking_report(ranks, self.ks).items()}

    def baselines(self, batch_size: int) -> dict[str, float]:
        """Popularity (and, on synthetic data, the oracle) ranked on the same users, splits and exclusions."""
        if self._baselines is None:
            pop = popularity_scores(self.data)
            scorers = {"popularity": lambda b, dev: np.broadcast_to(pop, (b["inputs"].shape[0], pop.size))}
            if self.world is not None:
                ids = self.data.item_ids
                scorers["oracle"] = lambda b, dev: self.world.next_item_probs(ids[b["inputs"][:, -1]], ids)
            self._baselines = {k: v for name, f in scorers.items() for split in SPLITS
                               for k, v in self._report(f"{name}/{split}", self._ranks(split, batch_size, f)).items()}
        return dict(self._baselines)

    def evaluate(self, predict: Callable, state: Any, put: Callable, batch_size: int) -> dict[str, float]:
        out = {}
        for split in SPLITS:
            out.update(self._report(split, self._ranks(split, batch_size, lambda b, dev: predict(state, put(dev)))))
        return {**out, **self.baselines(batch_size)}

    def data_metrics(self) -> dict[str, int]:
        """Cold items: validation / test targets whose item never occurs in any training prefix (no training
        signal at all for that row). ``data/cold_*_targets`` count targets (users), ``data/cold_items`` the
        distinct items. With a data file, ``data/duplicate_rows``: its exact duplicate rows dropped."""
        out = cold_targets(self.data)
        if self.data_file is not None:  # rows of data.path dropped as exact duplicates (data.duplicates=drop)
            out["data/duplicate_rows"] = self.duplicate_rows
        return out

    def warnings(self) -> list[str]:
        """What a run says about its data before it trains (runner.app prints it): duplicate rows it dropped, and
        cutoffs that reach the whole catalogue (HR is 1 there for every model and baseline; NDCG still ranks)."""
        out, n = [], self.data.num_items
        if self.duplicate_rows:
            out.append(f"note: {self.data_file}: dropped {self.duplicate_rows:,} rows that repeat an earlier row "
                       f"exactly (the same user, item and timestamp; data.duplicates=drop, counted in "
                       f"data/duplicate_rows); data.duplicates=refuse stops on them instead")
        whole = [k for k in self.ks if k >= n]
        if whole:
            out.append(f"warning: data.ks={list(self.ks)}: a cutoff of {whole[0]} reaches every one of the data's {n} "
                       f"items, so HR@{whole[0]} is 1 for every model and baseline (NDCG and MRR still rank them); "
                       f"cutoffs below {n} tell them apart")
        return out

    def summary_lines(self, s: Mapping[str, Any]) -> list[str]:
        k = self.ks[0]

        def line(p: str) -> str:
            return f"HR@{k} {s[f'{p}/hr@{k}']:.4f} NDCG@{k} {s[f'{p}/ndcg@{k}']:.4f} MRR {s[f'{p}/mrr']:.4f}"

        lines = [f"{self.data.num_users:,} users, {self.data.num_items:,} items, full ranking, leave-one-out "
                 f"(exclude_seen={self.exclude_seen})",
                 f"test  {line('test')}   (valid {line('valid')})",
                 f"popularity test  {line('popularity/test')}"]
        if self.world is not None:
            lines.append(f"oracle (Bayes-optimal) test  {line('oracle/test')}")
        if "best/step" in s and "best/test/mrr" in s:
            lines.insert(1, f"best  test  {line('best/test')}   (valid {line('best/valid')}; step {s['best/step']}, "
                            f"selected on {s.get('selected_on', self.objective)})")
            lines[2] = "final " + lines[2]
        if "data/cold_valid_targets" in s:
            lines.append(f"cold targets (item never in a training prefix): valid {s['data/cold_valid_targets']:,}, "
                         f"test {s['data/cold_test_targets']:,} of {self.data.num_users:,}")
        if s.get("data/duplicate_rows"):
            lines.append(f"dropped {s['data/duplicate_rows']:,} exact duplicate rows of {self.data_file} "
                         f"(data.duplicates=drop)")
        return lines


TASKS.register("movielens")(SequentialTask.from_config)
TASKS.register("synthetic_sequences")(SequentialTask.from_config)
