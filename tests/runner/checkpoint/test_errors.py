"""Bad input: an incompatible config is refused by name, a truncated or corrupted checkpoint is reported and
the one before it is used, an unwritable or full disk fails loudly, bad settings are refused up front."""
import json
import logging
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from runner.app import run
from runner.build import build
from runner.checkpoint import open_checkpoints
from runner.checkpoint import lock as ckpt_lock
from runner.checkpoint import meta as ckpt_meta
from runner.checkpoint.lock import LOCK_FILE
from runner.errors import CheckpointError, PreflightError
from tests.runner.support import TINY, compose_config
from tests.runner.checkpoint.test_resume import BASE, launch, saved_arrays, steps_in

RUN = ["trainer.steps=4", "trainer.run_id=bad-input"]


# The tests on this module's saved run (one launch) run in make test; make test-fast keeps the refusals
# that need no checkpoint.
@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """One finished async run with checkpoints at steps 2 and 4 (its final state)."""
    d = tmp_path_factory.mktemp("saved")
    launch(d, "first", RUN)
    assert steps_in(d / "ck") == [2, 4]
    assert not (d / "ck" / LOCK_FILE).exists()  # the run released checkpoint.dir when it ended
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
    ("mesh.permute_ids=true", r"table 'items' permute_ids \(mesh.permute_ids\): the checkpoint has False, this config "
                              r"has True; its rows are stored in that order, so resume it with mesh.permute_ids=false"),
    ("model.tables.items.dtype=bfloat16", r"table 'items' dtype \(model.tables.items.dtype\): the checkpoint has "
                                          r"'float32', this config has 'bfloat16'\n"),
    ("optimizer.weight_decay=0.01 optimizer.weight_decay_mode=decoupled_global",
     r"table 'items' weight decay \(optimizer.weight_decay_mode / table_optimizers.items.weight_decay_mode\): the "
     r"checkpoint was saved without the decay bookkeeping of weight_decay_mode=decoupled_global \(with a weight_decay "
     r"above 0\), and this config keeps it; resume with the mode it was saved with\n"),
], ids=["vocab", "width", "optimizer", "async_emb", "hidden", "permute_ids", "dtype", "decay_mode"])
@pytest.mark.slow
def test_incompatible_config_is_refused_by_name(saved, override, message):
    with pytest.raises(PreflightError, match=message) as e:
        open_with(saved, override.split())
    assert ".decay." not in str(e.value)  # the setting is named, not its arrays
    assert "written by an incompatible config" in str(e.value) and "checkpoint.resume=never" in str(e.value)
    assert steps_in(saved) == [2, 4]  # nothing was touched
    assert not (saved / LOCK_FILE).exists()  # the refused run let go of checkpoint.dir


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


def _drop_meta(step_dir: Path):  # the metadata file is gone: the arrays cannot be checked, so not trusted
    (step_dir / "meta" / "metadata").unlink()


def _edit_meta(step_dir: Path, edit) -> None:
    path = step_dir / "meta" / "metadata"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _tables_dropped(step_dir: Path):  # valid JSON of the wrong shape: a field gone
    _edit_meta(step_dir, lambda m: {k: v for k, v in m.items() if k != "tables"})


def _meta_a_list(step_dir: Path):
    _edit_meta(step_dir, lambda m: [])


# Orbax abandons the reads of the other arrays when one fails; the restore collects and drops their echoes
# (runner.checkpoint.manager._abandoned_reads_dropped), so none may reach pytest's unraisable-exception hook.
ORBAX_ABANDONED_READS = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


@ORBAX_ABANDONED_READS
@pytest.mark.parametrize("corrupt", [_truncate, _flip, _garble_meta, _drop_meta, _tables_dropped, _meta_a_list],
                         ids=["truncated", "flipped", "meta", "meta-missing", "meta-no-tables", "meta-a-list"])
@pytest.mark.slow
def test_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path, saved, caplog, corrupt):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    corrupt(ck / "4")
    with caplog.at_level(logging.WARNING, logger="runner"):
        program, checkpoints = open_with(ck)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings  # one line says it all
    assert re.fullmatch(rf"checkpoint {ck}/4 is unreadable or corrupted \(step 4 \(.+\)\); moved to {ck}/_corrupt/4, "
                        r"falling back to the one before it", warnings[0]), warnings[0]
    assert "See full TensorStore details" not in warnings[0]
    state, start, _ = checkpoints.resume_point()
    checkpoints.close()
    assert start == 2 and steps_in(ck) == [2] and (ck / "_corrupt" / "4").is_dir()
    want = saved_arrays(saved, 2)
    np.testing.assert_array_equal(np.asarray(state.tables["items"]), want["['tables']['items']"])
    np.testing.assert_array_equal(np.asarray(state.pending["items"].grads), want["['pending']['items']['grads']"])


@pytest.mark.slow
@ORBAX_ABANDONED_READS
def test_no_readable_checkpoint_is_an_error(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _truncate(ck / "4")
    _garble_meta(ck / "2")
    with pytest.raises(PreflightError, match=rf"no readable checkpoint in {ck}: step 4 .*; step 2 \(JSONDecodeError"):
        open_with(ck)


def test_metadata_of_the_wrong_shape_is_named_in_the_fallback_warning():
    from runner.checkpoint.meta import malformed

    assert malformed([]) == "its metadata is a JSON list, not an object"
    good = {"step": 4, "data_step": 4, "metrics_rows": 4, "async_emb": True, "tables": {}, "arrays": {},
            "versions": {}, "config": {}}
    assert malformed(good) is None
    assert malformed({**good, "versions": None}) == "its metadata's versions is None, not a JSON object"
    assert malformed({**good, "metrics_rows": -5}) == "its metadata's metrics_rows is -5, not a count"
    assert malformed({**good, "step": True}) == "its metadata's step is True, not a count"


@pytest.mark.slow
def test_a_step_folder_copied_under_another_number_is_refused_and_left_alone(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    shutil.copytree(ck / "2", ck / "6")
    with pytest.raises(PreflightError) as e:
        open_with(ck, ["trainer.steps=8"])
    assert str(e.value) == (f"checkpoint {ck / '6'} holds step 2 (its metadata says so), not step 6: a step folder "
                            f"copied or renamed by hand. Name it 2 (in a folder that holds no other step 2), or move it "
                            f"out of the checkpoint directory")
    assert steps_in(ck) == [2, 4, 6]


def test_a_run_shorter_than_its_checkpoint_is_refused_naming_both_ends(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    with pytest.raises(PreflightError) as e:
        open_with(ck, ["trainer.steps=3"])
    assert str(e.value) == (f"trainer.steps=3 is below step 4 of the checkpoint {ck / '4'}: that run is already past "
                            f"the end this one asks for. Raise trainer.steps to 4 or more to go on from it, or start a "
                            f"new run in another checkpoint.dir (with checkpoint.resume={ck / '2'} it starts from that "
                            f"earlier step)")
    assert steps_in(ck) == [2, 4]


@pytest.mark.parametrize("name", ["1", "9"])  # below the newest step (Orbax would remove it as old), above it
def test_a_users_numbered_folder_in_the_checkpoint_dir_is_refused_and_kept(tmp_path, saved, name):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    (ck / name).mkdir()
    (ck / name / "notes.txt").write_text("a user's own file")
    with pytest.raises(PreflightError) as e:
        open_with(ck, ["checkpoint.keep=1"])
    assert str(e.value) == (f"checkpoint.dir={ck} holds a folder {name} that is not a checkpoint (it holds notes.txt): "
                            f"every numbered folder there is taken for a checkpoint step, and old steps are removed. "
                            f"Move it out of checkpoint.dir, or give checkpoint.dir a folder of its own")
    assert (ck / name / "notes.txt").read_text() == "a user's own file" and steps_in(ck) == sorted([2, 4, int(name)])


def test_a_step_this_user_cannot_read_is_refused_and_neither_moved_nor_passed_over(tmp_path, saved, monkeypatch):
    """A permission problem is not damage: the step is not moved to _corrupt/ and the run does not quietly go
    back to an older step. (The suite may run as root, whom permissions do not stop, so ``os.access`` is told
    which file this user may not read.)"""
    import runner.checkpoint.trash as trash

    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    locked = sorted(f for f in (ck / "4" / "state").rglob("*") if f.is_file())[0]
    real = os.access
    monkeypatch.setattr(trash.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    with pytest.raises(PreflightError) as e:
        open_with(ck)
    assert str(e.value) == (f"checkpoint {ck / '4'} cannot be read by this user: {locked} is not readable "
                            f"(permission denied). Give read access (chmod -R u+rX {ck / '4'}) and re-launch, or "
                            f"move that step out of checkpoint.dir to resume from the one before it")
    assert steps_in(ck) == [2, 4] and not (ck / "_corrupt").exists()
    monkeypatch.setattr(trash.os, "access", lambda p, mode: Path(p) != ck / "4" / "meta" and real(p, mode))
    assert trash.unreadable(ck / "4") == ck / "4" / "meta"  # a folder it may not enter
    monkeypatch.undo()
    assert trash.unreadable(ck / "4") is None


def test_unwritable_checkpoint_dir_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the checkpoint directory should go")
    with pytest.raises(PreflightError, match=rf"checkpoint.dir={blocker}/ck is not writable \(.*\); point "
                                             r"checkpoint.dir at a writable directory"):
        open_with(blocker / "ck")


def test_checkpoint_dir_that_is_a_file_is_refused_and_left_alone(tmp_path):
    blocker = tmp_path / "ck"
    blocker.write_text("not a directory")
    with pytest.raises(PreflightError, match=rf"^checkpoint.dir={blocker} is a file, not a directory; point "
                                             r"checkpoint.dir at a directory .*or move the file away$"):
        open_with(blocker)
    assert blocker.read_text() == "not a directory"


@pytest.mark.slow
def test_full_disk_fails_the_save_loudly_and_keeps_the_previous_checkpoint(tmp_path, caplog):
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
                                                  r"File too large\nThe previous checkpoints are intact"), \
                caplog.at_level(logging.WARNING):
            checkpoints.save(2, state)
            checkpoints.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    checkpoints.close()
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == []  # the error says it once
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


def test_a_stop_after_out_of_range_is_not_offered_as_the_checkpoint_interval(tmp_path):
    """checkpoint.interval=0 with trainer.stop_after=0 (or past the steps): the one fix is stop_after's range; the
    checkpoint hint would suggest an interval as bad as the value it echoes."""
    for stop in (0, -1, 100):
        with pytest.raises(PreflightError) as e:
            open_with(tmp_path / "ck", ["checkpoint.interval=0", f"trainer.stop_after={stop}"])
        assert str(e.value) == (f"invalid config:\n  - trainer.stop_after={stop} must be between 1 and "
                                f"trainer.steps=4")


@pytest.mark.slow
def test_resume_never_refuses_to_mix_with_existing_checkpoints(saved):
    with pytest.raises(PreflightError, match=rf"checkpoint.resume=never but checkpoint.dir={saved} already holds "
                                             r"checkpoints \[2, 4\]"):
        open_with(saved, ["checkpoint.resume=never"])


@pytest.mark.slow
def test_resume_from_a_path_restores_that_step(tmp_path, saved, caplog):
    with caplog.at_level(logging.INFO):  # the path's checkpoint is read through a read-only manager: no word on it
        program, checkpoints = open_with(tmp_path / "ck", [f"checkpoint.resume={saved / '2'}"])
    assert not [r for r in caplog.records if "read only" in r.getMessage()]
    state, start, _ = checkpoints.resume_point()
    assert start == 2 and int(jax.device_get(state.step)) == 2
    np.testing.assert_array_equal(np.asarray(state.tables["users"]), saved_arrays(saved, 2)["['tables']['users']"])


@pytest.mark.slow
def test_changed_settings_are_named_in_a_warning(saved, caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        _, checkpoints = open_with(saved, ["optimizer.learning_rate=0.5"])
    assert checkpoints.resume_point()[1] == 4
    checkpoints.close()
    assert re.search(r"resuming with settings that differ from the checkpoint's: optimizer.learning_rate: "
                     r"[0-9.e-]+ -> 0.5$", caplog.text, re.M)


def test_a_changed_setting_of_a_fixed_set_of_words_is_named_as_written():
    from omegaconf import OmegaConf

    old = OmegaConf.to_container(compose_config(BASE), resolve=True, enum_to_str=True)  # as a checkpoint records it
    changes = ckpt_meta.config_changes(old, compose_config(BASE + ["async_emb.compensation=dc"]))
    assert changes == ["async_emb.compensation: 'none' -> 'dc'"]


@pytest.mark.slow
def test_resume_from_an_older_step_refuses_to_collide_with_newer_ones(saved):
    with pytest.raises(PreflightError, match=rf"restores step 2, but checkpoint.dir={saved} already holds steps "
                                             r"\[4\] that new saves would collide with"):
        open_with(saved, [f"checkpoint.resume={saved / '2'}"])


@pytest.mark.slow
def test_finished_run_resumed_into_a_new_directory_only_evaluates(tmp_path, saved):
    cfg = compose_config(BASE + RUN + [f"checkpoint.dir={tmp_path / 'ck'}", f"checkpoint.resume={saved / '4'}"])
    summary = json.loads((saved.parent / "first" / "summary.json").read_text())
    assert run(cfg, tmp_path / "out") == summary["valid/auc_mean"]
    assert steps_in(tmp_path / "ck") == []  # nothing new to save: the run was complete


# ----- one run per checkpoint directory: the lock -----------------------------------------------------------
def _lock_record(pid: int, host: str | None = None, **extra) -> dict:
    return {"host": host or socket.gethostname(), "pid": pid, "pid_start": ckpt_lock._proc_start(pid),
            "started": "2026-11-30 21:00:00 UTC", "output_dir": "/runs/first", "run_id": "bad-input",
            "command": "python -m runner", "token": "t0", **extra}


def _restores_step_4(ck: Path) -> None:
    """The directory's checkpoints are untouched and still restore (and the lock is released again)."""
    _, again = open_with(ck)
    state, start, _ = again.resume_point()
    again.close()
    assert start == 4 and steps_in(ck) == [2, 4] and not (ck / LOCK_FILE).exists()
    np.testing.assert_array_equal(np.asarray(state.tables["items"]), saved_arrays(ck, 4)["['tables']['items']"])


@pytest.mark.slow
def test_a_second_open_of_a_checkpoint_dir_is_refused_naming_the_holder(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _, first = open_with(ck, out=tmp_path / "first")
    holder = json.loads((ck / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["output_dir"] == str(tmp_path / "first")
    with pytest.raises(PreflightError, match=rf"checkpoint.dir={ck} is in use by another run: pid {os.getpid()} on "
                                             rf"host {re.escape(socket.gethostname())}, started .* UTC, output dir "
                                             rf"{tmp_path / 'first'} \(lock {ck / LOCK_FILE}\).*Wait for that run to "
                                             r"end or stop it, or give this run another checkpoint.dir"):
        open_with(ck, out=tmp_path / "second")
    assert json.loads((ck / LOCK_FILE).read_text()) == holder  # the holder keeps it
    first.close()
    _restores_step_4(ck)


@pytest.mark.slow
def test_a_lock_held_by_another_live_process_is_refused(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    holder = subprocess.Popen(["sleep", "600"])
    try:
        (ck / LOCK_FILE).write_text(json.dumps(_lock_record(holder.pid)))
        with pytest.raises(PreflightError, match=rf"is in use by another run: pid {holder.pid} on host .*, started "
                                                 r"2026-11-30 21:00:00 UTC, output dir /runs/first"):
            open_with(ck)
        assert json.loads((ck / LOCK_FILE).read_text())["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone now: its lock is stale and the next open breaks it
    _restores_step_4(ck)


@pytest.mark.slow
def test_a_stale_lock_of_a_dead_process_is_broken(tmp_path, saved, caplog):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (ck / LOCK_FILE).write_text(json.dumps(_lock_record(dead.pid, pid_start="1")))  # "1": even a reused pid is not it
    with caplog.at_level(logging.WARNING, logger="runner"):
        _, checkpoints = open_with(ck)
    assert f"checkpoint.dir lock {ck / LOCK_FILE} was left by a run that is no longer running (pid {dead.pid}" \
           in caplog.text
    assert json.loads((ck / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert checkpoints.resume_point()[1] == 4
    checkpoints.close()
    assert not (ck / LOCK_FILE).exists() and not [p for p in ck.iterdir() if p.name.startswith(".run.lock")]


@pytest.mark.slow
def test_a_lock_from_another_host_is_never_broken(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    (ck / LOCK_FILE).write_text(json.dumps(_lock_record(12345, host="node-17")))
    with pytest.raises(PreflightError, match=rf"checkpoint.dir={ck} is locked by a run on another host: pid 12345 on "
                                             rf"host node-17, .*If it is not, remove {ck / LOCK_FILE} and re-launch"):
        open_with(ck)
    assert json.loads((ck / LOCK_FILE).read_text())["host"] == "node-17"
    (ck / LOCK_FILE).unlink()  # the fix the message gives
    _restores_step_4(ck)


@pytest.mark.slow
def test_a_garbled_lock_file_is_refused_by_name(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    (ck / LOCK_FILE).write_text("{half a lock")
    with pytest.raises(PreflightError, match=rf"checkpoint.dir lock {ck / LOCK_FILE} is not a lock this runner wrote "
                                             r"\('\{half a lock'\); if no other run uses this checkpoint.dir, remove "
                                             r"it and re-launch"):
        open_with(ck)
    (ck / LOCK_FILE).unlink()
    _restores_step_4(ck)


# ----- a deferred update naming a padding row ---------------------------------------------------------------
STRAY = 502  # vocab 501 padded to 504 rows on the 2x4 row layout: 502 is a padding row


@pytest.fixture(scope="module")
def stray_record(tmp_path_factory) -> Path:
    """A checkpoint (step 1, 2x4 row layout) whose deferred update of the items table names padding row 502:
    written by the runner's own save, so its digests match and only the resume's refit can notice it."""
    d = tmp_path_factory.mktemp("stray")
    cfg = compose_config(BASE + RUN + [f"checkpoint.dir={d / 'ck'}", "mesh=data_table", "mesh.axes={data:2,table:4}",
                                       "mesh.table_layout=row"])
    program, _, plan = build(cfg)
    assert (program.tables["items"].vocab, program.tables["items"].rows) == (501, 504)
    checkpoints = open_checkpoints(cfg, program, plan, d / "first")
    state = program.init_state(0)
    upd = state.pending["items"]
    unique = np.asarray(upd.unique_tokens).copy()
    unique[0] = STRAY
    put = lambda x, like: jax.device_put(np.asarray(x, like.dtype), like.sharding)  # noqa: E731
    state = state._replace(step=put(1, state.step), pending={**state.pending, "items": upd._replace(
        unique_tokens=put(unique, upd.unique_tokens), pending=put(True, upd.pending))})
    checkpoints.save(1, state)
    checkpoints.wait()
    checkpoints.close()
    return d / "ck"


def stray_message(ck: Path) -> str:
    return (f"checkpoint {ck / '1'}: the deferred update of table 'items' holds ids [{STRAY}] outside its 501 rows "
            f"(ids 0..500, stored padded to 504 rows). No run writes such an update: the checkpoint was damaged "
            f"before its digests were taken, or written by another program. Move {ck / '1'} away to resume from "
            f"the checkpoint before it, or start a new run: checkpoint.resume=never with another checkpoint.dir "
            f"or trainer.run_id.")


@pytest.mark.slow  # its fixture builds and saves a 2x4 checkpoint (~4-7 s)
@pytest.mark.parametrize("mesh", [["mesh=single"], ["mesh=data_table", "mesh.axes={data:2,table:4}",
                                                    "mesh.table_layout=row"]], ids=["501-rows", "same-504-rows"])
def test_a_deferred_update_naming_a_padding_row_is_refused(stray_record, mesh):
    """Onto one device (the record is rebuilt for 501 rows) and onto the mesh that wrote it (kept as it is)."""
    with pytest.raises(PreflightError) as e:
        open_with(stray_record, mesh)
    assert str(e.value) == stray_message(stray_record)
    assert steps_in(stray_record) == [1] and not (stray_record / LOCK_FILE).exists()  # left as it was


# ----- the command line: one clear message, no traceback --------------------------------------------------
NOISE = ("Traceback", "Task exception was never retrieved", "Exception ignored in", "Event loop is closed")


def cli(tmp: Path, run_dir: str, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "runner", *TINY, *BASE, *RUN, f"hydra.run.dir={tmp / run_dir}", *overrides]
    return subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_refusals_on_the_command_line_are_one_message_and_leave_the_directory_alone(tmp_path, saved):
    """checkpoint.resume=<missing path> with checkpoints on, and a second run on a locked checkpoint.dir."""
    missing = cli(tmp_path, "r1", f"checkpoint.dir={tmp_path / 'fresh'}", "checkpoint.resume=/nope")
    assert missing.returncode == 2
    assert "error: checkpoint.resume=/nope is not a checkpoint (no step directory with a meta/ item there); use " \
           "auto, never, or the path of a checkpoint step or checkpoint directory" in missing.stderr
    assert not [n for n in NOISE if n in missing.stdout + missing.stderr], missing.stderr[-3000:]
    assert not (tmp_path / "fresh").exists()  # refused before anything was created

    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _, holder = open_with(ck, out=tmp_path / "first")  # this test process is the first run
    try:
        second = cli(tmp_path, "r2", f"checkpoint.dir={ck}")
    finally:
        holder.close()
    assert second.returncode == 2
    assert (f"error: checkpoint.dir={ck} is in use by another run: pid {os.getpid()} on host "
            f"{socket.gethostname()}, started ") in second.stderr
    assert f"output dir {tmp_path / 'first'} (lock {ck / LOCK_FILE})" in second.stderr
    assert not [n for n in NOISE if n in second.stdout + second.stderr], second.stderr[-3000:]
    _restores_step_4(ck)


@pytest.mark.slow
def test_a_deferred_update_naming_a_padding_row_is_one_message_on_the_command_line(tmp_path, stray_record):
    proc = cli(tmp_path, "r", f"checkpoint.dir={stray_record}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: {stray_message(stray_record)}\n" in proc.stderr
    assert not [n for n in NOISE if n in proc.stdout + proc.stderr], proc.stderr[-3000:]
    assert steps_in(stray_record) == [1] and not (stray_record / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_is_one_warning_on_the_command_line(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _truncate(ck / "4")
    proc = cli(tmp_path, "r", f"checkpoint.dir={ck}")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert text.count("is unreadable or corrupted") == 1 and not [n for n in NOISE if n in text], text[-6000:]
    assert re.search(rf"\[runner\]\[WARNING\] - checkpoint {ck}/4 is unreadable or corrupted \(step 4 \(.*\)\); "
                     rf"moved to {ck}/_corrupt/4, falling back to the one before it", text)
    assert f"resuming from {ck / '2'}: step 2 of 4" in text
    assert steps_in(ck) == [2, 4] and not (ck / LOCK_FILE).exists()  # 4 written again, the lock released


# ----- older and newer checkpoint formats -------------------------------------------------------------------
@pytest.mark.slow
def test_a_format_1_checkpoint_is_verified_with_its_own_digest_and_other_formats_are_refused(tmp_path, saved):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    program, checkpoints = open_with(ck)
    state = checkpoints.resume_point()[0]
    checkpoints.close()
    meta_file = ck / "4" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert meta["format"] == ckpt_meta.FORMAT == 2
    old = ckpt_meta.digests(state, ckpt_meta.tables_of(program), 1)  # as the runner before format 2 wrote them
    assert old != {k: a["digest"] for k, a in meta["arrays"].items()}
    meta_file.write_text(json.dumps({**meta, "format": 1,
                                     "arrays": {k: {**a, "digest": old[k]} for k, a in meta["arrays"].items()}}))
    _restores_step_4(ck)  # read, and its digests matched under the old scheme

    version = meta["versions"]["recsys-runner"]
    for fmt, says in ((99, f"; a newer runner (recsys-runner {version}) wrote it: resume it with that version of "
                           f"the runner, or start a new run"),
                      (0, f"; an older runner (recsys-runner {version}) wrote it, and this one no longer reads "
                          f"that format: resume it with the runner version that wrote it, or start a new run"),
                      ("2", "; '2' is no format any runner writes, so its meta/ item is damaged or was not written "
                            "by this runner: start a new run")):
        meta_file.write_text(json.dumps({**meta, "format": fmt}))
        with pytest.raises(PreflightError) as err:
            open_with(ck)
        assert str(err.value).startswith(f"checkpoint {ck / '4'} cannot be read by this runner: checkpoint format: "
                                         f"the checkpoint has {fmt!r}, this runner reads [1, 2]{says}"), str(err.value)
        assert "the config that wrote it" not in str(err.value)  # a format is no config problem
        assert steps_in(ck) == [2, 4] and not (ck / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_locked_checkpoint_dir_stops_every_process_of_a_multi_process_run(tmp_path):
    """Process 0 holds the lock for the run; when it cannot, every process ends with an error, none hangs."""
    ck = tmp_path / "ck"
    ck.mkdir()
    holder = subprocess.Popen(["sleep", "600"])
    try:
        (ck / LOCK_FILE).write_text(json.dumps(_lock_record(holder.pid)))
        proc = subprocess.run([sys.executable, "-m", "runner.launch", "-n", "2", "--", *TINY, "mesh=data",
                               "mesh.cpu_devices=1", "checkpoint.interval=2", f"checkpoint.dir={ck}",
                               f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert json.loads((ck / LOCK_FILE).read_text())["pid"] == holder.pid  # still the holder's
    finally:
        holder.kill()
        holder.wait()
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (f"[p0] error: checkpoint.dir={ck} is in use by another run: pid {holder.pid} on host "
            f"{socket.gethostname()}, started 2026-11-30 21:00:00 UTC, output dir /runs/first") in text, text[-3000:]
    assert f"[p1] error: checkpoint.dir={ck} is in use by another run: process 0 could not lock it" in text
    assert "Traceback" not in text


