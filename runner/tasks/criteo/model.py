"""DLRM and DCNv2 over Criteo-format features, in plain JAX.

Features: 13 dense values (already ``log(1 + x)``) and 26 categorical features, one table per feature
(``cat_01`` ... ``cat_26``). A feature's rows (one, or a bag of up to ``tokens_per_example`` for a multi-hot
feature, padded with row 0) are looked up by the trainer and handed to the model, which pools each bag by
its sum or its mean (``pooling``: FBGEMM's and TorchRec's EmbeddingBag), so the fused embedding optimizers
see the gradient of every id of a bag (the pooled gradient, divided by the bag's length under the mean). Both
models end in one click logit trained with BCE.

- :class:`DLRM` (Naumov et al., 2019, "Deep Learning Recommendation Model for Personalization and
  Recommendation Systems"): a bottom MLP maps the dense features to the embedding width; the dot products
  of every pair among it and the 26 embeddings (351 numbers), with the bottom output, feed the top MLP.
- :class:`DCN` (Wang et al., 2021, "DCN V2: Improved Deep & Cross Network"): the dense features and every
  embedding concatenated into ``x0``; cross layers ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l``, ``W_l`` full rank
  or ``U_l V_l`` of rank ``low_rank``; then an MLP (the stacked structure), or the MLP over ``x0`` beside the
  cross layers and one linear layer over both (parallel). With ``bottom``, a bottom MLP maps the dense features
  to one more embedding-wide vector in ``x0``, as in MLPerf's DLRMv2 (DLRM with a DCNv2 interaction).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ...core.embeddings import TableSpec
from .config import TABLES  # cat_01 ... cat_26
from .tsv import NUM_CAT, NUM_DENSE


def _dense_layers(key: jax.Array, sizes: tuple[int, ...]) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, max(len(sizes) - 1, 1))
    return [{"w": jax.random.normal(k, (i, o), jnp.float32) * jnp.sqrt(2.0 / i), "b": jnp.zeros((o,), jnp.float32)}
            for k, i, o in zip(keys, sizes[:-1], sizes[1:])]


def _mlp(layers, x: jax.Array, last_relu: bool) -> jax.Array:
    for i, layer in enumerate(layers):
        x = x @ layer["w"] + layer["b"]
        if i < len(layers) - 1 or last_relu:
            x = jax.nn.relu(x)
    return x


def _bce(logit: jax.Array, label: jax.Array) -> jax.Array:
    return jnp.mean(jnp.maximum(logit, 0) - logit * label + jnp.log1p(jnp.exp(-jnp.abs(logit))))


@dataclasses.dataclass(frozen=True)
class _ClickModel:
    tables: Mapping[str, TableSpec]
    pooling: str = "sum"  # a bag's rows: "sum" or "mean" (over its ids; padding row 0 left out)

    @property
    def width(self) -> int:
        return self.tables[TABLES[0]].width

    def table_ids(self, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """``[B, L]`` rows per table (``L``: the table's ``tokens_per_example``, its bag size): feature ``j``'s
        columns of ``batch["cat"]`` (already mapped by the task's id map, 0 padding a bag)."""
        cat = jnp.asarray(batch["cat"]).astype(jnp.int32)
        out, start = {}, 0
        for name in TABLES:
            size = self.tables[name].tokens_per_example
            out[name], start = cat[:, start:start + size], start + size
        return out

    def embeddings(self, embs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]) -> jax.Array:
        """[B, 26, D]: each table's bag pooled (a one-hot feature's row itself)."""
        ids = self.table_ids(batch)
        pooled = []
        for name in TABLES:
            rows = embs[name]
            if rows.shape[1] == 1:
                pooled.append(rows[:, 0])
                continue
            total = rows.sum(axis=1)  # padding reads row 0, which is zero
            if self.pooling == "mean":
                total = total / jnp.maximum((ids[name] > 0).sum(axis=1, keepdims=True), 1).astype(total.dtype)
            pooled.append(total)
        return jnp.stack(pooled, axis=1)

    def logit(self, params, embs, batch) -> jax.Array:
        raise NotImplementedError

    def loss(self, params, embs, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Mean BCE of the click logit; returns (loss, {"probs": [B]})."""
        logit = self.logit(params, embs, batch)
        return _bce(logit, batch["label"]), {"probs": jax.nn.sigmoid(logit)}

    def predict(self, params, embs, batch, tables=None) -> jax.Array:
        """Click probabilities [B]."""
        return jax.nn.sigmoid(self.logit(params, embs, batch))


@dataclasses.dataclass(frozen=True)
class DLRM(_ClickModel):
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (128, 64)

    def init(self, key: jax.Array) -> dict[str, Any]:
        kb, kt = jax.random.split(key)
        pairs = (NUM_CAT + 1) * NUM_CAT // 2
        return {"bottom": _dense_layers(kb, (NUM_DENSE, *self.bottom, self.width)),
                "top": _dense_layers(kt, (self.width + pairs, *self.top, 1))}

    def logit(self, params, embs, batch) -> jax.Array:
        x = _mlp(params["bottom"], batch["dense"].astype(jnp.float32), last_relu=True)  # [B, D]
        t = jnp.concatenate([x[:, None], self.embeddings(embs, batch)], axis=1)  # [B, 27, D]
        z = jnp.einsum("bid,bjd->bij", t, t)
        i, j = jnp.tril_indices(NUM_CAT + 1, k=-1)  # every pair once, no self-products
        return _mlp(params["top"], jnp.concatenate([x, z[:, i, j]], axis=1), last_relu=False)[:, 0]


@dataclasses.dataclass(frozen=True)
class DCN(_ClickModel):
    cross_layers: int = 3
    low_rank: int | None = None
    deep: tuple[int, ...] = (128, 64)
    bottom: tuple[int, ...] | None = None  # an MLP from the 13 dense features to one more embedding (DLRMv2's)
    structure: str = "stacked"  # stacked: cross layers, then the MLP; parallel: both over x0, then one linear

    @property
    def input_width(self) -> int:
        dense = NUM_DENSE if self.bottom is None else self.width
        return dense + NUM_CAT * self.width

    def init(self, key: jax.Array) -> dict[str, Any]:
        d = self.input_width
        kc, kd, kb, ko = jax.random.split(key, 4)
        cross = []
        # Each cross layer is a residual branch, x0 * (W x + b) added to x, and starts at zero (W = 0, or V = 0 of
        # U V): every layer begins as the identity and the products grow from the gradient, which is not zero
        # (x0 x^T). On experiment=criteo_synthetic's valid AUC this beat W ~ N(0, 1/d) on all three seeds
        # (docs/results/criteo.md).
        for k in jax.random.split(kc, max(self.cross_layers, 1))[:self.cross_layers]:
            if self.low_rank is None:
                layer = {"w": jnp.zeros((d, d), jnp.float32)}
            else:
                layer = {"u": jax.random.normal(k, (d, self.low_rank), jnp.float32) / jnp.sqrt(d),
                         "v": jnp.zeros((self.low_rank, d), jnp.float32)}
            cross.append({**layer, "b": jnp.zeros((d,), jnp.float32)})
        params: dict[str, Any] = {"cross": cross}
        if self.bottom is not None:
            params["bottom"] = _dense_layers(kb, (NUM_DENSE, *self.bottom, self.width))
        if self.structure == "stacked":
            params["deep"] = _dense_layers(kd, (d, *self.deep, 1))
        else:  # the MLP's last hidden layer and the cross output, side by side, into one linear layer
            params["deep"] = _dense_layers(kd, (d, *self.deep)) if self.deep else []
            params["out"] = _dense_layers(ko, (d + (self.deep[-1] if self.deep else d), 1))
        return params

    def logit(self, params, embs, batch) -> jax.Array:
        e = self.embeddings(embs, batch)
        dense = batch["dense"].astype(jnp.float32)
        if self.bottom is not None:
            dense = _mlp(params["bottom"], dense, last_relu=True)
        x0 = jnp.concatenate([dense, e.reshape(e.shape[0], -1)], axis=1)
        x = x0
        for layer in params["cross"]:
            wx = x @ layer["w"] if "w" in layer else (x @ layer["u"]) @ layer["v"]
            x = x0 * (wx + layer["b"]) + x
        if self.structure == "stacked":
            return _mlp(params["deep"], x, last_relu=False)[:, 0]
        h = _mlp(params["deep"], x0, last_relu=True) if params["deep"] else x0
        return _mlp(params["out"], jnp.concatenate([x, h], axis=1), last_relu=False)[:, 0]
