"""Id routing (row layout): bucketing by owner against numpy, and capacity overflow counted and refused.

Equality of the routed update with one device is in ``test_sharded.py`` (the row layout routes by default).
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
from tests.optimizers.test_contract import fused_step

VOCAB, WIDTH = 32, 8


def table_mesh():
    return Mesh(np.array(jax.devices()), ("table",))


def test_bucket_puts_each_id_in_its_owners_slots():
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, 8 * 16, mesh=table_mesh(), table_axis="table",
                                     route_capacity=1.0, route_min_slots=1)
    assert (ctx.table_shards, ctx.shard_rows, ctx.local_unique, ctx.route_slots) == (8, 4, 17, 2)
    unique = np.array(sorted({0, 1, 2, 5, 9, 10, 11, 31}) + [VOCAB] * 9, np.int32)
    b = jax.jit(lambda u: routing.bucket(ctx, u))(unique)
    # owner 0 holds rows 0..3: ids 0, 1 fit, 2 overflows; owner 1: 5; owner 2: 9, 10 fit, 11 overflows; owner 7: 31
    want = np.full((8, 2), 4)
    want[0], want[1, 0], want[2], want[7, 0] = [0, 1], 1, [1, 2], 3
    np.testing.assert_array_equal(np.asarray(b.send), want)
    assert int(b.overflow) == 2 and int(b.peak) == 3
    slot = np.asarray(b.slot)
    assert list(slot[:8]) == [0, 1, 16, 2, 4, 5, 16, 14] and (slot[8:] == 16).all()


def skewed(tokens):
    """Every device's tokens hold ids 1, 2, 3: all owned by shard 0 of 8."""
    ids = np.tile(np.array([1, 2, 3], np.int32), tokens // 3)
    grads = np.ones((tokens, WIDTH), np.float32)
    return ids, grads


@pytest.mark.slow
def test_overflow_is_counted_and_the_update_refused_when_the_policy_is_stop():
    mesh = table_mesh()
    tokens = 24  # 3 per device
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens, mesh=mesh, table_axis="table", table_layout=TableLayout.row,
                                     route_capacity=1.0, route_min_slots=1, route_overflow=RouteOverflow.stop)
    assert ctx.routed and ctx.route_slots == 1
    opt = optimizers.create("async_sgd", learning_rate=0.1)
    ids, grads = skewed(tokens)
    update = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    table0 = np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table = jax.device_put(table0, NamedSharding(mesh, ctx.table_spec()))
    state = opt.init(VOCAB, WIDTH)

    def step(table, state, update):
        c = ctx.fresh()
        keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros(()))
        return table, state, opt.gradient_update_done(c, keep[0])[1], c.results["route_refused"]

    table, state, valid, overflow = jax.jit(step)(table, state, update)
    assert int(overflow) == 8 * 2 and not bool(valid)  # 2 of 3 ids per device had no slot: nothing written
    np.testing.assert_array_equal(np.asarray(table), table0)

    rows, (overflow, peak) = jax.jit(lambda t, i: lookup_counted(ctx, t, i))(table, ids.reshape(8, 3))
    assert (int(overflow), int(peak)) == (16, 3)
    assert np.count_nonzero(np.asarray(rows).any(axis=-1)) == 8  # only the routed id of each device was read

    roomy = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens, mesh=mesh, table_axis="table", route_capacity=8.0,
                                       route_min_slots=1)
    assert roomy.route_slots == 3
    step_ok = fused_step(opt, roomy)
    _, _, _, valid = step_ok(jax.device_put(table0, NamedSharding(mesh, roomy.table_spec())), state, update)
    assert bool(valid)


def sgd_reference(table0, ids, grads, lr):
    """A plain dense SGD step: every id's row minus lr times the sum of its tokens' gradients."""
    want = table0.copy()
    np.add.at(want, ids, -lr * grads)
    return want


def routed_step(ctx, opt, table0, update):
    table = jax.device_put(table0, NamedSharding(ctx.mesh, ctx.table_spec()))

    def step(table, state, update):
        c = ctx.fresh()
        keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros(()))
        return table, opt.gradient_update_done(c, keep[0])[1], c.results["route_refused"]

    return jax.jit(step)(table, opt.init(*table0.shape), update)


@pytest.mark.slow
def test_overflowing_ids_are_rerouted_in_rounds_by_default():
    """The default policy: a step where any device has more ids for one shard than its slots routes the rest in
    further rounds of the same slots, so the lookup reads every row and the update is the dense one."""
    mesh = table_mesh()
    tokens = 24
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens, mesh=mesh, table_axis="table", route_capacity=1.0,
                                     route_min_slots=1)
    assert ctx.reroutes and ctx.route_slots == 1
    opt = optimizers.create("async_sgd", learning_rate=0.1)
    ids, grads = skewed(tokens)
    grads = grads * np.arange(1, tokens + 1, dtype=np.float32)[:, None]
    update = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    table0 = np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table, valid, refused = routed_step(ctx, opt, table0, update)
    assert bool(valid) and int(refused) == 0
    np.testing.assert_allclose(np.asarray(table), sgd_reference(table0, ids, grads, 0.1), rtol=1e-6, atol=1e-6)

    rows, (overflow, peak) = jax.jit(lambda t, i: lookup_counted(ctx, t, i))(table, ids.reshape(8, 3))
    assert (int(overflow), int(peak)) == (16, 3)  # counted, and every row read anyway
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(table)[ids.reshape(8, 3)])


@pytest.mark.slow
def test_rows_past_an_owners_buffer_after_rerouting_refuse_the_update():
    """Rerouting delivers every device's ids in rounds, but an owner keeps at most every device's slots of
    distinct rows (``owner_slots_for``); past that the update is refused whole and counted, never half-written."""
    mesh = table_mesh()
    vocab, tokens = 256, 16  # 32 rows a shard; 2 ids a device, 16 distinct ids all owned by shard 0
    ctx = optimizers.AsyncEmbContext(vocab, WIDTH, tokens, mesh=mesh, table_axis="table", route_capacity=0.5,
                                     route_min_slots=1)
    assert ctx.route_slots == 1 and ctx.owner_unique == 8 + 1
    opt = optimizers.create("async_sgd", learning_rate=0.1)
    ids = np.arange(1, tokens + 1, dtype=np.int32)
    grads = np.ones((tokens, WIDTH), np.float32)
    update = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    table0 = np.random.default_rng(1).normal(size=(vocab, WIDTH)).astype(np.float32)
    table, valid, refused = routed_step(ctx, opt, table0, update)
    assert not bool(valid) and int(refused) == 16 - 9  # the owner kept 9 of the 16 rows
    np.testing.assert_array_equal(np.asarray(table), table0)


def test_route_peak_counts_each_devices_distinct_ids_per_shard():
    ids = np.array([[1, 4, 2], [9, 3, 3], [9, 10, 11], [12, 0, 99]], np.int32)  # 2 devices, 2 rows each
    # device 0: {1, 2, 3, 4, 9}: 4 for shard 0 (rows 0-7); device 1: {0, 9, 10, 11, 12}: 4 for shard 1
    assert routing.route_peak(ids, devices=2, shard_rows=8, shards=2) == 4
    # one device: {0, 1, 2, 3, 4} for shard 0; 99 is past the 16 rows: it goes nowhere
    assert routing.route_peak(ids, devices=1, shard_rows=8, shards=2) == 5
    ctx = optimizers.AsyncEmbContext(256, WIDTH, 128, mesh=table_mesh(), table_axis="table", route_capacity=1.5,
                                     route_peak=3, route_min_slots=1)
    # 16 tokens a device: 1.5 x 3 slots; twice the tokens, twice the peak; exact: room for all 32
    assert (ctx.route_slots, ctx.slots_for(32), ctx.slots_for(32, exact=True)) == (5, 9, 32)


def test_permute_ids_is_a_bijection_that_spreads_hot_ids():
    for vocab in (3, 5, 32, 501, 4096, 4097):
        x = np.arange(-2, vocab + 2, dtype=np.int32)
        y = np.asarray(jax.jit(lambda a, v=vocab: routing.permute_ids(a, v))(x))
        inside = (x >= 1) & (x < vocab)
        np.testing.assert_array_equal(y[~inside], x[~inside])  # padding 0 and out-of-range ids stay
        np.testing.assert_array_equal(np.sort(y[inside]), np.arange(1, vocab))
    vocab, shards = 4096, 8
    hot = np.asarray(routing.permute_ids(np.arange(1, 257, dtype=np.int32), vocab))
    per_shard = np.bincount(hot // (vocab // shards), minlength=shards)
    assert per_shard.max() <= 1.5 * 256 / shards  # the 256 hottest ids: about even, not all on shard 0


def test_unpermute_ids_inverts_permute_ids():
    def round_trips(x, vocab):
        y = routing.permute_ids(x, vocab)
        return y, routing.unpermute_ids(y, vocab), routing.permute_ids(routing.unpermute_ids(x, vocab), vocab)

    for vocab in (4, 33, 501, 4097):  # 2**b - 1 ids, 2**b, a few past 2**b (long cycle walks)
        x = np.arange(-2, vocab + 2, dtype=np.int32)
        y, back, forth = map(np.asarray, jax.jit(round_trips, static_argnums=1)(x, vocab))
        assert (y != x).sum() >= (vocab - 1) // 2  # a real relabelling, so the round trips mean something
        np.testing.assert_array_equal(back, x)
        np.testing.assert_array_equal(forth, x)


def test_lookup_of_a_larger_batch_than_the_train_batch_reads_every_row():
    """Evaluation batches may be bigger than the train batch the context was sized for: the lookup sizes its
    buffers from the ids it gets and, without a capacity (``lookup``), reads every row."""
    from runner.core.embeddings import lookup

    mesh = table_mesh()
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, 24, mesh=mesh, table_axis="table", route_min_slots=1)
    table0 = np.arange(VOCAB * WIDTH, dtype=np.float32).reshape(VOCAB, WIDTH)
    table = jax.device_put(table0, NamedSharding(mesh, ctx.table_spec()))
    ids = np.random.default_rng(3).integers(-2, VOCAB + 2, size=(8, 40)).astype(np.int32)  # 40 per device
    got = np.asarray(jax.jit(lambda t, i: lookup(ctx, t, i))(table, ids))
    want = np.where(((ids >= 0) & (ids < VOCAB))[..., None], table0[np.clip(ids, 0, VOCAB - 1)], 0)
    np.testing.assert_array_equal(got, want)


def test_make_update_on_the_routed_layout_dedupes_each_devices_own_tokens():
    """Routed: ``mesh.size`` blocks of ``local_unique`` ids, one per device's tokens, each token's segment id
    into its own block; host-side ``record_token_ids`` reads either kind back and ``record_for`` rebuilds it."""
    from optimizers import record_for, record_token_ids

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    tokens = 8 * 6
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens, mesh=mesh, table_axis="table")
    whole = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens)
    ids = np.random.default_rng(5).integers(-1, VOCAB + 2, size=tokens).astype(np.int32)
    ids[:3] = 0  # padding
    grads = np.ones((tokens, WIDTH), np.float32)
    upd = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    ref = jax.jit(lambda i, g: optimizers.make_update(whole, i, g))(ids, grads)
    assert ctx.record_unique == 8 * ctx.local_unique == 8 * 7 and upd.unique_tokens.shape == (ctx.record_unique,)
    assert ctx.local_record(upd) and not ctx.local_record(ref) and not whole.local_record(ref)
    assert upd.unique_tokens.sharding.spec == jax.sharding.PartitionSpec(("data", "table"))
    unique, seg = np.asarray(upd.unique_tokens), np.asarray(upd.segment_ids)
    want = np.where((ids > 0) & (ids < VOCAB), ids, -1)
    for d in range(8):  # each device's block: its own tokens' distinct ids, sorted, padded with VOCAB
        mine = want[d * 6:(d + 1) * 6]
        u = np.unique(mine[mine >= 0])
        np.testing.assert_array_equal(unique[d * 7:(d + 1) * 7], np.r_[u, [VOCAB] * (7 - u.size)])
        np.testing.assert_array_equal(seg[d * 6:(d + 1) * 6], np.where(mine >= 0, np.searchsorted(u, mine), -1))
    np.testing.assert_array_equal(record_token_ids(unique, seg, VOCAB), want)
    np.testing.assert_array_equal(record_token_ids(ref.unique_tokens, ref.segment_ids, VOCAB), want)
    for c, u in ((ctx, upd), (whole, ref)):
        got = record_for(c, want)
        np.testing.assert_array_equal(got[0], np.asarray(u.unique_tokens))
        np.testing.assert_array_equal(got[1], np.asarray(u.segment_ids))
    empty = optimizers.empty_update(ctx)
    assert empty.unique_tokens.shape == (ctx.record_unique,) and ctx.local_record(empty)
    with pytest.raises(ValueError, match="an update record of 48 tokens cannot hold 49 unique ids"):
        record_token_ids(np.zeros(49, np.int32), seg, VOCAB)


@pytest.mark.parametrize("layout", [TableLayout.row, TableLayout.column])
@pytest.mark.slow
def test_the_lookups_dedupe_without_the_padding_id_is_make_updates(layout):
    """The routed row and the column train step reuse their lookup's per-device dedupe (which keeps id 0, the
    padding row) as the update record: with 0 dropped it equals ``make_update``'s, padding tokens -1, with or
    without a 0; and the rows it reads are the table's."""
    mesh = table_mesh()
    tokens = 8 * 5
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens, mesh=mesh, table_axis="table", table_layout=layout)
    assert ctx.per_device_record
    table0 = np.random.default_rng(2).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table = jax.device_put(table0, NamedSharding(mesh, ctx.table_spec()))
    rng = np.random.default_rng(9)
    for zeros in (0, 7):
        ids = rng.integers(1, VOCAB + 2, size=tokens).astype(np.int32)  # a few out of range
        ids[rng.permutation(tokens)[:zeros]] = 0
        rows, _, (unique, seg) = jax.jit(lambda t, i: lookup_counted(ctx, t, i, with_dedupe=True))(
            table, ids.reshape(-1, 1))
        want = jax.jit(lambda i: optimizers.make_update(ctx, i, np.zeros((tokens, WIDTH), np.float32)))(ids)
        np.testing.assert_array_equal(np.asarray(unique), np.asarray(want.unique_tokens))
        np.testing.assert_array_equal(np.asarray(seg), np.asarray(want.segment_ids))
        inside = (ids < VOCAB)[:, None]
        np.testing.assert_array_equal(np.asarray(rows)[:, 0], np.where(inside, table0[np.minimum(ids, VOCAB - 1)], 0))
    whole = optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens)
    with pytest.raises(ValueError, match="with_dedupe=True\\) needs a per-device record"):
        lookup_counted(whole, np.zeros((VOCAB, WIDTH), np.float32), ids, with_dedupe=True)


@pytest.mark.parametrize("routed", [False, True], ids=["one-device", "routed-2x4"])
def test_a_record_without_some_rows_is_make_update_without_their_ids(routed):
    """``without_rows``: dropping some unique rows of a record (per device block on the routed layout) gives the
    record ``make_update`` builds from the same ids with the dropped ones out of range, exactly: unique ids
    still sorted with padding last, the dropped rows' tokens at segment -1, the gradients untouched."""
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    tokens = 8 * 6
    ctx = (optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens, mesh=mesh, table_axis="table") if routed
           else optimizers.AsyncEmbContext(VOCAB, WIDTH, tokens))
    rng = np.random.default_rng(9)
    ids = rng.integers(-1, VOCAB + 2, size=tokens).astype(np.int32)
    ids[:3] = 0  # padding
    grads = rng.normal(size=(tokens, WIDTH)).astype(np.float32)
    upd = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(ids, grads)
    unique = np.asarray(upd.unique_tokens)
    drop = (rng.random(unique.shape) < 0.4) & (unique < VOCAB)
    assert drop.sum() > 3
    seg = np.asarray(upd.segment_ids)  # a token's row is its own block's (one block on one device)
    block = np.arange(tokens) // (tokens // 8) * ctx.local_unique if routed else np.zeros(tokens, int)
    gone = (seg >= 0) & drop[block + np.maximum(seg, 0)]
    got = jax.jit(lambda u, d: optimizers.without_rows(ctx, u, d))(upd, drop)
    want = jax.jit(lambda i, g: optimizers.make_update(ctx, i, g))(np.where(gone, VOCAB, ids), grads)
    np.testing.assert_array_equal(np.asarray(got.unique_tokens), np.asarray(want.unique_tokens))
    np.testing.assert_array_equal(np.asarray(got.segment_ids), np.asarray(want.segment_ids))
    np.testing.assert_array_equal(np.asarray(got.grads), grads)
    assert (np.asarray(got.segment_ids)[gone] == -1).all() and ctx.local_record(got) == routed
