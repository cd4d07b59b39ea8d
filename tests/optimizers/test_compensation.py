"""Delay compensation (DC-ASGD; ``AsyncEmbContext.dc_lambda``) against the dense numpy reference.

A deferred gradient was computed on rows that have moved since: every touched row's summed gradient ``g``
becomes ``g + dc_lambda * g * g * (w_now - w_then)`` before the optimizer's rule, ``w_then`` the row the
gradient was computed on (carried per token in the update record) and ``w_now`` the row as the update finds
it. Checked on every table layout, with ``w_then`` taken from the table two updates back (as a staleness of
two would), so the correction is not zero.
"""
from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers
from optimizers.layouts import REGISTRY, Routing
from tests.optimizers.reference import reference_for
from tests.optimizers.test_contract import (BATCH, DRAWN, SEQ, TOKENS, VOCAB, WIDTH, batch, fused_step,
                                            initial_table, leaves, placed)

LAMBDA = 0.5
CASES = [("async_rowwise_adagrad", dict(learning_rate=0.3, eps=1e-8, initial_accumulator_value=0.1)),
         ("async_adam", dict(learning_rate=0.1, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1))]


@functools.lru_cache(maxsize=None)
def context(layout: str, dc_lambda: float | None = LAMBDA) -> optimizers.AsyncEmbContext:
    want = REGISTRY[layout]
    if want.table_layout is None:
        return optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, dc_lambda=dc_lambda)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table",
                                     table_layout=want.table_layout, routing=want.routing or Routing.alltoall,
                                     dc_lambda=dc_lambda)
    assert ctx.layout is want
    return ctx


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("layout", list(REGISTRY))
def test_compensated_updates_match_the_reference(case, layout):
    name, hp = case
    opt = optimizers.create(name, **hp)
    ctx = context(layout)
    step = fused_step(opt, ctx)
    make = jax.jit(lambda ids, g, rows: optimizers.make_update(ctx, ids, g, True, rows=rows))
    table0 = initial_table(3)
    ref, plain = reference_for(name, opt, table0), reference_for(name, opt, table0)
    table, state = placed(ctx, jnp.asarray(table0), opt.init(VOCAB, WIDTH))
    history = [table0.copy(), table0.copy()]  # the table two updates back is what the gradient saw
    rng = np.random.default_rng(4)
    for i in range(5):
        ids, grads = batch(rng)
        then = history[-2][ids.reshape(-1)].astype(np.float32)
        table, state, norm, valid = step(table, state, make(ids, grads, then))
        ref_norm, ref_valid, touched = ref.step(ids, grads, True, then=then, dc_lambda=LAMBDA)
        plain.step(ids, grads, True)
        assert bool(valid) and ref_valid
        np.testing.assert_allclose(float(norm), ref_norm, rtol=1e-6, err_msg=f"update {i}: norm (of g)")
        got = np.asarray(table)
        # 1e-6 of the table's scale (its rows are unit normals): a value that cancels to near 0 keeps the
        # float32 rounding of the larger terms it came from
        np.testing.assert_allclose(got[touched], ref.table[touched], rtol=1e-6, atol=1e-6,
                                   err_msg=f"update {i}: touched rows")
        for key, leaf in leaves(state).items():
            np.testing.assert_allclose(leaf[touched], ref.state[key][touched], rtol=1e-6, atol=1e-6,
                                       err_msg=f"update {i}: state {key}")
        history.append(got.copy())
    np.testing.assert_array_equal(np.asarray(table)[DRAWN:], table0[DRAWN:])
    assert np.abs(ref.table - plain.table).max() > 1e-2  # the correction mattered: uncompensated ends elsewhere


@pytest.mark.slow
def test_without_the_correction_the_same_rows_differ():
    """The correction is not a no-op: the same updates uncompensated end elsewhere (so the check above can
    fail), and a compensated record whose w_then equals the row now changes nothing against no compensation."""
    name, hp = CASES[0]
    opt = optimizers.create(name, **hp)
    plain, comp = context("single", None), context("single")
    rng = np.random.default_rng(5)
    ids, grads = batch(rng)
    table0 = initial_table(3)
    fresh = lambda: (jnp.asarray(table0), opt.init(VOCAB, WIDTH))  # noqa: E731
    a = fused_step(opt, plain)(*fresh(), optimizers.make_update(plain, ids, grads))[0]
    same = fused_step(opt, comp)(*fresh(), optimizers.make_update(comp, ids, grads, rows=table0[ids]))[0]
    off = fused_step(opt, comp)(*fresh(), optimizers.make_update(comp, ids, grads, rows=table0[ids] - 0.5))[0]
    np.testing.assert_array_equal(np.asarray(same), np.asarray(a))
    assert np.abs(np.asarray(off) - np.asarray(a)).max() > 1e-3


def test_a_record_without_rows_is_refused_on_a_compensating_context():
    opt = optimizers.create(*CASES[0][:1], **CASES[0][1])
    comp, plain = context("single"), context("single", None)
    ids, grads = batch(np.random.default_rng(6))
    with pytest.raises(ValueError, match="pass rows="):
        optimizers.make_update(comp, ids, grads)
    record = optimizers.make_update(plain, ids, grads)
    with pytest.raises(ValueError, match="without rows .* with delay compensation"):
        fused_step(opt, comp)(jnp.asarray(initial_table()), opt.init(VOCAB, WIDTH), record)
    assert optimizers.empty_update(comp).rows.shape == (BATCH * SEQ, WIDTH)


@pytest.mark.parametrize("shape", [(TOKENS, WIDTH // 2), (TOKENS // 2, WIDTH), (TOKENS,)])
def test_rows_that_are_not_one_row_per_token_are_refused_by_make_update(shape):
    """Before: ``make_update`` built the record, and only the update refused it (``rows ... do not match its grads``)."""
    ids, grads = batch(np.random.default_rng(6))
    with pytest.raises(ValueError, match=re.escape(
            f"rows {list(shape)} must be each token's row as its gradient was computed on it: one row of the table's "
            f"width {WIDTH} (ctx.emb_width) per id, [{TOKENS}, {WIDTH}] like the gradients (the looked-up rows)")):
        optimizers.make_update(context("single"), ids, grads, rows=np.zeros(shape, np.float32))
    rows = optimizers.make_update(context("single"), ids, grads, rows=np.ones((BATCH, SEQ, WIDTH), np.int32)).rows
    assert rows.dtype == jnp.float32 and rows.shape == (TOKENS, WIDTH)


@pytest.mark.parametrize("value, message", [
    (-5.0, "dc_lambda=-5.0 is outside [0, inf)"), (float("nan"), "dc_lambda=nan is outside [0, inf)"),
    (float("inf"), "dc_lambda=inf is outside [0, inf)"), ("100", "dc_lambda='100' is not a number"),
    (1e39, "dc_lambda=1e+39 is beyond float32's largest number (3.4e+38), the precision the update runs in: it would "
           "be inf there"),
], ids=["negative", "nan", "inf", "word", "beyond-float32"])
def test_a_dc_lambda_that_is_not_a_finite_number_at_least_0_is_refused(value, message):
    with pytest.raises(ValueError) as err:
        optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, dc_lambda=value)
    doc = " (delay compensation's strength: a finite number >= 0, or None for no compensation)"
    assert str(err.value) == message + ("" if "float32" in message else doc)


def test_dc_lambda_0_carries_rows_and_none_turns_compensation_off():
    assert optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, dc_lambda=0.0).compensates
    assert not optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, dc_lambda=None).compensates
