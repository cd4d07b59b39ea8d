"""The AsyncEmbOptimizer protocol: who supports the fused async update, the exact refusal message, and the
dense optax baselines (sync only) against optax itself."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optimizers
from optimizers import AsyncEmbOptimizer, supports_async_emb
from tests.optimizers.test_contract import unranged


def refusal(name: str) -> str:
    return (f"use_async_emb requires an embedding optimizer implementing AsyncEmbOptimizer, "
            f"and {name} has no fused table update")


class OnlyDone(AsyncEmbOptimizer):
    def gradient_update_done(self, context, gate):
        return jnp.zeros(()), jnp.ones((), bool), gate


class OnlyStart(AsyncEmbOptimizer):
    def gradient_update_start(self, context, update, table, state, gate):
        return (), table, state


class Nothing(AsyncEmbOptimizer):
    pass


# ----------------------------------------------------------------------------------------------------
# supports_async_emb and the refusal
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", optimizers.FUSED)
def test_fused_optimizers_support_async_emb(name):
    assert supports_async_emb(optimizers.REGISTRY[name])
    assert supports_async_emb(optimizers.create(name))


@pytest.mark.parametrize("cls", [optimizers.Adam, optimizers.Adagrad, OnlyDone, OnlyStart, Nothing])
def test_others_do_not_support_async_emb(cls):
    assert not supports_async_emb(cls)
    assert not supports_async_emb(cls())


def test_registry_holds_exactly_the_fused_and_dense_optimizers():
    dense = {n for n, c in optimizers.REGISTRY.items() if not supports_async_emb(c)}
    assert dense == {"adam", "adagrad"}
    assert set(optimizers.FUSED) == set(optimizers.REGISTRY) - dense


@pytest.mark.parametrize("cls,method", [
    (optimizers.Adam, "gradient_update_start"), (optimizers.Adam, "gradient_update_done"),
    (optimizers.Adagrad, "gradient_update_start"), (optimizers.Adagrad, "gradient_update_done"),
    (OnlyDone, "gradient_update_start"), (OnlyStart, "gradient_update_done"),
    (Nothing, "gradient_update_start"), (Nothing, "gradient_update_done"),
])
def test_default_methods_refuse_with_the_class_name(cls, method):
    fn = getattr(cls(), method)
    args = (None,) * (5 if method == "gradient_update_start" else 2)
    with pytest.raises(NotImplementedError) as err:
        fn(*args)
    assert str(err.value) == refusal(cls.__name__)


def test_unknown_optimizer_name_is_refused():
    with pytest.raises(ValueError, match=r"unknown embedding optimizer 'adamax'; known: async_adam, "):
        optimizers.create("adamax")


# ----------------------------------------------------------------------------------------------------
# The dense optax baselines
# ----------------------------------------------------------------------------------------------------
VOCAB, WIDTH, TOKENS = 16, 4, 10


def dense_gradient(ids, grads):
    """Scatter-add of the non-padding tokens' gradients into a table-sized gradient, in numpy."""
    g = np.zeros((VOCAB, WIDTH), np.float32)
    keep = (ids > 0) & (ids < VOCAB)
    np.add.at(g, ids[keep], grads[keep])
    return g


@pytest.mark.parametrize("opt,tx", [
    (optimizers.Adam(learning_rate=0.05, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1),
     optax.adamw(0.05, 0.8, 0.95, 1e-6, weight_decay=0.1)),
    (optimizers.Adagrad(learning_rate=0.1, initial_accumulator_value=0.2, eps=1e-6),
     optax.adagrad(0.1, initial_accumulator_value=0.2, eps=1e-6)),
], ids=["adam", "adagrad"])
@pytest.mark.slow
def test_dense_apply_matches_optax_and_skips_bad_steps(opt, tx):
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS)
    apply = jax.jit(functools.partial(opt.apply_dense, ctx))
    rng = np.random.default_rng(0)
    table0 = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table, state = jnp.asarray(table0), opt.init(VOCAB, WIDTH)
    params, opt_state = jnp.asarray(table0), tx.init(jnp.asarray(table0))
    tx_update = jax.jit(tx.update)

    for i in range(6):
        ids = rng.integers(0, VOCAB, size=TOKENS).astype(np.int32)
        grads = rng.normal(size=(TOKENS, WIDTH)).astype(np.float32)
        bad = i in (2, 4)
        if bad:
            grads[np.argmax(ids > 0), 0] = np.nan if i == 2 else np.inf
        update = optimizers.empty_update(ctx) if i == 3 else optimizers.make_update(ctx, ids, grads)
        before = jax.tree.map(np.array, (table, state))

        table, state, norm, valid = apply(update, table, state)

        if bad or i == 3:
            assert not bool(valid)
            jax.tree.map(np.testing.assert_array_equal, (np.asarray(table), jax.tree.map(np.asarray, state)),
                         before)
            continue
        assert bool(valid)
        g = dense_gradient(ids, grads)
        np.testing.assert_allclose(float(norm), np.linalg.norm(g.astype(np.float64)), rtol=1e-6)
        updates, opt_state = tx_update(jnp.asarray(g), opt_state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(np.asarray(table), np.asarray(params), rtol=1e-5, atol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7),
                     state, opt_state)


# eps=0 and b1=1 are out of range (the update refuses them before it is traced): a class without ranges has them
@pytest.mark.parametrize("opt", [
    unranged(optimizers.Adam)(learning_rate=0.05, eps=0.0),  # untouched rows: 0 / (sqrt(0) + 0)
    unranged(optimizers.Adam)(learning_rate=0.05, b1=1.0),  # bias correction divides by 1 - 1**t = 0
    optimizers.Adam(learning_rate=3e38),  # finite gradient, the step overflows float32
    optimizers.Adagrad(learning_rate=3e38),
], ids=["adam-eps0", "adam-b1=1", "adam-lr3e38", "adagrad-lr3e38"])
def test_dense_apply_refuses_a_non_finite_result(opt):
    """A finite gradient whose new table or state is not finite changes nothing and is not valid."""
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS)
    rng = np.random.default_rng(1)
    table = jnp.asarray(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32) * 1e38)
    state = opt.init(VOCAB, WIDTH)
    ids = np.arange(1, TOKENS + 1, dtype=np.int32)
    grads = rng.normal(size=(TOKENS, WIDTH)).astype(np.float32)
    before = jax.tree.map(np.array, (table, state))
    table, state, norm, valid = jax.jit(functools.partial(opt.apply_dense, ctx))(
        optimizers.make_update(ctx, ids, grads), table, state)
    assert np.isfinite(float(norm)) and not bool(valid)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, (table, state)), before)
