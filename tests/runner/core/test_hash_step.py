"""Hash tables in the train step: a run with hash tables equals a plain numpy loop over a dict of rows (the
policy's reference, ``DictTable``) in sync and async mode, across evictions; a slot given to a new id gets
fresh values and a fresh optimizer state; a deferred update of a row given away in between is dropped."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runner.build import build
from runner.core import hash_step, hash_rows as hr, hash_tables as ht
from tests.runner.core.test_hash_tables import DictTable, jit_find
from tests.runner.support import numpy_tree, run_steps

LR = 0.3
HASHED = ["data.raw_ids=true", "data.drift=7", "trainer.eval_batches=4", "model.tables.users.kind=hash", "model.tables.users.capacity=40",
          "model.tables.users.probes=4", "model.tables.items.kind=hash", "model.tables.items.capacity=150",
          "model.tables.items.probes=8"]


def _key_ints(keys: np.ndarray) -> list[int]:
    k = keys.reshape(-1, 2).astype(np.uint64)
    return [int(x) for x in (k[:, 0] << np.uint64(32)) | k[:, 1]]


def _oracle(program, data, state0, steps, delay):
    """Plain loop: each hash table's slots from the dict reference, a slot's row set to the id's fresh row when
    the id gets it, rows looked up from numpy tables (no slot: zeros), SGD on summed rows; ``delay=1``: step
    t applies G_{t-1} after its lookups, without the rows step t gave to another id."""
    model, B = program.model, program.contexts["items"].tokens_per_batch // program.tables["items"].tokens_per_example
    tables = {n: np.array(t, np.float32) for n, t in state0.tables.items()}
    params, opt_state = state0.params, state0.opt_state
    hashed = sorted(state0.hashed)
    refs = {n: DictTable(program.tables[n].hash) for n in hashed}
    seeds = {n: jax.random.bits(jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(state0.rng)), 7919 + i), (2,),
                                jnp.uint32) for i, n in enumerate(hashed)}
    loss_and_grads = jax.jit(jax.value_and_grad(model.loss, argnums=(0, 1), has_aux=True))
    dense_update = jax.jit(program.dense_tx.update)
    queue, losses, dropped = [], [], 0

    def apply(grads, moved):
        nonlocal dropped
        for n, (rows, g) in grads.items():
            keep = (rows > 0) & (rows < tables[n].shape[0])
            gone = np.isin(rows, list(moved.get(n, ())))
            dropped += len(np.unique(rows[keep & gone]))
            keep &= ~gone
            acc = np.zeros_like(tables[n], np.float64)
            np.add.at(acc, rows[keep], g[keep])
            touched = np.unique(rows[keep])
            tables[n][touched] -= (LR * acc[touched]).astype(np.float32)

    for t in range(steps):
        host = data.batch(t, B)
        batch = {k: jnp.asarray(host[k]) for k in program.model_keys}
        raw = {n: np.asarray(v) for n, v in model.table_ids(batch).items()}
        rows, moved = {}, {}
        for n, v in raw.items():
            if n not in refs:
                rows[n] = v.reshape(-1)
                continue
            before = list(refs[n].key_of)
            slots, _, _ = refs[n].step(_key_ints(v), t)
            moved[n] = {s + 1 for s, (a, b) in enumerate(zip(before, refs[n].key_of)) if a != b}
            for s in sorted(moved[n]):
                k = refs[n].key_of[s - 1]
                key = jnp.asarray([[k >> 32, k & 0xFFFFFFFF]], jnp.uint32)
                spec = program.tables[n]
                tables[n][s] = np.asarray(hr.fresh_rows(spec.hash, seeds[n], key, spec.width, spec.init_scale))[0]
            rows[n] = np.asarray([s + 1 if s >= 0 else tables[n].shape[0] for s in slots])
            rows[n][np.asarray(_key_ints(v)) == 0] = 0
        embs = {n: jnp.asarray(np.concatenate([tables[n], np.zeros((1, tables[n].shape[1]), np.float32)])[rows[n]]
                               .reshape(*raw[n].shape[:2], -1)) for n in raw}
        if delay and queue:
            apply(queue.pop(0), moved)
        (loss, _), (gp, ge) = loss_and_grads(params, embs, batch)
        losses.append(float(loss))
        upd, opt_state = dense_update(gp, opt_state, params)
        params = optax.apply_updates(params, upd)
        grads = {n: (rows[n], np.asarray(ge[n]).reshape(-1, ge[n].shape[-1])) for n in raw}
        if delay:
            queue.append(grads)
        else:
            apply(grads, {})
    for grads in queue:
        apply(grads, {})  # the flush
    return tables, params, losses, refs, dropped


@pytest.mark.parametrize("mode, policy", [("on", []), pytest.param("off", ["model.tables.items.evict=lfu",
                                                                             "model.tables.items.admit_after=2"],
                                                                      marks=pytest.mark.slow)],
                         ids=["async-lru", "sync-lfu-admit2"])
def test_hash_tables_train_as_the_dict_oracle(cfg_of, mode, policy):
    steps = 12
    program, data, _ = build(cfg_of(["optimizer=async_sgd", f"optimizer.learning_rate={LR}", f"async_emb={mode}",
                                     *HASHED, *policy, f"trainer.steps={steps}"]))
    assert {n: s.kind for n, s in program.tables.items()} == {"users": "hash", "items": "hash", "authors": "dense"}
    state0, state, losses, metrics = run_steps(program, data, steps)
    tables, params, ref_losses, refs, dropped = _oracle(program, data, state0, steps, delay=1 if mode == "on" else 0)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for n in tables:
        np.testing.assert_allclose(np.asarray(state.tables[n]), tables[n], rtol=1e-4, atol=1e-6)
    for n, ref in refs.items():
        keys = np.asarray(state.hashed[n].keys)
        assert _key_ints(keys) == [k or 0 for k in ref.key_of]
        assert sum(int(m[f"emb/evicted/{n}"]) for m in metrics) > 0, "the run must evict"
        assert float(metrics[-1][f"emb/occupancy/{n}"]) == pytest.approx(np.mean([k is not None for k in ref.key_of]))
    if mode == "on":
        got = sum(int(m[f"emb/stale_dropped/{n}"]) for m in metrics for n in refs)
        assert got == dropped > 0, "an update of a row given to another id in between must be dropped and counted"
    else:
        assert sum(int(m["emb/unadmitted_lookups/items"]) for m in metrics) > 0  # admit_after=2 holds ids back


@pytest.mark.slow
def test_a_new_id_gets_fresh_values_and_optimizer_state(cfg_of):
    """Adam moments and the row of a slot given to a new id are reset; every other row is untouched."""
    program, data, _ = build(cfg_of(["optimizer=async_adam", "async_emb=off", *HASHED]))
    _, state, _, _ = run_steps(program, data, 4, flush=False)
    before = numpy_tree(state)
    spec = program.tables["users"]
    held = np.asarray(before.hashed["users"].keys)
    # ids never seen, as many as there are slots: each lands in its window and evicts there
    new = ht.fingerprint(np.arange(10**12, 10**12 + spec.hash.capacity, dtype=np.int64))
    raw = {n: jnp.asarray(v) for n, v in program.model.table_ids(
        {k: jnp.asarray(v) for k, v in data.batch(99, 32).items()}).items()}
    raw["users"] = jnp.asarray(new)[:, None]
    after, rows, moved, m = jax.jit(lambda st, r: hash_step.map_batch(program, st, r))(state, raw)
    changed = (np.asarray(moved["users"].before) != np.asarray(moved["users"].after)).any(-1)  # slots given away
    moved = np.zeros(program.tables["users"].rows, bool)
    moved[np.asarray(hr.slot_rows(spec.hash, jnp.asarray(np.flatnonzero(changed))))] = True
    assert int(m["emb/admitted/users"]) == moved.sum() > 0 and int(m["emb/evicted/users"]) == moved.sum()
    mu, nu = (np.asarray(x) for x in (after.emb_states["users"].rows.mu, after.emb_states["users"].rows.nu))
    assert (mu[moved] == 0).all() and (nu[moved] == 0).all()
    assert np.array_equal(mu[~moved], np.asarray(before.emb_states["users"].rows.mu)[~moved])
    assert np.abs(np.asarray(before.emb_states["users"].rows.mu)[moved]).sum() > 0, "the evicted rows had moments"
    table = np.asarray(after.tables["users"])
    assert np.array_equal(table[~moved], np.asarray(before.tables["users"])[~moved])
    assert not np.allclose(table[moved], np.asarray(before.tables["users"])[moved])
    np.testing.assert_allclose(table[moved].std(), spec.init_scale, rtol=0.3)
    assert (np.asarray(after.hashed["users"].keys) != held).any()


@pytest.mark.slow
def test_a_new_ids_row_does_not_catch_up_on_decay_from_before_it_held_the_slot(cfg_of):
    """weight_decay_mode=decoupled_global: a reset row's last touch is the table's running decay now, so its first
    update decays it once, as a row never trained (its touch used to be reset to 0: a fresh row shrank to ~0)."""
    program, data, _ = build(cfg_of(["optimizer=async_sgd", "async_emb=off", "optimizer.weight_decay=0.1",
                                     "optimizer.weight_decay_mode=decoupled_global", *HASHED]))
    _, state, _, _ = run_steps(program, data, 4, flush=False)
    before = numpy_tree(state.emb_states["users"].decay)
    assert before.total < -0.1  # four updates of log(1 - lr * wd) each: what a reset to 0 would make a row miss
    spec = program.tables["users"]
    raw = {n: jnp.asarray(v) for n, v in program.model.table_ids(
        {k: jnp.asarray(v) for k, v in data.batch(99, 32).items()}).items()}
    raw["users"] = jnp.asarray(ht.fingerprint(np.arange(10**12, 10**12 + spec.hash.capacity, dtype=np.int64)))[:, None]
    after, _, moved, _ = jax.jit(lambda st, r: hash_step.map_batch(program, st, r))(state, raw)
    changed = (np.asarray(moved["users"].before) != np.asarray(moved["users"].after)).any(-1)
    rows = np.zeros(spec.rows, bool)
    rows[np.asarray(hr.slot_rows(spec.hash, jnp.asarray(np.flatnonzero(changed))))] = True
    touch = np.asarray(after.emb_states["users"].decay.touch)
    assert rows.sum() > 0 and (touch[rows] == before.total).all()
    np.testing.assert_array_equal(touch[~rows], before.touch[~rows])


@pytest.mark.slow
def test_evaluation_reads_without_changing_the_table(cfg_of):
    """predict maps ids read-only: an id the table holds reads its row; one it does not, zeros (default=zeros)
    or the shared row (default=shared)."""
    program, data, _ = build(cfg_of(["optimizer=async_sgd", *HASHED, "model.tables.users.default=shared"]))
    _, state, _, _ = run_steps(program, data, 3)
    before = numpy_tree(state)
    raw = program.model.table_ids({k: jnp.asarray(v) for k, v in data.batch(50, 32).items()})
    rows = np.asarray(jax.jit(lambda st, r: hash_step.read_rows(program, st, r))(state, raw)["users"])
    spec = program.tables["users"]
    slots = np.asarray(jit_find(spec.hash, state.hashed["users"], raw["users"]))
    assert (slots >= 0).any() and (slots < 0).any()
    np.testing.assert_array_equal(rows, np.where(slots >= 0, slots + 1, spec.hash.shared_row))
    zeros = dataclasses.replace(spec.hash, default="zeros")
    out = program.contexts["users"].stored_rows
    rows_of = jax.jit(hr.rows_of, static_argnums=(0, 2))
    np.testing.assert_array_equal(np.asarray(rows_of(zeros, jnp.asarray(slots), out)),
                                  np.where(slots >= 0, slots + 1, out))
    scores = np.asarray(jax.jit(program.predict)(state, {k: jnp.asarray(v) for k, v in data.batch(50, 32).items()}))
    assert scores.shape == (32, 3) and np.isfinite(scores).all()
    for a, b in zip(jax.tree.leaves(numpy_tree(state.hashed)), jax.tree.leaves(before.hashed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_data_parallel_on_eight_devices_equals_one_device(cfg_of):
    """mesh=data (the batch split over 8 devices, hash tables replicated) trains exactly as one device: the
    same slots, rows, optimizer state and losses; a modulo table beside them likewise."""
    over = ["optimizer=async_rowwise_adagrad", "async_emb=on", *HASHED, "data.num_authors=50",
            "model.tables.authors.kind=modulo", "model.tables.authors.vocab=31", "trainer.batch_size=64"]
    runs = {}
    for mesh in (["mesh=single"], ["mesh=data"]):
        program, data, plan = build(cfg_of([*over, *mesh]))
        runs[plan.num_devices] = run_steps(program, data, 6)
    (_, one, l1, m1), (_, eight, l8, m8) = runs[1], runs[8]
    np.testing.assert_allclose(l8, l1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(numpy_tree(eight)), jax.tree.leaves(numpy_tree(one))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [int(m["emb/evicted/items"]) for m in m8] == [int(m["emb/evicted/items"]) for m in m1]
    assert float(m1[-1]["emb/collision_rate/authors"]) > 0  # 50 authors on 30 rows


@pytest.mark.slow
def test_row_sharded_on_a_2x4_mesh_equals_one_device_with_as_many_partitions(cfg_of):
    """mesh=data_table 2x4 (rows split over 4 table shards, each holding one partition of each hash table's
    slots, ids routed to their rows' owners) trains as one device with the tables in 4 partitions: the same
    slots, metadata, sketch, rows, optimizer state and losses, admissions and evictions (async mode, whose
    deferred updates also drop the rows given away in between; sync mode runs the same mapping)."""
    over = ["optimizer=async_rowwise_adagrad", "async_emb=on", *HASHED, "model.tables.users.capacity=40",
            "model.tables.items.capacity=152", "model.tables.items.admit_after=2", "trainer.batch_size=64"]
    one_cfg = [*over, "mesh=single", "model.tables.users.partitions=4", "model.tables.items.partitions=4"]
    mesh_cfg = [*over, "mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"]
    runs = {}
    for name, cfg in (("one", one_cfg), ("mesh", mesh_cfg)):
        program, data, plan = build(cfg_of(cfg))
        assert program.tables["items"].hash.partitions == 4  # the mesh's default: one partition a row shard
        runs[name] = run_steps(program, data, 6)
    (_, one, l1, m1), (_, mesh, l8, m8) = runs["one"], runs["mesh"]
    np.testing.assert_allclose(l8, l1, rtol=1e-5)
    for n in ("users", "items"):
        for a, b in zip(numpy_tree(mesh.hashed[n]), numpy_tree(one.hashed[n])):
            np.testing.assert_array_equal(a, b, err_msg=n)  # slots, metadata, sketch: exactly
        np.testing.assert_allclose(np.asarray(mesh.tables[n]), np.asarray(one.tables[n]), rtol=1e-5, atol=1e-6)
        for a, b in zip(*(jax.tree.leaves(numpy_tree(s.emb_states[n])) for s in (mesh, one))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=n)
    for k in ("emb/admitted/items", "emb/evicted/items", "emb/unadmitted_lookups/items", "emb/occupancy/items",
              "emb/stale_dropped/items", "emb/stale_dropped/users"):
        assert [float(m[k]) for m in m8] == [float(m[k]) for m in m1], k
    assert sum(int(m["emb/evicted/items"]) for m in m1) > 0 and sum(int(m["emb/admitted/users"]) for m in m1) > 0
    # the mesh drops what one device drops: found in the rows every shard gave away, or by their keys
    assert sum(int(m["emb/stale_dropped/users"]) + int(m["emb/stale_dropped/items"]) for m in m1) > 0


@pytest.mark.slow
@pytest.mark.parametrize("opt", ["adam", "adagrad"])
def test_the_dense_optax_optimizers_start_a_new_ids_row_afresh_but_for_adams_table_wide_count(cfg_of, opt):
    """optimizer=adam and optimizer=adagrad (plain optax over the whole table): a slot given to a new id gets its
    per-row state reset (Adam's mu and nu to 0, Adagrad's sums to initial_accumulator_value), every other row keeps
    its own. Adam's step count is the table's (optax keeps one), so the new row's first update is bias-corrected
    by it: after 4 steps 0.55 of a fresh Adam row's first update (numpy below); Adagrad's equals a fresh row's."""
    program, data, _ = build(cfg_of([f"optimizer={opt}", "async_emb=off", *HASHED]))
    o, spec = program.emb_optimizers["users"], program.tables["users"]
    _, state, _, _ = run_steps(program, data, 4, flush=False)
    rows = spec.rows
    per_row = lambda leaf: getattr(leaf, "ndim", 0) >= 1 and leaf.shape[0] == rows  # noqa: E731
    # every per-row leaf moved off its initial value, so that a row left un-reset shows
    state = state._replace(emb_states={**state.emb_states, "users": jax.tree.map(
        lambda x: x + 1.0 if per_row(x) else x, state.emb_states["users"])})
    before = numpy_tree(state.emb_states["users"])
    raw = {n: jnp.asarray(v) for n, v in program.model.table_ids(
        {k: jnp.asarray(v) for k, v in data.batch(99, 32).items()}).items()}
    raw["users"] = jnp.asarray(ht.fingerprint(np.arange(10**12, 10**12 + spec.hash.capacity, dtype=np.int64)))[:, None]
    after, _, moved, _ = jax.jit(lambda st, r: hash_step.map_batch(program, st, r))(state, raw)
    changed = (np.asarray(moved["users"].before) != np.asarray(moved["users"].after)).any(-1)
    new = np.zeros(rows, bool)
    new[np.asarray(hr.slot_rows(spec.hash, jnp.asarray(np.flatnonzero(changed))))] = True
    assert new.sum() > 0
    initial = numpy_tree(o.init(1, spec.columns))
    for b, a, i in zip(*(jax.tree.leaves(x) for x in (before, numpy_tree(after.emb_states["users"]), initial))):
        if per_row(a):
            assert (a[new] == i[0]).all() and (b[new] != i[0]).all()
            np.testing.assert_array_equal(a[~new], b[~new])
        else:  # Adam's count: the table's 4 updates, untouched
            np.testing.assert_array_equal(a, b)
            assert int(a) == 4
    # the first update of the new rows, for the same gradient g on each of them
    g = np.where(new[:, None], np.float32(0.01), np.float32(0)) * np.ones((1, spec.columns), np.float32)
    upd, _ = jax.jit(o.transform().update)(jnp.asarray(g), after.emb_states["users"], after.tables["users"])
    got = np.asarray(upd)[new]
    lr, g0 = o.learning_rate, 0.01
    if opt == "adam":
        def adam_first(count):  # one step from zero moments, bias-corrected by update number ``count``
            mu, nu = (1 - o.b1) * g0 / (1 - o.b1 ** count), (1 - o.b2) * g0 ** 2 / (1 - o.b2 ** count)
            return -lr * mu / (np.sqrt(nu) + o.eps)
        np.testing.assert_allclose(got, adam_first(5), rtol=1e-5)  # the table's 5th update
        assert adam_first(5) / adam_first(1) == pytest.approx(0.5455, abs=1e-4)  # not a fresh row's first
    else:
        np.testing.assert_allclose(got, -lr * g0 / np.sqrt(o.initial_accumulator_value + g0 ** 2 + o.eps), rtol=1e-5)
