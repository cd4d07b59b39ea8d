"""Synthetic multi-action ranking data with a hidden ground-truth model (pure numpy, ships with the code).

The world (drawn once from ``spec.seed``):

* ``num_items`` items, each with a fixed author (uniform over ``1..num_authors``);
* latent vectors (``latent_dim``) for users, items and authors;
* bounded Zipf(``zipf_a``) popularity over users and over items, each composed with a fixed random
  permutation, so the popular ids are scattered over the id range rather than being the small ids;
* per action ``a``: a weight vector ``w_a`` (shared direction with action-specific emphasis per latent
  dim) and a bias ``b_a``.

An example is a (user, history, candidate) triple. The user and candidate item are Zipf draws; the history
is 0..L Zipf item draws, left-aligned, padded with 0. With ``h`` the mean latent of the history items
(zero for an empty history), the true logit of action ``a`` is::

    b_a + <w_a, u*i + 0.5*h*i + 0.3*u*author(i)> + 0.3 * zpop(i)

where ``*`` is the elementwise product and ``zpop`` the standardised log popularity of the candidate.
The scale of ``w_a`` is set so the latent signal has standard deviation 1.6 (``_logit_std``), and ``b_a``
so the label base rate of action ``k`` is ``0.3 / 3**k`` (click ~30%, like ~10%, share ~3% by default).
Labels are Bernoulli draws from the true probabilities, which are returned as well (``probs``), so the
Bayes-optimal AUC is known (``bayes_auc``).

Ids are 1-based: user in [1, num_users], item in [1, num_items], author in [1, num_authors]; 0 is padding.

Drift and raw ids (the hash tables' workload, ``experiment=hash_tables``): with ``drift`` > 0 the Zipf ranks
of users and items slide over their populations, ``drift`` ranks per step (rank r at step t is the id of
rank r + drift * t), so ids rise through the ranks from the cold tail, peak and stop appearing, and the set
of ids a window of steps sees keeps changing; an entity's latents (and ``zpop``, its popularity at step 0, a
fixed per-item bias) do not change. The held-out splits are drawn at step ``eval_at`` (the run's last
step: what the model serves next). With ``raw_ids`` the user and item ids are replaced by 64-bit ids (a
fixed splitmix64 scramble of the id, never 0), delivered as their ``[..., 2]`` uint32 halves
(``runner.core.hash_tables.fingerprint``); author ids stay small.

Determinism: example row ``r`` of ``batch(step, B, split=s)`` depends only on (spec, s, step, r). Rows are
generated in fixed blocks of ``_BLOCK`` rows, each from
``np.random.default_rng(SeedSequence([seed, split_code, step, block]))`` -- never a stateful stream -- so a
resumed run or another process draws exactly the same examples. The global batch of a step is the
concatenation over shards: ``batch(step, B, shard=k, num_shards=n)`` equals rows ``[k*B/n, (k+1)*B/n)`` of
``batch(step, B)``, and a shard only generates the blocks it overlaps. (A consequence: ``batch(step, B)``
is a prefix of ``batch(step, B')`` for ``B' > B``.) The 'train', 'valid' and 'test' splits use disjoint seed
streams: a model is selected and tuned on 'valid' and reported on 'test'.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ...core.hash_tables import fingerprint
from .auc import auc

_SPLIT_CODES = {"train": 0, "test": 1, "valid": 3}  # each split its own seed stream
_CALIB_CODE = 2  # private stream used to calibrate weights and biases at construction
_WORLD_CODE = 0x5EED  # stream for the hidden world (latents, author map, permutations)
_BLOCK = 256  # rows per seeded block
_CALIB_EXAMPLES = 32_768
_POP_COEF = 0.3
_HIST_COEF = 0.5
_AUTHOR_COEF = 0.3
_ACTION_SPREAD = 0.4  # relative per-dim variation of w_a around the shared direction


def _base_rate(k: int) -> float:
    return 0.3 / 3.0**k


def _logit_std(k: int) -> float:
    return 1.6


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    num_users: int = 20_000
    num_items: int = 50_000
    num_authors: int = 5_000
    history_len: int = 16
    actions: tuple[str, ...] = ("click", "like", "share")
    zipf_a: float = 1.1  # Zipf exponent of item/user popularity
    latent_dim: int = 8  # hidden ground-truth model size
    seed: int = 0
    drift: float = 0.0  # ranks of users and items slide this many per step (module docstring)
    raw_ids: bool = False  # user and item ids as 64-bit ids, as [..., 2] uint32 halves
    eval_at: int = 0  # the step whose distribution the held-out splits are drawn at


class _Zipf:
    """Bounded Zipf over ids 1..n (rank r has mass ~ (r+1)^-a), ids permuted; O(1) sampling by Walker's alias
    method (a searchsorted inverse CDF is ~10x slower at these sizes)."""

    def __init__(self, n: int, a: float, rng: np.random.Generator):
        p = np.arange(1, n + 1, dtype=np.float64) ** -a
        p /= p.sum()
        perm = (rng.permutation(n) + 1).astype(np.int32)  # rank -> id
        self.prob_of_id = np.zeros(n + 1)  # id -> probability (index 0: padding, 0)
        self.prob_of_id[perm] = p
        self.log_prob_mean = float(np.sum(p * np.log(p)))
        self.log_prob_std = float(np.sqrt(max(np.sum(p * np.log(p) ** 2) - self.log_prob_mean**2, 1e-12)))
        # Vose's alias table: column k keeps rank k with probability keep[k], else gives rank alias[k].
        scaled = p * n
        keep = np.ones(n)
        alias = np.arange(n)
        small = [k for k in range(n) if scaled[k] < 1.0]
        large = [k for k in range(n) if scaled[k] >= 1.0]
        while small and large:
            s, g = small.pop(), large.pop()
            keep[s], alias[s] = scaled[s], g
            scaled[g] -= 1.0 - scaled[s]
            (small if scaled[g] < 1.0 else large).append(g)
        # leftovers are 1 up to rounding: keep[k] stays 1
        self.n = n
        self.keep = keep
        self.perm = perm  # rank -> id (the ids of the columns kept)
        self.alias = alias
        self.id_alias = perm[alias]

    def ids(self, u: np.ndarray, shift: int = 0) -> np.ndarray:
        """Map uniforms in [0, 1) to ids (int32, same shape); ``shift``: rank r draws the id of rank r + shift."""
        x = u * self.n
        col = np.minimum(x.astype(np.int64), self.n - 1)
        if shift:
            rank = np.where(x - col < np.take(self.keep, col), col, np.take(self.alias, col))
            return np.take(self.perm, (rank + shift) % self.n)
        return np.where(x - col < np.take(self.keep, col), np.take(self.perm, col), np.take(self.id_alias, col))


def raw_id(ids: np.ndarray, seed: int) -> np.ndarray:
    """int64 64-bit ids of small ids (splitmix64 of the id under the world's seed; 0 stays 0, none is 0)."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    z = np.where(z == 0, np.uint64(1), z)
    return np.where(ids == 0, np.uint64(0), z).view(np.int64)


class SyntheticRanking:
    def __init__(self, spec: SyntheticSpec):
        if min(spec.num_users, spec.num_items, spec.num_authors, spec.history_len, spec.latent_dim) < 1:
            raise ValueError(f"sizes must be positive: {spec}")
        if not spec.actions:
            raise ValueError("need at least one action")
        self.spec = spec
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, _WORLD_CODE]))
        d, na = spec.latent_dim, len(spec.actions)
        self._users = _Zipf(spec.num_users, spec.zipf_a, rng)
        self._items = _Zipf(spec.num_items, spec.zipf_a, rng)
        self.item_author = np.zeros(spec.num_items + 1, np.int32)  # item id -> author id; 0 -> 0
        self.item_author[1:] = rng.integers(1, spec.num_authors + 1, size=spec.num_items)

        def latents(n: int) -> np.ndarray:
            z = np.zeros((n + 1, d), np.float32)  # row 0 (padding) stays zero
            z[1:] = rng.standard_normal((n, d), dtype=np.float32) / np.float32(d**0.25)
            return z

        self._u_lat = latents(spec.num_users)
        self._i_lat = latents(spec.num_items)
        self._a_lat = latents(spec.num_authors)
        direction = 1.0 + _ACTION_SPREAD * rng.standard_normal((na, d))
        self._pop_z = ((np.log(np.maximum(self._items.prob_of_id, 1e-300)) - self._items.log_prob_mean)
                       / self._items.log_prob_std).astype(np.float32)
        self._pop_z[0] = 0.0

        # Calibrate: scale w_a so the latent signal has std _logit_std(a), then b_a for the target base rate.
        feats, pop = self._features(*self._draw(_CALIB_CODE, 0, 0, _CALIB_EXAMPLES)[1:4])
        raw = feats @ direction.T  # [N, A]
        scale = np.array([_logit_std(k) for k in range(na)]) / raw.std(axis=0)
        self._w = (direction * scale[:, None]).astype(np.float32)  # [A, d]
        signal = raw * scale + _POP_COEF * pop[:, None]
        target = np.array([_base_rate(k) for k in range(na)])
        lo, hi = np.full(na, -30.0), np.full(na, 30.0)
        for _ in range(60):  # mean sigmoid is increasing in the bias: bisect
            mid = (lo + hi) / 2
            rate = (1.0 / (1.0 + np.exp(-(signal + mid)))).mean(axis=0)
            lo, hi = np.where(rate < target, mid, lo), np.where(rate < target, hi, mid)
        self._b = ((lo + hi) / 2).astype(np.float32)  # [A]

    # -- generation ---------------------------------------------------------------------------------------

    def _draw(self, split_code: int, step: int, start: int, stop: int):
        """Rows [start, stop) of (split, step): ids and label uniforms, from the per-block seeded streams."""
        spec = self.spec
        L, na = spec.history_len, len(spec.actions)
        width = 3 + L + na  # user, hist length, candidate, L history items, A label uniforms
        b0, b1 = start // _BLOCK, (stop - 1) // _BLOCK + 1
        u = np.concatenate([
            np.random.default_rng(np.random.SeedSequence([spec.seed, split_code, step, blk])).random(
                (_BLOCK, width))
            for blk in range(b0, b1)
        ])[start - b0 * _BLOCK:stop - b0 * _BLOCK]
        t = step if split_code == _SPLIT_CODES["train"] else spec.eval_at  # held out: drawn at eval_at
        shift = int(spec.drift * t) if split_code != _CALIB_CODE else 0
        user = self._users.ids(u[:, 0], shift)
        hist_len = np.minimum((u[:, 1] * (L + 1)).astype(np.int32), L)  # uniform on 0..L
        cand = self._items.ids(u[:, 2], shift)
        hist = self._items.ids(u[:, 3:3 + L], shift)
        hist[np.arange(L)[None, :] >= hist_len[:, None]] = 0
        return hist_len, user, hist, cand, u[:, 3 + L:]

    def _features(self, user, hist, cand):
        """Elementwise interaction features [N, d] (so that the signal is feats @ w_a) and zpop [N]."""
        ul = np.take(self._u_lat, user, axis=0)
        il = np.take(self._i_lat, cand, axis=0)
        al = np.take(self._a_lat, np.take(self.item_author, cand), axis=0)
        n_hist = np.count_nonzero(hist, axis=1)
        hl = np.einsum("bld->bd", np.take(self._i_lat, hist, axis=0))  # padding rows are zero
        hl /= np.maximum(n_hist, 1)[:, None].astype(np.float32)
        feats = ul * il + np.float32(_HIST_COEF) * hl * il + np.float32(_AUTHOR_COEF) * ul * al
        return feats, self._pop_z[cand]

    def batch(self, step: int, batch_size: int, *, split: str = "train", shard: int = 0,
              num_shards: int = 1) -> dict[str, np.ndarray]:
        """This shard's ``batch_size // num_shards`` rows of the global batch ``(split, step)``.

        The global batch is the concatenation of the shards' batches in shard order. Keys: ``user`` [B],
        ``hist_items`` / ``hist_authors`` [B, L] (left-aligned, 0 = padding), ``cand_item``, ``cand_author``
        [B] (all int32; with ``spec.raw_ids`` the user and item keys are [..., 2] uint32 halves of 64-bit ids),
        ``labels`` (0/1) and ``probs`` (true probabilities) float32 [B, A], A in
        ``spec.actions`` order.
        """
        if split not in _SPLIT_CODES:
            raise ValueError(f"split must be one of {sorted(_SPLIT_CODES)}, got {split!r}")
        if step < 0 or batch_size < 1:
            raise ValueError(f"need step >= 0 and batch_size >= 1, got {step}, {batch_size}")
        if num_shards < 1 or not 0 <= shard < num_shards:
            raise ValueError(f"bad shard {shard} of {num_shards}")
        if batch_size % num_shards:
            raise ValueError(f"batch_size {batch_size} not divisible by num_shards {num_shards}")
        per = batch_size // num_shards
        _, user, hist, cand, u_label = self._draw(_SPLIT_CODES[split], int(step), shard * per, (shard + 1) * per)
        feats, pop = self._features(user, hist, cand)
        logits = feats @ self._w.T + self._b + np.float32(_POP_COEF) * pop[:, None]
        probs = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        raw = (lambda x: fingerprint(raw_id(x, self.spec.seed))) if self.spec.raw_ids else (lambda x: x)
        return {
            "user": raw(user),
            "hist_items": raw(hist),
            "hist_authors": np.take(self.item_author, hist),
            "cand_item": raw(cand),
            "cand_author": np.take(self.item_author, cand),
            "labels": (u_label < probs).astype(np.float32),
            "probs": probs,
        }

    def bayes_auc(self, num_examples: int = 200_000, split: str = "test") -> dict[str, float]:
        """Per action, the AUC of the true probabilities against their labels on the first ``num_examples``
        examples of ``split`` (its steps 0, 1, ... of 8192 rows) -- the best AUC any model can reach there."""
        chunk = 8192
        probs, labels = [], []
        for step in range(-(-num_examples // chunk)):
            b = self.batch(step, chunk, split=split)
            probs.append(b["probs"])
            labels.append(b["labels"])
        probs = np.concatenate(probs)[:num_examples]
        labels = np.concatenate(labels)[:num_examples]
        return {a: auc(labels[:, k], probs[:, k]) for k, a in enumerate(self.spec.actions)}


@functools.lru_cache(maxsize=4)
def world(spec: SyntheticSpec) -> SyntheticRanking:
    """The world of ``spec``, generated once per process: it is a pure function of the spec and never changed
    after it is built, so runs in one process (a sweep's in-process trials, the tests) share it."""
    return SyntheticRanking(spec)
