"""The fused update on a table sharded over 8 CPU devices equals the single-device run.

Every fused optimizer (its first configured case of the contract) runs on 2x4 and 4x2 ('data', 'table')
meshes and a 1-D 'table' mesh, with the table split by rows and by columns; table, state and norm must match the unsharded
run step for step, gating included, and the outputs must keep the layout's sharding.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import optimizers
from optimizers import Routing, TableLayout
from tests.optimizers.test_contract import CASES, CTX, DRAWN, FIRST_OF_EACH, POISON, TOKENS, VOCAB, WIDTH, batch, \
    build_update, case_id, fused_step, initial_table, library, unranged

# FIRST_OF_EACH: each optimizer's first configured case: every optimizer on every mesh here; every configuration
# of each one on every layout is the contract's (tests/optimizers/test_contract.py, 2x4 mesh).

MESHES = {
    "2x4": lambda: Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table")),
    "4x2": lambda: Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "table")),
    "8": lambda: Mesh(np.array(jax.devices()), ("table",)),
}
assert VOCAB % 8 == 0 and WIDTH % 8 == 0, "row and column layouts need vocab and width divisible by the shards"


@functools.lru_cache(maxsize=None)
def raw_steps():
    """Finite steps with padding and out-of-range ids, a NaN step, a non-pending update ("empty"), then more
    steps: (ids, grads) pairs."""
    rng = np.random.default_rng(11)
    steps = [batch(rng, out_of_range=(i == 1)) for i in range(3)]
    ids, grads = batch(rng)
    b, t = np.argwhere(ids > 0)[0]
    grads[b, t, 0] = np.nan
    steps.append((ids, grads))
    steps.append("empty")
    steps += [batch(rng) for _ in range(2)]
    return steps


def updates_for(ctx):
    """``raw_steps`` as ``ctx``'s update records (``make_update(ctx)``: per device on the routed row layout),
    as host arrays (jit places them for each mesh)."""
    build = jax.jit(functools.partial(optimizers.make_update, ctx))
    return [jax.tree.map(np.asarray, optimizers.empty_update(ctx) if isinstance(s, str) else build(*s, True))
            for s in raw_steps()]


@functools.lru_cache(maxsize=None)
def updates():
    """``raw_steps`` as one device's records (a dedupe of the whole batch)."""
    return updates_for(CTX)


@functools.lru_cache(maxsize=None)
def unsharded_run(case):
    opt, step = library((case[0], dict(case[1])))
    table, state = jnp.asarray(initial_table()), opt.init(VOCAB, WIDTH)
    out = []
    for update in updates():
        table, state, norm, valid = step(table, state, update)
        out.append(jax.tree.map(np.array, (table, state, norm, valid)))
    return out


@pytest.mark.parametrize("layout", [TableLayout.row, TableLayout.column])
# make test-fast: the 2x4 (data x table) mesh; make test adds 4x2 (a second data x table shape) and 8 (table only)
@pytest.mark.parametrize("mesh_name", [m if m == "2x4" else pytest.param(m, marks=pytest.mark.slow) for m in MESHES])
@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in FIRST_OF_EACH])
def test_sharded_equals_unsharded(case, mesh_name, layout):
    """Records as the train step makes them for the sharded context (``make_update(ctx)``: per device on
    the routed row layout) against one device's records on one device."""
    _check_sharded(case, mesh_name, layout, whole_batch_records=False)


@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in CASES[:4:2]])
def test_routed_update_accepts_a_record_of_the_whole_batch(case):
    """A record built for one device (replicated ids, e.g. restored from one device's run) applied on the
    routed row layout: each device re-derives its tokens' ids; the same result as one device."""
    _check_sharded(case, "2x4", TableLayout.row, whole_batch_records=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in CASES[:3:2]])
def test_a_capped_column_exchange_equals_unsharded(case):
    """The column layout exchanging only C = 2 of a device's distinct ids (``route_peak`` 2 x capacity 1): steps
    where every device has at most 2 take the small exchange, steps where one has 3 exchange every device's
    whole buffer (rerouted); both equal one device, the rule's full-width row sums (row-wise Adagrad) included."""
    kw = dict(route_peak=2, route_capacity=1.0, route_min_slots=1)
    ctx = _check_sharded(case, "2x4", TableLayout.column, whole_batch_records=False, **kw)
    assert ctx.column_capped and ctx.route_slots == 2
    distinct = [max(np.sum(u < VOCAB) for u in np.split(np.asarray(r.unique_tokens), 8)) for r in updates_for(ctx)]
    assert {d > 2 for d in distinct} == {True, False}  # both branches were taken


DENSE = {"adam": optimizers.Adam(learning_rate=0.05, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1),
         "adagrad": optimizers.Adagrad(learning_rate=0.1, initial_accumulator_value=0.2, eps=1e-6)}


def dense_step(opt, ctx):
    return jax.jit(lambda table, state, update: opt.apply_dense(ctx, update, table, state), donate_argnums=(0, 1))


@functools.lru_cache(maxsize=None)
def unsharded_dense_run(name):
    opt = DENSE[name]
    table, state, step, out = jnp.asarray(initial_table()), opt.init(VOCAB, WIDTH), dense_step(opt, CTX), []
    for update in updates():
        table, state, norm, valid = step(table, state, update)
        out.append(jax.tree.map(np.array, (table, state, norm, valid)))
    return out


@pytest.mark.parametrize("name", sorted(DENSE))
@pytest.mark.parametrize("layout, routing", [(TableLayout.row, Routing.alltoall), (TableLayout.row, Routing.gather),
                                             (TableLayout.column, Routing.alltoall)], ids=["row", "row-gather", "column"])
@pytest.mark.slow
def test_dense_baseline_sharded_equals_unsharded(name, layout, routing):
    """The plain optax baselines on 2x4 shards, fed the records the train step makes for the layout (per device
    on the routed row and the column layout, the whole batch's on the gather row layout): table, state, norm and
    valid equal one device's run step for step (the NaN and the empty step refused), the table and state
    split as the layout splits them."""
    opt, mesh = DENSE[name], MESHES["2x4"]()
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout=layout,
                                     routing=routing)
    records = updates_for(ctx)
    assert all(ctx.local_record(u) == ctx.per_device_record for u in records)
    table_sharding = NamedSharding(mesh, ctx.table_spec())
    state = opt.init(VOCAB, WIDTH)
    state_shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), ctx.state_specs(state))
    table = jax.device_put(jnp.asarray(initial_table()), table_sharding)
    state = jax.device_put(state, state_shardings)
    want = unsharded_dense_run(name)
    for table, state in steps_match(dense_step(opt, ctx), table, state, records, want, f"{name} {layout} "):
        assert table.sharding.is_equivalent_to(table_sharding, table.ndim), table.sharding
        for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(state_shardings)):
            assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (leaf.sharding, sharding)
    assert [bool(v) for *_, v in want] == [True, True, True, False, False, True, True]


def steps_match(step, table, state, records, want, label):
    """Apply ``records`` one by one; after each, valid, norm, table and state equal the unsharded run's
    (``want``). Yields each step's (table, state) for further checks."""
    for i, (update, (w_table, w_state, w_norm, w_valid)) in enumerate(zip(records, want)):
        table, state, norm, valid = step(table, state, update)
        where = f"{label}step {i}"
        assert bool(valid) == bool(w_valid), where
        np.testing.assert_allclose(float(norm), float(w_norm), rtol=1e-6, err_msg=where)
        np.testing.assert_allclose(np.asarray(table), w_table, rtol=1e-6, atol=1e-7, err_msg=where)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-7,
                                                             err_msg=where), state, w_state)
        yield table, state


def _check_sharded(case, mesh_name, layout, whole_batch_records, **kw):
    name, hp = case
    mesh = MESHES[mesh_name]()
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout=layout, **kw)
    records = updates() if whole_batch_records else updates_for(ctx)
    if ctx.routed:
        assert all(ctx.local_record(u) != whole_batch_records for u in records)
    opt = optimizers.create(name, **hp)
    step = fused_step(opt, ctx)

    state = opt.init(VOCAB, WIDTH)
    table_sharding = NamedSharding(mesh, ctx.table_spec())
    state_shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), ctx.state_specs(state))
    table = jax.device_put(jnp.asarray(initial_table()), table_sharding)
    state = jax.device_put(state, state_shardings)

    want = unsharded_run((name, tuple(sorted(hp.items()))))
    for i, (table, state) in enumerate(steps_match(step, table, state, records, want, "")):
        assert table.sharding.is_equivalent_to(table_sharding, table.ndim), (i, table.sharding)
        for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(state_shardings)):
            assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (i, leaf.sharding, sharding)
    assert [bool(v) for *_, v in want] == [True, True, True, False, False, True, True]
    np.testing.assert_array_equal(np.asarray(table)[DRAWN:], initial_table()[DRAWN:])
    return ctx


def poisoned_updates():
    """A finite step, then one whose gradient is finite but whose result is not (under ``POISON``'s
    hyperparameters): a fresh row with a zero gradient and a 2**30 gradient element, then a finite step."""
    rng = np.random.default_rng(12)
    raw = [batch(rng) for _ in range(3)]
    raw = [(ids, np.abs(g) + 1 / 64) for ids, g in raw]
    ids, grads = raw[1]
    fresh = next(i for i in range(1, DRAWN) if i not in raw[0][0])
    ids[0, 0] = fresh
    grads[ids == fresh] = 0.0
    b, t = np.argwhere((ids > 0) & (ids != fresh))[0]
    grads[b, t, 0] = 2.0**30
    return [jax.tree.map(np.asarray, build_update(ids, g, True)) for ids, g in raw]


@pytest.mark.parametrize("layout", [TableLayout.row, TableLayout.column])
@pytest.mark.parametrize("name", sorted(POISON))
@pytest.mark.slow
def test_refusal_of_a_non_finite_result_is_one_decision_on_every_shard(name, layout):
    """Only one row shard (row layout) or every column shard holds the non-finite result; every shard
    refuses the whole update: table and state bit-for-bit unchanged, valid false, like one device."""
    opt = unranged(optimizers.REGISTRY[name])(**POISON[name])  # out of range on purpose: a class without ranges
    mesh = MESHES["2x4"]()
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table", table_layout=layout)
    sharded, single = fused_step(opt, ctx), fused_step(opt, CTX)
    state = opt.init(VOCAB, WIDTH)
    table = jax.device_put(jnp.asarray(initial_table()), NamedSharding(mesh, ctx.table_spec()))
    state = jax.device_put(state, jax.tree.map(lambda spec: NamedSharding(mesh, spec), ctx.state_specs(state)))
    ref_table, ref_state = jnp.asarray(initial_table()), opt.init(VOCAB, WIDTH)
    reported = []
    for i, update in enumerate(poisoned_updates()):
        before = jax.tree.map(np.array, (table, state))
        table, state, norm, valid = sharded(table, state, update)
        ref_table, ref_state, ref_norm, ref_valid = single(ref_table, ref_state, update)
        reported.append(bool(valid))
        assert bool(valid) == bool(ref_valid), f"step {i}"
        np.testing.assert_allclose(float(norm), float(ref_norm), rtol=1e-6)
        if not bool(valid):
            jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, (table, state)), before)
        np.testing.assert_allclose(np.asarray(table), np.asarray(ref_table), rtol=1e-6, atol=1e-7)
    assert reported == [True, False, True]


@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in CASES[:3]])
@pytest.mark.slow
def test_the_rule_run_chunk_by_chunk_changes_nothing(case, monkeypatch):
    """The routed owner runs the rule over its owned rows in chunks of ``RULE_CHUNK`` rows, skipping chunks of
    padding only. With chunks of 2 rows (several per step, the last part padding) table, state, norm and
    valid equal one device's step for step on 2x4 row shards (one device does not chunk: checked too)."""
    from optimizers.layouts import row_routed

    name, hp = case
    want = unsharded_run((name, tuple(sorted(hp.items()))))  # chunk 256: one chunk at this size
    monkeypatch.setattr(row_routed, "RULE_CHUNK", 2)
    opt = optimizers.create(name, **hp)
    mesh = MESHES["2x4"]()
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table")
    for c, records in ((CTX, updates()), (ctx, updates_for(ctx))):
        step = fused_step(opt, c)
        state = opt.init(VOCAB, WIDTH)
        table = jnp.asarray(initial_table())
        if c.sharded:
            table = jax.device_put(table, NamedSharding(mesh, c.table_spec()))
            state = jax.device_put(state, jax.tree.map(lambda s: NamedSharding(mesh, s), c.state_specs(state)))
        for _ in steps_match(step, table, state, records, want, "sharded " if c.sharded else "one device "):
            pass


@pytest.mark.slow
def test_chunked_rule_on_a_bfloat16_table_is_bit_identical(monkeypatch):
    """bfloat16 table (f32 state, stochastic rounding keyed by row id): the routed owner's rule in 2-row
    chunks writes the same bits as in one pass."""
    from optimizers.layouts import row_routed

    mesh = MESHES["2x4"]()
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table")
    opt = optimizers.create("async_adam", learning_rate=0.02)
    records = updates_for(ctx)

    def run(chunk):
        monkeypatch.setattr(row_routed, "RULE_CHUNK", chunk)
        step = fused_step(opt, ctx)
        table = jax.device_put(jnp.asarray(initial_table(), jnp.bfloat16), NamedSharding(mesh, ctx.table_spec()))
        state = jax.device_put(opt.init(VOCAB, WIDTH),
                               jax.tree.map(lambda s: NamedSharding(mesh, s), ctx.state_specs(opt.init(VOCAB, WIDTH))))
        out = []
        for update in records:
            table, state, norm, valid = step(table, state, update)
            out.append(jax.tree.map(np.array, (table, state, norm, valid)))
        return out

    for a, b in zip(run(2), run(10**6)):
        jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a[0], np.asarray(initial_table(), jnp.bfloat16))  # the table did move
