"""Leave-one-out next-item sequences over interactions (``interactions.py`` reads the files).

Splits
------
``SequenceDataset.from_interactions(inter, max_len, min_interactions=3)`` keeps users with at least
``min_interactions`` interactions (one pass, not a k-core), maps users to 0..U-1 and items to
1..N (both in increasing raw-id order; 0 is padding), orders each user's interactions by
(timestamp, position in the file) and splits leave-one-out: the last item is the test target, the
second last the validation target, the rest is the training prefix. Storage is CSR: ``offsets``
[U+1] into the flat chronological ``items`` (int32); all batching is vectorized gathers.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .interactions import DataError, Interactions

__all__ = ["SequenceDataset", "cold_targets", "popularity_scores"]


def _dense_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes 0..K-1 in increasing-value order, sorted unique values); O(n) when the id range is small."""
    if x.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, x.dtype)
    lo, hi = int(x.min()), int(x.max())
    if hi - lo <= 4 * x.size + (1 << 20):
        shifted = x - lo
        present = np.bincount(shifted, minlength=hi - lo + 1) > 0
        remap = np.cumsum(present) - 1
        return remap[shifted], np.flatnonzero(present) + lo
    uniq, codes = np.unique(x, return_inverse=True)
    return codes.reshape(-1), uniq


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenation of arange(s, s+l) for each (s, l), plus the row each element belongs to."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    rows = np.repeat(np.arange(lengths.size), lengths)
    base = np.repeat(starts.astype(np.int64) - (np.cumsum(lengths) - lengths), lengths)
    return base + np.arange(total, dtype=np.int64), rows


@dataclass(frozen=True, eq=False)
class SequenceDataset:
    """Leave-one-out sequences in CSR layout.

    ``items[offsets[u]:offsets[u+1]]`` is user u's chronological item sequence (dense ids 1..N).
    With L = its length: positions [0, L-2) are the training prefix, L-2 the validation target,
    L-1 the test target.
    """

    max_len: int
    offsets: np.ndarray  # int64 [U+1]
    items: np.ndarray  # int32 [total], dense item ids 1..num_items
    user_ids: np.ndarray  # raw user id of dense user u, [U]
    item_ids: np.ndarray  # raw item id of dense item i, [N+1]; item_ids[0] = -1 (padding)
    num_items: int
    source: str = ""
    fmt: str = ""

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_interactions(cls, inter: Interactions, max_len: int, min_interactions: int = 3) -> "SequenceDataset":
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if min_interactions < 3:
            raise ValueError(f"min_interactions must be >= 3 (test + validation target + one training "
                             f"item), got {min_interactions}")
        if len(inter) == 0:
            raise DataError(f"{inter.source}: no interactions")
        ucode, user_ids = _dense_codes(inter.user)
        counts = np.bincount(ucode)
        kept = counts >= min_interactions
        if not kept.any():
            raise DataError(f"{inter.source}: no user has >= {min_interactions} interactions (data.min_interactions; "
                            f"the longest sequence has {int(counts.max())}): leave-one-out takes a test and a "
                            f"validation target from each user and trains on the rest; use data where users have "
                            f">= 4 interactions" + (f", or lower data.min_interactions to {int(counts.max())} or less"
                                                     if counts.max() >= 4 else ""))
        item, ts = inter.item, inter.timestamp
        if not kept.all():
            keep = kept[ucode]
            item, ts = item[keep], ts[keep]
            ucode = (np.cumsum(kept) - 1)[ucode[keep]]
            user_ids, counts = user_ids[kept], counts[kept]
        if counts.max() < 4:  # every kept user has exactly 3: nothing left to train on
            raise DataError(
                f"{inter.source}: no user can be trained on: the longest kept sequence has {int(counts.max())} "
                f"interactions, and leave-one-out training needs a user with >= 4 (two training items to "
                f"predict one from, plus the validation and test targets); use data where some users have >= 4 "
                f"interactions")
        icode, item_uniq = _dense_codes(item)
        # stable order by (user, timestamp); ties keep file order
        tmin, tspan = int(ts.min()), int(ts.max()) - int(ts.min()) + 1
        if len(user_ids) * tspan < (1 << 62):
            order = np.argsort(ucode * tspan + (ts - tmin), kind="stable")
        else:
            order = np.lexsort((ts, ucode))
        offsets = np.zeros(len(user_ids) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        items = (icode[order] + 1).astype(np.int32)
        item_ids = np.concatenate([np.array([-1], item_uniq.dtype), item_uniq])
        return cls(max_len=int(max_len), offsets=offsets, items=items, user_ids=user_ids,
                   item_ids=item_ids, num_items=int(item_uniq.size), source=inter.source, fmt=inter.fmt)

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def num_users(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Full sequence length per user (train prefix + 2)."""
        return np.diff(self.offsets)

    @property
    def train_lengths(self) -> np.ndarray:
        return self.lengths - 2

    @property
    def valid_target(self) -> np.ndarray:
        return self.items[self.offsets[1:] - 2]

    @property
    def test_target(self) -> np.ndarray:
        return self.items[self.offsets[1:] - 1]

    def train_sequence(self, u: int) -> np.ndarray:
        return self.items[self.offsets[u]:self.offsets[u + 1] - 2]

    def train_items(self) -> np.ndarray:
        """Every item of every training prefix (flat)."""
        pos, _ = _ranges(self.offsets[:-1], self.train_lengths)
        return self.items[pos]

    # ---- batching -------------------------------------------------------------------------
    def _window(self, users: np.ndarray, end: np.ndarray, shift: int) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded [B, max_len] of seq[end-max_len+shift : end+shift] (position < shift -> 0)."""
        j = np.arange(self.max_len, dtype=np.int64)
        idx = end[:, None] - self.max_len + j[None, :]  # position in the user's sequence
        valid = idx >= 0
        flat = self.offsets[users][:, None] + np.where(valid, idx, 0) + shift
        return np.where(valid, self.items[flat], 0).astype(np.int32), valid

    def train_batch(self, step: int, batch_size: int, seed: int = 0, *, random_crop: bool = False,
                    num_negatives: int = 0, windows: str = "last") -> dict:
        """One training batch, a pure function of (seed, step).

        Users are drawn uniformly with replacement among users whose training prefix has >= 2
        items. For a prefix s of length P, the window ends at ``end = P`` (the full prefix,
        SASRec; default) or, with ``random_crop``, at ``end`` uniform in [2, P]; then
        ``inputs = s[:end-1][-max_len:]`` and ``targets = s[1:end][-max_len:]``, both left-padded
        with 0 (targets are 0 exactly where inputs are padding).

        With ``windows="all"`` the examples are windows, not users: each training prefix is cut from its end
        into consecutive windows of ``max_len`` targets (ends at P, P - max_len, ...; the first may be
        shorter), and a batch draws windows uniformly, so every training target is trained on equally often
        (``"last"``: only the last ``max_len`` targets of each user's prefix ever are). ``random_crop`` applies
        to ``"last"`` only.

        Returns ``user`` int32 [B] (dense), ``inputs`` / ``targets`` int32 [B, max_len], and with
        ``num_negatives > 0`` ``negatives`` int32 [B, max_len, num_negatives]: items uniform in
        1..N (may coincide with the target), 0 at padded positions.
        """
        eligible = self._train_users
        if eligible.size == 0:
            raise DataError(f"{self.source}: no user has a training prefix of >= 2 items")
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(step)]))
        if windows == "all":
            w_users, w_ends = self.train_windows()
            pick = rng.integers(0, w_users.size, size=batch_size)
            users, end = w_users[pick], w_ends[pick]
        else:
            users = eligible[rng.integers(0, eligible.size, size=batch_size)]
            prefix = self.train_lengths[users]
            end = rng.integers(2, prefix + 1) if random_crop else prefix
        inputs, valid = self._window(users, end - 1, 0)
        targets, _ = self._window(users, end - 1, 1)
        out = {"user": users.astype(np.int32), "inputs": inputs, "targets": targets}
        if num_negatives > 0:
            neg = rng.integers(1, self.num_items + 1, size=(batch_size, self.max_len, num_negatives))
            out["negatives"] = np.where(valid[:, :, None], neg, 0).astype(np.int32)
        return out

    def train_windows(self) -> tuple[np.ndarray, np.ndarray]:
        """(user, end) of every training window: each prefix of length P >= 2 cut from its end into windows of
        ``max_len`` targets, ending at P, P - max_len, ... while an end leaves >= 2 items (input and target).
        Every target of every prefix is in exactly one window."""
        cache = self.__dict__.get("_train_windows_cache")
        if cache is None:
            users = self._train_users
            P = self.train_lengths[users].astype(np.int64)
            count = -(-(P - 1) // self.max_len)  # targets P-1, max_len of them per window
            w_users = np.repeat(users, count)
            k = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)  # window index per user
            cache = (w_users, np.repeat(P, count) - k * self.max_len)
            object.__setattr__(self, "_train_windows_cache", cache)
        return cache

    @property
    def _train_users(self) -> np.ndarray:
        cache = self.__dict__.get("_train_users_cache")
        if cache is None:
            cache = np.flatnonzero(self.train_lengths >= 2)
            object.__setattr__(self, "_train_users_cache", cache)
        return cache

    def eval_batches(self, split: str, batch_size: int, *, history: bool = True,
                     pad_last: bool = False) -> Iterator[dict]:
        """Every user once, in dense-user order.

        ``valid``: inputs = the training prefix, target = the validation item.
        ``test``: inputs = training prefix + validation item, target = the test item.
        Yields ``user`` int32 [B], ``inputs`` int32 [B, max_len] (last max_len items, left-padded
        with 0), ``target`` int32 [B], ``mask`` bool [B] (False on rows added by ``pad_last``,
        which pads the last batch to ``batch_size`` by repeating user 0), and with ``history``
        a bool [B, num_items+1] mask of every item in the input sequence (the whole prefix, not
        only the last max_len), for excluding already-seen items from the ranking.
        """
        if split not in ("valid", "test"):
            raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        shift = 2 if split == "valid" else 1
        for start in range(0, self.num_users, batch_size):
            users = np.arange(start, min(start + batch_size, self.num_users), dtype=np.int64)
            n = users.size
            if pad_last and n < batch_size:
                users = np.concatenate([users, np.zeros(batch_size - n, np.int64)])
            mask = np.arange(users.size) < n
            end = self.lengths[users] - shift  # length of the input sequence
            inputs, _ = self._window(users, end, 0)
            out = {
                "user": users.astype(np.int32),
                "inputs": inputs,
                "target": self.items[self.offsets[users] + end].astype(np.int32),
                "mask": mask,
            }
            if history:
                pos, rows = _ranges(self.offsets[users], end)
                hist = np.zeros((users.size, self.num_items + 1), bool)
                hist[rows, self.items[pos]] = True
                out["history"] = hist
            yield out


def popularity_scores(dataset: SequenceDataset) -> np.ndarray:
    """float32 [num_items+1]: how often each item occurs in the training prefixes (the
    validation/test targets are not counted); column 0 (padding) is 0."""
    counts = np.bincount(dataset.train_items(), minlength=dataset.num_items + 1)
    counts[0] = 0
    return counts.astype(np.float32)


def cold_targets(dataset: SequenceDataset) -> dict[str, int]:
    """Validation and test targets whose item never occurs in any training prefix: ``data/cold_valid_targets``
    and ``data/cold_test_targets`` (users), ``data/cold_items`` (distinct such items)."""
    seen = popularity_scores(dataset) > 0
    ends = dataset.offsets[1:]
    valid, test = dataset.items[ends - 2], dataset.items[ends - 1]
    cold_v, cold_t = ~seen[valid], ~seen[test]
    return {"data/cold_valid_targets": int(cold_v.sum()), "data/cold_test_targets": int(cold_t.sum()),
            "data/cold_items": int(np.unique(np.concatenate([valid[cold_v], test[cold_t]])).size)}
