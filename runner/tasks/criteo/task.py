"""Click-through prediction on Criteo-format logs: DLRM or DCNv2 over 13 dense and 26 categorical features.

Data (``data=criteo``): ``data.path`` names a folder converted by ``python -m runner.prepare criteo``, or the
raw logs (a file, a folder of day files, a glob), converted on first use into ``<data.cache>/logs-<key>``
(``logs.py``: a bad line refuses the run unless ``data.max_bad_lines`` allows it). With ``data.path`` unset,
logs are generated with a planted click model (``synthetic.py``) and converted once into
``<data.cache>/generated-<spec hash>``. ``data.cache`` defaults to ``outputs/criteo_data``; later runs reuse
what is there. Each
categorical feature is one table (``cat_01`` ... ``cat_26``), its values mapped to rows by hashing or by the
training split's vocabulary (``data.ids``, ``ids.py``).

Training reads the train split in a seeded order that is a pure function of the step (``order.py``), so a
resumed or relaunched run reads exactly the examples an uninterrupted one would. Evaluation scores the valid
and test splits (``data.eval_examples`` of each, in file order): ``{valid,test}/auc`` and ``/logloss``, and on
generated logs the Bayes-optimal AUC of the same labels (``bayes/{valid,test}/auc``). Runs are selected and
tuned on ``valid/auc``; test is reported.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from omegaconf import DictConfig

from ...errors import PreflightError, TrainingError
from .. import TASKS, refuse_own_widths
from ..ranking.auc import auc
from .config import CriteoIds, CriteoLogs, DCNStructure, Pooling
from .disk import DiskError
from .ids import FIRST, HashIds, VocabIds, vocabulary
from .logs import DEFAULT_CACHE, cache_failed, converted, once, raw_logs
from .model import DCN, DLRM, TABLES
from .order import examples
from .prepare import FORMAT, MIN_EXAMPLES, PrepareError, convert, split_rule, too_few
from .report import REPORT
from .shards import DamagedShard, Shards, read_manifest
from .synthetic import CriteoSpec, room_problem, write_logs
from .tsv import NUM_DENSE, ONE_HOT, check_bags

SPLITS = ("valid", "test")
MODELS = ("dlrm", "dcn")
PRESET_FILES = {CriteoLogs.kaggle: ("train.txt", "train.txt"),
                CriteoLogs.terabyte: ("a folder of day_0.gz ... day_23.gz", "day_{0..23}.gz")}
PRESET_SOURCES = {CriteoLogs.kaggle: "the Display Advertising Challenge's train.txt, from "
                                     "https://www.kaggle.com/c/criteo-display-ad-challenge",
                  CriteoLogs.terabyte: "the 24 day files of Criteo's 1TB Click Logs, from "
                                       "https://huggingface.co/datasets/criteo/CriteoClickLogs"}
LABEL_CHUNK = 1 << 16  # records read at a time looking for both labels in an evaluation split
CONVERT_AGAIN = ("convert the logs again into a new folder (python -m runner.prepare criteo <files> --out <folder>), "
                 "or set data.path to the raw logs")


def expanded(path: str | None) -> Path | None:
    """A ``data.path`` or ``data.cache`` as a path, ``~`` expanded (None stays None)."""
    return None if path is None else Path(path).expanduser()


def damaged(folder: Path, e: Exception, fix: str) -> PreflightError:
    """The message for a converted folder that cannot be read."""
    return PreflightError(f"{folder}: the converted logs cannot be read ({type(e).__name__}: {e}); the folder is "
                          f"damaged or incomplete: {fix}")


def generated(cfg: DictConfig) -> Path:
    """The converted folder of the generated logs ``cfg.data`` describes, made the first time (``logs.once``:
    concurrent processes and interrupted runs leave no half folder)."""
    d = cfg.data
    spec = _spec(d)
    key = hashlib.sha256(json.dumps([FORMAT, dataclasses.asdict(spec)], sort_keys=True).encode()).hexdigest()[:12]
    folder = (expanded(d.cache) or DEFAULT_CACHE) / f"generated-{key}"
    if (folder / "manifest.json").exists():
        return folder
    logging.getLogger("runner").info("generating %s Criteo-format lines (data.lines) and converting them into %s: "
                                     "once, later runs of the same data settings reuse them", f"{spec.lines:,}", folder)

    def make(work: Path) -> Path:
        convert(write_logs(spec, work / "logs"), work / "shards", seed=spec.seed, bags=spec.bags)
        return work / "shards"

    room = room_problem(spec, folder)
    if room is not None:  # before a byte is written; the shards take more on top
        raise PreflightError(f"data.lines={spec.lines}: {room}; lower data.lines, or set data.cache to a folder on a "
                             f"file system with room")
    try:
        return once(folder, make)
    except (OSError, DiskError) as e:  # before PrepareError, of which DiskError is one
        raise cache_failed(f"generating Criteo logs (data.path unset) into {folder}", e) from None
    except PrepareError as e:  # any other conversion refusal: the run's one line, as for raw logs (logs.converted)
        raise PreflightError(f"generating Criteo logs (data.path unset) into {folder}: {e}") from None


def _spec(d: DictConfig) -> CriteoSpec:
    bags = tuple(int(b) for b in d.bags) if d.get("bags") is not None else ONE_HOT
    return CriteoSpec(lines=int(d.lines), days=int(d.days), seed=int(d.seed), bags=bags)


def _check_rank(m: DictConfig) -> None:
    """DCN's ``low_rank`` must be below its cross layers' input width: a rank that reaches it is full rank, in two
    matrices holding more than the full-rank one."""
    if m.name != "dcn" or m.get("low_rank") is None or int(m.cross_layers) == 0:
        return
    w = int(m.emb_width)
    dense = NUM_DENSE if m.get("bottom") is None else w  # the dense features, or the bottom MLP's embedding-wide one
    width = dense + len(TABLES) * w
    if int(m.low_rank) >= width:
        raise PreflightError(f"model.low_rank={m.low_rank} is not below the cross layers' input width {width} "
                             f"({dense} dense + {len(TABLES)} x model.emb_width={w}): such a rank is full rank, in "
                             f"two matrices larger than the full-rank one; use a rank below {width} (DCNv2's "
                             f"paper uses about a quarter of it), or model.low_rank=null for full rank")


def check(cfg: DictConfig) -> list[Path] | None:
    """The settings refused before any data is read or converted; returns the raw log files ``data.path``
    names (None: a converted folder, or generated logs)."""
    if cfg.model.name not in MODELS:
        raise PreflightError(f"data=criteo is a click-log source, but model={cfg.model.name}; use model=dlrm or "
                             f"model=dcn")
    refuse_own_widths(cfg, "its features meet in dot products or one stacked input")
    _check_rank(cfg.model)
    d = cfg.data
    for key, fix in (("path", "give the Criteo logs or a converted folder, or leave data.path out (null) to train "
                              "on generated logs"),
                     ("cache", f"give a folder for the run's conversions, or leave data.cache out (null: "
                               f"{DEFAULT_CACHE})")):
        if d.get(key) is not None and not str(d.get(key)).strip():
            raise PreflightError(f"data.{key} is empty (data.{key}= with nothing after it, as from an unset shell "
                                 f"variable): {fix}")
    logs, skip = CriteoLogs(d.get("logs", "any")), int(d.get("max_bad_lines", 0))
    if logs is not CriteoLogs.any and not d.path:
        raw, files = PRESET_FILES[logs]
        raise PreflightError(f"data.logs={logs.value} trains on the real Criteo {logs.value} logs, and data.path is "
                             f"unset: set data.path to them ({raw}; converted on first use into data.cache), or to a "
                             f"folder converted ahead of time (python -m runner.prepare criteo {files} --out DIR). The logs: "
                             f"{PRESET_SOURCES[logs]}")
    if not d.path:
        bad = _spec(d).problems()
        if bad:
            raise PreflightError("generated Criteo logs (data.path unset): " + "; ".join(f"data.{b}" for b in bad))
        if skip:
            raise PreflightError(f"data.max_bad_lines={skip} applies to raw logs in data.path, and data.path is unset: "
                                 f"generated logs have no bad lines; unset data.max_bad_lines")
        return None
    files = raw_logs(d.path)
    if files is None:
        _check_converted(d)
    elif d.get("bags") is not None:
        try:
            check_bags(d.bags)
        except ValueError as e:
            raise PreflightError(f"data.bags: {e}") from None
    if files is not None and logs is CriteoLogs.terabyte and split_rule(files) != "day":
        raise PreflightError(f"data.logs=terabyte evaluates on the last day, but data.path={d.path} names "
                             f"{', '.join(map(str, files[:3]))}{' ...' if len(files) > 3 else ''}, not two or more "
                             f"day_<d> files; give the folder of day_<d>.gz files, or use data.logs=any")
    return files


def _check_converted(d: DictConfig) -> None:
    """``data.path`` is a converted folder: its bags and bad lines were settled at conversion."""
    if d.get("bags") is not None:
        raise PreflightError(f"data.bags={list(d.bags)} describes generated or raw logs, but data.path={d.path} is a "
                             f"converted folder, whose bags were fixed at conversion (python -m runner.prepare "
                             f"criteo --bag-sizes); unset data.bags")
    skip = int(d.get("max_bad_lines", 0))
    if skip:
        folder = expanded(d.path)
        try:
            m = read_manifest(folder)
        except (OSError, ValueError) as e:
            raise damaged(folder, e, CONVERT_AGAIN) from None
        raise PreflightError(f"data.max_bad_lines={skip} applies when a run converts raw logs, but data.path={d.path} "
                             f"is a converted folder, whose bad lines were settled at conversion (--max-bad-lines "
                             f"{m.get('max_bad_lines', 0)}: {m.get('bad_lines', 0):,} skipped); unset "
                             f"data.max_bad_lines, or set data.path to the raw logs (converted again with "
                             f"data.max_bad_lines={skip})")


@dataclasses.dataclass
class CriteoTask:
    folder: Path
    ids: Any  # HashIds or VocabIds
    seed: int
    eval_examples: int | None
    logs: str | None = None  # data.path where it names raw logs this run converted (into folder)
    repair: str = CONVERT_AGAIN  # how to get the folder again, should it be damaged
    model_keys: tuple[str, ...] = ("dense", "cat", "label")
    objective: str = "valid/auc"
    report = REPORT
    passes = 1.5  # a budget in steps past this many passes over the logs is warned about (runner.notices)

    def __post_init__(self):
        self.splits = {s: Shards(self.folder, s) for s in ("train", *SPLITS)}
        self.truth = all(f.get("truth") for f in self.splits["train"].manifest["files"])
        # what a checkpoint fingerprints (checkpoint/data.py): the manifest names every shard and its size, the
        # files converted and the split, so another conversion is refused on resume
        self.data_file = str(self.folder / "manifest.json")

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "CriteoTask":
        files, d = check(cfg), cfg.data
        if files is not None:
            folder = converted(d.path, files, expanded(d.cache), int(d.get("max_bad_lines", 0)),
                               tuple(int(b) for b in d.bags) if d.get("bags") is not None else None)
            fix = f"remove {folder} and the run converts {d.path} again"  # this run's conversion, under data.cache
        elif d.path:
            folder, fix = expanded(d.path), CONVERT_AGAIN
        else:
            folder = generated(cfg)
            fix = f"remove {folder} and the run generates the logs again"
        try:
            task = cls._open(cfg, folder, d.path if files is not None else None)
        except PreflightError:
            raise
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # json's errors are ValueErrors
            raise damaged(folder, e, fix) from None
        task.repair = fix
        try:
            one = task.one_label()
        except TrainingError as e:  # a damaged evaluation shard, met before anything compiles
            raise PreflightError(str(e)) from None
        if one:
            raise PreflightError(one)
        return task

    @classmethod
    def _open(cls, cfg: DictConfig, folder: Path, logs: str | None) -> "CriteoTask":
        """The task over the converted ``folder`` (``logs``: the raw logs it was converted from by this run)."""
        fixed = {n: int(t.vocab) for n, t in (cfg.model.get("tables") or {}).items() if t.get("vocab")}
        manifest = read_manifest(folder)
        bags = tuple(manifest["bags"])
        if CriteoLogs(cfg.data.get("logs", "any")) is CriteoLogs.terabyte and manifest["split"] != "day":
            raise PreflightError(f"data.logs=terabyte evaluates on the last day, but data.path={folder} was split "
                                 f"{manifest['split']} (one input file); convert the day_<d> files together, or use "
                                 f"data.logs=any")
        if CriteoIds(cfg.data.ids) is CriteoIds.vocab:  # an Enum member in a structured config
            ids = vocabulary(folder, int(cfg.data.min_count), bags)
            small = {n: (v, ids.table_rows()[TABLES.index(n)]) for n, v in fixed.items()
                     if n in TABLES and v < ids.table_rows()[TABLES.index(n)]}
            if small:
                raise PreflightError(f"model.tables.<name>.vocab below the vocabulary's rows (data.ids=vocab, "
                                     f"data.min_count={cfg.data.min_count}): {small}; raise them or unset them")
        else:
            with np.load(folder / "counts.npz") as z:
                distinct = [len(z[f"values_{j}"]) for j in range(len(TABLES))]
            low = {n: v for n, v in fixed.items() if n in TABLES and v < FIRST + 1}
            if low:
                raise PreflightError(f"model.tables.<name>.vocab={low}: a hashed table needs >= {FIRST + 1} rows (rows "
                                     f"0 and 1 pad bags and hold the missing value); raise them or unset them")
            ids = HashIds([fixed.get(n, min(distinct[j] + FIRST, int(cfg.data.hash_rows)))
                           for j, n in enumerate(TABLES)], bags)
        task = cls(folder, ids, int(cfg.data.seed), cfg.data.eval_examples, logs)
        small = too_few({s: len(d) for s, d in task.splits.items()})
        if small:
            raise PreflightError(f"{folder}: too few examples to train and evaluate on ({small}; each split needs "
                                 f">= {MIN_EXAMPLES}): convert more lines, or raise data.lines for generated logs")
        return task

    def evaluated(self, split: str) -> int:
        """The examples of ``split`` an evaluation scores: its first ``data.eval_examples`` (None: all)."""
        n = len(self.splits[split])
        return n if self.eval_examples is None else min(n, int(self.eval_examples))

    def one_label(self) -> str | None:
        """Why an evaluation's AUC would be undefined (None: it is not): a split whose examples evaluated hold
        one label only. Its AUC, the objective's included, would be nan, which no run can be selected on."""
        for split in SPLITS:
            data, n = self.splits[split], self.evaluated(split)
            first = other = None
            for lo in range(0, len(data), LABEL_CHUNK):  # real logs hold both labels in the first chunk
                labels = self.take(split, np.arange(lo, min(len(data), lo + LABEL_CHUNK)))["label"]
                first = labels[0] if first is None else first
                hit = np.flatnonzero(labels != first)
                if hit.size:
                    other = lo + int(hit[0])
                    break
            if other is not None and other < n:
                continue
            what = "no click" if first == 0 else "every one a click"
            if other is None:
                return (f"{self.folder}: every one of the {split} split's {len(data):,} examples has label "
                        f"{int(first)} ({what}), so its AUC is undefined: give logs that hold both clicks and "
                        f"non-clicks")
            return (f"{self.folder}: the {split} split's first {n:,} examples (data.eval_examples={n}) all have "
                    f"label {int(first)} ({what}), so its AUC is undefined: raise data.eval_examples to "
                    f"{other + 1} or more, or unset it (all of the split)")
        return None

    def take(self, split: str, index: np.ndarray) -> dict[str, np.ndarray]:
        """``split``'s examples at ``index``; a damaged shard stops the run with one message."""
        try:
            return self.splits[split].take(index, self.ids)
        except DamagedShard as e:
            raise TrainingError(f"{e}: the converted folder is damaged: {self.repair}") from None

    def tables(self) -> dict[str, tuple[int, int]]:
        """One table per categorical feature, ids 0..rows-1 (row 0 pads a bag, row 1 is the missing value, and
        under a vocabulary every rare one), each example holding up to its bag size of them."""
        return {n: (r - 1, b) for n, r, b in zip(TABLES, self.ids.table_rows(), self.ids.bags)}

    @property
    def num_train_examples(self) -> int:
        """The training split's examples: what ``trainer.epochs`` counts passes over."""
        return len(self.splits["train"])

    def data_metrics(self) -> dict[str, int]:
        """``data/bad_lines``: the input lines the conversion skipped (``--max-bad-lines``; 0 unless allowed)."""
        return {"data/bad_lines": int(self.splits["train"].manifest.get("bad_lines", 0))}

    def warnings(self) -> list[str]:
        """What a run says about its data before it trains (runner.app prints it)."""
        m, notes = self.splits["train"].manifest, []
        converted_with, mine = int(m.get("min_count", 1)), getattr(self.ids, "min_count", None)  # None: hashed ids
        if not self.logs and mine not in (None, converted_with):  # a folder the user converted
            notes.append(f"note: {self.folder} was converted with --min-count {converted_with}, and this run maps ids "
                         f"with data.min_count={mine} (the vocabulary is derived from the counts for any "
                         f"threshold): set data.min_count={converted_with} for the conversion's")
        if not m.get("bad_lines"):
            return notes
        first = next((f["first_bad"] for f in m["files"] if f.get("first_bad")), None)
        what, setting = ((f"the Criteo logs of data.path={self.logs} were converted into {self.folder}",
                          f"data.max_bad_lines={m.get('max_bad_lines')}") if self.logs else
                         (f"{self.folder} was converted", f"--max-bad-lines {m.get('max_bad_lines')}"))
        return notes + [f"note: {what} skipping {m['bad_lines']:,} bad input lines ({setting} per file; counted in "
                        f"data/bad_lines); the first: {first}"]

    def metric_names(self) -> list[str]:
        names = [f"{s}/{m}" for s in SPLITS for m in ("auc", "logloss", "accuracy")]
        return names + ([f"bayes/{s}/auc" for s in SPLITS] if self.truth else [])

    def make_model(self, specs, model_cfg: DictConfig):
        pooling = Pooling(model_cfg.get("pooling", "sum")).value
        if model_cfg.name == "dlrm":
            return DLRM(specs, pooling, tuple(model_cfg.bottom), tuple(model_cfg.top))
        bottom = model_cfg.get("bottom")
        return DCN(specs, pooling, int(model_cfg.cross_layers), model_cfg.low_rank, tuple(model_cfg.deep),
                   None if bottom is None else tuple(bottom), DCNStructure(model_cfg.get("structure", "stacked")).value)

    def batch(self, step: int, batch_size: int, shard: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        return self.take("train", examples(step, batch_size, len(self.splits["train"]), self.seed, shard, num_shards))

    def train_metrics(self, host_batch: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> dict[str, float]:
        return {"train/auc": auc(host_batch["label"], np.asarray(outputs["probs"]))}

    def evaluate(self, predict: Callable, state: Any, put: Callable, batch_size: int) -> dict[str, float]:
        """AUC, log loss and accuracy (a click predicted above 0.5) of each held-out split (its first
        ``data.eval_examples``), and on generated logs the Bayes-optimal AUC of the same labels."""
        out: dict[str, float] = {}
        for split in SPLITS:
            n = self.evaluated(split)
            labels, scores, truth = [], [], []
            for start in range(0, n, batch_size):
                index = np.minimum(np.arange(start, start + batch_size), n - 1)  # the last batch padded
                b = self.take(split, index)
                keep = min(batch_size, n - start)
                scores.append(np.asarray(predict(state, put({k: b[k] for k in self.model_keys})))[:keep])
                labels.append(b["label"][:keep])
                truth.append(b["p"][:keep])
            labels, scores, truth = map(np.concatenate, (labels, scores, truth))
            p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
            out[f"{split}/auc"] = auc(labels, scores)
            out[f"{split}/logloss"] = float(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean())
            out[f"{split}/accuracy"] = float(((scores > 0.5) == (labels > 0)).mean())  # the DLRM reference's
            if self.truth:
                out[f"bayes/{split}/auc"] = auc(labels, truth)
        return out

    def summary_lines(self, s: Mapping[str, Any]) -> list[str]:
        def line(p: str) -> str:
            text = f"AUC {s[f'{p}/auc']:.4f}, log loss {s[f'{p}/logloss']:.4f}"
            bayes = s.get(f"bayes/{p.split('/')[-1]}/auc")
            if bayes is not None and not math.isnan(bayes):
                text += f" (Bayes-optimal {bayes:.4f}: {s[f'{p}/auc'] / bayes:.4f} of it)"
            return text

        lines = [f"test  {line('test')}   (valid {line('valid')})"]
        if "best/step" in s and "best/test/auc" in s:
            lines.insert(0, f"best  test  {line('best/test')}   (valid {line('best/valid')}; step {s['best/step']})")
        return lines


TASKS.register("criteo")(CriteoTask.from_config)
