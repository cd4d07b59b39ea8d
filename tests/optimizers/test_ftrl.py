"""FTRL-Proximal's conventions, one row at a time, against the paper's closed forms written out by hand (the
contract in ``test_contract.py`` runs it through every layout against ``reference.FtrlReference``).

- the l2 convention: TensorFlow's ``2 * l2`` (default) and McMahan et al.'s ``l2`` give different, known steps;
- l1 makes weights exactly zero while ``|z| <= l1``;
- the first update of a row starts from its initial value, even with a large ``initial_accumulator``: the
  pitfall where ``z = 0`` at the start wipes initial embeddings does not happen here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers

WIDTH = 4


def one_update(opt, table: np.ndarray, grads: np.ndarray, state=None, valid_as: bool = True):
    """Apply one update that touches rows 1..len(grads) with ``grads`` (one token each); returns (table, state).
    ``valid_as``: whether the update must be written (false: refused, its result not finite)."""
    vocab = table.shape[0]
    ctx = optimizers.AsyncEmbContext(vocab, WIDTH, len(grads))
    ids = np.arange(1, len(grads) + 1, dtype=np.int32)
    update = optimizers.make_update(ctx, jnp.asarray(ids), jnp.asarray(grads, jnp.float32), True)
    state = opt.init(vocab, WIDTH) if state is None else state
    c = ctx.fresh()
    _, new_table, new_state = opt.gradient_update_start(c, update, jnp.asarray(table, jnp.float32), state,
                                                        jnp.zeros((), jnp.int32))
    _, valid, _ = opt.gradient_update_done(c, jnp.zeros((), jnp.int32))
    assert bool(valid) == valid_as
    return np.asarray(new_table), new_state


@pytest.mark.parametrize("tensorflow_l2, factor", [(True, 2.0), (False, 1.0)], ids=["tensorflow", "paper"])
@pytest.mark.slow
def test_the_l2_convention_from_a_zero_row(tensorflow_l2, factor):
    """From w = 0 (z = 0 on either reading): w' = -g / (sqrt(n0 + g**2) / alpha + factor * l2)."""
    alpha, l2, n0 = 0.5, 0.3, 0.1
    opt = optimizers.AsyncFtrl(learning_rate=alpha, l2=l2, initial_accumulator=n0, tensorflow_l2=tensorflow_l2)
    g = np.array([[0.5, -1.0, 2.0, 0.25]])
    table, _ = one_update(opt, np.zeros((3, WIDTH)), g)
    want = -g / (np.sqrt(n0 + g**2) / alpha + factor * l2)
    np.testing.assert_allclose(table[1], want[0], rtol=1e-6)
    np.testing.assert_array_equal(table[[0, 2]], 0.0)


@pytest.mark.slow
def test_l1_keeps_weights_exactly_zero_while_z_is_inside_it():
    """From w = 0: z' = g; |g| <= l1 gives exactly 0, else -(g - sign(g) l1) / (sqrt(n') / alpha)."""
    alpha, l1, n0 = 0.5, 0.6, 0.1
    opt = optimizers.AsyncFtrl(learning_rate=alpha, l1=l1, initial_accumulator=n0)
    g = np.array([[0.5, -0.6, 2.0, -1.5]])
    table, _ = one_update(opt, np.zeros((2, WIDTH)), g)
    want = np.where(np.abs(g) <= l1, 0.0, -(g - np.sign(g) * l1) / (np.sqrt(n0 + g**2) / alpha))
    np.testing.assert_allclose(table[1], want[0], rtol=1e-6)
    assert table[1, 0] == 0.0 and table[1, 1] == 0.0


@pytest.mark.parametrize("multiply", [False, True], ids=["z", "lr-times-z"])
@pytest.mark.slow
def test_the_first_update_steps_from_the_initial_embedding(multiply):
    """A large initial accumulator next to a small gradient: w' = w - g / (sqrt(n0 + g**2) / alpha), a small step.
    Starting from z = 0 instead would give w * (1 - sqrt(n0 / n')) - alpha * g / sqrt(n'): nearly 0."""
    alpha, n0 = 0.1, 10.0
    opt = optimizers.AsyncFtrl(learning_rate=alpha, initial_accumulator=n0, multiply_linear_by_learning_rate=multiply)
    w0 = np.random.default_rng(0).normal(size=(3, WIDTH)).astype(np.float32)
    g = np.full((1, WIDTH), 0.01)
    table, state = one_update(opt, w0, g)
    n1 = n0 + g**2
    np.testing.assert_allclose(table[1], (w0[1] - g / (np.sqrt(n1) / alpha))[0], rtol=1e-5)
    wiped = w0[1] * (1 - np.sqrt(n0 / n1[0])) - alpha * g[0] / np.sqrt(n1[0])
    assert np.all(np.abs(wiped) < 1e-3 * np.abs(w0[1]) + 1e-3)  # what z = 0 would have left of the row
    np.testing.assert_array_equal(table[[0, 2]], w0[[0, 2]])
    assert np.asarray(state.rows.count).tolist() == [0, 1, 0]

    # the second update goes on from z, not from the row again: the same two gradients on a fresh
    # optimizer from the first result would differ (n is larger now)
    table2, _ = one_update(opt, table, g, state)
    n2 = n1 + g**2
    z1 = -(w0[1] * np.sqrt(n0) / alpha) + g[0] - (np.sqrt(n1[0]) - np.sqrt(n0)) / alpha * w0[1]
    z2 = z1 + g[0] - (np.sqrt(n2[0]) - np.sqrt(n1[0])) / alpha * table[1].astype(np.float64)
    np.testing.assert_allclose(table2[1], -z2 / (np.sqrt(n2[0]) / alpha), rtol=1e-5)


def test_lr_power_stops_at_minus_4_where_n_to_the_4_is_finite_below_2_to_the_32():
    """The rule raises each accumulator to -lr_power in float32 (largest about 2**128). At the lowest lr_power
    allowed, -4, an accumulator just below 2**32 still updates; past it the update is refused as non-finite,
    and a lower lr_power would be refused far sooner, so ``problems`` names it."""
    assert optimizers.problems(optimizers.AsyncFtrl(lr_power=-100.0))[0].startswith(
        "lr_power=-100.0 is outside [-4, 0] (the per-coordinate step is learning_rate / n**(-lr_power)")
    assert optimizers.problems(optimizers.AsyncFtrl(lr_power=-4.0)) == []
    g = np.ones((1, WIDTH))
    kept = optimizers.AsyncFtrl(learning_rate=1.0, lr_power=-4.0, initial_accumulator=2.0**31)
    table, state = one_update(kept, np.ones((2, WIDTH)), g)  # written: the row counts its update
    assert np.isfinite(table).all() and np.asarray(state.rows.count).tolist() == [0, 1]
    beyond = optimizers.AsyncFtrl(learning_rate=1.0, lr_power=-4.0, initial_accumulator=2.0**33)
    table, state = one_update(beyond, np.ones((2, WIDTH)), g, valid_as=False)  # refused: nothing moves
    np.testing.assert_array_equal(table, 1.0)
    assert np.asarray(state.rows.count).tolist() == [0, 0]


def test_is_registered_fused_and_async_capable():
    opt = optimizers.create("async_ftrl")
    assert isinstance(opt, optimizers.AsyncFtrl) and "async_ftrl" in optimizers.FUSED
    assert optimizers.supports_async_emb(opt)
    assert opt.tensorflow_l2 and not opt.multiply_linear_by_learning_rate and opt.lr_power == -0.5
    state = jax.eval_shape(lambda: opt.init(10, WIDTH))
    assert {k: v.shape for k, v in state.rows._asdict().items()} == {"accum": (10, WIDTH), "linear": (10, WIDTH),
                                                                  "count": (10,)}
