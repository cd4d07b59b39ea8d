"""Shared helpers for the runner tests: run a built program for a few steps."""
import jax
import numpy as np

from runner.loop import to_device


def numpy_tree(tree):
    return jax.tree.map(lambda a: np.array(a), tree)


def batch_size(program) -> int:
    return program.contexts["items"].tokens_per_batch // program.tables["items"].tokens_per_example


def run_steps(program, data, steps, flush=True):
    """Init, then ``steps`` jitted steps (and the flush); returns (initial state as numpy, final state,
    per-step losses, per-step metrics)."""
    B = batch_size(program)
    state = program.init_state(0)
    state0 = numpy_tree(state)
    step, flush_fn, _ = program.compile(state, to_device(program, data.batch(0, B)))
    losses, metrics = [], []
    for t in range(steps):
        state, m = step(state, to_device(program, data.batch(t, B)))
        losses.append(float(m["train/loss"]))
        metrics.append(jax.device_get(m))
    return state0, (flush_fn(state) if flush else state), losses, metrics
