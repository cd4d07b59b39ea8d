"""Programs built alike in one process share their jitted functions (``TrainProgram.reuse_key``): a relaunch
that differs only in settings outside the program (checkpoints, logging, the stop drill, the run id) or in
the step's arguments (the dense schedule, the run's length and log interval) traces and compiles nothing
again, and each run's step still takes its own arguments; any setting the program is built from gives it
its own jitted functions."""
import functools

import jax
import numpy as np

from runner.build import OUTSIDE_THE_PROGRAM, STEP_ARGUMENTS, build
from runner.core.loop import to_device
from tests.runner.support import batch_size, compose_config, jitted


@functools.lru_cache(maxsize=None)
def compiled(*overrides):
    """(program, task, (step, flush, predict)) of the tiny run with ``overrides``."""
    program, task, _ = build(compose_config(["trainer.steps=4", *overrides]))
    return program, task, jitted(program, task)


def test_a_relaunch_outside_the_program_reuses_its_jitted_functions(tmp_path):
    first, _, (step, flush, predict) = compiled("logger=none")
    again, _, (step2, flush2, predict2) = compiled("logger=wandb", "logger.mode=disabled", "checkpoint.interval=2",
                                                   f"checkpoint.dir={tmp_path}", "trainer.stop_after=2",
                                                   "trainer.run_id=again", "trainer.progress=off",
                                                   "trainer.eval_interval=2")
    assert first.reuse_key == again.reuse_key
    assert step2.jitted is step.jitted and flush2.jitted is flush.jitted and predict2 is predict
    assert {"checkpoint", "logger", "trainer.stop_after", "trainer.run_id"} <= set(OUTSIDE_THE_PROGRAM)


def test_a_run_with_other_step_arguments_shares_the_step_and_takes_its_own_arguments():
    first = compiled("dense_optimizer.learning_rate=0.01", "dense_optimizer.warmup_steps=1")
    other = compiled("dense_optimizer.learning_rate=0.02", "dense_optimizer.warmup_steps=1", "trainer.steps=9",
                     "trainer.log_interval=2")
    assert other[0].reuse_key == first[0].reuse_key and other[2][0].jitted is first[2][0].jitted
    assert {"trainer.steps", "dense_optimizer.learning_rate"} <= set(STEP_ARGUMENTS)
    lrs = []
    for program, task, (step, _, _) in (first, other):
        state, got = program.init_state(0), []
        for t in range(3):
            state, m = step(state, to_device(program, task.batch(t, batch_size(program))))
            got.append(float(jax.device_get(m["dense/learning_rate"])))
        want = [float(program.dense.schedule()(t)) for t in range(3)]  # its own schedule, as Python constants
        np.testing.assert_allclose(got, want, rtol=1e-6)
        lrs.append(got)
    assert lrs[0][2] != lrs[1][2]  # the schedules differ: each run's step took its own numbers


def test_every_setting_the_program_is_built_from_gets_its_own():
    first, _, (step, _, _) = compiled()
    other, _, (step2, _, _) = compiled("async_emb=off")
    assert other.reuse_key != first.reuse_key and step2.jitted is not step.jitted
    for override in ("trainer.seed=1", "trainer.batch_size=64", "optimizer.learning_rate=0.5",
                     "dense_optimizer.clip_norm=0.5", "model.emb_width=16", "mesh=data", "mesh.permute_ids=true"):
        assert build(compose_config(["trainer.steps=4", override]))[0].reuse_key != first.reuse_key, override
