"""A table stored wider than its rows (``AsyncEmbContext.stored_width``: lane padding) trains as the narrow table.

Every fused optimizer (each configured case on one device; Adam and row-wise Adagrad on the row layouts) gives the
table's first ``emb_width`` columns and its state (whose padding columns it never reads) the values of the
unpadded run, to float32 rounding (XLA vectorizes the two widths differently); the table's padding columns stay
zero and its lookups return the unpadded rows. A width it cannot hold is refused by its message.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import optimizers
from optimizers import Routing, TableLayout
from tests.optimizers.test_contract import CASES, FIRST_OF_EACH, TOKENS, VOCAB, WIDTH, batch, case_id, fused_step, \
    initial_table, placed

STORED = WIDTH + 5  # not a multiple of anything the layouts split by: the padding is only ever sliced off

LAYOUTS = {  # name: (table_layout, routing) on a 2x4 ('data', 'table') mesh; single: one device
    "single": None,
    "row_routed": (TableLayout.row, Routing.alltoall),
    "row_gather": (TableLayout.row, Routing.gather),
}


def context(layout: str, stored_width: int | None) -> optimizers.AsyncEmbContext:
    if LAYOUTS[layout] is None:
        return optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, stored_width=stored_width)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    table_layout, routing = LAYOUTS[layout]
    return optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout=table_layout,
                                      routing=routing, stored_width=stored_width)


def train(case, layout: str, stored_width: int | None, steps):
    """The table, state and per-step (norm, valid) after ``steps`` on ``layout``, stored ``stored_width`` wide."""
    name, hp = case
    opt = optimizers.create(name, **hp)
    ctx = context(layout, stored_width)
    width = ctx.stored_width
    table0 = np.zeros((VOCAB, width), np.float32)
    table0[:, :WIDTH] = initial_table(0)
    state = opt.init(VOCAB, width)
    if stored_width is not None:  # the rules must never read the state's padding columns: NaN there would show
        state = jax.tree.map(lambda a: a.at[:, WIDTH:].set(jnp.nan) if a.ndim == 2 else a, state)
    table, state = placed(ctx, jnp.asarray(table0), state)
    step, make = fused_step(opt, ctx), jax.jit(lambda i, g, p: optimizers.make_update(ctx, i, g, p))
    out = []
    for ids, grads, pending in steps:
        table, state, norm, valid = step(table, state, make(ids, grads, pending))
        out.append((float(norm), bool(valid)))
    lookup = jax.jit(lambda t, i: ctx.layout.lookup(ctx, t, i)[0])(table, jnp.asarray(steps[0][0]).reshape(-1, 1))
    return np.array(table), jax.tree.map(np.array, state), out, np.array(lookup)


def steps():
    rng = np.random.default_rng(5)
    out = [(*batch(rng, out_of_range=(i == 1)), True) for i in range(4)]
    ids, grads = batch(rng)
    grads[np.argwhere(ids > 0)[0][0], np.argwhere(ids > 0)[0][1], 0] = np.nan  # a refused step
    return out + [(ids, grads, True), (*batch(rng), False), (*batch(rng), True)]


# Every case on one device: each rule meets its own padding there. The row layouts add what does not depend on the
# rule (the lookups cut the padding at the owner, the owner's rows and state are sliced by their leaves' shapes), so
# they run one optimizer of per-element state (Adam, the very first case, in make test-fast) on both, and one of
# per-row state (row-wise Adagrad) on the routed layout, the default.
ROW_CASES = {"row_routed": (CASES[0], next(c for c in FIRST_OF_EACH if c[0] == "async_rowwise_adagrad")),
             "row_gather": (CASES[0],)}
PARAMS = [pytest.param(c, layout, id=f"{layout}-{case_id(c)}",
                       marks=() if layout == "single" or c is CASES[0] else pytest.mark.slow)
          for c in CASES for layout in LAYOUTS if layout == "single" or any(c is r for r in ROW_CASES[layout])]


@pytest.mark.parametrize("case, layout", PARAMS)
def test_padded_table_trains_as_the_narrow_one(case, layout):
    run = steps()
    table, state, reported, rows = train(case, layout, None, run)
    p_table, p_state, p_reported, p_rows = train(case, layout, STORED, run)
    np.testing.assert_allclose(np.array(p_reported), np.array(reported), rtol=1e-6)  # NaN norms alike
    assert [v for _, v in reported] == [True, True, True, True, False, False, True]
    close = dict(rtol=1e-6, atol=1e-7)  # XLA vectorizes the two widths differently: a last-bit difference or two
    np.testing.assert_allclose(p_table[:, :WIDTH], table, **close)
    assert not p_table[:, WIDTH:].any(), "a padding column was written"
    for (path, leaf), p_leaf in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(p_state)):
        if leaf.ndim == 2:  # per-element state: stored padded too
            assert p_leaf.shape == (VOCAB, STORED)
            np.testing.assert_allclose(p_leaf[:, :WIDTH], leaf, **close, err_msg=jax.tree_util.keystr(path))
        else:
            np.testing.assert_allclose(p_leaf, leaf, **close, err_msg=jax.tree_util.keystr(path))
    assert rows.shape[-1] == WIDTH and p_rows.shape == rows.shape
    np.testing.assert_allclose(p_rows, rows, **close)


def test_bfloat16_padded_rounds_as_the_narrow_table():
    """Stochastic rounding draws its bits per (id, column, step): the padding does not shift them."""
    opt = optimizers.create("async_rowwise_adagrad")
    out = []
    for stored in (None, STORED):
        ctx = context("single", stored)
        first = jnp.asarray(initial_table(0)).astype(jnp.bfloat16)
        table = jnp.zeros((VOCAB, ctx.stored_width), jnp.bfloat16).at[:, :WIDTH].set(first)
        state = opt.init(VOCAB, ctx.stored_width)
        step = fused_step(opt, ctx)
        for ids, grads, pending in steps():
            table, state, _, _ = step(table, state, optimizers.make_update(ctx, ids, grads, pending))
        out.append(np.array(table.astype(jnp.float32)))
    np.testing.assert_array_equal(out[1][:, :WIDTH], out[0])
    assert not out[1][:, WIDTH:].any()


@pytest.mark.slow
def test_dense_baseline_on_a_padded_table():
    opt = optimizers.create("adam", learning_rate=0.05)
    tables = []
    for stored in (None, STORED):
        ctx = context("single", stored)
        table = jnp.zeros((VOCAB, ctx.stored_width), jnp.float32).at[:, :WIDTH].set(initial_table(0))
        state = opt.init(VOCAB, ctx.stored_width)
        for ids, grads, pending in steps()[:3]:
            table, state, _, valid = opt.apply_dense(ctx, optimizers.make_update(ctx, ids, grads, pending), table,
                                                     state)
            assert bool(valid)
        tables.append(np.array(table))
    np.testing.assert_allclose(tables[1][:, :WIDTH], tables[0], rtol=1e-6, atol=1e-7)
    assert not tables[1][:, WIDTH:].any()


def test_memory_model_counts_the_padding():
    assert context("single", 128).layout.table_bytes(context("single", 128)) == VOCAB * 128 * 4
    ctx = context("row_routed", 128)
    assert ctx.layout.shard_shape(ctx) == (VOCAB // 4, 128)


@pytest.mark.parametrize("stored, match", [
    (WIDTH - 1, f"stored_width={WIDTH - 1} is narrower than the table's width {WIDTH}"),
    (0, f"stored_width=0 is narrower than the table's width {WIDTH}"),
])
def test_narrower_stored_width_is_refused(stored, match):
    with pytest.raises(ValueError, match=match):
        context("single", stored)


def test_column_layout_refuses_padding():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    with pytest.raises(ValueError, match=f"stored_width=16 pads rows of width {WIDTH}, which the column layout "
                                         "splits over its shards"):
        optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout="column",
                                   stored_width=16)
    same = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout="column",
                                      stored_width=WIDTH)
    assert not same.padded
