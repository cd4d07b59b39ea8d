"""Async mode equals sync mode with the embedding gradients delayed one step (an independent oracle loop),
every update lands exactly once after the flush, and a non-finite step is skipped without stopping training."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runner.build import build
from runner.core.loop import to_device
from tests.runner.support import numpy_tree, run_steps

LR = 0.3
STEPS = 5


def _oracle(program, data, state0, steps, delay, dc_lambda=None):
    """Plain loop: lookup from numpy tables, grads w.r.t. the looked-up rows, SGD on summed rows.

    ``delay=k``: step t applies G_{t-k} after reading its rows (async, staleness k), and the flush applies the
    k still queued, oldest first; ``delay=0``: applies G_t (sync). ``dc_lambda``: each summed gradient ``g``
    of a row becomes ``g + dc_lambda * g * g * (w_now - w_then)``, ``w_then`` the row its step read.
    """
    model, B = program.model, program.contexts["items"].tokens_per_batch // program.tables["items"].tokens_per_example
    tables = {n: np.array(t, np.float32) for n, t in state0.tables.items()}
    params, opt_state = state0.params, state0.opt_state
    queue, losses = [], []
    # jitted once per program (op-by-op dispatch compiled every primitive on its own); the oracle's point is
    # the plain numpy table update and the explicit delay below, not the model's gradient
    loss_and_grads = jax.jit(jax.value_and_grad(model.loss, argnums=(0, 1), has_aux=True))
    dense_update = jax.jit(program.dense_tx.update)

    def apply(grads):
        for n, (ids, g, then) in grads.items():
            acc = np.zeros_like(tables[n], np.float64)
            keep = ids != 0
            np.add.at(acc, ids[keep], g[keep])
            touched = np.unique(ids[keep])
            step = acc[touched]
            if dc_lambda is not None:
                w_then = np.zeros_like(tables[n], np.float64)
                w_then[ids[keep]] = then[keep]
                step = step + dc_lambda * step * step * (tables[n][touched] - w_then[touched])
            tables[n][touched] -= (LR * step).astype(np.float32)

    for t in range(steps):
        host = data.batch(t, B)
        batch = {k: jnp.asarray(host[k]) for k in program.model_keys}
        ids = {n: np.asarray(v) for n, v in model.table_ids(batch).items()}
        embs = {n: jnp.asarray(tables[n][ids[n]]) for n in ids}
        (loss, _), (gp, ge) = loss_and_grads(params, embs, batch)
        losses.append(float(loss))
        upd, opt_state = dense_update(gp, opt_state, params)
        params = optax.apply_updates(params, upd)
        grads = {n: (ids[n].reshape(-1), np.asarray(ge[n]).reshape(-1, ge[n].shape[-1]),
                     np.asarray(embs[n]).reshape(-1, ge[n].shape[-1])) for n in ids}
        queue.append(grads)
        if len(queue) > delay:
            apply(queue.pop(0))
    for grads in queue:
        apply(grads)  # the flush, oldest first
    return tables, params, losses


@pytest.mark.parametrize("mode", ["on", pytest.param("off", marks=pytest.mark.slow)])
def test_matches_oracle(cfg_of, mode):
    program, data, _ = build(cfg_of(["optimizer=async_sgd", f"optimizer.learning_rate={LR}", f"async_emb={mode}"]))
    state0, state, losses, _ = run_steps(program, data, STEPS)
    tables, params, ref_losses = _oracle(program, data, state0, STEPS, delay=1 if mode == "on" else 0)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for n in tables:
        np.testing.assert_allclose(np.asarray(state.tables[n]), tables[n], rtol=1e-4, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
                 state.params, params)


DC_LAMBDA = 3e5  # this task's summed row gradients are ~1e-3: a lambda this large makes the correction matter


@pytest.mark.parametrize("staleness, dc", [pytest.param(2, False, marks=pytest.mark.slow), (3, True),
                                           pytest.param(1, True, marks=pytest.mark.slow)],
                         ids=["k2", "k3-dc", "k1-dc"])
def test_bounded_staleness_and_delay_compensation_match_the_oracle(cfg_of, staleness, dc):
    """``async_emb.staleness=k``: step t applies step t-k's update and the flush applies the k queued, in order;
    ``compensation=dc`` corrects each by the rows its step read. The oracle also runs without the correction
    and with k - 1, and the run must be nearer this oracle than those (so the check could fail)."""
    over = ["optimizer=async_sgd", f"optimizer.learning_rate={LR}", "async_emb=on",
            f"async_emb.staleness={staleness}"] + (["async_emb.compensation=dc", f"async_emb.dc_lambda={DC_LAMBDA}"]
                                                    if dc else [])
    program, data, _ = build(cfg_of(over))
    assert program.staleness == staleness and program.contexts["items"].compensates == dc
    steps = STEPS + staleness
    state0, state, losses, metrics = run_steps(program, data, steps)
    lam = DC_LAMBDA if dc else None
    tables, params, ref_losses = _oracle(program, data, state0, steps, delay=staleness, dc_lambda=lam)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for n in tables:
        np.testing.assert_allclose(np.asarray(state.tables[n]), tables[n], rtol=1e-4, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
                 state.params, params)
    # the first k steps apply nothing; every later one applies one update
    assert [bool(m["emb/valid_step"]) for m in metrics] == [False] * staleness + [True] * STEPS
    other = _oracle(program, data, state0, steps, delay=staleness, dc_lambda=None if dc else DC_LAMBDA)[0] \
        if dc else _oracle(program, data, state0, steps, delay=staleness - 1)[0]
    gap = lambda ref: max(float(np.abs(np.asarray(state.tables[n]) - ref[n]).max()) for n in ref)  # noqa: E731
    assert gap(other) > 20 * max(gap(tables), 1e-7)


@pytest.mark.slow
def test_the_flush_of_a_long_queue_is_one_update_a_table_in_a_loop(cfg_of):
    """The flush applies a queue of k records in a loop (``lax.scan``), not unrolled: its program holds as many
    scatters for k = 16 as for k = 2 (unrolled, a queue of 64 took minutes to compile)."""
    def flush_ops(k):
        program, data, _ = build(cfg_of(["async_emb=on", f"async_emb.staleness={k}"]))
        state = program.init_state(0)
        batch = to_device(program, data.batch(0, program.contexts["items"].tokens_per_batch
                                              // program.tables["items"].tokens_per_example))
        _, flush, _ = program.compile(state, batch)
        text = flush.lower(state).as_text()
        return text.count("stablehlo.scatter"), text.count("stablehlo.while")

    (short, loops), (long, loops_long) = flush_ops(2), flush_ops(16)
    assert short == long > 0 and loops == loops_long >= 1


@pytest.mark.slow
def test_async_differs_from_sync_and_is_one_step_stale(cfg_of):
    """Same data, same kernels: the two modes must really differ (the oracle test above could not pass
    for both modes with the same code path), and async's first step applies nothing."""
    runs = {}
    for mode in ("on", "off"):
        program, data, _ = build(cfg_of(["optimizer=async_sgd", f"optimizer.learning_rate={LR}",
                                         f"async_emb={mode}"]))
        runs[mode] = run_steps(program, data, 3)
    (_, a_state, _, a_metrics), (_, s_state, _, s_metrics) = runs["on"], runs["off"]
    assert not np.allclose(np.asarray(a_state.tables["items"]), np.asarray(s_state.tables["items"]))
    assert not bool(a_metrics[0]["emb/valid_step"]) and bool(a_metrics[1]["emb/valid_step"])
    assert all(bool(m["emb/valid_step"]) for m in s_metrics)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [[], ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"]],
                         ids=["single", "2x4-row-routed"])
def test_stale_rows_counted_on_logged_steps(cfg_of, mesh):
    """``emb/stale_rows``: rows a batch reads whose previous-step update is still pending, i.e. the ids
    batch t shares with batch t-1; computed on the steps the loop logs (every 2nd and the last), -1 else.
    ``emb/unique_rows``: the batch's distinct ids, every step on one device; routed (per-device update
    records, no dedupe of the whole batch), on logged steps only, -1 else."""
    steps = 5
    program, data, _ = build(cfg_of(["optimizer=async_sgd", "async_emb=on", "trainer.log_interval=2",
                                     f"trainer.steps={steps}", *mesh]))
    routed = program.contexts["items"].routed
    assert routed == bool(mesh)
    _, _, _, metrics = run_steps(program, data, steps)
    B = program.contexts["items"].tokens_per_batch // program.tables["items"].tokens_per_example

    def unique_ids(t):
        batch = {k: jnp.asarray(v) for k, v in data.batch(t, B).items() if k in program.model_keys}
        return {n: set(np.unique(np.asarray(ids)).tolist()) - {0} for n, ids in program.model.table_ids(batch).items()}

    seen = [unique_ids(t) for t in range(steps)]
    for t, m in enumerate(metrics):
        logged = (t + 1) % 2 == 0 or t + 1 == steps
        distinct = sum(len(ids) for ids in seen[t].values())
        assert int(m["emb/unique_rows"]) == (distinct if logged or not routed else -1), t
        if not logged:
            assert int(m["emb/stale_rows"]) == -1
            continue
        want = {n: len(ids & seen[t - 1][n]) if t > 0 else 0 for n, ids in seen[t].items()}
        for n, w in want.items():
            assert int(m[f"emb/stale_rows/{n}"]) == w, (t, n)
        assert int(m["emb/stale_rows"]) == sum(want.values()) > 0  # hot ids repeat batch to batch


def test_every_update_applied_exactly_once_after_flush(cfg_of):
    program, data, _ = build(cfg_of(["optimizer=async_adam", "async_emb=on"]))
    B = program.contexts["items"].tokens_per_batch // program.tables["items"].tokens_per_example
    _, state, _, _ = run_steps(program, data, STEPS)
    for n, st in state.emb_states.items():
        assert int(st.count) == STEPS  # one valid update per step, the last one by the flush
        seen = np.zeros(program.tables[n].rows, np.int32)
        for t in range(STEPS):
            batch = {k: jnp.asarray(v) for k, v in data.batch(t, B).items() if k in program.model_keys}
            ids = np.unique(np.asarray(program.model.table_ids(batch)[n]))
            seen[ids[ids != 0]] += 1
        np.testing.assert_array_equal(np.asarray(st.rows.count), seen)  # per-row Adam counts
        assert not bool(state.pending[n].pending)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["on", "off"])
def test_nonfinite_step_is_skipped_and_training_continues(cfg_of, mode):
    program, data, _ = build(cfg_of(["optimizer=async_rowwise_adagrad", f"async_emb={mode}"]))
    B = program.contexts["items"].tokens_per_batch // program.tables["items"].tokens_per_example
    state = program.init_state(0)
    step, flush, _ = program.compile(state, to_device(program, data.batch(0, B)))
    state, _ = step(state, to_device(program, data.batch(0, B)))
    if mode == "on":
        state = flush(state)
    before = numpy_tree((state.tables, state.emb_states, state.params))
    bad = data.batch(1, B)
    bad["labels"] = np.full_like(bad["labels"], np.nan)
    state, m = step(state, to_device(program, bad))
    if mode == "on":  # the poisoned gradient is deferred: it is refused when applied, one step later
        state, m = step(state, to_device(program, data.batch(2, B)))
        assert not bool(m["emb/valid_step"])
        after = numpy_tree((state.tables, state.emb_states))
        jax.tree.map(np.testing.assert_array_equal, before[:2], after)
    else:
        assert not bool(m["emb/valid_step"]) and not np.isfinite(float(m["dense/grad_norm"]))
        after = numpy_tree((state.tables, state.emb_states, state.params))
        jax.tree.map(np.testing.assert_array_equal, before, after)
    state, m = step(state, to_device(program, data.batch(3, B)))
    assert np.isfinite(float(m["train/loss"])) and bool(m["emb/valid_step"])
    for t in state.tables.values():
        assert np.isfinite(np.asarray(t)).all()
