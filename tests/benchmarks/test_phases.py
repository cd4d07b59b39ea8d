"""The per-phase profile and the commit comparison: self times against a hand-worked nesting, every op of a
compiled fused update charged to the phase its scope names, and --compare's refusals."""
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers
from benchmarks import compare, phases
from optimizers.scopes import PHASES, phase, phase_of

ROOT = Path(__file__).resolve().parents[2]


def ev(name, ts, dur, tid=1):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {"hlo_op": name}}


def test_self_times_subtract_what_ran_inside_on_the_same_thread():
    events = [ev("while", 0, 10), ev("body_a", 1, 3), ev("body_b", 5, 2), ev("after", 12, 4),
              ev("other_thread", 2, 6, tid=2)]
    assert sorted(phases.self_times(events)) == sorted(
        [("while", 5), ("body_a", 3), ("body_b", 2), ("after", 4), ("other_thread", 6)])


def test_phase_of_reads_the_innermost_phase_scope():
    assert phase_of("jit(step)/emb_routing/emb_dedupe/sort") == "dedupe"
    assert phase_of("jit(step)/shard_map/emb_gate/reduce_sum") == "gate"
    assert phase_of("jit(step)/emb_nothing/add") is None and phase_of("jit(step)/mul") is None
    with pytest.raises(ValueError, match="unknown phase 'lookup'"):
        phase("lookup")


@pytest.mark.parametrize("name", ["async_sgd", "async_adam"])
def test_every_phase_of_a_one_device_update_is_in_the_compiled_module(name):
    """Every phase but routing on one device; with a native CPU kernel (Adam's) its gather, gate and scatter are
    the kernel's own, named as the rule."""
    V, D, B = 512, 8, 64
    opt, ctx = optimizers.create(name), optimizers.AsyncEmbContext(V, D, B)

    def step(table, state, ids, grads):
        c = ctx.fresh()
        keep, table, state = opt.gradient_update_start(c, optimizers.make_update(c, ids, grads), table, state,
                                                       jnp.zeros(()))
        return table, state, opt.gradient_update_done(c, keep[0])[0]

    args = (jnp.zeros((V, D)), opt.init(V, D), jnp.asarray(np.arange(B) % 50, jnp.int32), jnp.ones((B, D)))
    named = set(phases.op_phases(jax.jit(step).lower(*args).compile().as_text()).values())
    if name == "async_adam":
        assert {"dedupe", "segment_sum", "rule"} <= named and not {"gather", "gate", "scatter"} & named, named
    else:
        assert set(PHASES) - {"routing"} <= named


def test_compare_refuses_an_unknown_ref_and_zero_rounds():
    with pytest.raises(SystemExit, match="cannot check out 'no-such-ref'"):
        compare.compare("no-such-ref", rounds=1, quick=True)
    with pytest.raises(SystemExit, match="--rounds must be >= 1, got 0"):
        compare.compare("HEAD", rounds=0, quick=True)


@pytest.mark.slow
def test_compare_times_both_trees_and_prints_the_ratio():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--compare", "HEAD", "--quick", "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| async_rowwise_adagrad | 1,000 |" in proc.stdout and "this tree against HEAD" in proc.stdout
