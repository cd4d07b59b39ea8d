"""Gather -> per-row rule -> gate -> in-place scatter over a table's unique touched rows: the part of the
fused update every layout shares (``Layout.update`` brings each shard its rows and their summed gradients).

The cost follows the rows a batch touches, never the vocabulary: nothing here builds a table-sized temporary,
and the scatter writes into the (donated) table buffer. A bfloat16 table's new rows are rounded
stochastically (``optimizers.rounding``); an update whose gradient, new rows or new state is not finite, or
that was not pending, writes nothing at all.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from ._lazy import jax, jnp, lax
from . import kernels
from .indexing import take_rows
from .rounding import rounding_bits, stochastic_round_bf16
from .scopes import phase

if TYPE_CHECKING:
    from .context import AsyncEmbContext


class WeightDecayMode(str, enum.Enum):
    """How a fused optimizer's ``weight_decay`` acts (FBGEMM's modes).

    - ``decoupled`` (default): inside the rule, ``row -= lr * (... + weight_decay * row)``, on the rows an update
      touches, once per update that touches them (a rarely seen row decays rarely).
    - ``l2``: ``weight_decay * row`` is added to the summed gradient before the rule (an L2 penalty: the
      adaptive rules scale it, and row-wise Adagrad squares it into its accumulator).
    - ``decoupled_global``: as ``decoupled``, and a touched row first catches up, exactly, on the decay it
      missed while untouched: times ``prod(1 - lr_s * weight_decay)`` over the table's updates ``s`` since its
      last touch (kept as a running sum of logs, so a learning-rate schedule is followed too). A row then
      holds what decaying every row at every update would give it, while the update still touches only the
      batch's rows; an untouched row's stored value is its value at its last touch (``GlobalDecay``).
    """

    decoupled = "decoupled"
    l2 = "l2"
    decoupled_global = "decoupled_global"


class GlobalDecay(NamedTuple):
    """``decoupled_global``'s bookkeeping: the table's running sum of ``log(1 - lr * weight_decay)`` over its
    updates, and each row's value of it at its last touch (a row's missed decay is ``exp(total - touch)``)."""

    touch: jax.Array  # [rows] f32
    total: jax.Array  # f32


class EmbOptState(NamedTuple):
    """An embedding optimizer's state: per-row leaves (leading dim = table rows), an update count, and with
    ``weight_decay_mode=decoupled_global`` its :class:`GlobalDecay` (else None: no leaves)."""

    rows: Any
    count: jax.Array  # int32: number of valid updates applied
    decay: Any = None


def decay_mode(opt: Any) -> WeightDecayMode | None:
    """``opt``'s weight-decay mode when it decays at all (``weight_decay > 0``), else None."""
    wd = getattr(opt, "weight_decay", 0.0)
    if not isinstance(wd, (int, float)) or not wd > 0:
        return None
    return WeightDecayMode(getattr(opt, "weight_decay_mode", WeightDecayMode.decoupled))


class RowContext(NamedTuple):
    """What a per-row rule may use besides its rows, state and gradient."""

    step: jax.Array  # int32, 1-based count of this update
    emb_width: int  # full width of a row, even when this shard holds a slice of it
    width_sum: Callable[[jax.Array], jax.Array]  # sum over the full width (reduced across width shards)
    grad_sq_sum: Callable[[], jax.Array]  # [rows]: sum of grad**2 over the full width (shared with the norm)
    learning_rate: Any = None  # this update's learning rate: learning_rate times its schedule (a float if constant)


class Touched(NamedTuple):
    """The unique rows one shard updates: ``ids`` (global row ids, the table's stored row count for padding),
    ``local`` (their rows in this shard), ``owned`` (whether this shard holds each one) and ``grads`` (their
    fp32 gradient sums, ``[rows, shard width]``)."""

    ids: jax.Array
    local: jax.Array
    owned: jax.Array
    grads: jax.Array
    then: Any = None  # delay compensation: their rows as the gradient was computed on them ([rows, shard width])


def write_rows(opt: Any, ctx: AsyncEmbContext, touched: Touched, table: jax.Array, state: EmbOptState,
               gate: jax.Array, pending: jax.Array, chunk: int | None = None, lost: jax.Array | None = None,
               live: tuple[int, jax.Array] | None = None):
    """``xla_write_rows``'s result. Where a native CPU kernel applies (``native_applies``: row-wise Adagrad or Adam
    on one device) a CPU program runs it instead: the same values up to float32 rounding, in one pass."""
    if lost is None and live is None and native_applies(opt, ctx, touched, table, state):
        return _native_write(opt, ctx, touched, table, state, gate, pending)
    return xla_write_rows(opt, ctx, touched, table, state, gate, pending, chunk, lost, live)


def native_applies(opt: Any, ctx: AsyncEmbContext, touched: Touched, table: jax.Array, state: EmbOptState) -> bool:
    """Whether ``optimizers.kernels.fused_rows`` computes this update: an optimizer with a native rule
    (``native_rule``: ``AsyncRowwiseAdagrad``, ``AsyncAdam``; not a subclass that overrides ``update_rows``), one
    device, a float32 table stored at its width with float32 and int32 state, no weight decay or the decoupled
    kind, no delay compensation, and the kernels usable (``optimizers.kernels.usable()``: on CPU and built)."""
    owner = next((c for c in type(opt).__mro__ if vars(c).get("native_rule")), None)
    if owner is None or type(opt).update_rows is not owner.update_rows:
        return False
    leaves = jax.tree.leaves(state.rows)
    return (ctx.one_device and not ctx.compensates and touched.then is None and state.decay is None
            and decay_mode(opt) in (None, WeightDecayMode.decoupled) and table.dtype == jnp.float32
            and table.ndim == 2 and table.shape[1] == ctx.emb_width
            and all(a.dtype in (jnp.float32, jnp.int32) and a.shape[0] == table.shape[0] for a in leaves)
            and not kernels.usable())


def _native_write(opt: Any, ctx: AsyncEmbContext, touched: Touched, table: jax.Array, state: EmbOptState,
                  gate: jax.Array, pending: jax.Array):
    """``write_rows`` by the optimizer's native kernel (its time shows in the "rule" phase)."""
    step = state.count + 1
    lr = _learning_rate(opt, step)
    ids = jnp.where(touched.owned, touched.local, table.shape[0])
    leaves, tree = jax.tree.flatten(state.rows)
    with phase("rule"):
        table, leaves, norm, valid, written = kernels.fused_rows(
            opt.native_rule, table, leaves, ids, touched.grads, lr, step, pending, gate,
            weight_decay=opt.weight_decay if decay_mode(opt) else 0.0, **opt.native_attrs())
    rows = jax.tree.unflatten(tree, leaves)
    return table, EmbOptState(rows, jnp.where(valid, step, state.count), None), norm, valid, written


def xla_write_rows(opt: Any, ctx: AsyncEmbContext, touched: Touched, table: jax.Array, state: EmbOptState,
                   gate: jax.Array, pending: jax.Array, chunk: int | None = None, lost: jax.Array | None = None,
                   live: tuple[int, jax.Array] | None = None):
    """Norm, gather, rule, gate, scatter for ``touched``'s unique rows (global ``ids``; ``local`` in this
    shard, valid where ``owned``) with their summed gradients; returns ``(table, state, norm, valid,
    rows_updated [1])``. Runs per shard inside ``jax.shard_map`` on a sharded table (the sums it needs across
    shards are collectives over ``ctx.table_axis``), or on one device. ``chunk``: the owned rows come first (the rest is
    padding); the rule runs on ``chunk`` rows at a time, only as many chunks as hold owned rows. ``lost``
    (int32): rows of this update this shard could not hold; any, summed over the shards, refuse it whole, and
    the sum is returned after the other results. ``live`` (column layout): ``(k, whole)``: unless ``whole``
    (a bool every device agrees on), only the first ``k`` rows can be owned, so the width sums (a psum over the
    table axis) move those rows only.

    Under delay compensation (``ctx.dc_lambda``; ``touched.then`` holds each row's ``w_then``) the rule gets
    ``g + dc_lambda * g * g * (w_now - w_then)`` for each touched row, ``w_now`` its row as gathered here (as
    stored), before any l2 term; the norm stays the batch gradient's."""
    ids, local, owned, g, then = touched
    if ctx.compensates and then is None:
        raise ValueError("delay compensation (dc_lambda) needs the touched rows' w_then (Touched.then)")
    axis = ctx.table_axis if ctx.sharded else None
    with phase("gate"):  # one pass over g serves the norm and any rule that needs sum(g**2)
        row_sq = _row_sums(g * g)
        sq = _row_sums(row_sq)  # summed over the shards below, with the rule's check: each its rows or columns

    n_local = table.shape[0]

    def narrow(a):
        """A gathered table or per-element state leaf's own columns (``ctx.stored_width``: its padding cut off)."""
        return ctx.narrow(a) if a.ndim >= 2 and a.shape[-1] == ctx.stored_width else a

    def widen(v, a):
        """New values ``v`` for leaf ``a``: padded with zero columns up to ``a``'s stored width."""
        if a.ndim >= 2 and v.shape[-1] != a.shape[-1]:
            return jnp.pad(v, ((0, 0),) * (v.ndim - 1) + ((0, a.shape[-1] - v.shape[-1]),))
        return v
    local = jnp.where(owned, local, n_local)  # out of range: gathers fill, scatters drop

    def across_width(s):
        if axis is None or not ctx.layout.splits_width:
            return s
        if live is None or live[0] >= s.shape[0]:
            return lax.psum(s, axis)
        k, whole = live  # the rows past k are padding unless whole: their sums are zeros there
        return lax.cond(whole, lambda: lax.psum(s, axis),
                        lambda: jnp.pad(lax.psum(s[:k], axis), ((0, s.shape[0] - k),) + ((0, 0),) * (s.ndim - 1)))

    def width_sum(x):
        return across_width(jnp.sum(x, axis=-1))

    step = state.count + 1
    lr = _learning_rate(opt, step)
    mode = decay_mode(opt)
    rule_opt = dataclasses.replace(opt, weight_decay=0.0) if mode is WeightDecayMode.l2 else opt
    if mode is WeightDecayMode.decoupled_global:
        total = state.decay.total + jnp.log1p(-jnp.asarray(lr, jnp.float32) * opt.weight_decay)

    def rule(local, ids, g, row_sq, owned, then):
        """New rows (float32, or rounded to the table's bfloat16) and state for these rows, and how many of
        the owned ones hold a non-finite value (as stored)."""
        with phase("gather"):  # stored rows (ctx.stored_width) narrowed to the width the rule sees
            rows = narrow(take_rows(table, local)).astype(jnp.float32)
            row_state = jax.tree.map(
                lambda a: narrow(take_rows(a, local)), state.rows)
        with phase("rule"):
            if then is not None:  # the gradient, late by the updates applied since, corrected (DC-ASGD)
                g = g + jnp.float32(ctx.dc_lambda) * g * g * (rows - then)
                row_sq = _row_sums(g * g)
            if mode is WeightDecayMode.l2:  # the penalty's gradient joins the batch's, squares included
                g = g + opt.weight_decay * rows
                row_sq = _row_sums(g * g)
            elif mode is WeightDecayMode.decoupled_global:  # the decay the row missed since its last touch
                touch = take_rows(state.decay.touch, local)
                rows = rows * jnp.exp(state.decay.total - touch)[:, None]
            rc = RowContext(step, ctx.emb_width, width_sum, lambda: across_width(row_sq), lr)
            new_rows, new_row_state = rule_opt.update_rows(rows, row_state, g, rc)
            if table.dtype == jnp.bfloat16:  # state stays f32; the rows are rounded stochastically on write-back
                cols = jnp.arange(new_rows.shape[1], dtype=jnp.int32)
                if axis is not None and ctx.layout.splits_width:
                    cols = cols + lax.axis_index(axis) * ctx.shard_width  # global column ids: same bits on any layout
                new_rows = stochastic_round_bf16(new_rows, rounding_bits(ids, cols, step))
        # The gate covers the rule's output: an update whose new rows or state would not be finite (as
        # stored) writes nothing. Every shard counts its own non-finite touched rows; a psum decides for all.
        with phase("gate"):
            bad = _non_finite_rows(new_rows.astype(table.dtype), owned)
            for leaf, new_leaf in zip(jax.tree.leaves(state.rows), jax.tree.leaves(new_row_state)):
                bad = bad + _non_finite_rows(jnp.asarray(new_leaf).astype(leaf.dtype), owned)
        return new_rows, new_row_state, bad

    if chunk is None or chunk >= local.shape[0]:
        new_rows, new_row_state, bad = rule(local, ids, g, row_sq, owned, then)
    else:
        # Owned rows come first (sorted unique ids, padding last): the rule runs chunk by chunk over them only,
        # so its cost follows the rows this shard really updates, not the static buffer (mostly padding).
        n = local.shape[0]
        total = -(-n // chunk) * chunk
        pad = lambda x, v: jnp.concatenate([x, jnp.full((total - n, *x.shape[1:]), v, x.dtype)])  # noqa: E731
        local, ids, g, row_sq, owned = (pad(local, n_local), pad(ids, ctx.stored_rows), pad(g, 0), pad(row_sq, 0),
                                        pad(owned, False))
        then = None if then is None else pad(then, 0)
        shapes = jax.eval_shape(lambda: rule(local[:chunk], ids[:chunk], g[:chunk], row_sq[:chunk], owned[:chunk],
                                             None if then is None else then[:chunk]))
        out0 = jax.tree.map(lambda s: jnp.zeros((total, *s.shape[1:]), s.dtype), shapes[:2])
        chunks = -(-jnp.sum(owned).astype(jnp.int32) // chunk)  # chunks that hold owned rows

        def body(carry):
            i, out, bad = carry
            at = i * chunk
            part = lambda x: lax.dynamic_slice_in_dim(x, at, chunk)  # noqa: E731
            r, st, b = rule(part(local), part(ids), part(g), part(row_sq), part(owned),
                            None if then is None else part(then))
            out = jax.tree.map(lambda o, v: lax.dynamic_update_slice_in_dim(o, v, at, 0), out, (r, st))
            return i + 1, out, bad + b

        _, (new_rows, new_row_state), bad = lax.while_loop(lambda c: c[0] < chunks, body,
                                                           (jnp.int32(0), out0, jnp.zeros((), jnp.int32)))
    # Invalid or not ours: an index past the end (n_local or n_local + 1, after the gate), nothing is written.
    # A padded table's rows (and per-element state) are written whole: the rule's columns, then zeros.
    scatter = lambda a, v: a.at[write].set(widen(v, a).astype(a.dtype), mode="drop", unique_indices=True)  # noqa: E731
    refused = jnp.zeros((), jnp.int32) if lost is None else lost
    with phase("gate"):
        if axis is not None:  # one all-reduce for all three (counts as float32: exact below 2**24 rows a step)
            sq, bad, refused = lax.psum(jnp.stack([sq, bad.astype(jnp.float32), refused.astype(jnp.float32)]), axis)
            bad, refused = bad.astype(jnp.int32), refused.astype(jnp.int32)
        norm = jnp.sqrt(sq)
        valid = jnp.isfinite(norm) & pending & (bad == 0) & (refused == 0)
        if mode is WeightDecayMode.decoupled_global:
            valid = valid & jnp.isfinite(total)
    with phase("scatter"):
        write = jnp.where(valid & owned, local, n_local + _gate_bit(gate))
        table = scatter(table, new_rows)
        decay = state.decay
        if mode is WeightDecayMode.decoupled_global:
            decay = GlobalDecay(scatter(decay.touch, jnp.broadcast_to(total, write.shape)),
                                jnp.where(valid, total, decay.total))
        new_state = EmbOptState(jax.tree.map(scatter, state.rows, new_row_state),
                                jnp.where(valid, step, state.count), decay)
        rows_updated = jnp.sum(valid & owned).astype(jnp.int32).reshape(1)
    out = (table, new_state, norm, valid, rows_updated)
    return out if lost is None else (*out, refused)


def _learning_rate(opt: Any, step: jax.Array) -> Any:
    """``opt``'s learning rate for its ``step``-th update: with its schedule where it has one."""
    return opt.learning_rate_at(step) if hasattr(opt, "learning_rate_at") else getattr(opt, "learning_rate", None)


def _gate_bit(gate: jax.Array) -> jax.Array:
    """0 or 1 (the gate's sign bit): data the scatter's indices can depend on without changing them.

    XLA:CPU turns optimization barriers into control edges that its copy insertion does not honour: a
    write whose only link to an earlier read of the table is a barrier gets a whole-table copy. Making
    the out-of-range index a scatter drops depend on the gate's value keeps the write in place.
    """
    bits = lax.bitcast_convert_type(jnp.ravel(jnp.asarray(gate))[0].astype(jnp.float32), jnp.uint32)
    return (bits >> 31).astype(jnp.int32)


def _row_sums(x: jax.Array) -> jax.Array:
    """Sums over the last axis as a product with ones (full float32 precision): on XLA:CPU a dot runs as one
    fused kernel, where a reduce there materialises its input first and takes a few times longer."""
    ones = jnp.ones((x.shape[-1],), jnp.float32)
    return jnp.dot(x.astype(jnp.float32), ones, precision=lax.Precision.HIGHEST)


def _non_finite_rows(x: jax.Array, owned: jax.Array) -> jax.Array:
    """int32: how many of the rows this shard owns hold a non-finite value (integer leaves never do)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros((), jnp.int32)
    finite = jnp.isfinite(x).reshape(x.shape[0], -1).all(axis=1) if x.ndim > 1 else jnp.isfinite(x)
    return jnp.sum(owned & ~finite).astype(jnp.int32)
