"""Checkpoints and exact resume, through Orbax's CheckpointManager (tensorstore zarr3 on OCDBT).

One checkpoint is one step directory ``<checkpoint.dir>/<step>/`` holding two items: ``state/`` (the whole
``TrainState``: tables and their optimizer state, dense params and optax state, the deferred async update,
step and RNG, each array sharded as it is in memory) and ``meta/`` (JSON from ``runner.checkpoint.meta``:
the data position, the metrics rows logged so far, the run id, the config and library versions that wrote
it, every array's shape and digest).

- Atomic: Orbax writes into ``<step>.orbax-checkpoint-tmp`` and renames it only after every item is
  committed, so a crash mid-write leaves the previous checkpoints untouched and the partial one is ignored
  (and removed on the next launch).
- Async: ``save`` returns once the arrays are copied off the device; the write continues in the background.
  A failed write is raised as ``CheckpointError`` at the next save or at the end of the run (``wait``).
- Resume: the newest checkpoint that restores and matches its digests wins; an unreadable one is reported,
  moved to ``<checkpoint.dir>/_corrupt/`` and the one before it is used. Arrays are read straight into this
  run's shardings, so a checkpoint reshards onto another mesh or table layout.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from omegaconf import DictConfig

from . import meta as meta_lib
from ..core import mesh as mesh_lib
from ..outputs import METRICS_FILE
from ..preflight import PreflightError

log = logging.getLogger("runner")
KILL_ENV = "RUNNER_TEST_KILL_BEFORE_COMMIT"  # test hook: SIGKILL the process just before this step commits
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the run stops rather than train on without one."""


@dataclasses.dataclass
class Restored:
    state: Any
    step: int
    metrics_rows: int
    path: Path
    meta: dict


class _KillBeforeCommit(ocp.path.atomicity.AtomicRenameTemporaryPath):
    """Only with ``RUNNER_TEST_KILL_BEFORE_COMMIT=<step>``: every array of that step is written, then the
    process dies before the rename that would commit it (the pre-emption drill of the tests)."""

    async def finalize(self, *args, **kwargs):
        if self.get_final().name == os.environ.get(KILL_ENV):
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().finalize(*args, **kwargs)


class Checkpoints:
    """This run's checkpoints: restore once at the start, save every ``interval`` steps, wait at the end."""

    def __init__(self, cfg: DictConfig, program: Any, plan: Any, output_dir: Path, directory: Path | None):
        c = cfg.checkpoint
        self.cfg, self.program, self.plan, self.output_dir = cfg, program, plan, output_dir
        self.run_id, self.directory = meta_lib.run_id(cfg), directory
        self.interval, self.steps = int(c.interval), int(cfg.trainer.steps)
        self.stop_after = cfg.trainer.get("stop_after")
        self.restored: Restored | None = None
        self.last_step, self.rows, self.last_row = -1, 0, {}
        self.written: int | None = None  # the step of the last save this launch started
        self.manager = None if directory is None else _manager(directory, keep=c.keep, async_save=c.async_save,
                                                               compress=c.compress)

    # ----- saving ------------------------------------------------------------------------------------
    def step_done(self, step: int, state: Any) -> None:
        """After a train step (and its log row): save if the interval or the pre-emption drill says so."""
        if step < self.steps and ((self.interval > 0 and step % self.interval == 0) or step == self.stop_after):
            self.save(step, state)

    def save_final(self, state: Any) -> None:
        """After the final flush: the end state, so a re-launch of a finished run only re-evaluates."""
        self.save(self.steps, state)

    def save(self, step: int, state: Any) -> None:
        if self.manager is None or step <= self.last_step:
            return
        meta = meta_lib.describe(self.cfg, self.program, state, step=step, metrics_rows=self.rows,
                                 run=self.run_id, output_dir=str(self.output_dir.absolute()),
                                 mesh=self.plan.describe())
        args = ocp.args.Composite(state=ocp.args.PyTreeSave(state), meta=ocp.args.JsonSave(meta))
        try:
            self.manager.save(step, args=args, force=True)  # first waits for (and raises) the previous save
        except Exception as e:  # noqa: BLE001 - any failure to write is fatal, with the path and the cause
            raise self._failed(step, e) from e
        self.last_step = self.written = step

    def wait(self) -> None:
        """Block until the last save is committed; raise CheckpointError if it failed."""
        if self.manager is None or self.written is None:
            return
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._failed(self.written, e) from e
        if jax.process_index() == 0 and not (self.directory / str(self.written)).is_dir():
            raise self._failed(self.written, RuntimeError("the step directory was never committed"))

    def close(self) -> None:
        """Wait for an in-flight save without raising (the run is ending on another error, or already waited)."""
        if self.manager is None:
            return
        try:
            self.manager.close()
        except Exception as e:  # noqa: BLE001
            log.error("checkpoint save failed while the run was ending: %s", e)

    def _failed(self, step: int, e: BaseException) -> CheckpointError:
        return CheckpointError(
            f"saving checkpoint step {step} to {self.directory} failed: {type(e).__name__}: {e}\n"
            f"The previous checkpoints are intact. Free space or fix permissions on checkpoint.dir (or point it "
            f"elsewhere) and re-launch: the run resumes from the newest complete checkpoint.")

    # ----- tracking ----------------------------------------------------------------------------------
    def track(self, tracker: Any) -> "_CountingTracker":
        """Count the rows the run logs, so a resume keeps exactly those logged before its checkpoint."""
        return _CountingTracker(tracker, self)

    def resume_point(self) -> tuple[Any, int, dict]:
        """(restored state or None, first step to run, last train row logged); hands the state over once."""
        if self.restored is None:
            return None, 0, {}
        r, self.restored = self.restored, None
        return r.state, r.step, self.last_row

    # ----- restoring ---------------------------------------------------------------------------------
    def restore_newest(self, manager: Any, steps: list[int], own: bool) -> Restored | None:
        abstract = jax.eval_shape(lambda: self.program.init_state(int(self.cfg.trainer.seed)))
        shardings = self.program.state_shardings(abstract)
        bad = []
        for step in sorted(steps, reverse=True):
            where = Path(manager.directory) / str(step)
            try:
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
            except Exception as e:  # noqa: BLE001
                bad.append(self._unreadable(where, step, e, own))
                continue
            meta_lib.check_compatible(meta, self.program, str(where))  # a wrong config is an error, not a skip
            target = meta_lib.restore_target(meta, abstract, shardings, mesh_lib.replicated(self.program.mesh),
                                             str(where))
            try:
                # strict=False: row-padded leaves are padded with zeros or cut to this layout's row count
                how = ocp.checkpoint_utils.construct_restore_args(target, strict=False)
                args = ocp.args.Composite(state=ocp.args.PyTreeRestore(target, restore_args=how))
                state = manager.restore(step, args=args).state
                self._verify(state, meta)
            except Exception as e:  # noqa: BLE001
                bad.append(self._unreadable(where, step, e, own))
                continue
            changes = meta_lib.config_changes(meta["config"], self.cfg)
            if changes:
                log.warning("resuming with settings that differ from the checkpoint's: %s", "; ".join(changes))
            return Restored(self._refit(state, meta), int(meta["data_step"]), int(meta["metrics_rows"]), where,
                            meta)
        if bad:
            raise PreflightError(
                f"no readable checkpoint in {manager.directory}: " + "; ".join(bad) + ". They were moved aside "
                "(own run) or left as they are; re-launch to start from scratch, or resume from a copy "
                "with checkpoint.resume=<path>.")
        return None

    def _unreadable(self, where: Path, step: int, e: BaseException, own: bool) -> str:
        first = str(e).splitlines()[0] if str(e) else ""
        msg = f"step {step} ({type(e).__name__}: {first[:160]})"
        log.warning("checkpoint %s is unreadable or corrupted (%s); falling back to the one before it",
                    where, msg)
        if own and jax.process_index() == 0:
            dest = self.directory / "_corrupt" / f"{step}"
            n = 0
            while dest.exists():
                n += 1
                dest = self.directory / "_corrupt" / f"{step}.{n}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(where), str(dest))
            log.warning("moved %s to %s", where, dest)
        if own:
            _sync("checkpoint_quarantine")
            self.manager.reload()
        return msg

    def _verify(self, state: Any, meta: Mapping[str, Any]) -> None:
        got = meta_lib.digests(state, meta_lib.tables_of(self.program))
        wrong = [k for k, a in meta["arrays"].items() if got.get(k) != a["digest"]]
        if wrong:
            raise ValueError(f"content does not match the digests written with it: {wrong[:4]}")
        if int(np.asarray(state.step.addressable_data(0))) != int(meta["data_step"]):
            raise ValueError(f"state.step does not match the recorded data position {meta['data_step']}")

    def _refit(self, state: Any, meta: Mapping[str, Any]) -> Any:
        """Re-pad the deferred updates' id lists for this run's padded row counts."""
        if not state.pending:
            return state
        pending = dict(state.pending)
        for n, upd in pending.items():
            ctx, old = self.program.contexts[n], meta["tables"][n]
            if upd.unique_tokens.shape == (ctx.num_unique,) and old["rows"] == ctx.vocab:
                continue
            ids = meta_lib.refit_unique_tokens(np.asarray(upd.unique_tokens.addressable_data(0)),
                                               old["vocab"], old["rows"], ctx.vocab, ctx.num_unique)
            sharding = mesh_lib.replicated(self.program.mesh)
            pending[n] = upd._replace(unique_tokens=jax.make_array_from_callback(
                ids.shape, sharding, lambda idx, ids=ids: ids[idx]))
        return state._replace(pending=pending)


class _CountingTracker:
    def __init__(self, inner: Any, owner: Checkpoints):
        self.inner, self.owner = inner, owner

    def log(self, metrics, step):
        self.inner.log(metrics, step)
        self.owner.rows += 1

    def __getattr__(self, name):  # everything else (log_summary, finish, ...) is the wrapped tracker's
        return getattr(self.inner, name)


def _manager(directory: Path, *, keep: int, async_save: bool, compress: bool = False, read_only: bool = False):
    """The state as zarr3 arrays in an OCDBT key-value store (zstd only with ``compress``); meta as JSON."""
    opts = dict(read_only=True, save_interval_steps=0, create=False) if read_only else dict(
        max_to_keep=keep, create=True, cleanup_tmp_directories=True, enable_async_checkpointing=async_save)
    if os.environ.get(KILL_ENV) and not read_only:
        opts["temporary_path_class"] = _KillBeforeCommit
    handlers = {"state": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=compress),
                "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(**opts), item_handlers=handlers)


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# ----- setup: checks, the run's directory, the resume ---------------------------------------------------
def open_checkpoints(cfg: DictConfig, program: Any, plan: Any, output_dir: str | os.PathLike) -> Checkpoints | None:
    """Check the checkpoint settings, restore per ``checkpoint.resume`` and carry the metrics history over.
    None when checkpoints are off (``checkpoint.interval=0`` and nothing to resume from)."""
    c, out = cfg.checkpoint, Path(output_dir)
    meta_lib.check_settings(cfg)
    resume = str(c.resume)
    if c.interval == 0 and resume in ("auto", "never"):
        return None
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every step of every save at INFO
    directory = Path(c.dir or Path("outputs/checkpoints") / meta_lib.run_id(cfg)).absolute()
    if c.interval > 0:
        meta_lib.check_writable(directory)
        partial = sorted(p.name for p in directory.iterdir() if TMP_SUFFIX in p.name)
        if partial:
            log.warning("%s holds interrupted saves %s (never committed): ignored and removed", directory, partial)
    ck = Checkpoints(cfg, program, plan, out, directory if c.interval > 0 else None)
    own = ck.manager.all_steps() if ck.manager is not None else []
    if resume == "never" and own:
        raise PreflightError(
            f"checkpoint.resume=never but checkpoint.dir={directory} already holds checkpoints {own}; a new run "
            f"would mix with them. Use checkpoint.resume=auto to continue that run, or another checkpoint.dir "
            f"or trainer.run_id to start a new one.")
    if resume == "auto":
        ck.restored = ck.restore_newest(ck.manager, own, own=True)
    elif resume != "never":
        source, steps = meta_lib.resume_source(Path(resume))
        ck.restored = ck.restore_newest(_manager(source, keep=1, async_save=False, read_only=True), steps, own=False)
        later = [s for s in own if s > ck.restored.step]
        if later:
            raise PreflightError(
                f"checkpoint.resume={resume} restores step {ck.restored.step}, but checkpoint.dir={directory} "
                f"already holds steps {later} that new saves would collide with; move them away or use another "
                f"checkpoint.dir")
    if ck.restored is not None:
        ck.last_step, ck.rows = ck.restored.step, ck.restored.metrics_rows
        if jax.process_index() == 0:
            log.info("resuming from %s: step %d of %d (written by %s)", ck.restored.path, ck.restored.step,
                     ck.steps, ", ".join(f"{k} {v}" for k, v in ck.restored.meta["versions"].items()))
            ck.last_row = meta_lib.carry_metrics(out / METRICS_FILE, ck.restored.meta.get("output_dir"), ck.rows)
    return ck
