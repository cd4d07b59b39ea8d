"""A multi-action ranking model in plain JAX.

Features: the user id, the user's history of (item, author) ids, and a candidate (item, author), each looked
up in its embedding table (``users``, ``items``, ``authors``) by its raw id: row i holds id i, and the trainer
counts (or, with ``trainer.strict_ids``, refuses) an id outside ``[0, vocab)`` (``TrainProgram.table_ids``). The history is pooled two ways (masked mean,
and attention with the candidate as query, as in DIN); an MLP over the pooled features and the
user-candidate interactions predicts one logit per engagement action, trained with per-action BCE.

The model never sees a table: it gets the looked-up rows, so the trainer can differentiate with respect to
the rows a batch used (the per-token gradients the fused embedding optimizers consume).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ...core.embeddings import TableSpec


@dataclasses.dataclass(frozen=True)
class RankingModel:
    tables: Mapping[str, TableSpec]
    actions: tuple[str, ...]
    hidden: tuple[int, ...] = (128, 64)

    @property
    def width(self) -> int:
        return self.tables["items"].width

    def table_ids(self, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """[B, tokens_per_example] raw ids per table (0 = padding), unmapped: the trainer's range check must see
        them as they are (a hash or modulo here would land an id outside the table on a real row)."""
        def as_int(x):  # raw 64-bit ids (data.raw_ids) stay [..., 2] uint32 halves, for hash and modulo tables
            x = jnp.asarray(x)
            return x if x.dtype == jnp.uint32 else x.astype(jnp.int32)

        return {
            "users": as_int(batch["user"])[:, None],
            "items": as_int(jnp.concatenate([batch["hist_items"], batch["cand_item"][:, None]], 1)),
            "authors": as_int(jnp.concatenate([batch["hist_authors"], batch["cand_author"][:, None]], 1)),
        }

    def init(self, key: jax.Array) -> dict[str, Any]:
        w = self.width
        sizes = (7 * w, *self.hidden, len(self.actions))
        keys = jax.random.split(key, len(sizes))
        layers = [
            {"w": jax.random.normal(k, (i, o), jnp.float32) * jnp.sqrt(2.0 / i), "b": jnp.zeros((o,), jnp.float32)}
            for k, i, o in zip(keys, sizes[:-1], sizes[1:])
        ]
        return {"mlp": layers, "attn_q": jnp.eye(w, dtype=jnp.float32)}

    def apply(self, params, embs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]) -> jax.Array:
        """Logits [B, actions]."""
        user = embs["users"][:, 0]
        items, authors = embs["items"], embs["authors"]
        hist = items[:, :-1] + authors[:, :-1]  # [B, L, D]
        cand_item, cand_author = items[:, -1], authors[:, -1]
        cand = cand_item + cand_author
        h = jnp.asarray(batch["hist_items"])
        mask = ((h != 0).any(-1) if h.ndim == 3 else h != 0).astype(jnp.float32)  # [B, L]; raw ids: [B, L, 2]
        count = jnp.maximum(mask.sum(1, keepdims=True), 1.0)
        hist_mean = (hist * mask[..., None]).sum(1) / count
        scores = jnp.einsum("bld,de,be->bl", hist, params["attn_q"], cand) / jnp.sqrt(hist.shape[-1])
        scores = jnp.where(mask > 0, scores, -1e9)
        attn = jax.nn.softmax(scores, axis=-1) * (mask.sum(1, keepdims=True) > 0)
        hist_attn = jnp.einsum("bl,bld->bd", attn, hist)
        x = jnp.concatenate([user, cand_item, cand_author, hist_mean, hist_attn, user * cand, hist_attn * cand], -1)
        layers = params["mlp"]
        for layer in layers[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        return x @ layers[-1]["w"] + layers[-1]["b"]

    def loss(self, params, embs, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Mean over actions of the per-action BCE; returns (loss, {"probs": [B, actions]})."""
        logits = self.apply(params, embs, batch)
        labels = batch["labels"]
        bce = jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))
        return bce.mean(), {"probs": jax.nn.sigmoid(logits)}

    def predict(self, params, embs, batch, tables=None) -> jax.Array:
        """Per-action probabilities [B, actions]."""
        return jax.nn.sigmoid(self.apply(params, embs, batch))
