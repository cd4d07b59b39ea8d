"""The library used directly, off the happy path: a table, state, ids, gradients or record that do not fit
their ``AsyncEmbContext`` are refused by a ValueError naming the argument and the fix, before anything
compiles (``optimizers.checks``), instead of failing deep in JAX or, worse, updating the wrong rows. And what
is accepted computes what a plain numpy reference does: ids outside the table (64-bit ones past int32 too)
update nothing."""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers

VOCAB, WIDTH, TOKENS, LR = 32, 8, 24, 0.1


def fused_step(opt, ctx, table, state, ids, grads, **kw):
    """make_update + start/done under one jit, as the runner runs them."""

    def step(table, state, ids, grads):
        c = ctx.fresh()
        update = optimizers.make_update(c, ids, grads, **kw)
        keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros((), jnp.int32))
        norm, valid, _ = opt.gradient_update_done(c, keep[0])
        return table, state, norm, valid

    return jax.jit(step)(table, state, ids, grads)


def sgd_reference(table, ids, grads, lr=LR):
    """Plain numpy SGD: every token's gradient into its row; padding id 0 and ids outside the table skipped."""
    out = np.array(table, np.float64)
    g = np.zeros_like(out)
    for i, row in zip(np.asarray(ids).reshape(-1), np.asarray(grads, np.float64).reshape(-1, WIDTH)):
        if 0 < i < VOCAB:
            g[i] += row
    return out - lr * g


@pytest.fixture
def setup():
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, VOCAB, TOKENS), jnp.int32)
    grads = jnp.asarray(rng.normal(size=(TOKENS, WIDTH)), jnp.float32)
    table = jnp.asarray(rng.normal(size=(VOCAB, WIDTH)), jnp.float32)
    sgd = optimizers.create("async_sgd", learning_rate=LR)
    return optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS), sgd, table, ids, grads


# ----- the table and its state against the context ---------------------------------------------------------
@pytest.mark.parametrize("rows,width", [(16, WIDTH), (64, WIDTH), (VOCAB, 4), (VOCAB, 16)])
def test_a_table_of_another_size_than_its_context_is_refused(setup, rows, width):
    ctx, sgd, _, ids, grads = setup  # before: a table of 64 rows left rows 32.. untouched, valid true
    table = jnp.zeros((rows, width), jnp.float32)
    with pytest.raises(ValueError, match=rf"the table is \[{rows}, {width}\], but its context describes "
                                         rf"\[{VOCAB}, {WIDTH}\] \(stored_rows, stored_width\)"):
        fused_step(sgd, ctx, table, sgd.init(rows, width), ids, grads)


@pytest.mark.parametrize("shape", [(VOCAB,), (1, VOCAB, WIDTH)])
def test_a_table_that_is_not_a_matrix_is_refused(setup, shape):
    ctx, sgd, _, ids, grads = setup
    with pytest.raises(ValueError, match=r"the table is \[.*\], but its context describes \[32, 8\]"):
        fused_step(sgd, ctx, jnp.zeros(shape), sgd.init(VOCAB, WIDTH), ids, grads)


def test_an_integer_table_is_refused(setup):
    ctx, sgd, table, ids, grads = setup  # before: every update rounded to an int, valid true
    with pytest.raises(ValueError, match=r"the table must be floating point .* got \[32, 8\] int32"):
        fused_step(sgd, ctx, (table * 10).astype(jnp.int32), sgd.init(VOCAB, WIDTH), ids, grads)


def test_a_state_for_fewer_rows_is_refused(setup):
    ctx, _, table, ids, grads = setup  # before: rows 16.. updated from zero moments, their state dropped
    adam = optimizers.create("async_adam")
    with pytest.raises(ValueError, match=r"the optimizer state's \.rows\.mu is \[16, 8\] float32, not \[32, 8\] "
                                         r"float32: build it with opt\.init\(32, 8\)"):
        fused_step(adam, ctx, table, adam.init(16, WIDTH), ids, grads)


def test_another_optimizers_state_is_refused(setup):
    ctx, sgd, table, ids, grads = setup  # before: TypeError: unsupported operand ... 'builtin_function_or_method'
    adam = optimizers.create("async_adam")
    with pytest.raises(ValueError, match=r"the optimizer state is not AsyncAdam's .*AdamRows"):
        fused_step(adam, ctx, table, sgd.init(VOCAB, WIDTH), ids, grads)


def test_the_dense_baseline_refuses_a_mismatched_table(setup):
    ctx, _, _, ids, grads = setup
    adam = optimizers.create("adam")
    table = jnp.zeros((16, WIDTH), jnp.float32)
    update = optimizers.make_update(ctx, ids, grads)
    with pytest.raises(ValueError, match=r"the table is \[16, 8\], but its context describes \[32, 8\]"):
        adam.apply_dense(ctx, update, table, adam.init(16, WIDTH))


# ----- ids and gradients against the context (make_update) ---------------------------------------------------
def test_more_tokens_than_the_context_holds_are_refused(setup):
    _, sgd, table, ids, grads = setup  # before: distinct ids past the record's 13 slots silently dropped
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, 12)
    with pytest.raises(ValueError, match=r"ids hold 24 tokens, more than the context's tokens_per_batch=12: .* "
                                         r"build the context with tokens_per_batch=24"):
        fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids, grads)


def test_fewer_tokens_than_the_context_holds_match_the_reference(setup):
    ctx, sgd, table, ids, grads = setup
    out = fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids[:10], grads[:10])
    assert bool(out[3])
    np.testing.assert_allclose(np.asarray(out[0]), sgd_reference(table, ids[:10], grads[:10]), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bool_])
def test_ids_that_are_not_integers_are_refused(setup, dtype):
    ctx, sgd, table, ids, grads = setup  # before: float ids truncated onto rows, bools read as rows 0 and 1
    with pytest.raises(ValueError, match=r"ids must be integers, got \[24\] (float32|bool)"):
        fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids.astype(dtype), grads)
    with pytest.raises(ValueError, match="ids must be integers"):
        optimizers.dedupe(ids.astype(dtype), VOCAB, 25)


@pytest.mark.parametrize("shape", [(TOKENS, 1), (TOKENS, 4), (TOKENS, 16), (TOKENS,), (WIDTH, TOKENS)])
def test_gradients_of_another_width_are_refused(setup, shape):
    ctx, sgd, table, ids, _ = setup  # before: [24, 1] was broadcast over the row; others a broadcasting TypeError
    grads = jnp.ones(shape, jnp.float32)
    with pytest.raises(ValueError, match=r"grads \[.*\] must end in the table's width 8 \(ctx\.emb_width\)"):
        fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids, grads)


@pytest.mark.parametrize("rows", [12, 48])
def test_gradients_of_another_token_count_are_refused(setup, rows):
    ctx, sgd, table, ids, _ = setup  # before: "Incompatible types for broadcasting"
    grads = jnp.ones((rows, WIDTH), jnp.float32)
    with pytest.raises(ValueError, match=rf"grads \[{rows}, 8\] hold {rows} gradient rows for 24 ids \[24\]: "
                                         "give one row per id"):
        fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids, grads)


def test_integer_gradients_and_a_non_scalar_pending_are_refused(setup):
    ctx, _, _, ids, grads = setup
    with pytest.raises(ValueError, match=r"grads must be floating point, got \[24, 8\] int32"):
        optimizers.make_update(ctx, ids, grads.astype(jnp.int32))
    with pytest.raises(ValueError, match=r"pending must be a scalar bool, got shape \[2\]"):
        optimizers.make_update(ctx, ids, grads, pending=jnp.array([True, False]))


@pytest.mark.parametrize("pending, got", [("no", "'no' (str)"), (0.5, "0.5 (float)"), (1, "1 (int)"),
                                          (None, "None (NoneType)"), (np.float32(1), "[] float32"),
                                          (jnp.int32(0), "[] int32")])
def test_a_pending_that_is_not_a_bool_is_refused(setup, pending, got):
    """Before: ``jnp.asarray("no", bool)`` is True, so ``pending="no"`` (or 0.5) applied the update."""
    ctx, sgd, table, ids, grads = setup
    line = re.escape(f"pending must be a bool (True: the update is applied, False: it is skipped), got {got}: pass "
                     "True or False, or a bool array such as jnp.asarray(step > 0)")
    with pytest.raises(ValueError, match="^" + line):
        optimizers.make_update(ctx, ids, grads, pending=pending)
    record = optimizers.make_update(ctx, ids, grads)._replace(pending=pending)  # a record built by hand
    with pytest.raises(ValueError, match="^the update record's " + line):
        sgd.gradient_update_start(ctx.fresh(), record, table, sgd.init(VOCAB, WIDTH), jnp.zeros(()))


def test_a_traced_pending_that_is_not_a_bool_is_refused(setup):
    ctx, _, _, ids, grads = setup
    with pytest.raises(ValueError, match=r"pending must be a bool .*, got \[\] float32: pass True or False"):
        jax.jit(lambda p: optimizers.make_update(ctx, ids, grads, pending=p))(jnp.float32(0.5))


@pytest.mark.parametrize("pending", [True, False, np.True_, np.asarray(False), jnp.asarray(True)])
def test_a_bool_pending_of_any_kind_is_taken_as_it_is(setup, pending):
    ctx, sgd, table, ids, grads = setup
    for make in (optimizers.make_update, jax.jit(optimizers.make_update, static_argnums=0)):
        assert bool(make(ctx, ids, grads, pending).pending) == bool(pending)
    out = fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids, grads, pending=pending)
    assert bool(out[3]) == bool(pending)
    np.testing.assert_allclose(np.asarray(out[0]), sgd_reference(table, ids, grads) if pending else table, atol=1e-6)


@pytest.mark.parametrize("pad_id", ["0", 0.5, 0.0, True])
def test_a_pad_id_that_is_not_an_int_is_refused(setup, pad_id):
    """Before: ``pad_id="0"`` matched no id, so the tokens of id 0 (the padding) updated row 0."""
    ctx, _, _, ids, grads = setup
    line = re.escape(f"pad_id={pad_id!r} must be an int, the id whose tokens are padding (0 by default), or None "
                     f"for none, not a {type(pad_id).__name__}")
    with pytest.raises(ValueError, match="^" + line):
        optimizers.make_update(ctx, ids.at[:4].set(0), grads, pad_id=pad_id)
    with pytest.raises(ValueError, match="^" + line):
        optimizers.dedupe(ids, VOCAB, 25, pad_id)
    for pad_id in (0, np.int64(0), None):  # ints of any kind, or no padding id
        optimizers.make_update(ctx, ids, grads, pad_id=pad_id)


def test_no_tokens_are_refused(setup):
    ctx = setup[0]  # before: "Incompatible types for broadcasting: input type=int32[0] and requested type=int32[1]"
    with pytest.raises(ValueError, match=re.escape("ids [0] hold no tokens: an update record needs at least one; for "
                                                   "a step with nothing to apply, use optimizers.empty_update(ctx)")):
        optimizers.make_update(ctx, np.zeros((0,), np.int32), np.zeros((0, WIDTH), np.float32))


def test_a_record_from_another_context_is_refused(setup):
    ctx, sgd, table, ids, grads = setup  # a record of a 16-row context on a 32-row table
    update = optimizers.make_update(optimizers.AsyncEmbContext(VOCAB, WIDTH, 8), ids[:8], grads[:8])
    with pytest.raises(ValueError, match=r"the update record's unique_tokens \[9\] are not of this context's size "
                                         r"\(\[25\]\)"):
        sgd.gradient_update_start(ctx.fresh(), update, table, sgd.init(VOCAB, WIDTH), jnp.zeros(()))
    bad = optimizers.make_update(ctx, ids, grads)._replace(grads=grads[:, :1])
    with pytest.raises(ValueError, match=r"the update record's grads are \[24, 1\], not \[tokens, 8\]"):
        sgd.gradient_update_start(ctx.fresh(), bad, table, sgd.init(VOCAB, WIDTH), jnp.zeros(()))


@pytest.mark.slow
def test_64_bit_ids_past_int32_update_nothing(setup):
    """A numpy int64 id of 2**32 + 5 used to wrap onto row 5 (JAX's int32); now it is out of range, dropped."""
    ctx, sgd, table, ids, grads = setup
    wide = np.asarray(ids, np.int64)
    wide[:4] = [2**32 + 5, -(2**33), 2**31 + 1, VOCAB]
    update = optimizers.make_update(ctx, wide, grads)
    _, new, _ = sgd.gradient_update_start(ctx.fresh(), update, table, sgd.init(VOCAB, WIDTH), jnp.zeros(()))
    expected = sgd_reference(table, np.where(np.arange(TOKENS) < 4, -1, wide), grads)
    np.testing.assert_allclose(np.asarray(new), expected, atol=1e-6)
    assert int(np.sum(np.asarray(update.segment_ids)[:4] >= 0)) == 0


# ----- the optimizer's hyperparameters -------------------------------------------------------------------------
HOW = "; build it with values in range (optimizers.create checks them as it builds it)"


@pytest.mark.parametrize("opt, line", [
    (optimizers.AsyncSGD(learning_rate=-1.0), "AsyncSGD: learning_rate=-1.0 is outside (0, inf) (step size)"),
    (optimizers.AsyncAdam(b1=1.5, eps=0.0), "AsyncAdam: b1=1.5 is outside [0, 1) (decay of the first-moment (mean) "
     "estimate); eps=0.0 is outside (0, inf) (added to sqrt(second moment): keeps the step finite for a zero "
     "gradient)"),
    (optimizers.AsyncSGD(learning_rate="0.1"), "AsyncSGD: learning_rate='0.1' is not a number (step size)"),
    (optimizers.AsyncSGD(learning_rate=0.5, weight_decay=4.0, weight_decay_mode="decoupled_global"),
     "AsyncSGD: weight_decay=4.0 with learning_rate=0.5 decays a row by 1 - 2 per update under "
     "weight_decay_mode=decoupled_global: their product must be below 1"),
    (optimizers.AsyncSGD(schedule=optimizers.Schedule("step", step_factor=2.0)),
     "AsyncSGD: schedule.step_factor=2.0 is outside (0, 1] (the step schedule's multiplier per step)"),
], ids=["negative-lr", "two-at-once", "a-word", "across-fields", "schedule"])
def test_an_optimizer_built_out_of_range_is_refused_when_its_update_is_traced(setup, opt, line):
    """The class checks nothing when built (its caller may say it in its own words, as the runner does); before,
    ``AsyncSGD(learning_rate=-1.0)`` then trained: every update moved the rows up their gradient, valid true."""
    ctx, _, table, ids, grads = setup
    with pytest.raises(ValueError, match="^" + re.escape(line + HOW)):
        fused_step(opt, ctx, table, opt.init(VOCAB, WIDTH), ids, grads)


def test_a_dense_optimizer_built_out_of_range_is_refused_when_its_update_is_traced(setup):
    ctx, _, table, ids, grads = setup  # before: optax.adamw with a negative step, valid true
    adam = optimizers.Adam(learning_rate=-0.05)
    with pytest.raises(ValueError, match="^" + re.escape("Adam: learning_rate=-0.05 is outside (0, inf) (step "
                                                         "size)" + HOW)):
        jax.jit(lambda t, s, u: adam.apply_dense(ctx, u, t, s))(table, adam.init(VOCAB, WIDTH),
                                                                 optimizers.make_update(ctx, ids, grads))


def test_an_optimizer_built_in_range_from_its_class_trains_as_create_builds_it(setup):
    ctx, sgd, table, ids, grads = setup
    by_hand = optimizers.AsyncSGD(learning_rate=np.float32(LR))  # numpy numbers are numbers
    a = fused_step(by_hand, ctx, table, by_hand.init(VOCAB, WIDTH), ids, grads)
    b = fused_step(sgd, ctx, table, sgd.init(VOCAB, WIDTH), ids, grads)
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
    np.testing.assert_allclose(np.asarray(a[0]), sgd_reference(table, ids, grads), atol=1e-6)


# ----- the context and the schedule ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,line", [
    (dict(stored_rows=0), "stored_rows=0 must be an int >= 1"),
    (dict(stored_rows=-5), "stored_rows=-5 must be an int >= 1"),
    (dict(stored_rows=32.0), "stored_rows=32.0 must be an int >= 1"),
    (dict(emb_width="8"), "emb_width='8' must be an int >= 1"),
    (dict(tokens_per_batch=0), "tokens_per_batch=0 must be an int >= 1"),
    (dict(tokens_per_batch=True), "tokens_per_batch=True must be an int >= 1"),
])
def test_a_context_of_impossible_sizes_is_refused(kwargs, line):
    args = dict(stored_rows=VOCAB, emb_width=WIDTH, tokens_per_batch=TOKENS) | kwargs
    with pytest.raises(ValueError, match=line):
        optimizers.AsyncEmbContext(**args)
    assert optimizers.AsyncEmbContext(np.int64(VOCAB), WIDTH, TOKENS).num_unique == TOKENS + 1


def mesh_2x4():
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "table"))


@pytest.mark.parametrize("kwargs,line", [
    (dict(table_axis="tabel"), "table_axis='tabel' is not an axis of the mesh (its axes: 'data', 'table'): name one "
                               "of them, or give None to replicate the table"),
    (dict(stored_rows=30), "stored_rows=30 does not divide over the 4 shards of mesh axis 'table', which the "
                           "row_routed layout gives a block of rows each: store the table with a multiple of 4 rows "
                           "(e.g. 32; rows no id names are never touched), or use table_layout='column'"),
    (dict(stored_rows=30, routing="gather"), "stored_rows=30 does not divide over the 4 shards of mesh axis 'table', "
                                             "which the row_gather layout"),
    (dict(emb_width=6, table_layout="column"), "emb_width=6 does not divide over the 4 shards of mesh axis 'table', "
                                               "which the column layout gives a slice of every row each: use a width "
                                               "that is a multiple of 4, or table_layout='row'"),
])
def test_a_context_its_mesh_cannot_split_is_refused(kwargs, line):
    """Before: ``KeyError: 'tabel'``, and a table of 30 rows over 4 shards (6 columns over 4) failed in the update's
    ``shard_map``: ``... axis sizes that are not evenly divisible by the corresponding mesh axis sizes``."""
    args = dict(stored_rows=32, emb_width=WIDTH, tokens_per_batch=TOKENS, mesh=mesh_2x4(), table_axis="table")
    with pytest.raises(ValueError, match="^" + re.escape(line)):
        optimizers.AsyncEmbContext(**args | kwargs)
    if "table_axis" not in kwargs:  # 30 rows or 6 columns divide over the 'data' axis's 2 shards
        assert optimizers.AsyncEmbContext(**args | kwargs | dict(table_axis="data")).table_shards == 2


@pytest.mark.parametrize("layout", [dict(), dict(table_layout="column")])
def test_tokens_that_do_not_split_over_the_devices_are_refused_where_each_device_dedupes_its_own(layout):
    """Before: ``shard_map applied to the function '<lambda>' was given argument arrays with axis sizes that are
    not evenly divisible``. The layouts that dedupe the whole batch take any count (``routing="gather"``)."""
    ctx = optimizers.AsyncEmbContext(32, WIDTH, TOKENS, mesh=mesh_2x4(), table_axis="table", **layout)
    ids, grads = np.arange(1, 21, dtype=np.int32), np.ones((20, WIDTH), np.float32)
    with pytest.raises(ValueError, match=re.escape(
            f"ids hold 20 tokens, which do not split evenly over the mesh's 8 devices: the {ctx.layout.name} layout "
            "dedupes each device's own share of the batch; give a multiple of 8 tokens (pad with id -1, outside the "
            "table: it updates nothing)")):
        jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    gather = optimizers.AsyncEmbContext(32, WIDTH, TOKENS, mesh=mesh_2x4(), table_axis="table", routing="gather")
    assert jax.jit(lambda i, g: optimizers.make_update(gather, i, g))(ids, grads).grads.shape == (20, WIDTH)


CAPACITY_DOC = "(routing slots per destination, as a multiple of route_peak or of the even share)"


@pytest.mark.parametrize("kwargs,line", [
    (dict(route_capacity=-1.0), f"route_capacity=-1.0 is outside (0, 1024] {CAPACITY_DOC}"),
    (dict(route_capacity=0), f"route_capacity=0 is outside (0, 1024] {CAPACITY_DOC}"),
    (dict(route_capacity=float("nan")), f"route_capacity=nan is outside (0, 1024] {CAPACITY_DOC}"),
    (dict(route_capacity=float("inf")), f"route_capacity=inf is outside (0, 1024] {CAPACITY_DOC}"),
    (dict(route_capacity=1025.0), f"route_capacity=1025.0 is outside (0, 1024] {CAPACITY_DOC}"),
    (dict(route_capacity="1.2"), f"route_capacity='1.2' is not a number {CAPACITY_DOC}"),
    (dict(route_capacity=True), f"route_capacity=True is not a number {CAPACITY_DOC}"),
    (dict(route_min_slots=-1), "route_min_slots=-1 must be an int >= 0 (the fewest routing slots per destination)"),
    (dict(route_min_slots=2.5), "route_min_slots=2.5 must be an int >= 0"),
    (dict(route_min_slots=True), "route_min_slots=True must be an int >= 0"),
    (dict(route_peak=-5), "route_peak=-5 must be None or an int >= 0 (the most distinct ids one device sent one "
                          "shard in sampled batches)"),
    (dict(route_peak=3.0), "route_peak=3.0 must be None or an int >= 0"),
    (dict(route_peak=False), "route_peak=False must be None or an int >= 0"),
])
def test_a_context_of_impossible_routing_settings_is_refused(kwargs, line):
    """Before, on a 2x4 routed table: ``route_capacity=-1.0`` gave 8 slots and ``route_peak=-5`` one slot per
    destination without a word, ``nan`` failed with ``cannot convert float NaN to integer`` and ``"1.2"`` with
    ``can't multiply sequence by non-int of type 'float'``. The same check holds in ``dataclasses.replace``."""
    args = dict(stored_rows=64, emb_width=WIDTH, tokens_per_batch=64, mesh=mesh_2x4(), table_axis="table")
    with pytest.raises(ValueError, match="^" + re.escape(line)):
        optimizers.AsyncEmbContext(**args, **kwargs)
    with pytest.raises(ValueError, match="^" + re.escape(line)):
        dataclasses.replace(optimizers.AsyncEmbContext(**args), **kwargs)


def test_routing_settings_at_their_bounds_are_taken():
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, route_capacity=1024, route_min_slots=0, route_peak=0)
    assert (ctx.route_capacity, ctx.route_min_slots, ctx.route_peak) == (1024, 0, 0)
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, route_capacity=np.float32(1e-3), route_peak=np.int64(3))
    assert ctx.route_slots >= 1


@pytest.mark.parametrize("schedule,line", [
    (optimizers.Schedule("step", step_every=-3), r"step_every=-3 is outside \[1, 2147483647\]"),
    (optimizers.Schedule("cosine", decay_steps=10, end_ratio=-1.0), r"end_ratio=-1.0 is outside \[0, 1\]"),
    (optimizers.Schedule("step", step_factor=2.0), r"step_factor=2.0 is outside \(0, 1\]"),
    (optimizers.Schedule("warmup", warmup_steps="10"), r"warmup_steps='10' is not a number"),
    (optimizers.Schedule("warmup", warmup_steps=2.5), r"warmup_steps=2.5 is not an int"),  # was taken
    (optimizers.Schedule("step", step_every=10.0), r"step_every=10.0 is not an int"),
])
def test_a_schedule_built_by_hand_checks_its_ranges_when_called(schedule, line):
    """Before: ``Schedule("step", step_every=-3)(5)`` was 4.0 and ``end_ratio=-1`` a negative learning rate."""
    with pytest.raises(ValueError, match="Schedule: " + line):
        schedule(5)
    with pytest.raises(ValueError, match="Schedule: " + line):  # and so an optimizer built by hand with it
        optimizers.AsyncSGD(schedule=schedule).learning_rate_at(jnp.int32(5))
