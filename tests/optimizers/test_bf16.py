"""bfloat16 tables: float32 optimizer state, stochastic rounding on write-back, no table-sized f32 copies.

Stochastic rounding is checked against plain numpy / ml_dtypes references: every written value is one of
the two bfloat16 neighbours of the exact float64 update (computed by the independent reference from the
previous bfloat16 row); rounding up happens with probability (x - down) / (up - down); many tiny updates
track the float32 table in expectation where round-to-nearest stalls; runs are reproducible bit for bit and
the same on every sharded layout.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import optimizers
from optimizers import TableLayout, compiler_options
from optimizers.rounding import rounding_bits, stochastic_round_bf16
from tests.optimizers.reference import reference_for
from tests.optimizers.test_contract import CASES, CTX, FIRST_OF_EACH, TOKENS, VOCAB, WIDTH, batch, build_update, \
    case_id

BF16 = ml_dtypes.bfloat16


def neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bfloat16 values just below and just above each float64 ``x`` (equal when x is one)."""
    near = x.astype(np.float32).astype(BF16)  # round to nearest
    n = near.astype(np.float64)
    up = np.nextafter(near, np.array(np.inf, BF16)).astype(np.float64)
    down = np.nextafter(near, np.array(-np.inf, BF16)).astype(np.float64)
    lo = np.where(n <= x, n, down)
    hi = np.where(n >= x, n, up)
    return lo, hi


def bf16_step(opt, ctx=CTX):
    def step(table, state, update):
        c = ctx.fresh()
        keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros((), jnp.int32))
        return table, state, opt.gradient_update_done(c, keep[0])[1]

    return jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options(["bfloat16"]))


@pytest.mark.slow
def test_rounding_picks_a_neighbour_with_the_right_probability():
    rng = np.random.default_rng(0)
    x = rng.normal(size=64).astype(np.float32) * 10.0 ** rng.integers(-6, 6, size=64)
    lo, hi = neighbours(x.astype(np.float64))
    p_up = np.where(hi > lo, (x - lo) / np.where(hi > lo, hi - lo, 1), 0)
    draws = 4000  # each value rounded with 4000 different (row, column, count) hashes
    xs = np.broadcast_to(x, (draws, x.size))
    bits = rounding_bits(jnp.arange(draws), jnp.arange(x.size), 7)
    got = np.asarray(stochastic_round_bf16(jnp.asarray(xs), bits)).astype(np.float64)
    assert np.all((got == lo) | (got == hi))
    frac_up = (got == hi).mean(0)
    assert np.all(np.abs(frac_up - p_up) < 5 * np.sqrt(0.25 / draws) + 1e-9), (frac_up, p_up)
    exact = stochastic_round_bf16(jnp.asarray([1.0, -2.5, 0.0, np.inf, -np.inf, np.nan], jnp.float32),
                                  rounding_bits(jnp.arange(1), jnp.arange(6), 1)[0])
    np.testing.assert_array_equal(np.asarray(exact, np.float64)[:5], [1.0, -2.5, 0.0, np.inf, -np.inf])
    assert np.isnan(np.asarray(exact, np.float64)[5])


# Each optimizer's first case, and decoupled_global (the one mode whose rows are read other than as stored).
@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in CASES if c in FIRST_OF_EACH
                                  or c[1].get("weight_decay_mode") == "decoupled_global"])
def test_every_write_rounds_the_float32_update_to_a_neighbour(case):
    """Each step: the reference applies the rule to the current bf16 rows in float64; the library's row
    must be one of that value's bfloat16 neighbours, and its float32 state must match the reference."""
    name, hp = case
    opt = optimizers.create(name, **hp)
    step = bf16_step(opt)
    table0 = np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype(BF16)
    table, state = jnp.asarray(table0), opt.init(VOCAB, WIDTH)
    ref = reference_for(name, opt, table0.astype(np.float64))
    rng = np.random.default_rng(1)
    for i in range(5):
        ids, grads = batch(rng)
        ref.table = np.asarray(table).astype(np.float64)  # the reference starts from the stored bf16 rows
        if state.decay is not None:  # decoupled_global: a row reads its stored value times its missed decay
            ref.table *= np.exp(np.float64(state.decay.total) - np.asarray(state.decay.touch, np.float64))[:, None]
        _, _, touched = ref.step(ids, grads)
        table, state, valid = step(table, state, build_update(ids, grads, True))
        assert bool(valid) and table.dtype == jnp.bfloat16
        got = np.asarray(table).astype(np.float64)
        # every row, or with decoupled_global the rows written (the others keep their stored value)
        rows = touched if state.decay is not None else np.arange(VOCAB)
        lo, hi = neighbours(ref.table[rows])
        tol = 1e-6 * np.abs(ref.table[rows])  # float32 arithmetic may land a hair across a bf16 grid point
        assert np.all((got[rows] >= lo - tol) & (got[rows] <= hi + tol)), f"step {i}"
        for key, leaf in state.rows._asdict().items():
            assert leaf.dtype in (jnp.float32, jnp.int32), key
            np.testing.assert_allclose(np.asarray(leaf), ref.state[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{key} step {i}")


def tiny_updates(opt_table, steps, lr=1.0, g=1e-4, rows=64, width=16):
    """``steps`` SGD updates of -lr*g on every row of a table of ones; returns the final table as float64."""
    opt = optimizers.AsyncSGD(learning_rate=lr)
    ctx = optimizers.AsyncEmbContext(rows, width, rows - 1)
    step = bf16_step(opt, ctx)
    table, state = jnp.ones((rows, width), opt_table), opt.init(rows, width)
    ids = jnp.arange(1, rows, dtype=jnp.int32)  # every row but the padding row 0, once
    update = jax.jit(lambda: optimizers.make_update(ctx, ids, jnp.full((rows - 1, width), g, jnp.float32)))()
    for _ in range(steps):
        table, state, _ = step(table, state, update)
    return np.asarray(table).astype(np.float64)[1:]


def test_many_tiny_updates_track_float32_where_round_to_nearest_stalls():
    steps, lr, g = 300, 1.0, 1e-4
    exact = 1.0 - steps * lr * g  # float64 reference: 0.97
    nearest = np.ones((), BF16)
    for _ in range(steps):  # round-to-nearest bf16 storage: each update is below half an ulp and vanishes
        nearest = (nearest.astype(np.float32) - np.float32(lr * g)).astype(BF16)
    assert float(nearest) == 1.0
    f32 = tiny_updates(jnp.float32, steps, lr, g)
    np.testing.assert_allclose(f32, exact, rtol=1e-4)
    bf16 = tiny_updates(jnp.bfloat16, steps, lr, g)
    assert abs(bf16.mean() - exact) < 0.005, bf16.mean()  # 1,008 entries; std of the mean about 0.001
    assert bf16.std() > 0  # entries rounded independently
    np.testing.assert_array_equal(bf16, tiny_updates(jnp.bfloat16, steps, lr, g))  # reproducible


@pytest.mark.parametrize("lr, moves", [(3e-3, False), (5e-3, True)])
def test_dense_optax_baseline_on_bfloat16_rounds_to_nearest(lr, moves):
    """What the runner's warning for a bfloat16 table under a plain optax optimizer says
    (``runner.notices.rounding_warnings``): it writes rows back rounded to nearest, so on a table of ones
    moving up (half a bfloat16 step is 2**-8 = 0.0039 there) Adam's steps of about ``lr`` are lost below it
    and kept above it."""
    rows, width = 16, 8
    opt = optimizers.Adam(learning_rate=lr)
    ctx = optimizers.AsyncEmbContext(rows, width, rows - 1)
    ids = jnp.arange(1, rows, dtype=jnp.int32)
    update = jax.jit(lambda: optimizers.make_update(ctx, ids, jnp.full((rows - 1, width), -0.5, jnp.float32)))()
    apply = jax.jit(lambda t, s: opt.apply_dense(ctx, update, t, s))
    table, state = jnp.ones((rows, width), jnp.bfloat16), opt.init(rows, width)
    for _ in range(3):
        table, state, _, valid = apply(table, state)
        assert bool(valid)
    got = np.asarray(table).astype(np.float64)[1:]
    if moves:
        np.testing.assert_array_equal(got, 1.0 + 3 * 2.0**-7)  # each step of ~lr rounds up to one bfloat16 step
    else:
        np.testing.assert_array_equal(got, 1.0)  # every step lost: the row never moved


def test_rounding_depends_on_row_column_and_update_count():
    x = jnp.full((256, 64), 1.0 + 2.0**-8, jnp.float32)  # halfway between 1 and the next bf16 (1 + 2**-7)
    a = np.asarray(stochastic_round_bf16(x, rounding_bits(jnp.arange(256), jnp.arange(64), 1)), np.float64)
    b = np.asarray(stochastic_round_bf16(x, rounding_bits(jnp.arange(256), jnp.arange(64), 2)), np.float64)
    assert 0.45 < (a > 1).mean() < 0.55 and 0.45 < (a[:, :1] > 1).mean() < 0.6 and 0.4 < (a[:1] > 1).mean() < 0.6
    assert 0.4 < (a != b).mean() < 0.6  # another update count: fresh bits


@pytest.mark.parametrize("layout", [TableLayout.row, TableLayout.column])
@pytest.mark.parametrize("name", ["async_rowwise_adagrad", "async_adam"])
@pytest.mark.slow
def test_sharded_bf16_equals_unsharded_bit_for_bit(name, layout):
    opt = optimizers.create(name, learning_rate=0.01)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    sctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout=layout)
    table0 = np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype(BF16)
    one, many = bf16_step(opt), bf16_step(opt, sctx)
    t1, s1 = jnp.asarray(table0), opt.init(VOCAB, WIDTH)  # both runs donate: each gets its own buffers
    t8 = jax.device_put(table0, NamedSharding(mesh, sctx.table_spec()))
    s8 = opt.init(VOCAB, WIDTH)
    s8 = jax.device_put(s8, jax.tree.map(lambda p: NamedSharding(mesh, p), sctx.state_specs(s8)))
    rng = np.random.default_rng(3)
    for _ in range(4):
        u = jax.tree.map(np.asarray, build_update(*batch(rng), True))
        t1, s1, _ = one(t1, s1, u)
        t8, s8, _ = many(t8, s8, u)
    np.testing.assert_array_equal(np.asarray(t8).view(np.uint16), np.asarray(t1).view(np.uint16))


def test_bf16_step_has_no_table_sized_float32_buffer():
    """XLA:CPU upcasts bf16 scatters to f32 (a whole-table copy each way) unless the step's compiler
    options switch that off; the compiled fused step must hold no f32 buffer of the table's shape."""
    rows, width = 4096, 24
    opt = optimizers.AsyncRowwiseAdagrad()
    ctx = optimizers.AsyncEmbContext(rows, width, 64)
    table = jax.ShapeDtypeStruct((rows, width), jnp.bfloat16)
    state = jax.eval_shape(lambda: opt.init(rows, width))
    update = jax.eval_shape(lambda: optimizers.empty_update(ctx))
    step = bf16_step(opt, ctx)
    hlo = step.lower(table, state, update).compile().as_text()
    assert f"f32[{rows},{width}]" not in hlo
    plain = jax.jit(step.__wrapped__, donate_argnums=(0, 1)).lower(table, state, update).compile().as_text()
    if jax.default_backend() == "cpu":  # the failure the options prevent is real
        assert f"f32[{rows},{width}]" in plain
