"""The dense optimizer's schedule equals optax's warmup-cosine schedule, and its numbers are arguments of the
compiled step: runs that differ only in length, logging or dense learning rate share one program."""
import jax.numpy as jnp
import optax
import pytest

from runner.build import build
from runner.core.dense_optimizer import DenseOptimizer
from runner.core.loop import to_device
from tests.runner.support import batch_size, compose_config


@pytest.mark.parametrize("warmup, total, end_ratio", [(20, 200, 0.1), (0, 50, 0.0), (10, 5, 1.0), (1, 2, 0.5)])
def test_schedule_matches_optax(warmup, total, end_ratio):
    dense = DenseOptimizer(2e-3, warmup, total, 2e-3 * end_ratio)
    want = optax.warmup_cosine_decay_schedule(0.0, 2e-3, max(warmup, 1), max(total, warmup + 1),
                                              end_value=2e-3 * end_ratio)
    traced = {k: jnp.asarray(v, jnp.float32) for k, v in dense.schedule_args().items()}
    for count in range(0, max(total, warmup) + 5):
        w = float(want(count))
        assert float(dense.schedule()(count)) == pytest.approx(w, rel=1e-5, abs=1e-5 * 2e-3), count
        assert float(dense.schedule(traced)(count)) == pytest.approx(w, rel=1e-5, abs=1e-5 * 2e-3), count


@pytest.mark.slow
def test_runs_differing_in_length_logging_and_dense_lr_share_one_program():
    def step_hlo(overrides):
        program, data, _ = build(compose_config(overrides))
        state = program.init_state(0)
        batch = to_device(program, data.batch(0, batch_size(program)))
        step, _, _ = program.compile(state, batch)
        return step.lower(state, batch).as_text(), program.run_args()

    a, args_a = step_hlo(["trainer.steps=6", "trainer.log_interval=1"])
    b, args_b = step_hlo(["trainer.steps=40", "trainer.log_interval=7", "dense_optimizer.learning_rate=0.01"])
    assert a == b
    assert (int(args_a["detail_last"]), int(args_b["detail_last"])) == (6, 40)
    assert float(args_b["peak"]) == pytest.approx(0.01)
    c, _ = step_hlo(["trainer.steps=6", "dense_optimizer.b1=0.5"])  # a constant of the program: another one
    assert c != a
