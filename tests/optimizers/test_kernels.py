"""The native CPU dedupe (``optimizers.kernels``) against the XLA ops it replaces, bit for bit; its build and
its fallbacks; and that nothing calls it on another platform."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers
from optimizers import kernels
from optimizers.kernels import build

ROOT = Path(__file__).resolve().parents[2]


def test_the_kernels_are_built_here():
    """Every machine this project is tested on has a C++ compiler: the kernels must be on, not silently off."""
    assert build.status() == "", build.status()
    assert Path(build.library_path()).is_file()


def native_and_xla_dedupe(keys: np.ndarray, fill: int, size: int):
    keys = jnp.asarray(keys, jnp.int32)
    native = jax.jit(lambda k: kernels.dedupe_keys(k, fill, size, "native"))(keys)
    xla = jax.jit(lambda k: kernels.xla_dedupe_keys(k, fill, size))(keys)
    return [np.asarray(a) for a in native], [np.asarray(a) for a in xla]


@pytest.mark.parametrize("fill,n", [(1, 5), (17, 40), (2047, 3000), (2048, 3000), (100_000, 16_384),
                                    (2**22 + 5, 4096), (2**31 - 1, 4096), (10, 1)])
def test_dedupe_kernel_is_the_xla_dedupe(fill, n):
    """Sorted distinct keys padded with ``fill`` and each key's run, for key ranges needing 1 to 3 radix passes
    (11 bits each), Zipf repeats, the fill key itself, and the top of int32."""
    rng = np.random.default_rng(fill + n)
    keys = np.minimum(rng.zipf(1.2, size=n) - 1 + rng.integers(0, 2, size=n) * (fill - 1) // 2, fill)
    keys[: n // 10] = fill  # dropped ids arrive as the fill key
    size = min(n, fill) + 1
    (nu, ns), (xu, xs) = native_and_xla_dedupe(keys, fill, size)
    np.testing.assert_array_equal(nu, xu)
    np.testing.assert_array_equal(ns, xs)
    distinct = np.unique(keys)
    np.testing.assert_array_equal(nu[: distinct.size], distinct)  # and both are np.unique's
    np.testing.assert_array_equal(nu[ns], keys)


def test_dedupe_kernel_when_every_key_is_the_same():
    (nu, ns), (xu, xs) = native_and_xla_dedupe(np.full(64, 9), 9, 10)
    np.testing.assert_array_equal(nu, xu)
    np.testing.assert_array_equal(ns, xs)
    assert nu.tolist() == [9] * 10 and ns.tolist() == [0] * 64


def test_with_another_default_backend_the_xla_ops_are_traced(monkeypatch):
    """With a TPU or GPU as JAX's default backend, programs hold no call to a CPU kernel."""
    keys = jnp.zeros((64,), jnp.int32)
    assert "rr_dedupe" in jax.jit(lambda k: kernels.dedupe_keys(k, 100, 65, "native")).lower(keys).as_text()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert kernels.usable() == "JAX's default backend is tpu, not the CPU"
    assert "rr_dedupe" not in jax.jit(lambda k: kernels.dedupe_keys(k, 100, 65, "native")).lower(keys).as_text()


CHILD = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import jax, jax.numpy as jnp
    from optimizers import kernels, record
    unique, seg = record.dedupe(jnp.array([5, 3, 3, 0, 9, 12], jnp.int32), 10, 7, method="native")
print(json.dumps({"status": kernels.build.status(), "unique": unique.tolist(), "seg": seg.tolist(),
                  "warnings": [str(w.message) for w in caught]}))
"""


def run_child(tmp_path, **env) -> dict:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OPTIMIZERS_KERNEL_CACHE": str(tmp_path / "cache"), **env}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=full, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


WANT = {"unique": [3, 5, 9, 10, 10, 10, 10], "seg": [1, 0, 0, -1, 2, -1]}


@pytest.mark.slow
def test_without_a_compiler_the_xla_ops_run_and_a_warning_says_why(tmp_path):
    out = run_child(tmp_path, CXX=str(tmp_path / "no-such-compiler"))
    assert out["status"].startswith("building cpu.cc into ") and "no-such-compiler" in out["status"], out["status"]
    assert {k: out[k] for k in WANT} == WANT
    assert len(out["warnings"]) == 1 and "the fused update's CPU kernels are off (building cpu.cc" in out["warnings"][0]
    assert "OPTIMIZERS_CPU_KERNELS=0" in out["warnings"][0]
    assert not list((tmp_path / "cache").glob("*.so")) and not list((tmp_path / "cache").glob("*.tmp"))


@pytest.mark.slow
def test_a_cache_folder_that_cannot_be_made_leaves_the_kernels_off_with_a_warning(tmp_path):
    """``OPTIMIZERS_KERNEL_CACHE`` naming a regular file: the XLA ops run, the warning names the path, and the file
    is left as it was."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("keep me")
    out = run_child(tmp_path, OPTIMIZERS_KERNEL_CACHE=str(blocker))
    assert out["status"].startswith(f"building cpu.cc into {blocker}/cpu-") and {k: out[k] for k in WANT} == WANT
    assert len(out["warnings"]) == 1 and str(blocker) in out["warnings"][0]
    assert blocker.read_text() == "keep me"


@pytest.mark.slow
def test_a_bad_switch_value_leaves_the_kernels_off_and_says_so(tmp_path):
    out = run_child(tmp_path, OPTIMIZERS_CPU_KERNELS="maybe")
    assert out["status"].startswith("OPTIMIZERS_CPU_KERNELS='maybe' is not 0 or 1") and {k: out[k] for k in WANT} == WANT
    assert len(out["warnings"]) == 1 and "OPTIMIZERS_CPU_KERNELS='maybe' is not 0 or 1" in out["warnings"][0]


@pytest.mark.slow
def test_switched_off_the_xla_ops_run_without_a_warning(tmp_path):
    out = run_child(tmp_path, OPTIMIZERS_CPU_KERNELS="0")
    assert out["status"] == "OPTIMIZERS_CPU_KERNELS=0 is set" and out["warnings"] == []
    assert {k: out[k] for k in WANT} == WANT


@pytest.mark.slow
def test_processes_starting_together_build_once_and_all_use_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPTIMIZERS_KERNEL_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for (stdout, stderr), p in zip(outs, procs):
        assert p.returncode == 0, stderr
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["status"] == "" and out["warnings"] == [] and {k: out[k] for k in WANT} == WANT
    assert len(list((tmp_path / "cache").glob("cpu-*.so"))) == 1
    assert not list((tmp_path / "cache").glob("*.tmp"))


def rowwise_inputs(width: int, rows: int = 300, unique: int = 90, seed: int = 0):
    """A table, sorted distinct ids then padding, and their summed gradients (zeros for the padding)."""
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.standard_normal((rows, width)), jnp.float32)
    ids = np.full(unique + 20, rows, np.int32)  # sorted distinct ids, then padding (out of range)
    ids[:unique] = np.sort(rng.choice(rows, unique, replace=False))
    grads = rng.standard_normal((ids.size, width)).astype(np.float32)
    grads[unique:] = 0.0
    return table, jnp.asarray(ids), jnp.asarray(grads)


def both_paths(opt, table, ids, grads, steps: int = 3, pending: bool = True):
    """(native, xla): each ``(table, state, norm, valid, written)`` after ``steps`` updates of the same rows."""
    from optimizers.row_update import Touched, write_rows, xla_write_rows

    ctx = optimizers.AsyncEmbContext(table.shape[0], table.shape[1], 64)
    touched = Touched(ids, ids, ids < table.shape[0], grads)
    out = []
    for fn in (write_rows, xla_write_rows):
        t, s = table, opt.init(*table.shape)
        for i in range(steps):
            t, s, norm, valid, written = jax.jit(lambda t, s, g: fn(opt, ctx, touched._replace(grads=g), t, s,
                                                                        jnp.float32(0), jnp.asarray(pending)))(
                t, s, grads * (i + 1))
        out.append((t, s, norm, valid, written))
    return out



CASES = [
    ("async_rowwise_adagrad", {}),
    ("async_rowwise_adagrad", dict(learning_rate=0.05, eps=1e-8, initial_accumulator_value=0.5, half_life_steps=3.0)),
    ("async_rowwise_adagrad", dict(learning_rate=0.05, half_life_steps=2.0, lazy_decay=False, weight_decay=0.1)),
    ("async_rowwise_adagrad", dict(learning_rate=0.3, schedule=optimizers.Schedule(kind="warmup_cosine", warmup_steps=2,
                                                                                  decay_steps=10))),
    ("async_adam", {}),
    ("async_adam", dict(learning_rate=0.01, b1=0.5, b2=0.9, eps=1e-6, weight_decay=0.2, bias_correction="per_row")),
    ("async_adam", dict(learning_rate=0.02, schedule=optimizers.Schedule(kind="warmup", warmup_steps=3))),
]


@pytest.mark.parametrize("width", [64, 13, 1])
@pytest.mark.parametrize("name,settings", CASES, ids=["rowwise_adagrad", "rowwise_lazy_decay", "rowwise_decay_wd",
                                                      "rowwise_schedule", "adam", "adam_per_row_wd", "adam_schedule"])
def test_native_kernel_matches_the_xla_ops(name, settings, width):
    """The native kernel's rows, state, norm and row count equal the XLA ops' (float32 rounding apart) over three
    updates of overlapping rows, whatever the width (a row's tail past the last 8 columns included)."""
    opt = optimizers.create(name, **settings)
    native, xla = both_paths(opt, *rowwise_inputs(width))
    for got, want in zip(jax.tree.leaves(native), jax.tree.leaves(xla)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-7)
    assert bool(native[3]) and int(native[4][0]) == 90 and int(native[1].count) == 3


@pytest.mark.parametrize("name", ["async_rowwise_adagrad", "async_adam"])
@pytest.mark.parametrize("spoil", ["inf_gradient", "nan_gradient", "overflowing_rule", "overflowing_state",
                                   "not_pending"])
def test_native_kernel_refuses_a_bad_update_whole(name, spoil):
    """A non-finite gradient, a rule whose new rows (or Adam's second moment) would overflow float32, or an update
    not pending: nothing is written (table and state bit for bit), valid is false, and the XLA ops agree."""
    table, ids, grads = rowwise_inputs(16)
    opt = optimizers.create(name)
    if spoil == "inf_gradient":
        grads = grads.at[5, 3].set(jnp.inf)
    elif spoil == "nan_gradient":
        grads = grads.at[40, 0].set(jnp.nan)
    elif spoil == "overflowing_rule":
        opt = optimizers.create(name, learning_rate=3e38)
        table = table.at[int(ids[7])].set(3e38)
    elif spoil == "overflowing_state":  # g**2 overflows: Adam's nu, row-wise Adagrad's accumulator
        grads = grads.at[11, 2].set(1e30)
    native, xla = both_paths(opt, table, ids, grads, steps=1, pending=spoil != "not_pending")
    for t, s, _, valid, written in (native, xla):
        assert not bool(valid) and int(written[0]) == 0 and int(s.count) == 0
        np.testing.assert_array_equal(np.asarray(t), np.asarray(table))
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, s), opt.init(*table.shape))


def compiled_text(opt, ctx, table, dtype=jnp.float32):
    def step(table, state, ids):
        emb = table.at[ids].get(mode="fill", fill_value=0).astype(jnp.float32)
        update = optimizers.make_update(ctx, ids, emb * 0.5 + 0.01)
        keep, table, state = opt.gradient_update_start(ctx, update, table, state, emb[0, 0])
        return table, state

    args = (jnp.zeros(table, dtype), opt.init(*table), jnp.arange(ctx.tokens_per_batch, dtype=jnp.int32))
    return jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile().as_text()


@pytest.mark.parametrize("name,rule", [("async_rowwise_adagrad", "rr_rowwise_adagrad"), ("async_adam", "rr_adam")])
def test_the_kernel_runs_where_it_applies_and_nowhere_else(name, rule):
    """One device, float32: the kernel, and no copy of the table or its state. A bfloat16 table, l2 or global weight
    decay, a subclass with its own rule: the XLA ops."""
    ctx = optimizers.AsyncEmbContext(500, 8, 32)
    text = compiled_text(optimizers.create(name), ctx, (500, 8))
    assert rule in text
    assert not [line for line in text.splitlines() if " copy(" in line and "[500" in line.split("copy(")[0]]
    assert rule not in compiled_text(optimizers.create(name), ctx, (500, 8), jnp.bfloat16)
    for mode in ("l2", "decoupled_global"):
        assert rule not in compiled_text(optimizers.create(name, weight_decay=0.1, weight_decay_mode=mode), ctx, (500, 8))
    cls = type(optimizers.create(name))
    own = type("OwnRule", (cls,), {"update_rows": lambda self, rows, state, grad, rc: cls.update_rows(
        self, rows, state, grad, rc)})
    assert rule not in compiled_text(own(), ctx, (500, 8))
    assert "rr_" not in compiled_text(optimizers.create("async_sgd"), ctx, (500, 8)).replace("rr_dedupe", "")


def test_a_multi_device_program_takes_no_native_kernel():
    """On a mesh of 8 devices (the table replicated, or split by rows) the XLA ops run: only one-device programs
    call the kernels (``AsyncEmbContext.one_device``)."""
    mesh = jax.make_mesh((2, 4), ("data", "table"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    for axis in (None, "table"):
        ctx = optimizers.AsyncEmbContext(512, 8, 32, mesh=mesh, table_axis=axis)
        assert not ctx.one_device
        for name in ("async_rowwise_adagrad", "async_adam"):
            assert "rr_" not in compiled_text(optimizers.create(name), ctx, (512, 8)), (axis, name)
    one = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:1])
    assert optimizers.AsyncEmbContext(512, 8, 32, mesh=one).one_device
