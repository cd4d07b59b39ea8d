"""Shared fused machinery: static-size dedupe, fp32 segment-sum, gated gather -> rule -> in-place scatter.

Every fused optimizer writes only its per-row rule (``FusedEmbOptimizer.update_rows``); this module does
the rest, once, for all of them, on one device or inside ``jax.shard_map`` over a table-sharded mesh
(row layout: ids routed to their owners, ``_apply_routed``; column layout: every shard gets each device's
first ``ctx.slots_for(n)`` distinct ids and their gradients' width slices, ``_apply_columns``; a step that
overflows either routes the rest in further rounds (row) or exchanges every device's whole buffer (column),
or is refused under ``route_overflow="stop"``).
The cost of an update grows with the rows a batch touches, never with the vocabulary: nothing here
builds a table-sized temporary, and the scatter writes into the (donated) table buffer.

Tables may be stored in bfloat16 while the optimizer state stays in float32: rows are gathered and
updated in float32 and written back with deterministic stochastic rounding (``stochastic_round_bf16``),
whose random bits hash (row id, column, update count), so no extra state is needed, a run is
reproducible bit for bit, and updates far below a bfloat16 ulp still move the row in expectation.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

from ._lazy import P, jax, jnp, lax
from .context import COLUMN, ROW, AsyncEmbContext, num_unique_for
from . import routing
from .protocol import AsyncEmbGradientUpdate, AsyncEmbOptimizer


# ----------------------------------------------------------------------------------------------------
# Dedupe and the update record
# ----------------------------------------------------------------------------------------------------
_INT32_MAX = 2**31 - 1


def dedupe_method(num_tokens: int, vocab: int) -> str:
    """``"packed"`` when every (id, position) pair fits one int32 key, else ``"search"``."""
    return "packed" if (vocab + 1) * max(num_tokens, 1) - 1 <= _INT32_MAX else "search"


def dedupe(ids: jax.Array, vocab: int, num_unique: int, pad_id: int | None = 0,
           method: str | None = None) -> tuple[jax.Array, jax.Array]:
    """Static-size unique of a batch's ids.

    Returns ``(unique_tokens [num_unique], segment_ids [n])``: sorted distinct ids padded with ``vocab``
    (out of range, so scatters drop it), and each token's index into them, -1 for padding tokens
    (``pad_id``) and ids outside ``[0, vocab)``. Both methods do one keys-only sort and find run starts
    (``jnp.unique(return_inverse=True)`` lowers to a two-operand sort, about 3x slower on XLA:CPU):

    - ``"search"``: sort the ids, then a scan ``searchsorted`` maps each token to its run;
    - ``"packed"`` (when ``(vocab + 1) * n`` fits in int32, e.g. small tables): sort ``id * n + position``,
      so each sorted key also says which token it came from and one scatter writes the segment ids
      (about 25% faster at 16K tokens). The default picks it whenever it fits; results are identical.
    """
    ids = ids.reshape(-1).astype(jnp.int32)
    n = ids.shape[0]
    method = method or dedupe_method(n, vocab)
    valid = (ids >= 0) & (ids < vocab)
    if pad_id is not None:
        valid &= ids != pad_id
    keys = jnp.where(valid, ids, vocab)
    if method == "packed":
        if dedupe_method(n, vocab) != "packed":
            raise ValueError(f"dedupe method 'packed' needs (vocab + 1) * tokens <= 2**31: vocab={vocab}, tokens={n}")
        packed = jnp.sort(keys * n + jnp.arange(n, dtype=jnp.int32))
        s = packed // n
        position = packed - s * n
    elif method == "search":
        s = jnp.sort(keys)
    else:
        raise ValueError(f"unknown dedupe method {method!r} (packed or search)")
    starts = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    run = jnp.cumsum(starts) - 1
    slot = jnp.where(starts, run, num_unique)
    unique = jnp.full((num_unique,), vocab, jnp.int32).at[slot].set(s, mode="drop", unique_indices=True)
    if method == "packed":
        seg = jnp.zeros((n,), jnp.int32).at[position].set(run.astype(jnp.int32), unique_indices=True)
    else:
        seg = jnp.searchsorted(unique, keys, method="scan").astype(jnp.int32)
    return unique, jnp.where(valid, seg, -1)


def make_update(ctx: AsyncEmbContext, ids: jax.Array, grads: jax.Array, pending: Any = True,
                pad_id: int | None = 0) -> AsyncEmbGradientUpdate:
    """Build the update record for one table from the batch's ids and per-token gradients.

    Routed (row layout, ``routing="alltoall"``) and column layout (``ctx.per_device_record``): each device
    dedupes only its own tokens (the batch split over every mesh axis, as the train step holds it) inside
    ``jax.shard_map``; ``unique_tokens`` is then
    ``mesh.size`` sorted blocks of ``ctx.local_unique``, one per device, and each token's segment id indexes
    its own device's block. No device sees another's ids. Otherwise one dedupe of the whole batch."""
    grads = grads.reshape(-1, grads.shape[-1])
    if ctx.per_device_record:
        axes = ctx.batch_axes
        local = jax.shard_map(lambda i: dedupe(i, ctx.vocab, ctx.local_unique, pad_id), mesh=ctx.mesh,
                              in_specs=P(axes), out_specs=(P(axes), P(axes)), check_vma=False)
        unique, seg = local(ids.reshape(-1))
    else:
        unique, seg = dedupe(ids, ctx.vocab, ctx.num_unique, pad_id)
    return AsyncEmbGradientUpdate(unique, grads, seg, jnp.asarray(pending, bool))


def empty_update(ctx: AsyncEmbContext, dtype: Any = "float32") -> AsyncEmbGradientUpdate:
    """A non-pending update of the right shapes (the first async step, or after a flush)."""
    return AsyncEmbGradientUpdate(
        jnp.full((ctx.record_unique,), ctx.vocab, jnp.int32),
        jnp.zeros((ctx.tokens_per_batch, ctx.emb_width), dtype),
        jnp.full((ctx.tokens_per_batch,), -1, jnp.int32),
        jnp.zeros((), bool),
    )


def update_token_ids(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate) -> jax.Array:
    """Each token's id ``[tokens]`` in an update record of either kind (``ctx.local_record``), ``ctx.vocab`` for
    the tokens it drops: of a per-device record each device reads its own block (split over the batch, as
    ``make_update`` built it), of a record of the whole batch the replicated ids. Traced; ``record_token_ids``
    is the host-side twin."""
    if not ctx.local_record(update):
        return routing.token_ids(ctx, update.unique_tokens, update.segment_ids)
    split = P(ctx.batch_axes)
    return jax.shard_map(functools.partial(routing.token_ids, ctx), mesh=ctx.mesh, in_specs=(split, split),
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
    unique = np.full((ctx.record_unique,), ctx.vocab, np.int32)
    seg = np.full((tok.size,), -1, np.int32)
    for b in range(blocks):
        t = tok[b * n:(b + 1) * n]
        valid = (t >= 0) & (t < ctx.vocab)
        u = np.unique(t[valid])
        if u.size > size - 1:
            raise ValueError(f"{u.size} distinct ids do not fit an update record of {size} slots")
        unique[b * size:b * size + u.size] = u
        seg[b * n:(b + 1) * n] = np.where(valid, np.searchsorted(u, t), -1)
    return unique, seg


def segment_sum(grads: jax.Array, segment_ids: jax.Array, num_unique: int) -> jax.Array:
    """fp32 sum of per-token gradients into their unique rows; padding tokens (-1) are dropped."""
    seg = jnp.where(segment_ids < 0, num_unique, segment_ids)
    return jax.ops.segment_sum(grads.astype(jnp.float32), seg, num_segments=num_unique)


def mix32(x: jax.Array) -> jax.Array:
    """A 32-bit integer finaliser (xor-shift-multiply): every input bit flips about half the output bits."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash2d(rows: jax.Array, cols: jax.Array, row_key: Any, col_key: Any) -> jax.Array:
    """uint32 [len(rows), len(cols)]: a hash of (row id, column) under two keys, the same on any layout.
    Shared by stochastic rounding and the runner's table initialisation."""
    r = mix32(rows.astype(jnp.uint32) * jnp.uint32(0x9E3779B1) + jnp.asarray(row_key).astype(jnp.uint32))
    c = cols.astype(jnp.uint32) * jnp.uint32(0x85EBCA77) + jnp.asarray(col_key).astype(jnp.uint32)
    return mix32(r[:, None] ^ c[None, :])


def rounding_bits(rows: jax.Array, cols: jax.Array, count: jax.Array) -> jax.Array:
    """uint32 [len(rows), len(cols)]: a hash of (row id, column, update count), the same on any layout."""
    return hash2d(rows, cols, count, jnp.uint32(0x6A09E667))


def stochastic_round_bf16(x: jax.Array, bits: jax.Array) -> jax.Array:
    """Round float32 ``x`` to bfloat16 up or down with probability proportional to proximity.

    Adding 16 random low bits to the float32 bit pattern and truncating rounds the magnitude up with
    probability (dropped fraction) / ulp, so the result is unbiased. Non-finite values round to nearest.
    """
    raw = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    noisy = (raw + (bits & jnp.uint32(0xFFFF))) & jnp.uint32(0xFFFF0000)
    rounded = lax.bitcast_convert_type(noisy, jnp.float32).astype(jnp.bfloat16)  # exact: low bits are zero
    return jnp.where(jnp.isfinite(x), rounded, x.astype(jnp.bfloat16))


def compiler_options(table_dtypes) -> dict[str, str]:
    """XLA options for a jitted step that updates tables of these dtypes (pass to ``jax.jit``).

    XLA:CPU rewrites every bfloat16 op to float32 (its ``float-normalization-bf16`` pass); around an
    in-place row scatter that converts the whole table to float32 and back on every step (two table-sized
    temporaries, ~1 s per step at 10M x 64). The fused update does its arithmetic in float32 itself and
    only moves bfloat16 rows, so steps that touch a bfloat16 table switch the pass off on CPU.
    """
    if jax.default_backend() == "cpu" and any(jnp.dtype(d) == jnp.bfloat16 for d in table_dtypes):
        return {"xla_disable_hlo_passes": "float-normalization-bf16"}
    return {}


class EmbOptState(NamedTuple):
    """An embedding optimizer's state: per-row leaves (leading dim = table rows) and an update count."""

    rows: Any
    count: jax.Array  # int32: number of valid updates applied


class RowContext(NamedTuple):
    """What a per-row rule may use besides its rows, state and gradient."""

    step: jax.Array  # int32, 1-based count of this update
    emb_width: int  # full width of a row, even when this shard holds a slice of it
    width_sum: Callable[[jax.Array], jax.Array]  # sum over the full width (reduced across width shards)
    grad_sq_sum: Callable[[], jax.Array]  # [rows]: sum of grad**2 over the full width (shared with the norm)


# ----------------------------------------------------------------------------------------------------
# The fused optimizer base
# ----------------------------------------------------------------------------------------------------
class FusedEmbOptimizer(AsyncEmbOptimizer):
    """Base of the fused optimizers: subclasses give ``init_rows`` and ``update_rows`` only."""

    def init_rows(self, num_rows: int, width: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def update_rows(self, rows: jax.Array, state: Any, grad: jax.Array, rc: RowContext) -> tuple[jax.Array, Any]:
        raise NotImplementedError  # pragma: no cover - abstract

    def init(self, num_rows: int, width: int) -> EmbOptState:
        return EmbOptState(self.init_rows(num_rows, width), jnp.zeros((), jnp.int32))

    # The protocol -------------------------------------------------------------------------------------
    def gradient_update_start(self, context: AsyncEmbContext, update: AsyncEmbGradientUpdate,
                              table: jax.Array, state: EmbOptState, gate: jax.Array):
        table, state, norm, valid, rows = apply_fused(self, context, update, table, state, gate)
        context.results.update(norm=norm, valid=valid, rows_per_shard=rows)
        return (norm, valid), table, state

    def gradient_update_done(self, context: AsyncEmbContext, gate: jax.Array):
        """``(norm, valid, done_pin)``: ``norm`` is the global L2 norm of the deduped gradient; ``valid`` is
        true only when the update was pending, its gradient finite and the rows and state it computed
        finite, i.e. when it was written. A refused update (``valid`` false with a finite ``norm``: the
        rule's result overflowed or was NaN, e.g. eps=0 on a zero gradient, b1=1, a huge learning rate)
        left table and state bit-for-bit unchanged, exactly like a non-finite gradient."""
        if "norm" not in context.results:
            raise RuntimeError("gradient_update_done called before gradient_update_start on this context")
        norm, valid = context.results["norm"], context.results["valid"]
        done_pin = lax.optimization_barrier((jnp.asarray(gate), norm, valid))[0]
        return norm, valid, done_pin


def apply_fused(opt: FusedEmbOptimizer, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate,
                table: jax.Array, state: EmbOptState, gate: jax.Array):
    """Apply ``update`` to the touched rows; returns (table, state, norm, valid, rows_updated_per_shard).

    With routed ids (row layout) it also records ``ctx.results["route_refused"]``: what the routing could not
    deliver, so the update was refused whole (``valid`` false). With ``route_overflow="stop"`` those are the
    ids without a slot at their owner (summed over the sending devices); with ``"reroute"`` a step with such
    ids routes them in further rounds, and only rows past an owner's buffer (``ctx.owner_slots_for``)
    count (summed over the table shards). The sharded column layout records it too: with ``"stop"`` the
    distinct ids past a device's exchange (``ctx.slots_for``, summed over devices); with ``"reroute"`` such a
    step exchanges every device's whole buffer and nothing is refused (0)."""
    # The gate orders the table writes after the gate's producer (e.g. the lookup that reads the table).
    table, state, gate = lax.optimization_barrier((table, state, jnp.asarray(gate)))
    if not ctx.sharded:
        return _apply_local(opt, ctx, update, table, state, gate, axis=None)
    specs_state = ctx.state_specs(state)
    local = ctx.local_record(update)  # a per-device record (routed row or column layout), used as it is
    if ctx.routed:  # also returns the ids it could not deliver
        body, extra = functools.partial(_apply_routed, local=local), (P(),)
    elif ctx.layout == COLUMN:  # also returns the ids past its exchange (route_overflow="stop"; else 0)
        body, extra = functools.partial(_apply_columns, local=local), (P(),)
    else:  # the gather row layout: every shard sees the whole batch's record
        body, extra = functools.partial(_apply_local, axis=ctx.table_axis), ()
    kernel = jax.shard_map(
        lambda u, t, s, g: body(opt, ctx, u, t, s, g),
        mesh=ctx.mesh,
        in_specs=(AsyncEmbGradientUpdate(*ctx.update_specs(local)), ctx.table_spec(), specs_state, P()),
        out_specs=(ctx.table_spec(), specs_state, P(), P(), P(ctx.table_axis), *extra),
        check_vma=False,
    )
    out = kernel(update, table, state, jnp.ravel(gate)[0])
    if extra:
        *out, ctx.results["route_refused"] = out
    return tuple(out)


def _gate_bit(gate: jax.Array) -> jax.Array:
    """0 or 1 (the gate's sign bit): data the scatter's indices can depend on without changing them.

    XLA:CPU turns optimization barriers into control edges that its copy insertion does not honour: a
    write whose only link to an earlier read of the table is a barrier gets a whole-table copy. Making
    the out-of-range index a scatter drops depend on the gate's value keeps the write in place.
    """
    bits = lax.bitcast_convert_type(jnp.ravel(jnp.asarray(gate))[0].astype(jnp.float32), jnp.uint32)
    return (bits >> 31).astype(jnp.int32)


def _non_finite_rows(x: jax.Array, owned: jax.Array) -> jax.Array:
    """int32: how many of the rows this shard owns hold a non-finite value (integer leaves never do)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros((), jnp.int32)
    finite = jnp.isfinite(x).reshape(x.shape[0], -1).all(axis=1) if x.ndim > 1 else jnp.isfinite(x)
    return jnp.sum(owned & ~finite).astype(jnp.int32)


# Rows the routed owner's rule handles at a time: its owned rows come first in a static buffer sized for the
# capacity (every sender's slots), mostly padding at the default capacity; it skips chunks of padding only.
RULE_CHUNK = 256


def _apply_local(opt, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state: EmbOptState, gate,
                 axis):
    """The per-shard kernel: segment-sum, norm, gather, rule, gated scatter."""
    ids, seg = update.unique_tokens, update.segment_ids
    if axis is not None and ctx.layout == ROW:
        offset = lax.axis_index(axis) * ctx.shard_rows
        local = ids - offset
        owned = (local >= 0) & (local < ctx.shard_rows)
        seg = jnp.where(owned.at[seg].get(mode="fill", fill_value=False), seg, -1)  # sum only the rows we own
    else:
        local = ids
        owned = ids < ctx.vocab
    g = segment_sum(update.grads, seg, ctx.num_unique)  # [U, width or width/n]
    return _rule_and_write(opt, ctx, ids, local, owned, g, table, state, gate, axis, update.pending)


def _apply_routed(opt, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state: EmbOptState, gate,
                  local: bool = True):
    """The routed per-device kernel: this device's unique ids and fp32 segment-summed gradients -> all-to-all
    to their owners -> the owner sums what every device sent for the same row -> rule on its own rows.

    ``local``: the record is per device (routed ``make_update``: this device's block of unique ids, its
    tokens' segment ids into it), used as it is. Otherwise it is a record of the whole batch (replicated
    ids): this device re-derives its tokens' ids and dedupes them first."""
    axis = ctx.table_axis
    n = update.segment_ids.shape[0]  # this device's tokens (ctx.local_tokens for a train batch's record)
    unique, seg = _device_record(ctx, update, local)
    slots = ctx.slots_for(n)
    b = routing.bucket(ctx, unique, slots)
    size = ctx.owner_slots_for(n)  # the owner's unique-row buffer

    def receive(b: routing.Buckets, held=None):
        """-> the owner's (local rows [size], fp32 gradient sums [size, width], rows that did not fit). ``held``:
        what earlier rounds delivered (the same triple); this round's rows are merged into it."""
        # Each token's gradient summed (fp32) straight into its unique id's send slot: one pass, no [U, width]
        # buffer to gather from. Padding tokens and ids without a slot this round land past the end: dropped.
        shards = b.send.shape[0]
        tok_slot = jnp.where(seg >= 0, b.slot.at[jnp.maximum(seg, 0)].get(mode="fill", fill_value=shards * slots),
                             -1)
        send_g = segment_sum(update.grads, tok_slot, shards * slots).reshape(shards, slots, -1)
        # One all-to-all carries both: each slot's row number rides, bit for bit, as an extra float32 column.
        width = send_g.shape[-1]
        packed = jnp.concatenate([send_g, lax.bitcast_convert_type(b.send, jnp.float32)[..., None]], axis=-1)
        got = routing.gather_over_data(ctx, routing.exchange(ctx, packed)).reshape(-1, width + 1)
        rows_in, g_in = lax.bitcast_convert_type(got[:, width], jnp.int32), got[:, :width]
        lost = jnp.zeros((), jnp.int32)
        if held is not None:
            rows_in, g_in = jnp.concatenate([held[0], rows_in]), jnp.concatenate([held[1], g_in])
            lost = held[2]
        full = min(rows_in.shape[0], ctx.shard_rows) + 1  # every received slot, or every owned row
        local, oseg = dedupe(rows_in, ctx.shard_rows, full, pad_id=None)
        g_own = segment_sum(g_in, oseg, full)  # every sender's gradient for each owned row
        # Owned rows come first (sorted, padding last): keep the first ``size``; any owned row past them is lost.
        lost = lost + jnp.sum(local[size:] < ctx.shard_rows).astype(jnp.int32)
        return local[:size], g_own[:size], lost

    if ctx.reroutes:
        # Rounds of the same slots until every id reached its owner: the first as usual, then (only when some
        # device has more ids for one shard than its slots; every device runs as many as the most crowded one
        # needs) the next slots of each run, merged into the owner's buffer. The table is written once, after
        # them (outside the loop: a scatter inside it would copy the table shard).
        rounds, _, _ = routing.rounds_needed(ctx, b, slots)
        local, g_own, lost = lax.fori_loop(
            1, rounds, lambda r, held: receive(routing.bucket(ctx, unique, slots, r * slots), held), receive(b))
    else:
        local, g_own, _ = receive(b)
        refused = lax.psum(b.overflow, ctx.batch_axes)  # ids without a slot, counted at their senders
    owned = local < ctx.shard_rows
    gids = jnp.where(owned, local + lax.axis_index(axis) * ctx.shard_rows, ctx.vocab)
    if ctx.reroutes:  # rows an owner could not hold refuse the update whole: summed with the norm and the rule's check
        return _rule_and_write(opt, ctx, gids, local, owned, g_own, table, state, gate, axis, update.pending,
                               chunk=RULE_CHUNK, lost=lost)
    out = _rule_and_write(opt, ctx, gids, local, owned, g_own, table, state, gate, axis,
                          update.pending & (refused == 0), chunk=RULE_CHUNK)
    return (*out, refused)


def _device_record(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, local: bool):
    """This device's (sorted unique ids, its tokens' segment ids): the record's own block when it is per device
    (``local``), else re-derived from a record of the whole batch (replicated ids) and deduped here."""
    if local:
        return update.unique_tokens, update.segment_ids
    n = update.segment_ids.shape[0]
    ids = routing.token_ids(ctx, update.unique_tokens, update.segment_ids)
    return dedupe(ids, ctx.vocab, num_unique_for(n, ctx.vocab), pad_id=None)


def _apply_columns(opt, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state: EmbOptState, gate,
                   local: bool = True):
    """The column layout's per-device kernel: this device's fp32 segment-summed gradients of its unique rows,
    split by width; an all-to-all gives every shard its slice of every table-group device's rows (and an
    all-gather their ids); each shard sums what all devices (of every data group) sent for the same row and
    applies the rule to its slice of those rows. Every shard sees the same ids in the same order, so the
    per-row sums over the full width the rule needs (``width_sum``, the norm) are one psum over the table axis.

    Only the first C = ``ctx.slots_for(n)`` unique ids (the distinct ones come first) and their gradient slices
    are exchanged; the record keeps its size. A device with more distinct ids than C: with ``reroute`` (the
    default) every device exchanges its whole buffer that step (``lax.cond`` on the overflow summed over the
    mesh; the table is written outside it), and the rule's width sums psum the whole owner buffer only then;
    with ``stop`` the update is refused whole and the ids past C (summed over devices) are returned last."""
    unique, seg = _device_record(ctx, update, local)
    n, size = seg.shape[0], unique.shape[0]  # this device's tokens and its unique buffer
    shards, width = ctx.table_shards, ctx.emb_width
    slots = ctx.slots_for(n)
    g = segment_sum(update.grads, seg, size)  # [U, width] fp32

    def owner_size(c: int) -> int:
        return min(ctx.mesh.size * c, ctx.vocab) + 1

    def receive(c: int, pad_to: int | None = None):
        """Exchange the first ``c`` unique ids -> (every row's id [S], every device's gradient slice summed
        [S, width / shards]), padded to ``pad_to`` rows (ids ``ctx.vocab``, gradients 0)."""
        gc = jnp.moveaxis(g[:c].reshape(c, shards, width // shards), 1, 0)  # [shards, c, width / shards]
        g_in = routing.gather_over_data(ctx, routing.exchange(ctx, gc)).reshape(-1, width // shards)
        rows_in = routing.gather_over_data(ctx, lax.all_gather(unique[:c], ctx.table_axis, axis=0)).reshape(-1)
        s = owner_size(c)
        ids, oseg = dedupe(rows_in, ctx.vocab, s, pad_id=None)
        g_own = segment_sum(g_in, oseg, s)  # every device's gradient slice for each row
        if pad_to is not None and pad_to > s:  # sorted ids, padding last: stays so
            ids = jnp.concatenate([ids, jnp.full((pad_to - s,), ctx.vocab, ids.dtype)])
            g_own = jnp.pad(g_own, ((0, pad_to - s), (0, 0)))
        return ids, g_own

    pending, live, refused = update.pending, None, jnp.zeros((), jnp.int32)
    if not ctx.column_capped_for(n):  # room for every distinct id: the whole buffer, as it is
        ids, g_own = receive(size)
    else:
        _, overflow = routing.past_exchange(ctx, unique, slots)
        if ctx.reroutes:  # every device takes the same branch: the test is on the overflow summed over the mesh
            rerouted = lax.psum(overflow, ctx.batch_axes) > 0
            full = owner_size(size)
            ids, g_own = lax.cond(rerouted, lambda: receive(size), lambda: receive(slots, full))
            live = (owner_size(slots), rerouted)  # the width sums move the whole buffer only when rerouted
        else:  # ids past the exchange: the update is refused whole
            refused = lax.psum(overflow, ctx.batch_axes)
            ids, g_own = receive(slots)
            pending = pending & (refused == 0)
    owned = ids < ctx.vocab
    # One pass over the whole buffer (no chunks): the rule's width sums are collectives, one per chunk otherwise.
    out = _rule_and_write(opt, ctx, ids, ids, owned, g_own, table, state, gate, ctx.table_axis, pending, live=live)
    return (*out, refused)


def _rule_and_write(opt, ctx: AsyncEmbContext, ids, local, owned, g, table, state: EmbOptState, gate, axis,
                    pending, chunk: int | None = None, lost: jax.Array | None = None,
                    live: tuple[int, jax.Array] | None = None):
    """Norm, gather, rule, gate, scatter for unique rows ``ids`` (global; ``local`` in this shard, valid
    where ``owned``) with their summed gradients ``g``. ``chunk``: the owned rows come first (the rest is
    padding); the rule runs on ``chunk`` rows at a time, only as many chunks as hold owned rows. ``lost``
    (int32): rows of this update this shard could not hold; any, summed over the shards, refuse it whole, and
    the sum is returned after the other results. ``live`` (column layout): ``(k, whole)``: unless ``whole``
    (a bool every device agrees on), only the first ``k`` rows can be owned, so the width sums (a psum over the
    table axis) move those rows only."""
    row_sq = jnp.sum(g * g, axis=-1)  # one pass over g serves the norm and any rule that needs sum(g**2)
    sq = jnp.sum(row_sq)  # summed over the shards below, with the rule's check: each summed its rows or columns

    n_local = table.shape[0]
    local = jnp.where(owned, local, n_local)  # out of range: gathers fill, scatters drop

    def across_width(s):
        if axis is None or ctx.layout != COLUMN:
            return s
        if live is None or live[0] >= s.shape[0]:
            return lax.psum(s, axis)
        k, whole = live  # the rows past k are padding unless whole: their sums are zeros there
        return lax.cond(whole, lambda: lax.psum(s, axis),
                        lambda: jnp.pad(lax.psum(s[:k], axis), ((0, s.shape[0] - k),) + ((0, 0),) * (s.ndim - 1)))

    def width_sum(x):
        return across_width(jnp.sum(x, axis=-1))

    step = state.count + 1

    def rule(local, ids, g, row_sq, owned):
        """New rows (float32, or rounded to the table's bfloat16) and state for these rows, and how many of
        the owned ones hold a non-finite value (as stored)."""
        rows = table.at[local].get(mode="fill", fill_value=0, unique_indices=True).astype(jnp.float32)
        row_state = jax.tree.map(lambda a: a.at[local].get(mode="fill", fill_value=0, unique_indices=True),
                                 state.rows)
        rc = RowContext(step, ctx.emb_width, width_sum, lambda: across_width(row_sq))
        new_rows, new_row_state = opt.update_rows(rows, row_state, g, rc)
        if table.dtype == jnp.bfloat16:  # state stays f32; the rows are rounded stochastically on write-back
            cols = jnp.arange(table.shape[1], dtype=jnp.int32)
            if axis is not None and ctx.layout == COLUMN:
                cols = cols + lax.axis_index(axis) * ctx.shard_width  # global column ids: same bits on any layout
            new_rows = stochastic_round_bf16(new_rows, rounding_bits(ids, cols, step))
        # The gate covers the rule's output: an update whose new rows or state would not be finite (as
        # stored) writes nothing. Every shard counts its own non-finite touched rows; a psum decides for all.
        bad = _non_finite_rows(new_rows.astype(table.dtype), owned)
        for leaf, new_leaf in zip(jax.tree.leaves(state.rows), jax.tree.leaves(new_row_state)):
            bad = bad + _non_finite_rows(jnp.asarray(new_leaf).astype(leaf.dtype), owned)
        return new_rows, new_row_state, bad

    if chunk is None or chunk >= local.shape[0]:
        new_rows, new_row_state, bad = rule(local, ids, g, row_sq, owned)
    else:
        # Owned rows come first (sorted unique ids, padding last): the rule runs chunk by chunk over them only,
        # so its cost follows the rows this shard really updates, not the static buffer (mostly padding).
        n = local.shape[0]
        total = -(-n // chunk) * chunk
        pad = lambda x, v: jnp.concatenate([x, jnp.full((total - n, *x.shape[1:]), v, x.dtype)])  # noqa: E731
        local, ids, g, row_sq, owned = (pad(local, n_local), pad(ids, ctx.vocab), pad(g, 0), pad(row_sq, 0),
                                        pad(owned, False))
        shapes = jax.eval_shape(lambda: rule(local[:chunk], ids[:chunk], g[:chunk], row_sq[:chunk], owned[:chunk]))
        out0 = jax.tree.map(lambda s: jnp.zeros((total, *s.shape[1:]), s.dtype), shapes[:2])
        live = -(-jnp.sum(owned).astype(jnp.int32) // chunk)

        def body(carry):
            i, out, bad = carry
            at = i * chunk
            part = lambda x: lax.dynamic_slice_in_dim(x, at, chunk)  # noqa: E731
            r, st, b = rule(part(local), part(ids), part(g), part(row_sq), part(owned))
            out = jax.tree.map(lambda o, v: lax.dynamic_update_slice_in_dim(o, v, at, 0), out, (r, st))
            return i + 1, out, bad + b

        _, (new_rows, new_row_state), bad = lax.while_loop(lambda c: c[0] < live, body,
                                                           (jnp.int32(0), out0, jnp.zeros((), jnp.int32)))
    # Invalid or not ours: an index past the end (n_local or n_local + 1, after the gate), nothing is written.
    scatter = lambda a, v: a.at[write].set(v.astype(a.dtype), mode="drop", unique_indices=True)  # noqa: E731
    refused = jnp.zeros((), jnp.int32) if lost is None else lost
    if axis is not None:  # one all-reduce for all three (counts as float32: exact below 2**24 rows a step)
        sq, bad, refused = lax.psum(jnp.stack([sq, bad.astype(jnp.float32), refused.astype(jnp.float32)]), axis)
        bad, refused = bad.astype(jnp.int32), refused.astype(jnp.int32)
    norm = jnp.sqrt(sq)
    valid = jnp.isfinite(norm) & pending & (bad == 0) & (refused == 0)
    write = jnp.where(valid & owned, local, n_local + _gate_bit(gate))
    table = scatter(table, new_rows)
    new_state = EmbOptState(jax.tree.map(scatter, state.rows, new_row_state),
                            jnp.where(valid, step, state.count))
    rows_updated = jnp.sum(valid & owned).astype(jnp.int32).reshape(1)
    out = (table, new_state, norm, valid, rows_updated)
    return out if lost is None else (*out, refused)
