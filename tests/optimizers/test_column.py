"""The column layout's exchange: sized from the sampled peak of distinct ids one device holds (``slots_for``),
overflow rerouted (the default: every device exchanges its whole buffer that step) or refused (``stop``).

Equality of a capped column update with one device, for every rule, is in ``test_sharded.py``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import optimizers
from optimizers import RouteOverflow, TableLayout, routing
from runner.core.embeddings import lookup_counted
from tests.optimizers.test_routing import sgd_reference

VOCAB, WIDTH = 64, 16
DEVICES, PER_DEVICE = 8, 6


def column_ctx(**kw):
    mesh = Mesh(np.array(jax.devices()), ("table",))
    return optimizers.AsyncEmbContext(VOCAB, WIDTH, DEVICES * PER_DEVICE, mesh=mesh, table_axis="table",
                                      table_layout=TableLayout.column, **kw)


def test_the_exchange_is_the_sampled_peak_times_the_capacity_clamped_to_the_buffer():
    ctx = column_ctx(route_capacity=1.5, route_peak=3, route_min_slots=1)
    # 6 tokens a device: ceil(1.5 x 3) = 5 of at most 6 distinct ids; twice the tokens, twice the peak (9 of 12)
    assert (ctx.route_slots, ctx.slots_for(12), ctx.slots_for(6, exact=True), ctx.column_capped) == (5, 9, 6, True)
    assert column_ctx(route_capacity=1.0, route_peak=3, route_min_slots=4).route_slots == 4  # the floor
    assert column_ctx(route_capacity=3.0, route_peak=3, route_min_slots=1).route_slots == 6  # at most the buffer
    assert column_ctx(route_capacity=1.5, route_peak=3, route_min_slots=1).slots_for(10**6) == VOCAB  # or the vocab
    roomy = column_ctx(route_capacity=3.0, route_peak=3, route_min_slots=1)
    assert not roomy.column_capped  # room for every distinct id: the whole buffer, nothing to overflow
    by_hand = column_ctx(route_min_slots=1)  # no sampled peak: the whole buffer (exact)
    assert by_hand.route_peak is None and by_hand.route_slots == PER_DEVICE and not by_hand.column_capped
    # the peak is what one device holds: 2 devices of 2 rows; device 0 {1, 2, 3, 4, 9}, device 1 {0, 9, 10, 11, 12}
    ids = np.array([[1, 4, 2], [9, 3, 3], [9, 10, 11], [12, 0, 99]], np.int32)
    assert routing.route_peak(ids, devices=2, shard_rows=64, shards=1) == 5  # 99 is past the 64 rows
    assert routing.route_peak(ids, devices=1, shard_rows=64, shards=1) == 9


def spread_batch():
    """Device d's 6 tokens: ids 1 + 7 d + (0..4), one of them twice: 5 distinct ids each (40 in all)."""
    ids = np.concatenate([1 + 7 * d + np.array([0, 1, 2, 3, 4, 0]) for d in range(DEVICES)]).astype(np.int32)
    grads = np.random.default_rng(4).normal(size=(ids.size, WIDTH)).astype(np.float32)
    return ids, grads


def column_step(ctx, opt, table0, update):
    table = jax.device_put(table0, NamedSharding(ctx.mesh, ctx.table_spec()))
    state = jax.device_put(opt.init(*table0.shape), jax.tree.map(lambda s: NamedSharding(ctx.mesh, s),
                                                                 ctx.state_specs(opt.init(*table0.shape))))

    def step(table, state, update):
        c = ctx.fresh()
        keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros(()))
        return table, opt.gradient_update_done(c, keep[0])[1], c.results["route_refused"]

    return jax.jit(step)(table, state, update)


def test_an_overflowing_column_step_exchanges_every_buffer_and_matches_dense_sgd():
    """C = 2 of 5 distinct ids a device (peak 2 x capacity 1): the step is exchanged again whole, so the update
    is the dense one and the lookup reads every row; the overflow is counted."""
    ctx = column_ctx(route_capacity=1.0, route_peak=2, route_min_slots=1)
    assert ctx.reroutes and ctx.route_slots == 2
    opt = optimizers.create("async_sgd", learning_rate=0.1)
    ids, grads = spread_batch()
    update = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    assert update.unique_tokens.shape == (DEVICES * ctx.local_unique,)  # the record keeps its size
    table0 = np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table, valid, refused = column_step(ctx, opt, table0, update)
    assert bool(valid) and int(refused) == 0
    np.testing.assert_allclose(np.asarray(table), sgd_reference(table0, ids, grads, 0.1), rtol=1e-6, atol=1e-6)

    rows, (overflow, peak) = jax.jit(lambda t, i: lookup_counted(ctx, t, i))(table, ids.reshape(DEVICES, -1))
    assert (int(overflow), int(peak)) == (DEVICES * 3, 5)  # 3 ids past the exchange on every device; 5 needed
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(table)[ids.reshape(DEVICES, -1)])


def test_with_stop_an_overflowing_column_update_is_refused_whole_and_counted():
    ctx = column_ctx(route_capacity=1.0, route_peak=2, route_min_slots=1, route_overflow=RouteOverflow.stop)
    opt = optimizers.create("async_sgd", learning_rate=0.1)
    ids, grads = spread_batch()
    ids[:PER_DEVICE] = 1  # device 0 holds one distinct id: within its 2; the 7 others hold 5 each
    update = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    table0 = np.random.default_rng(1).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table, valid, refused = column_step(ctx, opt, table0, update)
    assert not bool(valid) and int(refused) == 7 * 3
    np.testing.assert_array_equal(np.asarray(table), table0)  # bit for bit: nothing was written

    rows, (overflow, peak) = jax.jit(lambda t, i: lookup_counted(ctx, t, i))(table, ids.reshape(DEVICES, -1))
    assert (int(overflow), int(peak)) == (7 * 3, 5)
    rows, want = np.asarray(rows), table0[ids.reshape(DEVICES, -1)]
    # each device reads its 2 smallest distinct ids' rows; the ids past them read zeros
    first = np.array([np.isin(ids[d * PER_DEVICE:(d + 1) * PER_DEVICE], np.unique(ids[d * PER_DEVICE:
                                                                                        (d + 1) * PER_DEVICE])[:2])
                      for d in range(DEVICES)])
    np.testing.assert_array_equal(rows[first], want[first])
    assert not rows[~first].any()

    roomy = column_ctx(route_capacity=1.0, route_peak=5, route_min_slots=1, route_overflow=RouteOverflow.stop)
    table, valid, refused = column_step(roomy, opt, table0, update)
    assert bool(valid) and int(refused) == 0
    np.testing.assert_allclose(np.asarray(table), sgd_reference(table0, ids, grads, 0.1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("policy", [RouteOverflow.reroute, RouteOverflow.stop])
def test_a_column_step_within_its_exchange_moves_only_c_ids(policy):
    """The compiled update's all-to-all carries C rows' width slices, not the whole buffer (with ``reroute``, on a
    step that does not overflow: the cheaper branch of its conditional)."""
    from benchmarks.hlo import step_collective_bytes

    ctx = column_ctx(route_capacity=1.0, route_peak=2, route_min_slots=1, route_overflow=policy)
    whole = column_ctx(route_min_slots=1)
    opt = optimizers.create("async_sgd", learning_rate=0.1)
    ids, grads = spread_batch()
    got = {}
    for c in (ctx, whole):
        update = jax.jit(lambda i, g, c=c: optimizers.make_update(c, i, g))(ids, grads)
        table = jax.device_put(np.zeros((VOCAB, WIDTH), np.float32), NamedSharding(c.mesh, c.table_spec()))

        def step(table, state, update, c=c):
            cc = c.fresh()
            keep, table, state = opt.gradient_update_start(cc, update, table, state, jnp.zeros(()))
            return table, opt.gradient_update_done(cc, keep[0])[1]

        got[c is ctx] = step_collective_bytes(jax.jit(step).lower(table, opt.init(VOCAB, WIDTH), update)
                                                   .compile().as_text())["all-to-all"]
    # [shards, C, WIDTH / shards] float32 a device: C = 2 capped, the whole buffer (local_unique = 7) otherwise
    assert got == {True: 2 * WIDTH * 4, False: ctx.local_unique * WIDTH * 4}
