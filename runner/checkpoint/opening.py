"""Opening a run's checkpoint directory: the drills and settings checked, ``checkpoint.dir`` locked (process 0),
the remains of interrupted saves and cleanups reported, the restore per ``checkpoint.resume`` and the metrics
history carried over (``open_with_orbax``, which ``runner.checkpoint.open_checkpoints`` calls).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from . import data as data_lib
from . import drills, quiet, trash
from . import lock as lock_lib
from . import meta as meta_lib
from ..outputs import METRICS_FILE, SUMMARY_FILE, set_aside
from ..errors import PreflightError
from .manager import TMP_SUFFIX, Checkpoints, _manager

log = logging.getLogger("runner")


def open_with_orbax(cfg: DictConfig, program, plan, output_dir: str | os.PathLike,
                    data_file: str | os.PathLike | None = None) -> Checkpoints:
    """Lock ``checkpoint.dir``, restore per ``checkpoint.resume`` and carry the metrics history over; call it
    through ``runner.checkpoint.open_checkpoints``, which checks the settings first and returns None when
    checkpoints are off (``meta.wanted``). On any error the lock is released and Orbax's threads are stopped
    before it propagates. ``data_file`` is fingerprinted once, here (``data.py``)."""
    c, out = cfg.checkpoint, Path(output_dir)
    resume = str(c.resume)
    drills.check()
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every step of every save at INFO
    quiet.install_quiet_hooks()
    directory = meta_lib.directory_of(cfg)
    path = meta_lib.resume_path(cfg)
    source = None if path is None else meta_lib.resume_source(Path(path))  # before any thread
    data = None if data_file is None else data_lib.fingerprint(data_file)
    lock = None
    if c.interval > 0:
        meta_lib.check_writable(directory)
        lock = _lock(directory, out, meta_lib.run_id(cfg))
    ck = None
    try:
        if c.interval > 0:
            if jax.process_index() == 0:
                trash.empty(directory, report=True)
            stranger = trash.foreign_steps_problem(directory)
            if stranger:  # nothing of it is read, moved or removed
                raise PreflightError(stranger)
            partial = sorted(p.name for p in directory.iterdir() if TMP_SUFFIX in p.name)
            if partial and jax.process_index() == 0:  # every process sees them; one says so
                log.warning("%s holds interrupted saves %s (never committed): ignored and removed", directory,
                            partial)
        ck = Checkpoints(cfg, program, plan, out, directory if c.interval > 0 else None, lock, data=data)
        _resume(ck, resume, source, directory, out)
        return ck
    except BaseException:
        if ck is not None:
            ck.close()
        elif lock is not None:
            lock.release()
        raise


def _lock(directory: Path, out: Path, run_id: str) -> lock_lib.Lock | None:
    """Process 0 takes the directory's lock for the run; every process learns whether it could."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = lock_lib.acquire(directory, output_dir=str(out.absolute()), run_id=run_id)
        except PreflightError as e:
            error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        ok = np.asarray(multihost_utils.process_allgather(np.int32(error is None)))
        if not ok.all() and error is None:
            error = PreflightError(f"checkpoint.dir={directory} is in use by another run: process 0 could not lock "
                                   f"it (its error names the holder)")
    if error is not None:
        raise error
    return lock


def _resume(ck: Checkpoints, resume: str, source: tuple[Path, list[int]] | None, directory: Path, out: Path):
    own = ck.manager.all_steps() if ck.manager is not None else []
    if resume == "never" and own:
        raise PreflightError(
            f"checkpoint.resume=never but checkpoint.dir={directory} already holds checkpoints {own}; a new run "
            f"would mix with them. Use checkpoint.resume=auto to continue that run, or another checkpoint.dir "
            f"or trainer.run_id to start a new one.")
    if resume == "auto":
        ck.restored = ck.restore_newest(ck.manager, own, own=True)
    elif source is not None:
        path, steps = source
        reader = _manager(path, keep=1, async_save=False, read_only=True)
        try:
            ck.restored = ck.restore_newest(reader, steps, own=False)
        finally:
            reader.close()
        later = [s for s in own if s > ck.restored.step]
        if later:
            raise PreflightError(
                f"checkpoint.resume={resume} restores step {ck.restored.step}, but checkpoint.dir={directory} "
                f"already holds steps {later} that new saves would collide with; move them away or use another "
                f"checkpoint.dir")
    if ck.restored is not None and ck.restored.step > ck.steps:
        earlier = [s for s in own if s <= ck.steps]
        raise PreflightError(
            f"trainer.steps={ck.steps} is below step {ck.restored.step} of the checkpoint {ck.restored.path}: that "
            f"run is already past the end this one asks for. Raise trainer.steps to {ck.restored.step} or more to "
            f"go on from it, or start a new run in another checkpoint.dir" + (
                f" (with checkpoint.resume={directory / str(max(earlier))} it starts from that earlier step)"
                if earlier else ""))
    if ck.restored is not None:
        ck.last_step, ck.rows = ck.restored.step, ck.restored.metrics_rows
        if jax.process_index() == 0:
            log.info("resuming from %s: step %d of %d (written by %s)", ck.restored.path, ck.restored.step,
                     ck.steps, ", ".join(f"{k} {v}" for k, v in ck.restored.meta["versions"].items()))
            for level, note in ck.restored.notes:  # what the restore found (settings that differ among them): said
                log.log(level, "%s", note)  # once the resume is certain (not before a refusal), by process 0 alone
            ck.last_row = meta_lib.carry_metrics(out / METRICS_FILE, ck.restored.meta.get("output_dir"), ck.rows)
    elif ck.manager is not None and jax.process_index() == 0:
        _set_aside_metrics(out / METRICS_FILE)


def _set_aside_metrics(path: Path) -> None:
    """A checkpointed run that starts from step 0 in a folder holding a record (a launch that died before its
    first checkpoint committed, or another run given the same hydra.run.dir): appended to, its steps would repeat,
    and its summary.json would be overwritten. Both are moved aside, whole."""
    if not (path.exists() and path.stat().st_size) and not (path.parent / SUMMARY_FILE).is_file():
        return
    moved = set_aside(path.parent)
    rows = len(moved[path.name].read_text().splitlines()) if path.name in moved else 0
    log.warning("%s holds the record of an earlier run that this one does not continue (%d metric rows; no "
                "checkpoint of it in this checkpoint.dir): moved to %s; this run starts from step 0 and writes its own",
                path.parent, rows, ", ".join(p.name for p in moved.values()))
