"""Dedupe and the update record: a batch's ids and per-token gradients as an ``AsyncEmbGradientUpdate``.

A record holds the batch's sorted distinct ids (static size, padded with the out-of-range id, the table's
stored row count), each token's index into them and the per-token gradients, not yet summed. On a layout
whose devices each dedupe their own tokens (``Layout.per_device_record``) the record is per device: one
block of distinct ids per device, split over the mesh like the batch. ``segment_sum`` sums a record's
gradients into its unique rows in float32; the host-side helpers (``record_token_ids``, ``record_for``)
move a saved record between meshes and layouts.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ._lazy import P, jax, jnp
from . import kernels
from .checks import check_batch, check_ids, check_pad_id
from .indexing import take_rows
from .protocol import AsyncEmbGradientUpdate
from .scopes import in_phase

if TYPE_CHECKING:
    import numpy as np

    from .context import AsyncEmbContext


def num_unique_for(tokens_per_batch: int, rows: int) -> int:
    """Static size of the unique-id buffer: every distinct id fits, plus one padding slot."""
    return min(tokens_per_batch, rows) + 1


def int32_ids(ids: Any, vocab: int) -> jax.Array:
    """``ids`` as int32; 64-bit ids (numpy's, or JAX's with x64 on) outside ``[0, vocab)`` first become -1, so an
    id past int32 is dropped as out of range instead of wrapping onto a row (``2**32 + 5`` would be row 5)."""
    if getattr(ids, "dtype", None) is not None and ids.dtype.itemsize > 4:
        import numpy as np  # noqa: PLC0415

        xp = jnp if isinstance(ids, jax.Array) else np
        ids = xp.where((ids >= 0) & (ids < vocab), ids, -1)
    return jnp.asarray(ids).astype(jnp.int32)


@in_phase("dedupe")
def dedupe(ids: jax.Array, vocab: int, num_unique: int, pad_id: int | None = 0,
           method: str | None = None) -> tuple[jax.Array, jax.Array]:
    """Static-size unique of a batch's ids.

    Returns ``(unique_tokens [num_unique], segment_ids [n])``: sorted distinct ids padded with ``vocab``
    (out of range, so scatters drop it), and each token's index into them, -1 for padding tokens
    (``pad_id``) and ids outside ``[0, vocab)``. ``method``: "native" (the radix-sort CPU kernel of
    ``optimizers.kernels`` where usable, for one-device programs), or XLA's "packed" or "search" (None: the
    faster that fits; ``kernels.xla_dedupe_keys``). Every method gives the same result.
    """
    check_ids(ids)
    check_pad_id(pad_id)
    ids = int32_ids(ids, vocab).reshape(-1)
    valid = (ids >= 0) & (ids < vocab)
    if pad_id is not None:
        valid &= ids != pad_id
    unique, seg = kernels.dedupe_keys(jnp.where(valid, ids, vocab), vocab, num_unique, method)
    return unique, jnp.where(valid, seg, -1)


def make_update(ctx: AsyncEmbContext, ids: jax.Array, grads: jax.Array, pending: Any = True,
                pad_id: int | None = 0, rows: jax.Array | None = None) -> AsyncEmbGradientUpdate:
    """Build the update record for one table from the batch's ids and per-token gradients (and, for delay
    compensation, ``rows``: each token's row as the gradient was computed on it, ``[..., width]``).

    Routed (row layout, ``routing="alltoall"``) and column layout (``ctx.per_device_record``): each device
    dedupes only its own tokens (the batch split over every mesh axis, as the train step holds it) inside
    ``jax.shard_map``; ``unique_tokens`` is then
    ``mesh.size`` sorted blocks of ``ctx.local_unique``, one per device, and each token's segment id indexes
    its own device's block. No device sees another's ids. Otherwise one dedupe of the whole batch.

    Refused with a ValueError naming the fix (``optimizers.checks.check_batch``): ids that are not integers,
    more of them than ``ctx.tokens_per_batch`` (the record could not hold their distinct ids), gradients that
    are not one ``[ctx.emb_width]`` float row per id, a ``pending`` that is not a scalar bool (Python's, numpy's
    or a 0-d bool array: ``"no"``, ``1`` or ``0.5`` are refused, not read as truth values). 64-bit ids outside
    ``[0, ctx.stored_rows)`` are dropped like any id outside the table, not wrapped to int32."""
    check_batch(ctx, ids, grads, pending)
    check_pad_id(pad_id)
    grads = grads.reshape(-1, grads.shape[-1])
    rows = compensation_rows(ctx, rows, grads.shape[0])
    if ctx.per_device_record:
        axes = ctx.batch_axes
        local = jax.shard_map(lambda i: dedupe(i, ctx.stored_rows, ctx.local_unique, pad_id), mesh=ctx.mesh,
                              in_specs=P(axes), out_specs=(P(axes), P(axes)), check_vma=False)
        unique, seg = local(ids.reshape(-1))
    else:
        unique, seg = dedupe(ids, ctx.stored_rows, ctx.num_unique, pad_id, "native" if ctx.one_device else None)
    return AsyncEmbGradientUpdate(unique, grads, seg, jnp.asarray(pending, bool), rows)


def compensation_rows(ctx: AsyncEmbContext, rows: jax.Array | None, tokens: int | None = None) -> jax.Array | None:
    """The ``rows`` field of an update record on ``ctx``: ``rows`` as float32 ``[tokens, width]`` under delay
    compensation (refused when missing, or when not one row of ``ctx.emb_width`` per token: ``tokens``, if
    given), None otherwise (whatever was given)."""
    if not ctx.compensates:
        return None
    if rows is None:
        raise ValueError("delay compensation (dc_lambda) needs each token's row the gradient was computed on: "
                         "pass rows= (the looked-up rows) to make_update")
    width = ctx.emb_width
    if jnp.ndim(rows) < 1 or jnp.shape(rows)[-1] != width or tokens is not None and jnp.size(rows) // width != tokens:
        raise ValueError(f"rows {list(jnp.shape(rows))} must be each token's row as its gradient was computed on "
                         f"it: one row of the table's width {width} (ctx.emb_width) per id, [{tokens}, {width}] like "
                         "the gradients (the looked-up rows)")
    return jnp.asarray(rows).reshape(-1, width).astype(jnp.float32)


def empty_update(ctx: AsyncEmbContext, dtype: Any = "float32") -> AsyncEmbGradientUpdate:
    """A non-pending update of the right shapes (the first async step, or after a flush)."""
    return AsyncEmbGradientUpdate(
        jnp.full((ctx.record_unique,), ctx.stored_rows, jnp.int32),
        jnp.zeros((ctx.tokens_per_batch, ctx.emb_width), dtype),
        jnp.full((ctx.tokens_per_batch,), -1, jnp.int32),
        jnp.zeros((), bool),
        jnp.zeros((ctx.tokens_per_batch, ctx.emb_width), jnp.float32) if ctx.compensates else None,
    )


def update_token_ids(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate) -> jax.Array:
    """Each token's id ``[tokens]`` in an update record of either kind (``ctx.local_record``), ``ctx.stored_rows`` for
    the tokens it drops: of a per-device record each device reads its own block (split over the batch, as
    ``make_update`` built it), of a record of the whole batch the replicated ids. Traced; ``record_token_ids``
    is the host-side twin."""
    if not ctx.local_record(update):
        return token_ids(ctx, update.unique_tokens, update.segment_ids)
    split = P(ctx.batch_axes)
    return jax.shard_map(functools.partial(token_ids, ctx), mesh=ctx.mesh, in_specs=(split, split),
                         out_specs=split, check_vma=False)(update.unique_tokens, update.segment_ids)


def record_token_ids(unique: Any, segment_ids: Any, rows: int) -> "np.ndarray":
    """Host-side (numpy): each token's id in an update record of either kind, -1 for tokens it dropped.

    ``rows``: the table's stored rows when the record was made (its padding id). A record of the whole
    batch holds ``num_unique_for(T, rows)`` ids; a per-device record of ``m`` devices holds ``m`` blocks of
    ``num_unique_for(T / m, rows)`` (strictly more for every m > 1), so its size says which it is."""
    import numpy as np  # noqa: PLC0415

    unique, seg = np.asarray(unique), np.asarray(segment_ids).reshape(-1)
    tokens, size = seg.size, unique.size
    blocks = next((m for m in range(1, tokens + 1) if tokens % m == 0 and m * num_unique_for(tokens // m, rows) == size),
                  None)
    if blocks is None:
        raise ValueError(f"an update record of {tokens} tokens cannot hold {size} unique ids (rows={rows})")
    start = (np.arange(tokens) // (tokens // blocks)) * (size // blocks)
    return np.where(seg >= 0, unique[np.clip(start + seg, 0, size - 1)], -1).astype(np.int32)


def record_for(ctx: AsyncEmbContext, token_ids: Any) -> tuple["np.ndarray", "np.ndarray"]:
    """Host-side (numpy): ``(unique_tokens, segment_ids)`` of ``ctx``'s kind of record (``make_update``'s)
    for tokens' ids (-1: dropped), e.g. a restored deferred update moved to another mesh or layout."""
    import numpy as np  # noqa: PLC0415

    tok = np.asarray(token_ids).reshape(-1)
    blocks = ctx.mesh.size if ctx.per_device_record else 1
    size = ctx.record_unique // blocks
    n = tok.size // blocks
    unique = np.full((ctx.record_unique,), ctx.stored_rows, np.int32)
    seg = np.full((tok.size,), -1, np.int32)
    for b in range(blocks):
        t = tok[b * n:(b + 1) * n]
        valid = (t >= 0) & (t < ctx.stored_rows)
        u = np.unique(t[valid])
        if u.size > size - 1:
            raise ValueError(f"{u.size} distinct ids do not fit an update record of {size} slots")
        unique[b * size:b * size + u.size] = u
        seg[b * n:(b + 1) * n] = np.where(valid, np.searchsorted(u, t), -1)
    return unique, seg


@in_phase("segment_sum")
def segment_sum(grads: jax.Array, segment_ids: jax.Array, num_unique: int) -> jax.Array:
    """fp32 sum of per-token gradients into their unique rows; padding tokens (-1) are dropped."""
    seg = jnp.where(segment_ids < 0, num_unique, segment_ids)
    return jax.ops.segment_sum(grads.astype(jnp.float32), seg, num_segments=num_unique)


def segment_rows(rows: jax.Array, segment_ids: jax.Array, num_unique: int) -> jax.Array:
    """Each unique row's value from its tokens' ``rows`` (float32; every token of a row carries the same
    value, so any one of them is it, exactly); rows no token maps to are zeros, padding tokens (-1) dropped."""
    # Each row's first token (a scatter-min of token positions), then one gather of those rows: cheaper than
    # scattering every token's whole row.
    n = segment_ids.shape[0]
    seg = jnp.where(segment_ids < 0, num_unique, segment_ids)
    first = jax.ops.segment_min(jnp.arange(n, dtype=jnp.int32), seg, num_segments=num_unique)  # empty: int max
    return take_rows(rows.astype(jnp.float32), jnp.minimum(first, n))


def without_rows(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, drop: jax.Array) -> AsyncEmbGradientUpdate:
    """``update`` without the unique rows ``drop`` marks (bool, the shape of ``update.unique_tokens``): their
    tokens get segment id -1, so they are left out of the sums, the norm and the gate as padding is, and the
    other unique rows close up in order (still sorted, padding last; per device block of a per-device record).
    The same record as ``make_update`` of the same ids with the dropped ones out of range, in O(record) work:
    no sort."""
    def close_up(unique, seg, drop):
        keep = ~drop & (unique < ctx.stored_rows)
        at = jnp.cumsum(keep) - 1
        size = unique.shape[0]
        unique = jnp.full((size,), ctx.stored_rows, unique.dtype).at[jnp.where(keep, at, size)].set(
            unique, mode="drop", unique_indices=True)
        s = jnp.maximum(seg, 0)
        return unique, jnp.where((seg < 0) | ~keep[s], -1, at[s]).astype(seg.dtype)

    if ctx.local_record(update):
        split = P(ctx.batch_axes)
        close_up = jax.shard_map(close_up, mesh=ctx.mesh, in_specs=(split, split, split), out_specs=(split, split),
                                 check_vma=False)
    unique, seg = close_up(update.unique_tokens, update.segment_ids, drop)
    return update._replace(unique_tokens=unique, segment_ids=seg)


def token_ids(ctx: AsyncEmbContext, unique: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """Per-token ids from an update record's (unique ids, segment ids); padding tokens get ``ctx.stored_rows``."""
    return jnp.where(segment_ids < 0, ctx.stored_rows, take_rows(unique, jnp.maximum(segment_ids, 0),
                                                                      ctx.stored_rows))


def without_padding_id(unique: jax.Array, seg: jax.Array, rows: int, pad_id: int = 0):
    """A dedupe that kept ``pad_id`` (the smallest id: the first entry when present) -> the same dedupe
    without it (``dedupe(..., pad_id=pad_id)``): it is dropped, the rest shift down, padding tokens get -1.
    ``rows``: the padding id of the unique buffer (the table's stored rows)."""
    has = unique[0] == pad_id
    unique = jnp.where(has, jnp.concatenate([unique[1:], jnp.full((1,), rows, unique.dtype)]), unique)
    seg = jnp.where((seg < 0) | (has & (seg == 0)), -1, seg - has.astype(seg.dtype))
    return unique, seg


def device_record(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, local: bool):
    """This device's (sorted unique ids, its tokens' segment ids): the record's own block when it is per device
    (``local``), else re-derived from a record of the whole batch (replicated ids) and deduped here."""
    if local:
        return update.unique_tokens, update.segment_ids
    n = update.segment_ids.shape[0]
    ids = token_ids(ctx, update.unique_tokens, update.segment_ids)
    return dedupe(ids, ctx.stored_rows, num_unique_for(n, ctx.stored_rows), pad_id=None)
