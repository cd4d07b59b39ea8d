"""A SASRec-style next-item model in plain JAX (Kang & McAuley, 2018, "Self-Attentive Sequential
Recommendation"; the RecBole SASRec is the reference this runner compares against).

Input: the last ``max_len`` items of a sequence, left-padded with 0. Each position gets its item row
(scaled by sqrt(width)) plus a learned position embedding, then ``num_blocks`` pre-LN blocks of causal
multi-head self-attention and a GELU FFN (residuals, padding positions zeroed after each block), then a
final layer norm: ``h[b, t]`` is the state after item t. The output embedding is tied to the item table:
the score of item j after position t is ``<h[b, t], row_j> / temperature`` (both L2-normalised when
``l2_norm``). Dropout (off by default) draws from a per-example seed in the batch.

The model never sees the table while training: ``table_ids`` names the rows a batch uses and ``loss``
gets them looked up, so the fused embedding optimizer receives per-token gradients:

- ``sampled_softmax``: tokens are the inputs, the targets and the negatives; a negative equal to the
  target is masked out. ``negatives`` chooses them (``model.negatives``):
  - ``uniform``: ``num_negatives`` ids per sequence drawn uniformly from 1..N, shared by its positions;
    logits as they are;
  - ``popularity``: ``num_negatives`` ids per sequence drawn with probability q_j proportional to item j's
    count in the training prefixes; each negative's logit gets the logQ correction ``- log q_j`` (the batch
    carries ``negatives_logq``), so the sampled softmax estimates the full one instead of over-penalising
    popular items (Bengio & Senecal 2008; Yi et al. 2019, "Sampling-bias-corrected neural modeling");
  - ``in_batch``: no extra ids: at position t the negatives are the other sequences' targets at position t
    (B - 1 candidates; padding and accidental hits masked), each corrected by ``- log q`` of its item (the
    batch carries ``targets_logq``), the positive uncorrected in both cases.
- ``full_softmax``: tokens are the inputs plus the whole catalog, spread over the batch (each example
  carries ``ceil(N / batch)`` catalog ids), so every item row gets a gradient every step. The step
  computes batch * max_len * N logits (ML-1M: 128 * 200 * 3,706 = 95M, about 0.4 GB in fp32, plus the
  same again for their gradient) and updates all N rows: fine for a few thousand items, not for 10^5+.

``predict`` scores the last position against every row of the (possibly sharded) item table.

``seen_bias`` (``model.seen_bias``, off by default) adds one learned logit offset to every item that already
occurs in the input sequence up to the scored position (at ``predict``: anywhere in it), in training and in
scoring alike: repeat-aware scoring. Data where a user never consumes an item twice (MovieLens: one rating
per movie) teaches it a large negative offset, so the model learns to rank seen items low; data with repeats
teaches a positive one. Nothing is masked by rule: the history is still ranked (``data.exclude_seen`` is
the rule). The offset is ``SEEN_SCALE * params["seen"]`` (``seen`` starts at 0), so the dense optimizer's
steps of about its learning rate move it by logit units within a few hundred steps.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ...core.embeddings import TableSpec

NEG = -1e9  # finite "minus infinity": a fully masked row stays finite
SEEN_SCALE = 10.0  # seen_bias: the logit offset is SEEN_SCALE * params["seen"]


@dataclasses.dataclass(frozen=True)
class SequentialModel:
    items: TableSpec
    num_items: int  # N: item ids are 1..N, 0 is padding
    max_len: int
    num_blocks: int = 2
    num_heads: int = 1
    ffn_mult: int = 4
    dropout: float = 0.0
    loss_kind: str = "sampled_softmax"  # sampled: the negatives come with the batch (batch["negatives"])
    negatives: str = "uniform"  # sampled_softmax: uniform | popularity (logQ) | in_batch (logQ)
    catalog_per_example: int = 0  # full_softmax: catalog ids carried by each example
    l2_norm: bool = False
    temperature: float = 1.0
    seen_bias: bool = False  # a learned logit offset for items already in the input sequence

    @property
    def width(self) -> int:
        return self.items.width

    def skip_causes(self) -> list[str]:
        """The model's settings that can make every embedding update non-finite, for the message that stops a run
        on skipped updates (``runner.core.loop.check_health``)."""
        if self.temperature < 0.01:
            return [f"model.temperature={self.temperature:g}, which multiplies every logit and gradient by "
                    f"{1 / self.temperature:.3g} (typical values are 0.05 to 1)"]
        return []

    # ----- ids and parameters ------------------------------------------------------------------------
    def table_ids(self, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        inputs = batch["inputs"]
        if self.loss_kind == "full_softmax":
            B, c = inputs.shape[0], self.catalog_per_example
            cat = jnp.arange(1, B * c + 1, dtype=jnp.int32).reshape(B, c)
            return {"items": jnp.concatenate([inputs, jnp.where(cat <= self.num_items, cat, 0)], 1)}
        if self.negatives == "in_batch":
            return {"items": jnp.concatenate([inputs, batch["targets"]], 1)}
        return {"items": jnp.concatenate([inputs, batch["targets"], batch["negatives"]], 1)}

    def init(self, key: jax.Array) -> dict[str, Any]:
        d, f = self.width, self.ffn_mult * self.width
        keys = iter(jax.random.split(key, 1 + 6 * self.num_blocks))

        def dense(i, o):
            return jax.random.normal(next(keys), (i, o), jnp.float32) / math.sqrt(i)

        def ln():
            return {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)}

        blocks = [{"ln1": ln(), "wq": dense(d, d), "wk": dense(d, d), "wv": dense(d, d), "wo": dense(d, d),
                   "ln2": ln(), "w1": dense(d, f), "b1": jnp.zeros((f,), jnp.float32), "w2": dense(f, d),
                   "b2": jnp.zeros((d,), jnp.float32)} for _ in range(self.num_blocks)]
        pos = 0.02 * jax.random.normal(next(keys), (self.max_len, d), jnp.float32)
        params = {"pos": pos, "blocks": blocks, "ln_f": ln()}
        if self.seen_bias:
            params["seen"] = jnp.zeros((), jnp.float32)
        return params

    # ----- the encoder -------------------------------------------------------------------------------
    def encode(self, params, item_embs: jax.Array, inputs: jax.Array, seeds: jax.Array | None = None):
        """[B, L, D] hidden states; ``seeds`` ([B] int32) turns dropout on."""
        B, L, D = item_embs.shape
        mask = (inputs != 0)[..., None].astype(jnp.float32)
        keys = jax.vmap(jax.random.key)(seeds) if seeds is not None and self.dropout > 0 else None
        x = item_embs * math.sqrt(D) + params["pos"][None, -L:]
        x = _dropout(x, keys, 0, self.dropout) * mask
        allowed = jnp.tril(jnp.ones((L, L), bool))[None, None] & (inputs != 0)[:, None, None, :]
        H = self.num_heads
        for i, p in enumerate(params["blocks"]):
            y = _layer_norm(x, p["ln1"])
            q, k, v = ((y @ p[w]).reshape(B, L, H, D // H) for w in ("wq", "wk", "wv"))
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // H)
            a = jax.nn.softmax(jnp.where(allowed, s, NEG), axis=-1)
            o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, L, D) @ p["wo"]
            x = x + _dropout(o, keys, 2 * i + 1, self.dropout)
            y = jax.nn.gelu(_layer_norm(x, p["ln2"]) @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
            x = (x + _dropout(y, keys, 2 * i + 2, self.dropout)) * mask
        return _layer_norm(x, params["ln_f"])

    def _out(self, h: jax.Array, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
        if self.l2_norm:
            h, rows = _l2(h), _l2(rows)
        return h / self.temperature, rows

    # ----- training and scoring ----------------------------------------------------------------------
    def _seen(self, params, inputs: jax.Array):
        """``seen_bias``: ``(first, offset)``, ``first[b, j]`` the first position of item j in ``inputs[b]``
        (``max_len``-wide, so "never": the length; padding never counts), and the learned logit offset; an
        item is seen at position t when ``first <= t``. None without ``seen_bias``."""
        if not self.seen_bias:
            return None
        B, L = inputs.shape
        at = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
        first = jnp.full((B, self.num_items + 1), L, jnp.int32).at[jnp.arange(B)[:, None], inputs].min(at)
        return first.at[:, 0].set(L), SEEN_SCALE * params["seen"]

    def loss(self, params, embs, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Mean next-item cross-entropy over the non-padding positions; outputs {"top1": accuracy}."""
        inputs, targets = batch["inputs"], batch["targets"]
        L = inputs.shape[1]
        e = embs["items"]
        h = self.encode(params, e[:, :L], inputs, batch.get("seed"))
        valid = targets != 0
        seen = self._seen(params, inputs)
        t = jnp.arange(L, dtype=jnp.int32)[None, :, None]  # the scored position, against first[b, item]
        at = lambda first_of: jnp.where(first_of <= t, seen[1], 0.0)  # noqa: E731  ([B, L, n] offsets)
        if self.loss_kind == "full_softmax":
            B, c = inputs.shape[0], self.catalog_per_example
            catalog = e[:, L:].reshape(B * c, -1)[: self.num_items]
            rows = jnp.concatenate([jnp.zeros_like(catalog[:1]), catalog])  # row j = item j (0: padding)
            h, rows = self._out(h, rows)
            logits = jnp.einsum("bld,nd->bln", h, rows)
            if seen is not None:
                logits = logits + at(seen[0][:, None, :])
            logits = logits.at[..., 0].set(NEG)
            pos = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
            lse = jax.nn.logsumexp(logits, -1)
            hit = jnp.argmax(logits, -1) == targets
        else:
            h, rows = self._out(h, e[:, L:])  # [B, L + K, D]: the targets' rows, then the negatives'
            tgt, neg = rows[:, :L], rows[:, L:]
            pos = jnp.sum(h * tgt, -1)
            if seen is not None:
                pos = pos + at(jnp.take_along_axis(seen[0], targets, 1)[..., None])[..., 0]
            if self.negatives == "in_batch":  # candidate c at (b, t): sequence c's target at t
                others = jnp.einsum("bld,cld->blc", h, tgt) - batch["targets_logq"].T[None]
                cand = targets.T[None]  # [1, L, B]
                if seen is not None:
                    others = others + at(jax.vmap(lambda f: f[cand[0]])(seen[0]))  # first[b, targets[c, t]]
                others = jnp.where((cand == targets[:, :, None]) | (cand == 0), NEG, others)  # own, hits, padding
            else:
                others = jnp.einsum("bld,bkd->blk", h, neg)
                if self.negatives == "popularity":
                    others = others - batch["negatives_logq"][:, None, :]
                if seen is not None:
                    others = others + at(jnp.take_along_axis(seen[0], batch["negatives"], 1)[:, None, :])
                others = jnp.where(batch["negatives"][:, None, :] == targets[:, :, None], NEG, others)
            lse = jnp.logaddexp(pos, jax.nn.logsumexp(others, -1))
            hit = pos > others.max(-1)
        w = valid.astype(jnp.float32)
        n = jnp.maximum(w.sum(), 1.0)
        top1 = jnp.sum(hit * w) / n
        return jnp.sum((lse - pos) * w) / n, {"top1": top1}

    def predict(self, params, embs, batch, tables) -> jax.Array:
        """Scores [B, N+1] of every item after the last input position (column 0, padding: -1e9)."""
        inputs = batch["inputs"]
        h = self.encode(params, embs["items"][:, : inputs.shape[1]], inputs)[:, -1]
        h, rows = self._out(h, tables["items"][: self.num_items + 1].astype(jnp.float32))
        scores = h @ rows.T
        seen = self._seen(params, inputs)
        if seen is not None:  # anywhere in the input sequence
            scores = scores + jnp.where(seen[0] < inputs.shape[1], seen[1], 0.0)
        return scores.at[:, 0].set(NEG)


def _layer_norm(x, p, eps: float = 1e-6):
    mu = x.mean(-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _l2(x, eps: float = 1e-6):
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), eps * eps))


def _dropout(x, keys, site: int, rate: float):
    if keys is None or rate <= 0:
        return x
    keep = jax.vmap(lambda k: jax.random.bernoulli(jax.random.fold_in(k, site), 1.0 - rate, x.shape[1:]))(keys)
    return jnp.where(keep, x / (1.0 - rate), 0.0)
