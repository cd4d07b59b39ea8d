"""Converting Criteo-format logs into training shards: one streaming pass, bounded memory.

``convert(inputs, out)`` reads each file block by block (``tsv.read_blocks``; never a file whole), splits the
examples, and writes each split as shards of fixed-size records (``record_dtype(bags)``: the label, the 13
transformed integer features, the raw categorical values (``bags[j]`` slots for feature ``j``) and how many
values each feature holds, 0 where missing), each a ``.npy`` file a reader maps and indexes at random
(``shards.Shards``). ``bags`` (``--bag-sizes``) is fixed at conversion and recorded in the manifest. Beside the shards: ``manifest.json`` (the files read,
the examples and bad lines of each, the split rule, every shard with the SHA-256 of its records) and ``counts.npz``, each categorical
feature's values with their counts over the training split, from which a vocabulary for any ``min_count`` is
derived (``ids.vocabulary``; the one given here is saved as ``vocab_min<k>.npz``).

Splits, decided by the inputs' names: files named ``day_<d>`` (``.gz`` too), two or more, are split by day as
the Terabyte benchmark is (every day but the last trains; the last day's first half validates, its second
half tests); anything else (Kaggle's single ``train.txt``) gets a seeded 90/5/5 split of its lines. Days are
never mixed by a random split: ``day_<d>`` files given with any other file are refused, not split at random.
``python -m runner.prepare`` also refuses a conversion with a split of fewer than ``MIN_EXAMPLES`` examples, which
no run would take (``too_few``, the run's own check).

Every file is written to a temporary name and renamed when complete, and ``manifest.json`` last: a conversion
that stops leaves no manifest, and a directory holding a complete one is refused, never overwritten.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .disk import CLAIM, DiskError, PrepareError, claim, release, writing
from .ids import save_vocabulary, uniform, vocabulary_path
from .tsv import (BLOCK_BYTES, MAX_SEED, NUM_CAT, NUM_DENSE, ONE_HOT, FormatError, Reader, check_bags, offsets,
                  unreadable)

FORMAT = 2


def record_dtype(bags=ONE_HOT) -> np.dtype:
    """One example: ``cat`` holds feature j's values from slot ``offsets(bags)[j]`` (0 past its ``count``);
    ``p`` is the line's true click probability where the logs came with one (generated: <file>.p.npy), else NaN."""
    return np.dtype([("label", "i1"), ("dense", "<f4", (NUM_DENSE,)), ("cat", "<u4", (int(offsets(bags)[-1]),)),
                     ("count", "u1", (NUM_CAT,)), ("p", "<f4")])


RECORD = record_dtype()
SPLITS = ("train", "valid", "test")
DAY = re.compile(r"^day_(\d+)(\.gz)?$")
SHARD_LINES = 1 << 20
MIN_EXAMPLES = 100  # per split: fewer gives an evaluation without both labels (AUC undefined)


def too_few(sizes: dict[str, int]) -> dict[str, int]:
    """The splits of ``sizes`` (examples per split) below ``MIN_EXAMPLES``: a run refuses a folder with any
    (``CriteoTask``), and ``convert(..., refuse_small=True)`` refuses to write one."""
    return {s: int(n) for s, n in sizes.items() if n < MIN_EXAMPLES}


@dataclasses.dataclass
class _Writer:
    """One split's shards, streamed: each block's records are appended to the open shard file as they come (no
    shard is held in memory), the ``.npy`` header, of a fixed size, written over its placeholder once the
    shard's length is known; at ``shard_lines`` records (or the end) the file is renamed from its temporary name."""

    folder: Path
    shard_lines: int
    file: Any = None
    dtype: Any = None
    buffered: int = 0
    shards: list = dataclasses.field(default_factory=list)
    digest: Any = None  # SHA-256 of the open shard's records: the manifest records it, so a checkpoint's
    # fingerprint of the manifest (runner.checkpoint.data) changes with any record, not only with the counts

    def add(self, records: np.ndarray) -> None:
        with writing(self._tmp(), "writing a shard"):
            self._add(records)

    def _add(self, records: np.ndarray) -> None:
        while len(records):
            take = min(len(records), self.shard_lines - self.buffered)
            if self.file is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self.file, self.dtype, self.digest = open(self._tmp(), "wb"), records.dtype, hashlib.sha256()
                self.file.write(npy_header(records.dtype, 0))
            chunk = np.ascontiguousarray(records[:take]).tobytes()
            self.digest.update(chunk)
            self.file.write(chunk)
            self.buffered += take
            records = records[take:]
            if self.buffered == self.shard_lines:
                self.flush()

    def flush(self) -> None:
        if self.file is None:
            return
        name = self._name()
        with writing(self._tmp(), "writing a shard"):
            self.file.seek(0)
            self.file.write(npy_header(self.dtype, self.buffered))
            self.file.close()
            self._tmp().replace(self.folder / name)
        self.shards.append({"file": f"{self.folder.name}/{name}", "examples": self.buffered,
                            "sha256": self.digest.hexdigest()})
        self.file, self.buffered = None, 0

    def _name(self) -> str:  # the shard being written
        return f"shard-{len(self.shards):05d}.npy"

    def _tmp(self) -> Path:
        return self.folder / (self._name() + ".partial")


HEADER_BYTES = 1024  # every shard's .npy header, padded to this size (a multiple of 64, as the format wants)


def npy_header(dtype: np.dtype, n: int) -> bytes:
    """A version 1.0 ``.npy`` header for ``n`` records of ``dtype``, padded with spaces to ``HEADER_BYTES``."""
    text = repr({"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                 "shape": (int(n),)}).encode("latin1")
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise ValueError(f"a record type too long for a {HEADER_BYTES}-byte .npy header: {dtype}")
    return b"\x93NUMPY\x01\x00" + (HEADER_BYTES - 10).to_bytes(2, "little") + text + b" " * pad + b"\n"


class _Counts:
    """Each categorical feature's (values, counts), merged from blocks in batches (bounded work per block)."""

    def __init__(self):
        self.merged = [(np.zeros(0, np.uint32), np.zeros(0, np.int64)) for _ in range(NUM_CAT)]
        self.pending: list[list] = [[] for _ in range(NUM_CAT)]
        self.pending_size = [0] * NUM_CAT

    def add(self, cat: np.ndarray, count: np.ndarray, bags) -> None:
        start = offsets(bags)
        for j in range(NUM_CAT):
            slots = cat[:, start[j]:start[j + 1]]
            v, c = np.unique(slots[np.arange(slots.shape[1]) < count[:, j, None]], return_counts=True)
            self.pending[j].append((v, c))
            self.pending_size[j] += len(v)
            if self.pending_size[j] > max(1 << 18, len(self.merged[j][0]) // 2):
                self._merge(j)

    def _merge(self, j: int) -> None:
        parts = [self.merged[j], *self.pending[j]]
        v = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        order = np.argsort(v, kind="stable")
        v, c = v[order], c[order]
        del order
        starts = np.flatnonzero(np.concatenate([[True], v[1:] != v[:-1]])) if len(v) else np.zeros(0, np.int64)
        self.merged[j] = (v[starts], np.add.reduceat(c, starts) if len(v) else np.zeros(0, np.int64))
        self.pending[j], self.pending_size[j] = [], 0

    def result(self) -> list[tuple[np.ndarray, np.ndarray]]:
        for j in range(NUM_CAT):
            self._merge(j)
        return self.merged


def split_rule(inputs: Sequence[Path]) -> str:
    """``"day"`` when the inputs are two or more ``day_<d>`` files, else ``"seeded"``."""
    return "day" if len(inputs) >= 2 and all(DAY.match(p.name) for p in inputs) else "seeded"


def load_truth(path: Path) -> tuple[np.ndarray | None, str | None]:
    """(the click probabilities in ``path``, a ``<log>.p.npy``, or None when there is none; why it cannot be
    used, or None)."""
    what = ("A file of that name is the true click probability of each line that generated logs come with (python "
            "-m runner.prepare criteo-synthetic), read only for the Bayes-optimal AUC")
    try:
        if not path.exists():
            return None, None
        p = np.load(path, mmap_mode="r")
        problem = None if p.ndim == 1 and p.dtype.kind == "f" else f"{p.ndim}-d {p.dtype}, not 1-d floats"
    except PermissionError:  # a file that may hold the right array: not called damaged
        return None, (f"{path}: cannot be read (permission denied). {what}: let this user read it (chmod +r {path}, "
                      f"as its owner), run as a user who may, or remove it (the logs then convert without bayes/ "
                      f"metrics)")
    except (OSError, ValueError, EOFError) as e:
        p, problem = None, f"{type(e).__name__}: {str(e).rstrip('.')}"
    if problem:
        return None, (f"{path}: not an array of click probabilities ({problem}). {what}: remove it (the logs then "
                      f"convert without bayes/ metrics) or generate the logs again")
    return p, None


def records_of(block, truth: np.ndarray | None = None, bags=ONE_HOT) -> np.ndarray:
    """A block's examples as records of ``record_dtype(bags)``; ``truth``: the file's click probability per
    line, if it has them."""
    rec = np.zeros(len(block), record_dtype(bags))
    rec["label"], rec["dense"], rec["cat"], rec["count"] = block.label, block.dense, block.cat, block.count
    rec["p"] = truth[block.lines - 1] if truth is not None else np.nan
    return rec


def convert(inputs: Sequence[str | Path], out: str | Path, *, seed: int = 0, min_count: int = 1,
            max_bad_lines: int = 0, shard_lines: int = SHARD_LINES, block_bytes: int = BLOCK_BYTES,
            bags=None, refuse_small: bool = False) -> dict:
    """Convert Criteo-format files into shards under ``out``; returns the manifest (also ``out/manifest.json``).
    ``max_bad_lines`` applies to each file; ``min_count`` is the saved vocabulary's threshold; ``bags`` the
    most values each categorical feature may hold (26 ints, None: one each); ``refuse_small``: refuse (writing
    nothing) a conversion with a split no run takes (``too_few``; a run's own conversion is refused by the run)."""
    empty = [repr(str(p)) for p in inputs if not str(p).strip()]  # Path("") is Path("."): caught as a string
    if empty:
        raise PrepareError(f"an input named {empty[0]}: an empty name; give the path of a Criteo-format file "
                           f"(train.txt, or day_0 ... day_23, .gz too)")
    if not str(out).strip():
        raise PrepareError(f"--out {str(out)!r}: an empty name; give a new or empty output folder")
    inputs = [Path(p) for p in inputs]
    out = Path(out)
    if not inputs:
        raise PrepareError("no input files; give one or more Criteo-format files (train.txt, day_0 ... day_23)")
    for name, v, low in (("min_count", min_count, 1), ("max_bad_lines", max_bad_lines, 0),
                         ("shard_lines", shard_lines, 1), ("block_bytes", block_bytes, 1 << 10)):
        if int(v) != v or v < low:
            raise PrepareError(f"{name}={v}: must be an integer >= {low}")
    if int(seed) != seed or not 0 <= seed <= MAX_SEED:
        raise PrepareError(f"--seed {seed}: must be an integer in 0..{MAX_SEED}")
    try:
        bags = check_bags(bags)
    except ValueError as e:
        raise PrepareError(f"--bag-sizes: {e}") from None
    _check_inputs(inputs)
    if (out / "manifest.json").exists():
        raise PrepareError(f"{out} already holds converted shards (manifest.json); give another output folder, "
                           f"or remove {out} to convert again")
    made = claim(out, "conversion")
    try:
        manifest = _convert(inputs, out, seed, min_count, max_bad_lines, shard_lines, block_bytes, bags, refuse_small)
    except DiskError as e:  # a full disk, a folder no longer writable: said with what became of the folder
        raise e.left(out, release(out, made, keep=False)) from None
    except BaseException:  # a refused line, Ctrl-C, SIGTERM: leave the folder as it was (new or empty)
        release(out, made, keep=False)
        raise
    release(out, made, keep=True)
    return manifest


def _check_inputs(inputs: list[Path]) -> None:
    """Refused before the output folder is taken: an input that is a folder or may not be read (named as given);
    ``day_<d>`` files with others (split at random, the days would be mixed: a stray ``day_2.txt`` or a
    ``day_0.p.npy`` a shell glob picked up); the same file given twice, or the same day twice (``day_0`` and
    ``day_0.gz``, ``day_1`` and ``day_01``), which would be read twice: its lines counted twice, and a day
    trained on and evaluated on."""
    for path in inputs:
        problem = unreadable(path)
        if problem:
            raise problem
    odd = [p for p in inputs if not DAY.match(p.name)]
    if odd and len(odd) < len(inputs):
        days = [p for p in inputs if DAY.match(p.name)]
        truth = [p for p in odd if p.name.endswith(".p.npy")]
        logs, one = [p for p in odd if p not in truth], len(odd) - len(truth) == 1
        it, each = ("it", "it") if one else ("them", "each")
        fix = [f"rename {it} day_<d> (day_<d>.gz if gzipped) for the day {each} holds, or leave {it} out"] * bool(logs)
        if truth:
            fix.append("leave out the .p.npy files (generated logs' click probabilities, read beside their logs)")
        raise PrepareError(f"{', '.join(map(str, odd))}: not named day_<d> (or day_<d>.gz) while "
                           f"{', '.join(map(str, days[:3]))}{' ...' if len(days) > 3 else ''} are: day files are split "
                           f"by day (the last one evaluates), any other input by a random 90/5/5 split of its lines, "
                           f"which would mix the days; {'; '.join(fix)}")
    seen: dict[Any, Path] = {}
    for path in inputs:
        day = DAY.match(path.name)
        keys = [("file", path.resolve())] + ([("day", int(day.group(1)))] if day and split_rule(inputs) == "day" else [])
        for key in keys:
            if key in seen:
                same = "the same file" if key[0] == "file" else f"day {key[1]} twice"
                raise PrepareError(f"{seen[key]} and {path} are {same}: its lines would be read twice (and a day "
                                   f"could be trained and evaluated on). Give each file and each day once")
            seen[key] = path


def _convert(inputs: list[Path], out: Path, seed: int, min_count: int, max_bad_lines: int, shard_lines: int,
             block_bytes: int, bags: tuple[int, ...], refuse_small: bool) -> dict:
    rule = split_rule(inputs)
    if rule == "day":
        inputs = sorted(inputs, key=lambda p: int(DAY.match(p.name).group(1)))
    writers = {s: _Writer(out / s, shard_lines) for s in SPLITS}
    counts, files = _Counts(), []
    for k, path in enumerate(inputs):
        reader = Reader(path, max_bad_lines, block_bytes, bags)
        truth_file = path.with_name(path.name + ".p.npy")
        truth, problem = load_truth(truth_file)
        if problem:
            raise PrepareError(problem)
        last_day = rule == "day" and k == len(inputs) - 1
        eval_blocks = []
        for block in reader:
            if truth is not None and int(block.lines[-1]) > len(truth):
                raise PrepareError(f"{truth_file}: {len(truth)} click probabilities, but {path} has more lines; "
                                   f"remove it (it belongs to other logs) or generate the logs again")
            rec = records_of(block, truth, bags)
            if rule == "day" and not last_day:
                writers["train"].add(rec)
                counts.add(block.cat, block.count, bags)
            elif last_day:  # halves need the day's length: its records are split once it is read
                eval_blocks.append(rec)
            else:  # seeded 90/5/5 by the line's position in its file: the same lines whatever the blocks
                u = uniform(seed, k, block.lines)
                part = np.where(u < 0.9, 0, np.where(u < 0.95, 1, 2))
                for i, s in enumerate(SPLITS):
                    writers[s].add(rec[part == i])
                train = part == 0
                counts.add(block.cat[train], block.count[train], bags)
        if last_day:
            day = np.concatenate(eval_blocks) if eval_blocks else np.zeros(0, record_dtype(bags))
            writers["valid"].add(day[: len(day) // 2])
            writers["test"].add(day[len(day) // 2:])
        if not reader.examples:  # not an empty file (refused as such): every line of it was bad
            raise PrepareError(f"{path}: no example: every line was bad and skipped under --max-bad-lines "
                               f"{max_bad_lines} (the first: {reader.first_bad}); it is not a Criteo-format log, or "
                               f"it is damaged. Leave it out, or replace it")
        files.append({"file": str(path), "bytes": path.stat().st_size, "examples": reader.examples,
                      "truth": truth is not None,
                      "bad_lines": reader.bad_lines, "first_bad": reader.first_bad})
    sizes = {s: sum(x["examples"] for x in w.shards) + w.buffered for s, w in writers.items()}
    if sizes["train"] == 0:
        raise PrepareError(f"{', '.join(map(str, inputs))}: no training example (every line went to the evaluation "
                           f"split); give more lines, or day files other than the last")
    if refuse_small and too_few(sizes):
        how = (f"the last day, {inputs[-1]}, is halved into valid and test: give a last day of at least "
               f"{2 * MIN_EXAMPLES:,} lines" if rule == "day" else
               f"valid and test get 5% of the lines each: give at least {MIN_EXAMPLES * 30:,} lines (the split is "
               f"random: 5% of {MIN_EXAMPLES * 20:,} is {MIN_EXAMPLES} only on average)")
        raise PrepareError(f"{', '.join(map(str, inputs))}: too few examples for a run to train and evaluate on "
                           f"({sizes}; each split needs >= {MIN_EXAMPLES}, or a run refuses the folder); {how}")
    with writing(out, "making the output folder"):
        out.mkdir(parents=True, exist_ok=True)
    for w in writers.values():
        w.flush()
    values = counts.result()
    _save(out / "counts.npz", **{f"values_{j}": v for j, (v, _) in enumerate(values)},
          **{f"counts_{j}": c for j, (_, c) in enumerate(values)})
    del values, counts  # the vocabulary is derived from the file: the counts are not held twice
    with writing(vocabulary_path(out, min_count), "writing the vocabulary"):
        save_vocabulary(out, min_count)
    manifest = {"format": FORMAT, "split": rule, "seed": seed, "min_count": min_count, "bags": list(bags),
                "max_bad_lines": max_bad_lines, "files": files,
                "splits": {s: {"examples": sum(x["examples"] for x in w.shards), "shards": w.shards}
                           for s, w in writers.items()},
                "bad_lines": sum(f["bad_lines"] for f in files)}
    tmp = out / "manifest.json.partial"
    with writing(tmp, "writing the manifest"):  # the last file: a conversion without it is not finished
        tmp.write_text(json.dumps(manifest, indent=1))
        tmp.replace(out / "manifest.json")
    return manifest


def _save(path: Path, **arrays) -> None:
    tmp = path.with_name(path.name + ".partial")
    with writing(tmp, f"writing {path.name}"):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        tmp.replace(path)


__all__ = ["CLAIM", "claim", "convert", "DiskError", "FormatError", "MIN_EXAMPLES", "PrepareError", "RECORD", "SPLITS",
           "record_dtype", "release", "split_rule", "too_few"]
