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
- Resume: the newest checkpoint that restores and matches its digests wins; an unreadable one is reported in
  one warning, moved to ``<checkpoint.dir>/_corrupt/`` and the one before it is used (the echoes of Orbax's
  abandoned reads are dropped: ``quiet.abandoned_reads_dropped``). Arrays are read straight into this run's
  shardings, so a checkpoint reshards onto another mesh or table layout.
- Cleanup: a step past ``checkpoint.keep`` leaves the directory in one rename and its files are removed
  afterwards (``trash.py``), so a kill during cleanup leaves only whole steps; a step half-deleted in place
  (by an older runner) is skipped with a warning.
- One run per directory: ``opening.open_with_orbax`` takes ``<checkpoint.dir>/run.lock`` (``lock.py``) before Orbax
  touches the directory and ``Checkpoints.close`` releases it; every error on the way releases it too.
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from omegaconf import DictConfig

from . import data as data_lib
from . import drills, quiet, trash
from . import lock as lock_lib
from . import meta as meta_lib
from . import rebucket as rebucket_lib
from . import target as target_lib
from .handlers import type_handlers
from ..core import mesh as mesh_lib
from ..errors import CheckpointError, PreflightError

log = logging.getLogger("runner")
TMP_SUFFIX = ".orbax-checkpoint-tmp"


@dataclasses.dataclass
class Restored:
    state: Any
    step: int
    metrics_rows: int
    path: Path
    meta: dict
    notes: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (level, message): opening._resume's


class Checkpoints:
    """This run's checkpoints: restore once at the start, save every ``interval`` steps, wait at the end."""

    def __init__(self, cfg: DictConfig, program: Any, plan: Any, output_dir: Path, directory: Path | None,
                 lock: lock_lib.Lock | None = None, data: Mapping[str, Any] | None = None):
        c = cfg.checkpoint
        self.lock = lock  # process 0's hold on checkpoint.dir (None elsewhere, and when nothing is written)
        self.data = data  # the fingerprint of the task's data file (data.py), or None: recorded in each meta
        self.cfg, self.program, self.plan, self.output_dir = cfg, program, plan, output_dir
        self.run_id, self.directory = meta_lib.run_id(cfg), directory
        self.interval, self.steps = int(c.interval), int(cfg.trainer.steps)
        self.stop_after = cfg.trainer.get("stop_after")
        self.restored: Restored | None = None
        self.restored_selection, self.restored_best = None, None  # selection.py's record and BestState
        self.last_step, self.rows, self.last_row = -1, 0, {}
        self.written: int | None = None  # the step of the last save this launch started
        self.manager = None if directory is None else _manager(directory, keep=c.keep, async_save=c.async_save,
                                                               compress=c.compress)

    # ----- saving ------------------------------------------------------------------------------------
    def step_done(self, step: int, state: Any, selection: Any = None) -> None:
        """After a train step (and its log row): save if the interval or the pre-emption drill says so, or
        the run stops early here (``selection.stopped_at``)."""
        stops = selection is not None and selection.stopped_at == step
        if step < self.steps and not stops and ((self.interval > 0 and step % self.interval == 0)
                                                or step == self.stop_after):
            self.save(step, state, selection)

    def save_final(self, state: Any, selection: Any = None, step: int | None = None) -> None:
        """After the final flush: the end state (at ``step``, an early stop's, else trainer.steps), so a
        re-launch of a finished run only re-evaluates."""
        self.save(self.steps if step is None else step, state, selection)

    def save(self, step: int, state: Any, selection: Any = None) -> None:
        """The state, and beside it the best-state selection's record (meta ``selection``) and the best
        params and tables (item ``best``, with their digests in meta ``best_arrays``)."""
        if self.manager is None or step <= self.last_step:
            return
        meta = meta_lib.describe(self.cfg, self.program, state, step=step, metrics_rows=self.rows,
                                 run=self.run_id, output_dir=str(self.output_dir.absolute()),
                                 mesh=self.plan.describe(), data=self.data)
        items = dict(state=ocp.args.PyTreeSave(state))
        if selection is not None and selection.step is not None:
            meta["selection"] = selection.record()
            if selection.best is not None:
                meta["best_arrays"] = meta_lib.describe_arrays(self.program, selection.best)
                items["best"] = ocp.args.PyTreeSave(selection.best)
        args = ocp.args.Composite(**items, meta=ocp.args.JsonSave(meta))
        self._settle()  # the previous save committed (or raised) and its old steps' files are gone
        try:
            self.manager.save(step, args=args, force=True)
        except Exception as e:  # noqa: BLE001 - any failure to write is fatal, with the path and the cause
            raise self._failed(step, e) from e
        self.last_step = self.written = step

    def wait(self) -> None:
        """Block until the last save is committed; raise CheckpointError if it failed."""
        if self.manager is None or self.written is None:
            return
        self._settle()
        if jax.process_index() == 0 and not (self.directory / str(self.written)).is_dir():
            raise self._failed(self.written, RuntimeError("the step directory was never committed"))

    def _settle(self) -> None:
        """Wait for the save in flight, raising its failure; then remove the files of the steps it retired
        (Orbax moved them to ``_deleting/``: ``trash.py``)."""
        if self.written is None:
            return
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._failed(self.written, e) from e
        if jax.process_index() == 0:
            trash.empty(self.directory)

    def close(self) -> None:
        """Wait for an in-flight save without raising (the run is ending on another error, or already waited)."""
        try:
            if self.manager is not None:
                self.manager.close()
                if jax.process_index() == 0:
                    trash.empty(self.directory)
        except Exception as e:  # noqa: BLE001
            log.error("checkpoint save failed while the run was ending: %s", e)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _failed(self, step: int, e: BaseException) -> CheckpointError:
        return CheckpointError(
            f"saving checkpoint step {step} to {self.directory} failed: {type(e).__name__}: {e}\n"
            f"The previous checkpoints are intact. Free space or fix permissions on checkpoint.dir (or point it "
            f"elsewhere) and re-launch: the run resumes from the newest complete checkpoint.")

    # ----- tracking ----------------------------------------------------------------------------------
    def track(self, tracker: Any) -> "_CountingTracker":
        """Count the rows the run logs, so a resume keeps exactly those logged before its checkpoint."""
        return _CountingTracker(tracker, self)

    def selection_point(self) -> tuple[dict | None, Any]:
        """(the restored checkpoint's selection record or None, its best params and tables or None)."""
        return self.restored_selection, self.restored_best

    def resume_point(self) -> tuple[Any, int, dict]:
        """(restored state or None, first step to run, last train row logged); hands the state over once."""
        if self.restored is None:
            return None, 0, {}
        r, self.restored = self.restored, None
        return r.state, r.step, self.last_row

    # ----- restoring ---------------------------------------------------------------------------------
    def restore_newest(self, manager: Any, steps: list[int], own: bool) -> Restored | None:
        with drills.killed_in_restore():
            return self._restore_newest(manager, steps, own)

    def _restore_newest(self, manager: Any, steps: list[int], own: bool) -> Restored | None:
        abstract = self.program.state_shapes(int(self.cfg.trainer.seed))
        shardings = self.program.state_shardings(abstract)
        bad = []
        for step in sorted(steps, reverse=True):
            where = Path(manager.directory) / str(step)
            locked = trash.unreadable_problem(where)
            if locked:  # not damaged: neither moved aside nor passed over for an older step
                raise PreflightError(locked)
            failure = None
            missing = trash.half_deleted(where)
            if missing:
                bad.append(self._half_deleted(where, step, missing, own))
                continue
            try:
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
                shape = meta_lib.malformed(meta)
                if shape:
                    raise ValueError(shape)
            except Exception as e:  # noqa: BLE001
                failure = self._unreadable(where, step, e, own)
            if failure is not None:
                bad.append(failure)
                continue
            if meta["step"] != step:  # a step folder copied or renamed by hand: never read as this step
                raise PreflightError(
                    f"checkpoint {where} holds step {meta['step']} (its metadata says so), not step {step}: a step "
                    f"folder copied or renamed by hand. Name it {meta['step']} (in a folder that holds no other step "
                    f"{meta['step']}), or move it out of the checkpoint directory")
            meta_lib.check_compatible(meta, self.program, str(where))  # a wrong config is an error, not a skip
            notes, allow = [], bool(self.cfg.checkpoint.get("allow_data_change"))  # notes: Restored.notes
            data_lib.check(meta, self.data, str(where), allow, notes)
            data_lib.check_ids(meta, self.cfg.data, str(where), allow, notes)
            moves = rebucket_lib.rebucketed(meta, meta_lib.tables_of(self.program))  # other partitions
            target = target_lib.restore_target(meta, abstract, shardings, mesh_lib.replicated(self.program.mesh),
                                               str(where), read_whole=set(moves))
            try:
                # strict=False: row-padded leaves are padded with zeros or cut to this layout's row count
                how = ocp.checkpoint_utils.construct_restore_args(target, strict=False)
                args = ocp.args.Composite(state=ocp.args.PyTreeRestore(target, restore_args=how))
                with quiet.abandoned_reads_dropped():
                    state = manager.restore(step, args=args).state
                self._verify(state, meta, moves)
            except Exception as e:  # noqa: BLE001
                failure = self._unreadable(where, step, e, own)
            if failure is not None:
                bad.append(failure)
                continue
            state, row_maps = rebucket_lib.place(self.program, state, moves, shardings, where, notes)
            self.restored_selection, self.restored_best = meta.get("selection"), None
            if meta.get("best_arrays") and self.restored_selection:
                if moves:  # its tables' rows are in the old slots, and it keeps no keys to place them by
                    notes.append((logging.WARNING, f"checkpoint {where}: the best state saved beside it is not "
                                  f"carried over: hash table(s) {sorted(moves)} were saved with other partitions and"
                                  f" the best state has no keys to place its rows by; selection goes on from the "
                                  f"restored record"))
                else:
                    self.restored_best = self._restore_best(manager, step, abstract, shardings, meta, where, notes)
            if changed := "; ".join(meta_lib.config_changes(meta["config"], self.cfg)):
                notes.append((logging.WARNING, f"resuming with settings that differ from the checkpoint's: {changed}"))
            return Restored(self._refit(state, meta, where, row_maps), int(meta["data_step"]),
                            int(meta["metrics_rows"]), where, meta, notes)
        if bad:
            raise PreflightError(
                f"no readable checkpoint in {manager.directory}: " + "; ".join(bad) + ". They were moved aside "
                "(own run) or left as they are; re-launch to start from scratch, or resume from a copy "
                "with checkpoint.resume=<path>.")
        return None

    def _restore_best(self, manager: Any, step: int, abstract: Any, shardings: Any, meta: Mapping[str, Any],
                      where: Path, notes: list[tuple[int, str]]) -> Any:
        """The best params and tables saved beside the state, checked against their digests; None (with a
        warning in ``notes``: selection goes on from the restored record without them) if they cannot be read."""
        from ..core.selection import BestState

        best_abstract = BestState(abstract.params, abstract.tables)
        best_shardings = BestState(shardings.params, shardings.tables)
        try:
            target = target_lib.restore_target({"arrays": meta["best_arrays"], "tables": meta["tables"]}, best_abstract,
                                               best_shardings, mesh_lib.replicated(self.program.mesh), str(where))
            how = ocp.checkpoint_utils.construct_restore_args(target, strict=False)
            args = ocp.args.Composite(best=ocp.args.PyTreeRestore(target, restore_args=how))
            with quiet.abandoned_reads_dropped():
                best = manager.restore(step, args=args).best
            got = meta_lib.digests(best, meta_lib.tables_of(self.program), int(meta["format"]))
            if any(got.get(k) != a["digest"] for k, a in meta["best_arrays"].items()):
                raise ValueError("content does not match the digests written with it")
            return BestState(best.params, best.tables)
        except Exception as e:  # noqa: BLE001
            notes.append((logging.WARNING, f"checkpoint {where}: the best state saved beside it is unreadable "
                                           f"({_summary(e)}); its record is kept, the best state itself is not"))
            return None

    def _unreadable(self, where: Path, step: int, e: BaseException, own: bool) -> str:
        """Report an unreadable checkpoint in one warning; this run's own is moved to ``_corrupt/``."""
        msg = f"step {step} ({_summary(e)})"
        what = "left in place (not this run's checkpoint.dir)"
        if own:
            dest = trash.vacant(self.directory / "_corrupt" / f"{step}")
            what = f"moved to {dest}"
            if jax.process_index() == 0:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(where), str(dest))
        if jax.process_index() == 0:
            log.warning("checkpoint %s is unreadable or corrupted (%s); %s, falling back to the one before it",
                        where, msg, what)
        if own:
            _sync("checkpoint_quarantine")
            self.manager.reload()
        return msg

    def _half_deleted(self, where: Path, step: int, missing: list[str], own: bool) -> str:
        """A step whose removal was interrupted (it lacks entries every committed step has): skipped with one
        warning; this run's own is removed."""
        msg = f"step {step} (half-deleted: no {', '.join(missing)})"
        if jax.process_index() == 0:
            log.warning("checkpoint %s is half-deleted (it has no %s: a kill interrupted the removal of old "
                        "checkpoints); %s, falling back to the one before it", where, ", ".join(missing),
                        "removed" if own else "skipped (not this run's checkpoint.dir)")
            if own:
                trash.discard(where)
        if own:
            _sync("checkpoint_discard")
            self.manager.reload()
        return msg

    def _verify(self, state: Any, meta: Mapping[str, Any], moves: Mapping[str, int] = {}) -> None:  # noqa: B006
        tables = {**meta_lib.tables_of(self.program), **{n: meta["tables"][n] for n in moves}}  # as stored
        got = meta_lib.digests(state, tables, int(meta["format"]))
        wrong = [k for k, a in meta["arrays"].items() if got.get(k) != a["digest"]]
        if wrong:
            raise ValueError(f"content does not match the digests written with it: {wrong[:4]}")
        if int(np.asarray(state.step.addressable_data(0))) != int(meta["data_step"]):
            raise ValueError(f"state.step does not match the recorded data position {meta['data_step']}")

    def _refit(self, state: Any, meta: Mapping[str, Any], where: Path,
               row_maps: Mapping[str, np.ndarray] = {}) -> Any:  # noqa: B006
        """The deferred updates as this run makes them: their ids re-padded for this run's padded row
        counts and, when the checkpoint's record is of another kind (per device on a routed row layout, or
        of the whole batch; ``optimizers.record_token_ids``), rebuilt from its tokens' ids. A record
        naming a padding row (an id in ``[vocab, rows)``, which no run writes: ids outside the vocab become
        the padding id ``rows``) is refused, on any mesh: re-padded it would be dropped or land in another
        padding row, kept it would write one."""
        if not state.pending:
            return state
        pending = dict(state.pending)
        for n, queued in pending.items():  # k > 1: each table's queue of k records, oldest first
            ctx, old = self.program.contexts[n], meta["tables"][n]
            specs = ctx.update_specs()
            place = lambda x, spec: jax.make_array_from_callback(  # noqa: E731
                x.shape, NamedSharding(self.program.mesh, spec), lambda idx, x=x: x[idx])
            records = []
            for upd in (queued,) if self.program.staleness == 1 else queued:
                unique = np.asarray(upd.unique_tokens.addressable_data(0))  # both read whole (replicated)
                seg = np.asarray(upd.segment_ids.addressable_data(0))
                unique, seg = self._refit_record(n, ctx, old, unique, seg, where, row_maps.get(n))
                records.append(upd._replace(unique_tokens=place(unique, specs[0]), segment_ids=place(seg, specs[2])))
            pending[n] = records[0] if self.program.staleness == 1 else tuple(records)
        return state._replace(pending=pending)

    @staticmethod
    def _refit_record(n: str, ctx: Any, old: Mapping[str, Any], unique: np.ndarray, seg: np.ndarray, where: Path,
                      row_map: np.ndarray | None = None):
        """One deferred update's (unique ids, segment ids) as this run makes them (``_refit``); ``row_map``: a
        re-bucketed hash table's rows (``rebucket.place``), which the update's rows follow."""
        from optimizers import record_for, record_token_ids  # noqa: PLC0415

        stray = np.unique(unique[(unique >= old["vocab"]) & (unique < old["rows"])])
        if stray.size:
            raise PreflightError(
                f"checkpoint {where}: the deferred update of table '{n}' holds ids {stray[:4].tolist()} "
                f"outside its {old['vocab']} rows (ids 0..{old['vocab'] - 1}, stored padded to {old['rows']} "
                f"rows). No run writes such an update: the checkpoint was damaged before its digests were "
                f"taken, or written by another program. Move {where} away to resume from the checkpoint "
                f"before it, or start a new run: checkpoint.resume=never with another checkpoint.dir or "
                f"trainer.run_id.")
        if row_map is not None:
            moved = rebucket_lib.remap_tokens(record_token_ids(unique, seg, old["rows"]), row_map)
            unique, seg = record_for(ctx, moved)
        elif unique.shape != (ctx.record_unique,) or old["rows"] != ctx.stored_rows:
            unique, seg = record_for(ctx, record_token_ids(unique, seg, old["rows"]))
        return unique, seg


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
        max_to_keep=keep, create=True, cleanup_tmp_directories=True, enable_async_checkpointing=async_save,
        todelete_subdir=trash.TRASH)  # retired steps leave the directory in one rename (trash.py)
    if drills.kills_before_commit() and not read_only:
        opts["temporary_path_class"] = drills.KillBeforeCommit
    registry = type_handlers()
    handlers = {name: ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=compress,
                                                  type_handler_registry=registry) for name in ("state", "best")}
    handlers["meta"] = ocp.JsonCheckpointHandler()
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(**opts), item_handlers=handlers)


def _summary(e: BaseException) -> str:
    """``Type: first line`` of an error and of its cause, without TensorStore's repr of the whole spec."""
    parts = []
    while e is not None and len(parts) < 2:
        first = (str(e).splitlines() or [""])[0].split(" See full TensorStore details")[0]
        parts.append(f"{type(e).__name__}: {first[:200]}")
        e = e.__cause__
    return " <- ".join(parts)


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
