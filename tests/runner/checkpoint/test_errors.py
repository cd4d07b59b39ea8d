"""Bad input: an incompatible config is refused by name, a truncated or corrupted checkpoint is reported and
the one before it is used, an unwritable or full disk fails loudly, bad settings are refused up front."""
import json
import logging
import re
import resource
import shutil
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

from runner.app import run
from runner.build import build
from runner.checkpoint import CheckpointError, open_checkpoints
from runner.preflight import PreflightError
from tests.runner.support import compose_config
from tests.runner.checkpoint.test_resume import BASE, launch, saved_arrays, steps_in

RUN = ["trainer.steps=4", "trainer.run_id=bad-input"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """One finished async run with checkpoints at steps 2 and 4 (its final state)."""
    d = tmp_path_factory.mktemp("saved")
    launch(d, "first", RUN)
    assert steps_in(d / "ck") == [2, 4]
    return d / "ck"


def open_with(ckpt_dir: Path, overrides=(), out: Path | None = None):
    cfg = compose_config(BASE + RUN + [f"checkpoint.dir={ckpt_dir}", *overrides])
    program, _, plan = build(cfg)
    return program, open_checkpoints(cfg, program, plan, out or ckpt_dir.parent / "out")


@pytest.mark.parametrize("override, message", [
    ("data.num_items=600", r"table 'items' vocab \(model.tables.items.vocab.*\): the checkpoint has 501, this "
                           r"config has 601"),
    ("model.emb_width=16", r"table 'items' width \(.*model.emb_width\): the checkpoint has 8, this config has 16"),
    ("optimizer=async_rowwise_adagrad", r"table 'items' optimizer \(optimizer / table_optimizers.items\): the "
                                        r"checkpoint has 'AsyncAdam', this config has 'AsyncRowwiseAdagrad'"),
    ("async_emb=off", r"async_emb.enabled: the checkpoint has True, this config has False"),
    ("model.hidden=[32]", r"array .*params.* shape: the checkpoint has \(\d+, 16\), this config has \(\d+, 32\)"),
], ids=["vocab", "width", "optimizer", "async_emb", "hidden"])
def test_incompatible_config_is_refused_by_name(saved, override, message):
    with pytest.raises(PreflightError, match=message) as e:
        open_with(saved, [override])
    assert "written by an incompatible config" in str(e.value) and "checkpoint.resume=never" in str(e.value)
    assert steps_in(saved) == [2, 4]  # nothing was touched


def _truncate(step_dir: Path):
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])


def _flip(step_dir: Path):  # silent corruption: the files still parse, only the digest notices
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    middle = len(data) // 3
    data[middle: middle + 64] = bytes(b ^ 0xFF for b in data[middle: middle + 64])
    big.write_bytes(bytes(data))


def _garble_meta(step_dir: Path):
    (step_dir / "meta" / "metadata").write_text("{not json")


# Orbax leaves the reads of the other arrays un-awaited when one fails: that is its error path, not ours.
ORBAX_ABANDONED_READS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@ORBAX_ABANDONED_READS
@pytest.mark.parametrize("corrupt", [_truncate, _flip, _garble_meta], ids=["truncated", "flipped", "meta"])
def test_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path, saved, caplog, corrupt):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    corrupt(ck / "4")
    with caplog.at_level(logging.WARNING, logger="runner"):
        program, checkpoints = open_with(ck)
    assert re.search(rf"checkpoint {ck}/4 is unreadable or corrupted .*falling back to the one before it",
                     caplog.text)
    state, start, _ = checkpoints.resume_point()
    assert start == 2 and steps_in(ck) == [2] and (ck / "_corrupt" / "4").is_dir()
    want = saved_arrays(saved, 2)
    np.testing.assert_array_equal(np.asarray(state.tables["items"]), want["['tables']['items']"])
    np.testing.assert_array_equal(np.asarray(state.pending["items"].grads), want["['pending']['items']['grads']"])


@ORBAX_ABANDONED_READS
def test_no_readable_checkpoint_is_an_error(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _truncate(ck / "4")
    _garble_meta(ck / "2")
    with pytest.raises(PreflightError, match=rf"no readable checkpoint in {ck}: step 4 .*; step 2 \(JSONDecodeError"):
        open_with(ck)


def test_unwritable_checkpoint_dir_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the checkpoint directory should go")
    with pytest.raises(PreflightError, match=rf"checkpoint.dir={blocker}/ck is not writable \(.*\); point "
                                             r"checkpoint.dir at a writable directory"):
        open_with(blocker / "ck")


def test_full_disk_fails_the_save_loudly_and_keeps_the_previous_checkpoint(tmp_path):
    """RLIMIT_FSIZE makes every write past 1 KiB fail (EFBIG), as a full disk fails with ENOSPC; it works
    for root too, where a read-only chmod would not."""
    program, checkpoints = open_with(tmp_path / "ck", ["checkpoint.resume=never"])
    state = program.init_state(0)
    state = state._replace(step=state.step + 1)
    checkpoints.save(1, state)
    checkpoints.wait()
    state = state._replace(step=state.step + 1)
    limit, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limit[1]))
    try:
        with pytest.raises(CheckpointError, match=r"saving checkpoint step 2 to .*/ck failed: OSError: \[Errno 27\] "
                                                  r"File too large\nThe previous checkpoints are intact"):
            checkpoints.save(2, state)
            checkpoints.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    checkpoints.close()
    assert steps_in(tmp_path / "ck") == [1]
    _, again = open_with(tmp_path / "ck")
    assert again.resume_point()[1] == 1


@pytest.mark.parametrize("overrides, message", [
    (["checkpoint.interval=-1"], r"checkpoint.interval=-1 must be >= 0"),
    (["checkpoint.keep=0"], r"checkpoint.keep=0 must be >= 1"),
    (["trainer.run_id=a/b"], r"trainer.run_id='a/b': use 1-64 letters"),
    (["trainer.stop_after=9"], r"trainer.stop_after=9 must be between 1 and trainer.steps=4"),
    (["checkpoint.interval=0", "trainer.stop_after=2"], r"trainer.stop_after=2 .* needs checkpoints"),
    (["checkpoint.resume=/nonexistent/x"], r"checkpoint.resume=/nonexistent/x is not a checkpoint"),
], ids=["interval", "keep", "run_id", "stop_after", "stop_without_checkpoints", "resume_path"])
def test_bad_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(PreflightError, match=message):
        open_with(tmp_path / "ck", overrides)


def test_resume_never_refuses_to_mix_with_existing_checkpoints(saved):
    with pytest.raises(PreflightError, match=rf"checkpoint.resume=never but checkpoint.dir={saved} already holds "
                                             r"checkpoints \[2, 4\]"):
        open_with(saved, ["checkpoint.resume=never"])


def test_resume_from_a_path_restores_that_step(tmp_path, saved):
    program, checkpoints = open_with(tmp_path / "ck", [f"checkpoint.resume={saved / '2'}"])
    state, start, _ = checkpoints.resume_point()
    assert start == 2 and int(jax.device_get(state.step)) == 2
    np.testing.assert_array_equal(np.asarray(state.tables["users"]), saved_arrays(saved, 2)["['tables']['users']"])


def test_changed_settings_are_named_in_a_warning(saved, caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        _, checkpoints = open_with(saved, ["optimizer.learning_rate=0.5"])
    assert checkpoints.resume_point()[1] == 4
    assert re.search(r"resuming with settings that differ from the checkpoint's: optimizer.learning_rate: "
                     r"[0-9.e-]+ -> 0.5$", caplog.text, re.M)


def test_resume_from_an_older_step_refuses_to_collide_with_newer_ones(saved):
    with pytest.raises(PreflightError, match=rf"restores step 2, but checkpoint.dir={saved} already holds steps "
                                             r"\[4\] that new saves would collide with"):
        open_with(saved, [f"checkpoint.resume={saved / '2'}"])


def test_finished_run_resumed_into_a_new_directory_only_evaluates(tmp_path, saved):
    cfg = compose_config(BASE + RUN + [f"checkpoint.dir={tmp_path / 'ck'}", f"checkpoint.resume={saved / '4'}"])
    summary = json.loads((saved.parent / "first" / "summary.json").read_text())
    assert run(cfg, tmp_path / "out") == summary["eval/auc_mean"]
    assert steps_in(tmp_path / "ck") == []  # nothing new to save: the run was complete
