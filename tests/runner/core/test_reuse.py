"""Programs built alike in one process share their jitted functions (``TrainProgram.reuse_key``): a relaunch
that differs only in settings outside the program (checkpoints, logging, the stop drill, the run id) traces
and compiles nothing again; any setting the program is built from gives it its own."""
import functools

import pytest

from runner.build import OUTSIDE_THE_PROGRAM, build
from runner.core.loop import to_device
from tests.runner.support import batch_size, compose_config


@functools.lru_cache(maxsize=None)
def compiled(*overrides):
    program, data, _ = build(compose_config(["trainer.steps=4", *overrides]))
    return program, program.compile(program.init_state(0), to_device(program, data.batch(0, batch_size(program))))


def test_a_relaunch_outside_the_program_reuses_its_jitted_functions(tmp_path):
    first, (step, flush, predict) = compiled("logger=none")
    again, (step2, flush2, predict2) = compiled("logger=wandb", "logger.mode=disabled", "checkpoint.interval=2",
                                                f"checkpoint.dir={tmp_path}", "trainer.stop_after=2",
                                                "trainer.run_id=again", "trainer.progress=off")
    assert first.reuse_key == again.reuse_key
    assert step2.jitted is step.jitted and flush2.jitted is flush.jitted and predict2 is predict
    assert {"checkpoint", "logger", "trainer.stop_after", "trainer.run_id"} <= set(OUTSIDE_THE_PROGRAM)


@pytest.mark.parametrize("override", ["trainer.steps=5", "trainer.log_interval=2", "trainer.seed=1",
                                      "trainer.batch_size=64", "dense_optimizer.learning_rate=0.5",
                                      "optimizer.learning_rate=0.5", "async_emb=off", "model.emb_width=16",
                                      "mesh=data"])
def test_a_setting_the_program_is_built_from_gets_its_own(override):
    first, (step, _, _) = compiled()
    other, (step2, _, _) = compiled(override)
    assert other.reuse_key != first.reuse_key and step2.jitted is not step.jitted
