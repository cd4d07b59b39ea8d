"""Lazy Adam equals ``optax.adam`` / ``optax.adamw`` run on each row's own gradient stream.

Rows are touched at different steps and different numbers of times, so a row first seen late must
bias-correct with its own count (1, 2, ...) and not with the global step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optimizers
from tests.optimizers.reference import dedupe_sum
from tests.optimizers.test_contract import fused_step

VOCAB, WIDTH, TOKENS, STEPS = 16, 4, 12, 7


def schedule(seed=0):
    """Per step: ids [TOKENS] from a shifting window (rows enter late, leave, return) plus padding."""
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(STEPS):
        lo = 1 + (2 * t) % 10
        ids = rng.integers(lo, lo + 5, size=TOKENS)
        ids[rng.random(TOKENS) < 0.2] = 0
        grads = rng.normal(size=(TOKENS, WIDTH)).astype(np.float32)
        steps.append((ids.astype(np.int32), grads))
    return steps


@pytest.mark.parametrize("hp", [
    dict(learning_rate=0.05, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0),
    dict(learning_rate=0.05, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.2),
], ids=["adam", "adamw"])
@pytest.mark.slow
def test_rows_follow_optax_on_their_own_stream(hp):
    steps = schedule()
    table0 = np.random.default_rng(1).normal(size=(VOCAB, WIDTH)).astype(np.float32)

    # The library: one fused update per step.
    opt = optimizers.AsyncAdam(**hp)
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS)
    step = fused_step(opt, ctx)
    table, state = jnp.asarray(table0), opt.init(VOCAB, WIDTH)
    for ids, grads in steps:
        table, state, _, valid = step(table, state, optimizers.make_update(ctx, ids, grads))
        assert bool(valid)

    # optax, row by row, on the steps that touched that row only.
    if hp["weight_decay"]:
        tx = optax.adamw(hp["learning_rate"], hp["b1"], hp["b2"], hp["eps"], weight_decay=hp["weight_decay"])
    else:
        tx = optax.adam(hp["learning_rate"], hp["b1"], hp["b2"], hp["eps"])
    update = jax.jit(tx.update)
    expected = table0.copy()
    mu, nu = np.zeros((VOCAB, WIDTH), np.float32), np.zeros((VOCAB, WIDTH), np.float32)
    counts = np.zeros(VOCAB, np.int64)
    streams = {r: [] for r in range(VOCAB)}
    for ids, grads in steps:
        rows, summed = dedupe_sum(ids, grads, VOCAB)
        for r, g in zip(rows, summed):
            streams[int(r)].append(g.astype(np.float32))
    for r, stream in streams.items():
        params = jnp.asarray(table0[r])
        opt_state = tx.init(params)
        for g in stream:
            updates, opt_state = update(jnp.asarray(g), opt_state, params)
            params = optax.apply_updates(params, updates)
        expected[r] = np.asarray(params)
        adam_state = opt_state[0]
        mu[r], nu[r], counts[r] = adam_state.mu, adam_state.nu, int(adam_state.count)

    assert len({len(s) for s in streams.values()}) > 2, "rows should see different numbers of updates"
    np.testing.assert_allclose(np.asarray(table), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state.rows.mu), mu, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(state.rows.nu), nu, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(state.rows.count), counts)
    assert int(state.count) == STEPS
