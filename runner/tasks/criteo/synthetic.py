"""Criteo-format click logs with a planted click model, so a model trained on them can be held against the
Bayes-optimal AUC.

:func:`write_logs` writes files in the exact format of the real logs (``tsv.py``): one file (Kaggle's
``train.txt`` layout) or one per day (Terabyte's ``day_<d>``), optionally gzipped, and beside each file the
true click probability of each of its lines (``<file>.p.npy``, float32), from which :func:`bayes_auc` is
the best AUC any model can reach on those lines.

The planted model, per line: each of the 26 categorical features draws a value (Zipf-like popularity over its
cardinality, missing with probability ``missing``; by default the cardinalities are Criteo Terabyte's,
``TERABYTE_CARDINALITIES``, over the one factor ``SCALE`` with a floor: :func:`scaled`), each integer feature
a count (log-normal, missing likewise). The click logit is a bias, plus a weight per categorical value, plus
weights on ``log(1 + count)``, plus a rank-``rank`` interaction between the values of pairs of features
(``u_a[v_a] . u_b[v_b]``, which only a model with feature interactions, like DLRM's or DCNv2's, can learn).
Everything is a pure function of ``seed``: the same spec writes the same bytes.

Multi-hot (``bags``, as MLPerf DLRMv2's multi-hot Criteo): a feature of bag size ``L > 1`` holds 1 to ``L``
values per line (uniform), each drawn by popularity; its weight and its interaction factor are the mean over
the bag's values (so a model pooling the bag by its mean can represent the planted logit exactly).
"""
from __future__ import annotations

import dataclasses
import gzip
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .disk import writing
from .tsv import CAT, COLUMNS, DENSE, MAX_SEED, NUM_CAT, NUM_DENSE, ONE_HOT, check_bags, offsets

# Criteo Terabyte's distinct values per feature, C1 ... C26 (= cat_01 ... cat_26), over its 24 days, uncapped: the
# "Full Size" row of pytorch/torchrec examples/dlrm/README.MD (--num_embeddings_per_feature). Its "MLPerf" row, MLPerf
# DLRM v1's, caps the five largest at 40,000,000 rows; the other 21 are the same numbers.
TERABYTE_CARDINALITIES = (227_605_432, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 130_229_467, 3_067_956,
                          405_282, 10, 2_209, 11_938, 155, 4, 976, 14, 292_775_614, 40_790_948, 187_188_510,
                          590_152, 12_973, 108, 36)
SCALE = 1000  # the one factor: Terabyte's 4,373,472,329 lines / SCALE is experiment=criteo_synthetic's data.lines
FLOOR = 100  # a feature keeps min(real, FLOOR) values at least


def scaled(cardinalities=TERABYTE_CARDINALITIES, scale: int = SCALE, floor: int = FLOOR) -> tuple[int, ...]:
    """Each feature's ``max(real // scale, min(real, floor))`` values: the real count over ``scale``, but a
    feature of at most ``floor`` values keeps its real count and a larger one keeps ``floor`` at least (at
    ``SCALE`` = 1,000: the five features of 40M values and more 40,790 ... 292,775 values, 3,067,956 -> 3,067,
    39,060 -> 100, 63 -> 63; 883,979 in all)."""
    return tuple(max(c // scale, min(c, floor)) for c in cardinalities)


DEFAULT_CARDINALITIES = scaled()


@dataclasses.dataclass(frozen=True)
class CriteoSpec:
    """What :func:`write_logs` generates.

    Attributes:
        lines: examples in all, split evenly over ``days`` files.
        days: 1 writes ``train.txt``; more write ``day_0`` ... ``day_<days-1>``.
        cardinalities: distinct values of each of the 26 categorical features.
        seed: the click model's and the examples' seed.
        missing: probability that a feature is empty.
        zipf: popularity exponent of categorical values (higher: a few values dominate).
        rank: width of the planted pairwise interactions.
        bias: the logit's constant (sets the click rate: -1.5 gives about 25 percent clicks).
        gzip: write ``.gz`` files.
        chunk: lines generated and written at a time.
        bags: the most values each feature holds per line (1: one value, the real logs' layout).
    """

    lines: int = 200_000
    days: int = 1
    cardinalities: tuple[int, ...] = DEFAULT_CARDINALITIES
    seed: int = 0
    missing: float = 0.05
    zipf: float = 1.05
    rank: int = 4
    bias: float = -1.5
    gzip: bool = False
    chunk: int = 100_000
    bags: tuple[int, ...] = ONE_HOT

    def problems(self) -> list[str]:
        """Each bad value, named with its valid range."""
        out = []
        if self.lines < 1:
            out.append(f"lines={self.lines}: must be >= 1")
        if not 0 <= self.seed <= MAX_SEED:
            out.append(f"seed={self.seed}: must be in 0..{MAX_SEED}")
        if not 1 <= self.days <= self.lines:
            out.append(f"days={self.days}: must be 1..lines ({self.lines})")
        if len(self.cardinalities) != NUM_CAT or min(self.cardinalities) < 1:
            out.append(f"cardinalities: {NUM_CAT} values >= 1, one per categorical feature "
                       f"(got {len(self.cardinalities)})")
        if not 0.0 <= self.missing < 1.0:
            out.append(f"missing={self.missing}: must be in [0, 1)")
        if self.zipf <= 0:
            out.append(f"zipf={self.zipf}: must be > 0")
        if self.rank < 0 or self.chunk < 1:
            out.append(f"rank={self.rank}, chunk={self.chunk}: rank >= 0 and chunk >= 1")
        try:
            check_bags(self.bags)
        except ValueError as e:
            out.append(f"bags: {e}")
        return out


PAIRS = ((0, 1), (2, 3), (2, 9), (4, 12), (6, 15))  # the feature pairs with a planted interaction


class ClickModel:
    """The planted model's parameters (a pure function of the spec's seed)."""

    def __init__(self, spec: CriteoSpec):
        rng = np.random.default_rng([spec.seed, 1])
        self.spec = spec
        # each feature's values: a distinct 32-bit hash per value index (what the file holds, in hex)
        self.hashes = [rng.choice(2 ** 32, size=c, replace=False).astype(np.uint32) for c in spec.cardinalities]
        self.weights = [rng.normal(0.0, 0.3, c).astype(np.float32) for c in spec.cardinalities]
        self.dense_weights = rng.normal(0.0, 0.25, NUM_DENSE).astype(np.float32)
        self.dense_scale = rng.uniform(0.5, 2.5, NUM_DENSE)  # log-normal sigma of each count
        self.factors = {p: [rng.normal(0.0, 0.7 / max(spec.rank, 1) ** 0.25, (spec.cardinalities[f], spec.rank))
                            .astype(np.float32) for f in p] for p in PAIRS}
        self.popularity = [self._popularity(c, rng) for c in spec.cardinalities]

    def _popularity(self, card: int, rng: np.random.Generator) -> np.ndarray:
        p = 1.0 / np.arange(1, card + 1) ** self.spec.zipf
        return np.cumsum(rng.permutation(p / p.sum()))

    def draw(self, rng: np.random.Generator, n: int):
        """``n`` examples: (value indices ``[n, sum(bags)]``, feature j's bag from column ``offsets(bags)[j]``,
        -1 missing or past the bag's count; counts [n, 13] with -1 missing; p [n])."""
        s = self.spec
        one = np.stack([np.minimum(np.searchsorted(c, rng.random(n)), len(c) - 1) for c in self.popularity], 1)
        one[rng.random((n, NUM_CAT)) < s.missing] = -1
        counts = np.floor(np.exp(rng.normal(0.0, 1.0, (n, NUM_DENSE)) * self.dense_scale)).astype(np.int64)
        counts[rng.random((n, NUM_DENSE)) < s.missing] = -1
        start = offsets(s.bags)
        idx = np.full((n, int(start[-1])), -1, np.int64)
        for j, bag in enumerate(s.bags):  # the extra values of multi-hot features, drawn after the one-hot ones
            idx[:, start[j]] = one[:, j]
            if bag > 1:
                k = np.where(one[:, j] >= 0, rng.integers(1, bag + 1, n), 0)
                more = np.minimum(np.searchsorted(self.popularity[j], rng.random((n, bag - 1))),
                                  len(self.popularity[j]) - 1)
                idx[:, start[j] + 1:start[j + 1]] = np.where(np.arange(1, bag) < k[:, None], more, -1)

        def mean(j: int, table: np.ndarray) -> np.ndarray:  # feature j's bag mean of table rows (0 if missing)
            v = idx[:, start[j]:start[j + 1]]
            if v.shape[1] == 1:  # one-hot: the row itself, in the table's dtype
                return np.where((v[:, 0] >= 0).reshape(-1, *(1,) * (table.ndim - 1)), table[np.maximum(v[:, 0], 0)], 0)
            w = table[np.maximum(v, 0)] * (v >= 0).reshape(*v.shape, *(1,) * (table.ndim - 1))
            return w.sum(1) / np.maximum((v >= 0).sum(1), 1).reshape(-1, *(1,) * (table.ndim - 1))

        logit = np.full(n, s.bias, np.float64)
        for j in range(NUM_CAT):
            logit += mean(j, self.weights[j])
        logit += np.log1p(np.maximum(counts, 0)) @ self.dense_weights.astype(np.float64) - 0.2 * self.dense_weights.sum()
        for (a, b), (ua, ub) in self.factors.items():
            logit += np.sum(mean(a, ua) * mean(b, ub), axis=1)
        return idx, counts, (1.0 / (1.0 + np.exp(-logit))).astype(np.float32)


def _hex_column(values: np.ndarray, present: np.ndarray) -> pa.Array:
    """Bags of uint32 values ``[n, L]`` (``present``: bool ``[n, L]``, a bag's values first) as strings of 8 hex
    digits joined by commas ('' for an empty bag), built from buffers (no Python strings)."""
    n, bag = values.shape
    chars = np.full((n, bag, 9), ord(","), np.uint8)
    chars[:, :, :8] = np.frombuffer(b"0123456789abcdef", np.uint8)[
        (values[:, :, None] >> np.arange(28, -1, -4, dtype=np.uint32)) & 0xF]
    k = present.sum(1)
    keep = np.repeat(present, 9, axis=1).reshape(n, bag, 9)
    keep[np.arange(n), np.maximum(k - 1, 0), 8] = False  # no comma after a bag's last value
    lengths = np.maximum(9 * k - 1, 0).astype(np.int32)
    offsets_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = chars[keep].tobytes()
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets_.tobytes()), pa.py_buffer(data))


def _table(model: ClickModel, idx: np.ndarray, counts: np.ndarray, labels: np.ndarray) -> pa.Table:
    cols = {"label": pc.cast(pa.array(labels.astype(np.int8)), pa.string())}
    for j, c in enumerate(DENSE):
        cols[c] = pc.if_else(pa.array(counts[:, j] < 0), "", pc.cast(pa.array(counts[:, j]), pa.string()))
    start = offsets(model.spec.bags)
    for j, c in enumerate(CAT):
        v = idx[:, start[j]:start[j + 1]]
        cols[c] = _hex_column(model.hashes[j][np.maximum(v, 0)], v >= 0)
    return pa.table([cols[c] for c in COLUMNS], names=list(COLUMNS))


def file_names(spec: CriteoSpec) -> list[str]:
    """The files :func:`write_logs` writes, in order."""
    names = ["train.txt"] if spec.days == 1 else [f"day_{d}" for d in range(spec.days)]
    return [n + ".gz" if spec.gzip else n for n in names]


# A generated line's least size in bytes, with its click probability (4 bytes, float32) beside it: one value a
# feature, every field filled (measured: about 256 a line uncompressed, 98 gzipped; bags write more)
LEAST_LINE_BYTES, LEAST_GZIP_LINE_BYTES = 230, 80


class NoRoom(ValueError):
    """The files a spec generates cannot fit on ``out``'s file system, by a lower bound of their size."""


def room_problem(spec: CriteoSpec, out: str | Path) -> str | None:
    """Why ``spec``'s files cannot fit in ``out``'s file system (the free space of its nearest existing folder),
    or None. Their least size is counted, so a refusal is sure; files that would only just fit may still not."""
    need = spec.lines * (LEAST_GZIP_LINE_BYTES if spec.gzip else LEAST_LINE_BYTES)
    folder = Path(out).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if need <= free:
        return None
    how = "gzipped" if spec.gzip else "uncompressed"
    return (f"{spec.lines:,} generated lines take at least {need / 1e9:,.1f} GB {how}, and the file system of "
            f"{folder} has {free / 1e9:,.1f} GB free")


def write_logs(spec: CriteoSpec, out: str | Path) -> list[Path]:
    """Write the spec's files into ``out``, a new or empty folder (each written to a temporary name, then renamed);
    returns them. A folder holding anything is refused: the files would replace a user's logs of the same name,
    or sit beside another generation's days; so are files that cannot fit on its file system (:class:`NoRoom`,
    before a byte is written). Stopped midway (a full disk, Ctrl-C), it leaves ``out`` as found."""
    from .disk import DiskError, claim, release

    bad = spec.problems()
    if bad:
        raise ValueError("CriteoSpec: " + "; ".join(bad))
    room = room_problem(spec, out)
    if room is not None:
        raise NoRoom(room)
    out = Path(out)
    made = claim(out, "generation")
    try:
        paths = _write_logs(spec, out)
    except DiskError as e:  # a full disk, a folder no longer writable: said with what became of the folder
        raise e.left(out, release(out, made, keep=False)) from None
    except BaseException:
        release(out, made, keep=False)
        raise
    release(out, made, keep=True)
    return paths


def _write_logs(spec: CriteoSpec, out: Path) -> list[Path]:
    model, paths = ClickModel(spec), []
    per_day = np.diff(np.linspace(0, spec.lines, spec.days + 1).round().astype(int))
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    for day, (name, n) in enumerate(zip(file_names(spec), per_day)):
        path, tmp = out / name, out / (name + ".partial")
        plain = tmp.with_suffix(".tsv.partial") if spec.gzip else tmp
        with writing(plain, "writing a generated log"):  # pyarrow's errors name no file: the message does
            probs = _write_log(spec, model, day, n, plain, options)
        if spec.gzip:
            with writing(tmp, "compressing a generated log"):
                with open(plain, "rb") as src, gzip.open(tmp, "wb", compresslevel=1) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                plain.unlink()
        truth = out / (name + ".p.npy")
        with writing(truth, "writing a generated log's click probabilities"):
            np.save(truth, np.concatenate(probs) if probs else np.zeros(0, np.float32))
        with writing(tmp, "renaming a generated log into place"):
            tmp.replace(path)
        paths.append(path)
    return paths


def _write_log(spec: CriteoSpec, model: ClickModel, day: int, n: int, plain: Path, options) -> list[np.ndarray]:
    """Day ``day``'s ``n`` lines into ``plain``, uncompressed; returns their click probabilities."""
    probs = []
    with pa.OSFile(str(plain), "wb") as sink:
        for start in range(0, n, spec.chunk):
            m = min(spec.chunk, n - start)
            rng = np.random.default_rng([spec.seed, 2, day, start])
            idx, counts, p = model.draw(rng, m)
            labels = (rng.random(m) < p).astype(np.int8)
            pacsv.write_csv(_table(model, idx, counts, labels), sink, options)
            probs.append(p)
    return probs


def bayes_auc(labels: np.ndarray, p: np.ndarray) -> float:
    """The AUC of the true click probabilities: the best any model reaches on these labels."""
    from ..ranking.auc import auc

    return float(auc(np.asarray(labels), np.asarray(p)))
