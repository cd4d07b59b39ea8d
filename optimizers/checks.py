"""Static checks of what a library user hands the update: the optimizer's hyperparameters, and the ids,
gradients and record, the table and its optimizer state, against the table's ``AsyncEmbContext``.

Each check reads only shapes, dtypes and the context (static while a step is traced), so it runs once per
trace and adds nothing to the compiled step. Without them a mismatch either fails deep inside JAX with a
broadcasting error that names no argument, or, worse, runs: a table of more rows than its context drops the
updates of the rows past the context's, a record of too many tokens for the context drops distinct ids, a
``[tokens, 1]`` gradient is broadcast over the whole row, float ids are truncated, an integer table rounds
every update away, an optimizer built from its class with a negative learning rate ascends the loss. Each
error names the argument, what it is, what it should be, and how to build it right.
"""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from ._lazy import jax, jnp
from .hparams import problems

if TYPE_CHECKING:
    from .context import AsyncEmbContext
    from .protocol import AsyncEmbGradientUpdate


def _shape(x: Any) -> str:
    return "[" + ", ".join(str(d) for d in jnp.shape(x)) + "]"


def _kind(x: Any) -> str:
    return f"{_shape(x)} {jnp.result_type(x)}"


def check_ids(ids: Any) -> None:
    """A ValueError unless ``ids`` holds integers (float ids would be truncated onto rows, bools read as 0/1)."""
    dtype = jnp.result_type(ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"ids must be integers, got {_kind(ids)}: a float id would be truncated onto a row "
                         "(and a bool read as row 0 or 1); convert the ids with .astype(jnp.int32)")


def check_pending(pending: Any, what: str = "pending") -> None:
    """A ValueError unless ``pending`` is a scalar bool: Python's or numpy's, or a 0-d bool array (JAX's or
    numpy's, traced or not). Anything else is refused rather than read as a truth value: ``jnp.asarray("no",
    bool)`` is True, and so are 0.5 and 2, so ``pending="no"`` used to apply the update."""
    if isinstance(pending, bool):
        return
    dtype = getattr(pending, "dtype", None)  # numpy's bool scalar has one too
    if dtype is None or not jnp.issubdtype(dtype, jnp.bool_):
        got = _kind(pending) if dtype is not None else f"{pending!r} ({type(pending).__name__})"
        raise ValueError(f"{what} must be a bool (True: the update is applied, False: it is skipped), got {got}: "
                         "pass True or False, or a bool array such as jnp.asarray(step > 0)")
    if jnp.ndim(pending) != 0:
        raise ValueError(f"{what} must be a scalar bool, got shape {_shape(pending)}")


def check_pad_id(pad_id: Any) -> None:
    """A ValueError unless ``pad_id`` is None or an int: ``pad_id="0"`` (or 0.5) equals no id, so the padding
    tokens would update their row."""
    if pad_id is not None and (not isinstance(pad_id, numbers.Integral) or isinstance(pad_id, bool)):
        raise ValueError(f"pad_id={pad_id!r} must be an int, the id whose tokens are padding (0 by default), or None "
                         f"for none, not a {type(pad_id).__name__} (a word or a fraction matches no id: the padding "
                         "would update its row)")


def check_batch(ctx: AsyncEmbContext, ids: Any, grads: Any, pending: Any) -> None:
    """``make_update``'s arguments against ``ctx``: integer ids, no more than ``ctx.tokens_per_batch`` of them
    (the record's unique buffer holds that many distinct ids: more would be dropped) and, where each device
    dedupes its own (``ctx.per_device_record``), a multiple of the mesh's devices, one gradient row of
    ``ctx.emb_width`` per id, and a scalar bool ``pending`` (``check_pending``)."""
    check_ids(ids)
    tokens = int(jnp.size(ids))
    if tokens == 0:
        raise ValueError(f"ids {_shape(ids)} hold no tokens: an update record needs at least one; for a step with "
                         "nothing to apply, use optimizers.empty_update(ctx)")
    if tokens > ctx.tokens_per_batch:
        raise ValueError(f"ids hold {tokens} tokens, more than the context's tokens_per_batch="
                         f"{ctx.tokens_per_batch}: its update record has room for that many distinct ids, the "
                         "rest would be dropped; build the context with tokens_per_batch=" + str(tokens))
    if ctx.per_device_record and tokens % ctx.mesh.size:
        raise ValueError(f"ids hold {tokens} tokens, which do not split evenly over the mesh's {ctx.mesh.size} "
                         f"devices: the {ctx.layout.name} layout dedupes each device's own share of the batch; give a "
                         f"multiple of {ctx.mesh.size} tokens (pad with id -1, outside the table: it updates nothing)")
    if jnp.ndim(grads) < 1 or jnp.shape(grads)[-1] != ctx.emb_width:
        raise ValueError(f"grads {_shape(grads)} must end in the table's width {ctx.emb_width} "
                         f"(ctx.emb_width): one gradient row per id, [..., {ctx.emb_width}]")
    if not jnp.issubdtype(jnp.result_type(grads), jnp.inexact):
        raise ValueError(f"grads must be floating point, got {_kind(grads)}")
    if (rows := int(jnp.size(grads)) // ctx.emb_width) != tokens:
        raise ValueError(f"grads {_shape(grads)} hold {rows} gradient rows for {tokens} ids {_shape(ids)}: "
                         "give one row per id")
    check_pending(pending)


def check_record(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate) -> None:
    """An update record's shapes against ``ctx`` (``make_update``/``empty_update`` build it so), and its
    ``pending`` a scalar bool (``check_pending``: a record built by hand with ``pending=1.0`` or ``"no"``)."""
    grads, seg, unique = update.grads, update.segment_ids, update.unique_tokens
    if jnp.ndim(grads) != 2 or jnp.shape(grads)[1] != ctx.emb_width:
        raise ValueError(f"the update record's grads are {_shape(grads)}, not [tokens, {ctx.emb_width}] (the "
                         "context's emb_width): build records with make_update on the table's own context")
    if jnp.shape(seg) != jnp.shape(grads)[:1]:
        raise ValueError(f"the update record's segment_ids {_shape(seg)} do not match its grads {_shape(grads)}: "
                         "one segment id per token")
    if jnp.ndim(unique) != 1 or jnp.shape(unique)[0] not in (ctx.num_unique, ctx.record_unique):
        raise ValueError(f"the update record's unique_tokens {_shape(unique)} are not of this context's size "
                         f"([{ctx.record_unique}]): it was built on another context (another table size or "
                         "tokens_per_batch); build it with make_update on the table's own context")
    if update.rows is not None and jnp.shape(update.rows) != jnp.shape(grads):
        raise ValueError(f"the update record's rows {_shape(update.rows)} do not match its grads {_shape(grads)}")
    check_pending(update.pending, "the update record's pending")


def check_table(ctx: AsyncEmbContext, table: Any) -> None:
    """A ValueError unless ``table`` is a floating ``[ctx.stored_rows, ctx.stored_width]`` array: a table of
    other rows than its context drops (or never reaches) the updates of some rows, an integer one rounds them
    away."""
    want = (ctx.stored_rows, ctx.stored_width)
    if tuple(jnp.shape(table)) != want:
        raise ValueError(f"the table is {_shape(table)}, but its context describes [{want[0]}, {want[1]}] "
                         "(stored_rows, stored_width): build the AsyncEmbContext with this table's rows and width")
    if not jnp.issubdtype(jnp.result_type(table), jnp.floating):
        raise ValueError(f"the table must be floating point (float32 or bfloat16), got {_kind(table)}: an "
                         "integer table would round every update away")


def check_state(opt: Any, ctx: AsyncEmbContext, state: Any) -> None:
    """A ValueError unless ``state`` has the structure, shapes and dtypes of ``opt.init(ctx.stored_rows,
    ctx.stored_width)`` (another optimizer's state, or one for another table size, otherwise fails deep in
    the rule, or silently drops the state of rows past its own)."""
    want = jax.eval_shape(lambda: opt.init(ctx.stored_rows, ctx.stored_width))
    how = (f"build it with opt.init({ctx.stored_rows}, {ctx.stored_width}) (ctx.stored_rows, ctx.stored_width) "
           f"for this {type(opt).__name__}")
    got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(state)
    want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
    if got_tree != want_tree:
        raise ValueError(f"the optimizer state is not {type(opt).__name__}'s (its structure is {got_tree}, "
                         f"not {want_tree}): {how}")
    for (path, got), (_, exp) in zip(got_leaves, want_leaves):
        if tuple(jnp.shape(got)) != tuple(exp.shape) or jnp.result_type(got) != exp.dtype:
            raise ValueError(f"the optimizer state's {jax.tree_util.keystr(path)} is {_kind(got)}, not "
                             f"{_shape(exp)} {exp.dtype}: {how}")


def check_hparams(opt: Any) -> None:
    """A ValueError holding the lines of ``optimizers.problems(opt)``, if any: an optimizer built from its class
    (``optimizers.AsyncSGD(learning_rate=-1.0)``), which checks nothing when built, would otherwise train
    silently wrong (a negative step ascends the loss; ``b1=1.5`` grows the moments). ``optimizers.create`` and the
    runner's preflight refuse the same values earlier, in their own words."""
    if bad := problems(opt):
        raise ValueError(f"{type(opt).__name__}: {'; '.join(bad)}; build it with values in range "
                         "(optimizers.create checks them as it builds it)")


def check_update(opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table: Any, state: Any) -> None:
    """Every check an update's arguments get before it is traced: the optimizer's hyperparameters, the table,
    its state and the record."""
    check_hparams(opt)
    check_table(ctx, table)
    check_state(opt, ctx, state)
    check_record(ctx, update)
