"""An embedding learning-rate schedule in the runner: the step is compiled once for a 100-update warmup, every
logged step reports ``emb/learning_rate/<table>`` (the rate of the update that step applied), ``decay_steps=0``
spans the run, and a per-table override schedules one table only."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from runner.build import build
from tests.optimizers.reference import schedule_multiplier
from tests.runner.support import batch_size, compose_config, to_device


@pytest.mark.slow
def test_a_100_step_warmup_compiles_the_step_once_and_logs_each_tables_rate():
    cfg = compose_config(["optimizer.schedule.kind=warmup", "optimizer.schedule.warmup_steps=100",
                          "+optimizer@table_optimizers.users=async_sgd", "trainer.steps=120"])
    program, data, _ = build(cfg)
    B = batch_size(program)
    state = program.init_state(0)
    step, _, _ = program.compile(state, to_device(program, data.batch(0, B)))
    rates = {n: [] for n in program.tables}
    for t in range(120):
        state, m = step(state, to_device(program, data.batch(t, B)))
        m = jax.device_get(m)
        for n in rates:
            rates[n].append(float(m[f"emb/learning_rate/{n}"]))
    assert step.jitted._cache_size() == 1  # one compiled step for 120 different learning rates
    warm = schedule_multiplier("warmup", 100, 0, 0.0, 1000, 0.5)
    base = program.emb_optimizers["items"].learning_rate
    # async: step t (1-based) applies update t-1; at step 1 nothing is pending, and it reports update 1's rate
    want = [base * warm(max(t - 1, 1)) for t in range(1, 121)]
    np.testing.assert_allclose(rates["items"], want, rtol=1e-6)
    np.testing.assert_allclose(rates["authors"], want, rtol=1e-6)
    assert rates["users"] == [program.emb_optimizers["users"].learning_rate] * 120  # its own optimizer: constant


def test_decay_steps_0_is_the_runs_length_and_is_part_of_the_program():
    a, _, _ = build(compose_config(["optimizer.schedule.kind=cosine", "trainer.steps=40"]))
    b, _, _ = build(compose_config(["optimizer.schedule.kind=cosine", "trainer.steps=80"]))
    assert a.emb_optimizers["items"].schedule.decay_steps == 40 and b.emb_optimizers["items"].schedule.decay_steps == 80
    assert a.reuse_key != b.reuse_key  # runs that differ only in trainer.steps otherwise share one program
    c, _, _ = build(compose_config(["trainer.steps=40"]))
    d, _, _ = build(compose_config(["trainer.steps=80"]))
    assert c.reuse_key == d.reuse_key
