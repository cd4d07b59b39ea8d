"""A user's embedding optimizer that fails, while the step is traced or while it runs (a host callback), ends
the run with one message naming its class (its _target_), the table and what failed; the checkpoint
directory it resumed from is byte-identical afterwards."""
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.app import run
from runner.core.failures import OptimizerFailed
from runner.checkpoint.lock import LOCK_FILE
from tests.runner.checkpoint.test_resume import steps_in
from tests.runner.support import ROOT, TINY, compose_config

USER = "tests.runner.custom_optimizers"
SGD = ["optimizer=async_sgd", "trainer.steps=6", "trainer.log_interval=1", "checkpoint.interval=1",
       "trainer.run_id=user-optimizer"]
HOST = [f"optimizer._target_={USER}.HostCheckedSGD"]
SOURCE = ROOT / "tests" / "runner" / "custom_optimizers.py"


def line_of(text: str) -> int:
    """The line of custom_optimizers.py that raises ``text``."""
    return next(n for n, line in enumerate(SOURCE.read_text().splitlines(), 1) if text in line)


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A run of the user's class (its host check never fails) stopped at step 2: checkpoints 1 and 2."""
    d = tmp_path_factory.mktemp("user")
    run(compose_config(SGD + HOST + [f"checkpoint.dir={d / 'ck'}", "trainer.stop_after=2"]), d / "first")
    assert steps_in(d / "ck") == [1, 2]
    return d / "ck"


CASES = {
    "traced": ([f"optimizer._target_={USER}.RaisingSGD", "+optimizer.broken=true"],
               f"the embedding optimizer {USER}.RaisingSGD (optimizer._target_) of table 'authors' failed while the "
               f"train step was traced: ValueError: this rule is broken (at {SOURCE}:"
               f"{line_of('this rule is broken')} in update_rows). Nothing was trained with it and no checkpoint was written. Fix the class, or "
               f"pick a built-in optimizer, e.g. optimizer=async_adam."),
    # async: the first step applies nothing, so the saved step 2 had applied one update; the next is update 2
    "run_time": (HOST + ["+optimizer.fail_at=1"],
                 f"the embedding optimizer {USER}.HostCheckedSGD (optimizer._target_) of tables 'authors', 'items', "
                 f"'users' failed while the train step ran, in a host callback at {SOURCE}:"
                 f"{line_of('host check failed')} in _host_check: ValueError: host check failed at update 2. The failed "
                 f"step's state was not saved; the checkpoints already written are as they were. Fix the class, or "
                 f"pick a built-in optimizer, e.g. optimizer=async_adam."),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_a_failing_user_optimizer_is_one_message_and_the_checkpoints_are_untouched(tmp_path, saved, case, caplog):
    """The resume of the saved run with the user's class failing: traced (its rule raises) or at run time (its
    host callback raises on the first update after the resume)."""
    overrides, message = CASES[case]
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    before = tree(ck)
    if case == "traced":  # the saved run's class is another one: its resume would be refused by name
        overrides = overrides + ["checkpoint.resume=never", f"checkpoint.dir={tmp_path / 'fresh'}"]
    with caplog.at_level(logging.INFO), pytest.raises(OptimizerFailed) as e:
        run(compose_config(SGD + [f"checkpoint.dir={ck}", *overrides]), tmp_path / "out")
    assert str(e.value) == message
    assert tree(ck) == before and not (ck / LOCK_FILE).exists()
    assert "callback failed" not in caplog.text  # JAX's own traceback of the callback is not logged
    if case == "traced":
        assert not (tmp_path / "fresh").exists() or steps_in(tmp_path / "fresh") == []


@pytest.mark.slow
def test_a_host_callback_failing_mid_run_leaves_only_the_checkpoints_before_it(tmp_path):
    """Fresh run, the check fails from update 3 on: the checkpoints written before the failure are all there
    are (none of the failed step, no partial save)."""
    ck = tmp_path / "ck"
    with pytest.raises(OptimizerFailed, match="host check failed at update 3"):
        run(compose_config(SGD + HOST + ["+optimizer.fail_at=3", f"checkpoint.dir={ck}"]), tmp_path / "out")
    # async: update 3 is applied at step 4, which fails; steps 1-3 were saved, nothing after them
    assert steps_in(ck) == [1, 2, 3]
    assert not [p.name for p in ck.iterdir() if "tmp" in p.name] and not (ck / LOCK_FILE).exists()


@pytest.mark.slow
def test_the_command_line_gives_one_message_for_a_failing_host_callback(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "-m", "runner", *TINY, "optimizer=async_sgd",
                           f"optimizer._target_={USER}.HostCheckedSGD", "+optimizer.fail_at=1",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "callback failed" not in out, out[-3000:]
    assert proc.stderr.count("error: ") == 1
    assert (f"error: the embedding optimizer {USER}.HostCheckedSGD (optimizer._target_) of tables 'authors', "
            f"'items', 'users' failed while the train step ran, in a host callback") in proc.stderr
