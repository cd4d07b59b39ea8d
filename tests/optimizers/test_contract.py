"""The contract every fused embedding optimizer keeps (as optax's ``contrib/_common_test.py`` does).

Each case in ``CASES`` runs through the same checks against the independent numpy reference in
``reference.py``: parity of touched rows and their state, untouched rows and state bit-for-bit unchanged,
the global norm of the deduped gradient, padding tokens ignored, non-finite steps skipped, updates whose
result is not finite refused, and non-pending updates ignored. A new optimizer gets all of them by adding
one line to ``CASES`` (and its reference). Every check runs on every table layout in the registry
(``optimizers.layouts.REGISTRY``: one device, and the sharded ones on a 2x4 ('data', 'table') mesh of CPU
devices), so a new layout gets them all by registering itself; a case that only varies the per-row rule
(``RULE_VARIANTS``) runs on one device and the column layout.

The library runs as the runner runs it: ``make_update``, then ``gradient_update_start`` /
``gradient_update_done`` under one ``jax.jit`` per case with the table and state donated.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import optimizers
from optimizers.layouts import REGISTRY, Routing
from tests.optimizers.reference import REFERENCES, reference_for

VOCAB, WIDTH, BATCH, SEQ = 32, 8, 4, 6
TOKENS = BATCH * SEQ
DRAWN = 24  # ids are drawn from [0, DRAWN): rows DRAWN.. are never touched

# (registry name, hyperparameters): one line per optimizer configuration.
CASES = [
    ("async_adam", dict(learning_rate=0.02, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1)),
    ("async_adam", {}),
    ("async_rowwise_adagrad", dict(learning_rate=0.05, eps=1e-8, initial_accumulator_value=0.5,
                                   half_life_steps=3.0, lazy_decay=True, weight_decay=0.05)),
    ("async_rowwise_adagrad", dict(learning_rate=0.05, eps=1e-8, initial_accumulator_value=0.5,
                                   half_life_steps=3.0, lazy_decay=False, weight_decay=0.05)),
    ("async_rowwise_adagrad", {}),
    ("async_adagrad", dict(learning_rate=0.1, eps=1e-8, initial_accumulator_value=0.2, weight_decay=0.05)),
    ("async_sgd", dict(learning_rate=0.2, weight_decay=0.1)),
    ("async_ftrl", dict(learning_rate=0.3, lr_power=-0.5, l1=0.05, l2=0.1, beta=0.5, initial_accumulator=0.5)),
    ("async_ftrl", dict(learning_rate=0.3, lr_power=-0.3, l1=0.05, l2=0.1, beta=0.0, initial_accumulator=0.2,
                        tensorflow_l2=False, multiply_linear_by_learning_rate=True)),
    ("async_partial_rowwise_adam", dict(learning_rate=0.02, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1)),
    ("async_partial_rowwise_adam", dict(learning_rate=0.02, eps=1e-6, bias_correction="global")),
    ("async_rowwise_adagrad_momentum", dict(learning_rate=0.05, momentum=0.8, eps=1e-8,
                                            initial_accumulator_value=0.5, weight_decay=0.05)),
    ("async_adam", dict(learning_rate=0.02, b1=0.8, b2=0.95, eps=1e-6, bias_correction="global")),
    ("async_rowwise_adagrad", dict(learning_rate=0.05, eps=1e-8, initial_accumulator_value=0.5, weight_decay=0.05,
                                   weight_decay_mode="l2")),
    ("async_adam", dict(learning_rate=0.02, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1,
                        weight_decay_mode="decoupled_global")),
]


def case_id(case) -> str:
    name, hp = case
    return name + ("-" + "-".join(f"{k}={v}" for k, v in hp.items()) if hp else "-defaults")


PARAMS = [pytest.param(c, id=case_id(c)) for c in CASES]


# ----------------------------------------------------------------------------------------------------
# Driving the library and the reference side by side
# ----------------------------------------------------------------------------------------------------
def fused_step(opt, ctx):
    """One jitted ``(table, state, update) -> (table, state, norm, valid)``, table and state donated."""

    def step(table, state, update):
        c = ctx.fresh()
        keepalive, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros((), jnp.int32))
        norm, valid, _ = opt.gradient_update_done(c, keepalive[0])
        return table, state, norm, valid

    return jax.jit(step, donate_argnums=(0, 1))


CTX = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS)
build_update = jax.jit(functools.partial(optimizers.make_update, CTX))
# make test-fast runs the contract on one device and on the runner's default sharded layout (routed rows); make test
# (CI) on every registered layout. The other layouts' parity with one device stays in make test-fast through
# tests/optimizers/test_sharded.py.
FAST_LAYOUTS = ("single", "row_routed")


def _layout_param(*values, layout: str, ident: str):
    return pytest.param(*values, id=ident, marks=() if layout in FAST_LAYOUTS else pytest.mark.slow)


LAYOUTS = [_layout_param(name, layout=name, ident=name) for name in REGISTRY]  # every registered layout, by name
# Cases that only change the per-row rule (a bias-correction count, FTRL's lr * z form, l2 in the gradient): every
# layout runs the same rule, so they run on one device and on the column layout, the one that splits a row's
# width (l2's squared penalty is summed across it). Every other case runs on every layout.
RULE_VARIANTS = {case_id(c) for c in CASES if c[1].get("bias_correction") == "global"
                 or c[1].get("multiply_linear_by_learning_rate") or c[1].get("weight_decay_mode") == "l2"}
PAIRS = [_layout_param(c, name, layout=name, ident=f"{name}-{case_id(c)}") for c in CASES for name in REGISTRY
         if case_id(c) not in RULE_VARIANTS or name in ("single", "column")]
FIRST_OF_EACH = [c for i, c in enumerate(CASES) if c[1] and all(c[0] != d[0] for d in CASES[:i] if d[1])]


@functools.lru_cache(maxsize=None)
def context(layout: str = "single") -> optimizers.AsyncEmbContext:
    """The contract's table on ``layout``: one device, or split over the 'table' axis of a 2x4 mesh."""
    want = REGISTRY[layout]
    if want.table_layout is None:
        ctx = CTX
    else:
        mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
        ctx = optimizers.AsyncEmbContext(VOCAB, WIDTH, TOKENS, mesh=mesh, table_axis="table",
                                         table_layout=want.table_layout, routing=want.routing or Routing.alltoall)
    assert ctx.layout is want, f"the words of {layout} select {ctx.layout}"
    return ctx


@functools.lru_cache(maxsize=None)
def updater(layout: str = "single"):
    """``make_update`` for ``layout``'s context, jitted."""
    return build_update if layout == "single" else jax.jit(functools.partial(optimizers.make_update, context(layout)))


@functools.lru_cache(maxsize=None)
def unranged(cls: type) -> type:
    """``cls`` with its hyperparameters' ranges lifted: the same rule, fields and defaults, but, like a user's class
    that declares no ranges, nothing for ``optimizers.problems`` to refuse, so the update's own check
    (``optimizers.checks.check_hparams``) lets it through. ``POISON``'s values are out of range on purpose."""
    lifted = [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(cls)
              if "range" in f.metadata]
    return dataclasses.make_dataclass(f"Unranged{cls.__name__}", lifted, bases=(cls,), frozen=True)


@functools.lru_cache(maxsize=None)
def _library(name: str, hp: tuple, layout: str):
    # The class itself, or, for POISON's values (out of range on purpose: optimizers.create and the update's own
    # check refuse them), the class without ranges; test_every_case_passes_create checks that the cases are valid.
    cls = optimizers.REGISTRY[name]
    opt = (unranged(cls) if optimizers.problems(cls(**dict(hp))) else cls)(**dict(hp))
    return opt, fused_step(opt, context(layout))


def library(case, layout: str = "single"):
    name, hp = case
    return _library(name, tuple(sorted(hp.items())), layout)


def placed(ctx, table, state):
    """Table and state laid out as ``ctx``'s layout keeps them (as they are on one device)."""
    if not ctx.sharded:
        return table, state
    named = lambda spec: NamedSharding(ctx.mesh, spec)  # noqa: E731
    return (jax.device_put(table, named(ctx.table_spec())),
            jax.device_put(state, jax.tree.map(named, ctx.state_specs(state))))


def initial_table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(VOCAB, WIDTH)).astype(np.float32)


def batch(rng, *, pad_frac=0.25, out_of_range=False, pad_grad=None):
    """ids [BATCH, SEQ] with repeats and padding (id 0); grads [BATCH, SEQ, WIDTH] in steps of 1/64.

    Dyadic gradients make every segment sum exact in float32 and float64 alike, so a comparison measures
    the rule and not the summation order. Padding tokens get gradients too (``pad_grad`` if given).
    """
    ids = rng.integers(1, DRAWN, size=(BATCH, SEQ))
    ids[rng.random((BATCH, SEQ)) < pad_frac] = 0
    ids[0, :2] = ids[1, :2]  # at least two repeated ids
    if out_of_range:
        ids[2, 0], ids[3, 0] = VOCAB + 3, -1
    grads = np.round(rng.normal(size=(BATCH, SEQ, WIDTH)) * 64) / 64
    if pad_grad is not None:
        grads[(ids == 0) | (ids >= VOCAB) | (ids < 0)] = pad_grad
    return ids.astype(np.int32), grads.astype(np.float32)


def leaves(state) -> dict[str, np.ndarray]:
    """The library state as numpy copies (copies: the device buffers are donated to the next step)."""
    return {k: np.array(v) for k, v in state.rows._asdict().items()}


def run(case, steps, seed=0, layout="single"):
    """Run ``steps`` through the library (on ``layout``) and the reference, checking the contract after every
    step.

    Each step is ``(ids, grads, pending)``, or ``"empty"`` for ``optimizers.empty_update``. Returns the
    per-step ``(norm, valid)`` the library reported.
    """
    name, _ = case
    opt, step = library(case, layout)
    ctx, make = context(layout), updater(layout)
    table0 = initial_table(seed)
    ref = reference_for(name, opt, table0)
    table, state = placed(ctx, jnp.asarray(table0), opt.init(VOCAB, WIDTH))
    assert set(leaves(state)) == set(ref.state), "library and reference state leaves differ"
    for key, leaf in leaves(state).items():
        np.testing.assert_allclose(leaf, ref.state[key], rtol=1e-6, err_msg=f"initial {key}")

    reported = []
    for i, s in enumerate(steps):
        if isinstance(s, str) and s == "empty":
            update = optimizers.empty_update(ctx)
            ids, grads, pending = np.zeros(TOKENS, np.int32), np.zeros((TOKENS, WIDTH), np.float32), False
        else:
            ids, grads, pending = s
            update = make(ids, grads, pending)
        before_table, before_state = np.array(table), leaves(state)

        table, state, norm, valid = step(table, state, update)
        ref_norm, ref_valid, touched = ref.step(ids, grads, pending)
        norm, valid = float(norm), bool(valid)
        reported.append((norm, valid))
        after_table, after_state = np.array(table), leaves(state)

        where = f"step {i}"
        assert valid == ref_valid, where
        if np.isfinite(ref_norm):
            np.testing.assert_allclose(norm, ref_norm, rtol=1e-6, err_msg=f"{where}: norm")
        else:
            assert not np.isfinite(norm), f"{where}: norm {norm} should not be finite"
        assert int(state.count) == ref.count, f"{where}: update count"

        untouched = np.setdiff1d(np.arange(VOCAB), touched)
        assert np.array_equal(after_table[untouched], before_table[untouched]), f"{where}: untouched rows moved"
        for key in after_state:
            assert np.array_equal(after_state[key][untouched], before_state[key][untouched]), \
                f"{where}: state {key} of untouched rows moved"
        np.testing.assert_allclose(after_table[touched], ref.table[touched], rtol=1e-6, atol=1e-6,
                                   err_msg=f"{where}: touched rows")
        for key in after_state:  # atol 1e-7 of the leaf's scale: a value summed from larger terms (FTRL's z)
            scale = max(1.0, float(np.abs(ref.state[key][touched]).max(initial=0.0)))  # keeps their float32 error
            np.testing.assert_allclose(after_state[key][touched], ref.state[key][touched], rtol=1e-6,
                                       atol=1e-7 * scale, err_msg=f"{where}: state {key} of touched rows")
    np.testing.assert_array_equal(np.array(table)[DRAWN:], table0[DRAWN:])  # never-drawn rows never move
    return reported


def finite_steps(n, seed=1, **kw):
    rng = np.random.default_rng(seed)
    return [(*batch(rng, **kw), True) for _ in range(n)]


# ----------------------------------------------------------------------------------------------------
# The checks
# ----------------------------------------------------------------------------------------------------
def test_every_fused_optimizer_has_a_case_and_a_reference():
    assert {name for name, _ in CASES} == set(optimizers.FUSED)
    assert set(optimizers.FUSED) <= set(REFERENCES)


@pytest.mark.parametrize("case", PARAMS)
def test_every_case_passes_create(case):
    """Every case is a valid configuration: ``optimizers.create`` builds it (its range checks refuse none) as
    the class does."""
    name, hp = case
    assert optimizers.create(name, **hp) == optimizers.REGISTRY[name](**hp)


@pytest.mark.parametrize("case, layout", PAIRS)
def test_matches_reference(case, layout):
    steps = finite_steps(6)
    steps[3] = (*batch(np.random.default_rng(7), out_of_range=True), True)
    reported = run(case, steps, layout=layout)
    assert all(valid for _, valid in reported)


@pytest.mark.parametrize("case, layout", PAIRS)
def test_padding_tokens_are_ignored(case, layout):
    """Padding and out-of-range tokens carry huge or NaN gradients; the step still applies, unaffected."""
    steps = finite_steps(2, seed=2, out_of_range=True, pad_grad=1e6) + \
        finite_steps(2, seed=3, out_of_range=True, pad_grad=np.nan)
    reported = run(case, steps, layout=layout)
    assert all(valid and np.isfinite(norm) for norm, valid in reported)


@pytest.mark.parametrize("case, layout", PAIRS)
def test_non_finite_step_is_skipped(case, layout):
    steps = finite_steps(6, seed=4)
    for i, bad in ((1, np.nan), (3, np.inf), (4, -np.inf)):
        ids, grads, _ = steps[i]
        token = np.argwhere(ids > 0)[0]
        grads = grads.copy()
        grads[tuple(token)][1] = bad
        steps[i] = (ids, grads, True)
    reported = run(case, steps, layout=layout)  # checks the skipped steps leave everything bit-for-bit unchanged
    assert [valid for _, valid in reported] == [True, False, True, False, False, True]
    assert all(not np.isfinite(reported[i][0]) for i in (1, 3, 4))


@pytest.mark.parametrize("case, layout", PAIRS)
def test_non_pending_update_changes_nothing(case, layout):
    steps = finite_steps(4, seed=5)
    steps.insert(1, "empty")
    ids, grads, _ = steps[3]
    steps.insert(3, (ids, grads, False))  # a real gradient, but nothing pending
    reported = run(case, steps, layout=layout)
    assert [valid for _, valid in reported] == [True, False, True, False, True, True]


# Hyperparameters under which a finite gradient makes the rule's result non-finite: eps=0 divides 0 by 0 on
# a fresh row with a zero gradient; SGD's step overflows float32 for a gradient element of 2**30, and so
# does FTRL's n**(-lr_power) at lr_power=-4 (l1=0 keeps every weight non-zero, so no 0 * inf hides it).
POISON = {
    "async_adam": dict(eps=0.0),
    "async_rowwise_adagrad": dict(eps=0.0, initial_accumulator_value=0.0, weight_decay=0.0),  # l2's penalty: no 0/0
    "async_adagrad": dict(eps=0.0, initial_accumulator_value=0.0),
    "async_sgd": dict(learning_rate=2.0**100, weight_decay=0.0),
    # n**4 overflows float32 for a gradient element of 2**30 (n = 2**60); float64 holds it, and z's float32 does not
    "async_ftrl": dict(lr_power=-4.0, l1=0.0),
    "async_partial_rowwise_adam": dict(eps=0.0),
    "async_rowwise_adagrad_momentum": dict(eps=0.0, initial_accumulator_value=0.0),
}


@pytest.mark.parametrize("case, layout", PAIRS)
def test_update_with_non_finite_result_is_refused(case, layout):
    """A finite gradient whose rows or state come out non-finite writes nothing and is reported not valid;
    the steps around it apply as usual (the reference refuses the same step, from float32's range alone)."""
    name, hp = case
    poisoned = (name, {**hp, **POISON[name]})
    rng = np.random.default_rng(8)
    steps = []
    for _ in range(4):
        ids, grads = batch(rng)
        steps.append((ids, np.abs(grads) + 1 / 64, True))  # no zero gradient sums: eps=0 stays finite
    ids, grads, _ = steps[1]
    fresh = next(i for i in range(1, DRAWN) if i not in steps[0][0])
    ids, grads = ids.copy(), grads.copy()
    ids[0, 0] = fresh
    grads[ids == fresh] = 0.0  # a touched row that has never been touched, with a zero gradient
    b, t = np.argwhere((ids > 0) & (ids != fresh))[0]
    grads[b, t, 0] = 2.0**30  # finite norm, but lr * g overflows float32 for SGD
    steps[1] = (ids, grads, True)
    reported = run(poisoned, steps, layout=layout)  # checks the refused step leaves table and state bit-for-bit unchanged
    assert [valid for _, valid in reported] == [True, False, True, True]
    assert np.isfinite(reported[1][0]), "the gradient itself was finite: only the result was refused"


@pytest.mark.parametrize("case", [p for p in PARAMS if p.values[0][1].get("weight_decay", 0) > 0
                                  and p.values[0][1].get("weight_decay_mode", "decoupled") == "decoupled"])
def test_weight_decay_is_lazy(case):
    """Weight decay is lazy: an update decays only the rows its batch touches, once per update (however many
    tokens share the row), with the rule's own factor ``1 - learning_rate * weight_decay``; a row the batch
    does not touch keeps its value however long it waits (no catch-up on its next touch). With zero
    gradients every rule reduces to that decay, so the reference is plain numpy on the dense table.
    (Adam's moments stay zero under zero gradients: its step is 0 / (0 + eps) + weight_decay * row.)"""
    _, hp = case
    opt, step = library(case)
    table0 = initial_table(3)
    table, state = jnp.asarray(table0), opt.init(VOCAB, WIDTH)
    want = table0.astype(np.float64)
    factor = 1.0 - hp["learning_rate"] * hp["weight_decay"]
    rng = np.random.default_rng(11)
    for i in range(4):
        ids = rng.integers(1, 8 if i < 3 else DRAWN, size=(BATCH, SEQ)).astype(np.int32)  # rows 8.. wait 3 updates
        ids[0, :3] = ids[0, 0]  # one row three times in a batch: still one decay
        ids[1, 0] = 0  # padding: row 0 never decays
        table, state, _, valid = step(table, state, build_update(ids, np.zeros((BATCH, SEQ, WIDTH), np.float32),
                                                                 True))
        assert bool(valid)
        touched = np.unique(ids[ids > 0])
        want[touched] *= factor  # the dense reference: decay exactly the touched rows, once
        np.testing.assert_allclose(np.array(table), want, rtol=1e-6, atol=1e-7, err_msg=f"update {i}")
    np.testing.assert_array_equal(np.array(table)[0], table0[0])


SCHEDULE = optimizers.Schedule("warmup_cosine", warmup_steps=2, decay_steps=3, end_ratio=0.1)


# Each optimizer's first case (the schedule is read by every rule alike). The lr * z form of FTRL is TensorFlow's
# own algorithm once the learning rate changes (it equals the paper's only at a constant one), so the paper's
# reference could not check it under a schedule.
@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in FIRST_OF_EACH])
@pytest.mark.parametrize("layout", [pytest.param("single", id="single"), pytest.param("row_routed", id="row_routed")])
def test_a_schedule_scales_each_updates_learning_rate(case, layout):
    """Warmup then cosine over 6 updates: every rule runs at ``learning_rate`` times the multiplier of the
    update's own count (the reference's multiplier is written from the documented formula, not the library),
    the refused and skipped updates do not advance it, and the same jitted step serves every update."""
    name, hp = case
    scheduled = (name, {**hp, "schedule": SCHEDULE})
    steps = finite_steps(6, seed=9)
    ids, grads, _ = steps[2]
    grads = grads.copy()
    grads[tuple(np.argwhere(ids > 0)[0])][0] = np.nan  # skipped: the next update is still the 3rd
    steps.insert(2, (ids, grads, True))
    reported = run(scheduled, steps, layout=layout)
    assert [valid for _, valid in reported] == [True, True, False, True, True, True, True]
    opt, step = library(scheduled, layout)
    assert step._cache_size() == 1
    lr = [float(opt.learning_rate_at(t)) for t in range(1, 7)]
    base = opt.learning_rate
    np.testing.assert_allclose(lr, [base / 2, base, base * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi / 3))),
                                    base * (0.1 + 0.9 * 0.5 * (1 + np.cos(2 * np.pi / 3))), base * 0.1, base * 0.1],
                               rtol=1e-6)


@pytest.mark.parametrize("name", ["async_adam", "async_sgd"])
@pytest.mark.parametrize("layout", [pytest.param(n, id=n) for n in ("single", "row_routed", "column")])
def test_decoupled_global_decay_equals_decaying_every_row_every_update(name, layout):
    """``weight_decay_mode=decoupled_global`` under a warmup-cosine schedule: after each update, every row,
    touched or not, read as its stored value times the decay it has yet to catch up on
    (``exp(total - touch)``), equals a dense numpy table in which every row decays at every update by
    ``1 - lr_t * weight_decay`` (and the touched ones also take their rule's step). The rows no batch touches
    are never written (their stored value does not change)."""
    hp = dict(learning_rate=0.05, weight_decay=0.2, weight_decay_mode="decoupled_global", schedule=SCHEDULE)
    case = (name, hp)
    opt, step = library(case, layout)
    ctx, make = context(layout), updater(layout)
    table0 = initial_table(5)
    ref = reference_for(name, opt, table0)
    table, state = placed(ctx, jnp.asarray(table0), opt.init(VOCAB, WIDTH))
    rng = np.random.default_rng(12)
    for i in range(6):
        ids, grads = batch(rng)
        if i < 3:
            ids[ids >= 12] = 0  # rows 12.. wait three updates, then catch up
        table, state, _, valid = step(table, state, make(ids, grads, True))
        ref.step(ids, grads, True)
        assert bool(valid)
        decay = np.exp(np.asarray(state.decay.total, np.float64) - np.asarray(state.decay.touch, np.float64))
        np.testing.assert_allclose(np.asarray(table) * decay[:, None], ref.table, rtol=1e-5, atol=1e-6,
                                   err_msg=f"update {i}")
    np.testing.assert_array_equal(np.asarray(table)[DRAWN:], table0[DRAWN:])  # never touched: never written
    assert float(state.decay.total) == pytest.approx(
        sum(np.log1p(-0.05 * 0.2 * m) for m in (0.5, 1.0, 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.25, 0.1, 0.1)), rel=1e-5)
