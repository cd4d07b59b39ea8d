"""Synthetic next-item sequences with a planted pattern (pure numpy, ships with the code).

The world, drawn once from ``seed``:

* ``num_items`` items (raw ids 1..N) dealt into ``num_clusters`` clusters of (nearly) equal size by a
  random permutation, so a cluster's members are scattered over the id range;
* a successor map over clusters, ``succ`` (a random permutation: each cluster has one successor);
* within each cluster, a Zipf(``zipf_a``) popularity over its members.

A user's sequence is a Markov chain over clusters: the first cluster is uniform; then the next cluster
is ``succ[c]`` with probability ``1 - noise``, else uniform over all clusters; each step emits an item
of its cluster by the within-cluster popularity. An item's cluster is a function of the item, so the
chain's state is observed and the Bayes-optimal next-item distribution after item ``i`` is::

    P(j | i) = ((1 - noise) * [cluster(j) == succ[cluster(i)]] + noise / C) * p_within(j)

(``next_item_probs``). Global popularity carries almost no signal (every cluster is equally likely in
the long run), so a model that learns the pattern beats the popularity baseline by a wide margin, and
the oracle says how close to the best possible it gets.

Sequence lengths are uniform in ``[min_length, max_length]``; timestamps increase along a sequence. The
result is an ``Interactions`` (rating 5 everywhere) that goes through the same ``SequenceDataset`` path
as MovieLens; ``write_ratings_dat`` writes it as an ml-1m style ``ratings.dat``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .interactions import Interactions

_WORLD, _USERS = 0x5E0, 0x5E1  # seed streams


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    num_users: int = 2000
    num_items: int = 1000
    num_clusters: int = 50
    min_length: int = 8
    max_length: int = 40
    noise: float = 0.1  # probability that the next cluster is uniform instead of succ[current]
    zipf_a: float = 1.0  # within-cluster popularity exponent
    seed: int = 0

    def problems(self) -> list[str]:
        """What is wrong with these sizes, one line each (empty when fine)."""
        out = []
        if self.num_users < 1:
            out.append(f"num_users={self.num_users} must be positive")
        if not 1 <= self.num_clusters <= self.num_items:
            out.append(f"num_clusters={self.num_clusters} must be in 1..num_items={self.num_items}")
        if not 3 <= self.min_length <= self.max_length:
            out.append(f"min_length={self.min_length}, max_length={self.max_length}: need "
                       f"3 <= min_length <= max_length (leave-one-out takes two items per user)")
        if not 0.0 <= self.noise <= 1.0:
            out.append(f"noise={self.noise} must be in [0, 1]")
        if self.zipf_a < 0:
            out.append(f"zipf_a={self.zipf_a} must be >= 0")
        return out


class SequenceWorld:
    """The hidden pattern of a ``SequenceSpec``: clusters, successors, within-cluster popularity."""

    def __init__(self, spec: SequenceSpec):
        bad = spec.problems()
        if bad:
            raise ValueError("; ".join(bad))
        self.spec = spec
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, _WORLD]))
        n, c = spec.num_items, spec.num_clusters
        self.cluster = np.zeros(n + 1, np.int64)  # raw item id -> cluster (index 0: padding, unused)
        dealt = rng.permutation(n)  # raw id dealt[j] + 1 joins cluster j % c
        self.cluster[1 + dealt] = np.arange(n) % c
        self.succ = rng.permutation(c)
        members = [np.sort(dealt[k::c]) + 1 for k in range(c)]  # each cluster's raw ids, ascending
        self.p_within = np.zeros(n + 1)  # raw item id -> probability within its cluster
        self._members, self._cdfs = [], []
        for m in members:
            m = rng.permutation(m)  # popularity rank -> item
            p = np.arange(1, m.size + 1, dtype=np.float64) ** -spec.zipf_a
            p /= p.sum()
            self.p_within[m] = p
            self._members.append(m)
            self._cdfs.append(np.cumsum(p))
        self._size = np.array([m.size for m in members])
        width = int(self._size.max())
        self._table = np.zeros((c, width), np.int64)  # cluster -> items by rank (padded by the last)
        for k, m in enumerate(self._members):
            self._table[k, :m.size], self._table[k, m.size:] = m, m[-1]

    def _emit(self, clusters: np.ndarray, u: np.ndarray) -> np.ndarray:
        """An item of each cluster by within-cluster popularity (u uniform in [0, 1)): the item at the rank where u
        falls in the cluster's cumulative popularity, found by binary search, one cluster's draws at a time."""
        rank = np.empty(u.shape, np.int64)
        order = np.argsort(clusters, kind="stable")
        starts = np.searchsorted(clusters[order], np.arange(self.spec.num_clusters + 1))
        for k in np.flatnonzero(np.diff(starts)):
            at = order[starts[k]:starts[k + 1]]
            rank[at] = np.searchsorted(self._cdfs[k], u[at], side="right")  # how many cdf values are <= u
        return self._table[clusters, np.minimum(rank, self._size[clusters] - 1)]

    def interactions(self) -> Interactions:
        """Every user's sequence, vectorized over users (one loop over positions)."""
        s = self.spec
        rng = np.random.default_rng(np.random.SeedSequence([s.seed, _USERS]))
        lengths = rng.integers(s.min_length, s.max_length + 1, size=s.num_users)
        cols = []
        cl = rng.integers(0, s.num_clusters, size=s.num_users)
        for t in range(int(lengths.max())):
            if t:
                jump = rng.random(s.num_users) < s.noise
                cl = np.where(jump, rng.integers(0, s.num_clusters, size=s.num_users), self.succ[cl])
            cols.append(self._emit(cl, rng.random(s.num_users)))
        items = np.stack(cols, 1)  # [U, max_length]
        keep = np.arange(items.shape[1])[None, :] < lengths[:, None]
        user = np.broadcast_to(np.arange(1, s.num_users + 1)[:, None], items.shape)[keep]
        ts = 1_000_000_000 + np.broadcast_to(np.arange(items.shape[1])[None, :] * 60, items.shape)[keep]
        return Interactions(user=user.astype(np.int64), item=items[keep].astype(np.int64),
                            timestamp=ts.astype(np.int64), rating=np.full(user.size, 5, np.float32),
                            source=f"synthetic_sequences(seed={s.seed})", fmt="synthetic")

    def next_item_probs(self, last: np.ndarray, raw_ids: np.ndarray) -> np.ndarray:
        """Bayes-optimal ``P(next = raw_ids[j] | last item)`` for raw ``last`` [B] -> [B, len(raw_ids)].

        ``raw_ids`` lists the columns' raw item ids (e.g. a dataset's ``item_ids``); a column whose id is
        not an item (padding, -1) gets probability 0.
        """
        s = self.spec
        valid = (raw_ids >= 1) & (raw_ids <= s.num_items)
        col = np.where(valid, raw_ids, 0)
        nxt = self.succ[self.cluster[np.asarray(last)]]  # [B]
        w = np.where(self.cluster[col][None, :] == nxt[:, None], 1.0 - s.noise, 0.0) + s.noise / s.num_clusters
        return np.where(valid[None, :], w * self.p_within[col][None, :], 0.0)


def write_ratings_dat(inter: Interactions, path: str | Path) -> Path:
    """Write interactions as an ml-1m style ``user::item::rating::timestamp`` file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rating = inter.rating if inter.rating is not None else np.full(len(inter), 5, np.float32)
    rows = np.stack([inter.user, inter.item, rating.astype(np.int64), inter.timestamp], 1)
    np.savetxt(path, rows, fmt="%d", delimiter="::")
    return path


def main(argv: list[str] | None = None) -> None:
    """``python -m runner.tasks.sequential.synthetic OUT_DIR [num_users [num_items [num_clusters]]]``: the world's
    sequences as ``OUT_DIR/ratings.dat`` (MovieLens-1M's format: ``data=movielens data.path=OUT_DIR`` reads it).
    A ``ratings.dat`` already there (a MovieLens copy, say) is never replaced, and a bad argument is refused with
    one line (exit code 2) before anything is written."""
    import contextlib  # noqa: PLC0415 (only the command line needs them)
    import os  # noqa: PLC0415

    from ...command_line import OneLineParser  # noqa: PLC0415

    p = OneLineParser(prog="python -m runner.tasks.sequential.synthetic",
                      description="Write the synthetic sequences (a planted next-item pattern) as "
                                  "OUT_DIR/ratings.dat, in MovieLens-1M's format.")
    p.add_argument("out", metavar="OUT_DIR", help="the folder to write ratings.dat into (made if missing)")
    p.add_argument("sizes", metavar="N", type=int, nargs="*", default=[],
                   help="num_users num_items num_clusters, in that order (default 2000 1000 50)")
    a = p.parse_args(argv)
    if len(a.sizes) > 3:
        p.error(f"{len(a.sizes)} sizes given ({' '.join(map(str, a.sizes))}); give at most three: "
                f"num_users num_items num_clusters")
    spec = SequenceSpec(**dict(zip(("num_users", "num_items", "num_clusters"), a.sizes)))
    if spec.problems():
        p.error("; ".join(spec.problems()))
    if not a.out.strip():
        p.error("OUT_DIR is empty; give the folder to write ratings.dat into")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"OUT_DIR {a.out} is a file, not a folder; give the folder to write ratings.dat into")
    path = Path(a.out) / "ratings.dat"
    if path.exists() or path.is_symlink():
        p.error(f"{path} already exists, and it is never replaced (it may be real MovieLens data); give another "
                f"OUT_DIR, or remove that file first")
    part = path.with_name(f".ratings.dat.{os.getpid()}.part")  # written whole, then moved into place
    try:
        write_ratings_dat(SequenceWorld(spec).interactions(), part)
        os.replace(part, path)
    except OSError as e:
        p.error(f"writing {path} failed ({e.strerror or e}); give an OUT_DIR this user can write")
    finally:
        with contextlib.suppress(OSError):  # a write that failed leaves no part file behind (nor one to remove)
            part.unlink()
    print(path)


if __name__ == "__main__":
    main()
