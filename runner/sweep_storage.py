"""An Optuna search's stored study (``hydra.sweeper.storage``): opened once, with a heartbeat for its running trials.

The runner's sweeper (``hydra_plugins/runner_optuna``) opens the storage once, before its first trial, and hands the
opened storage to its checks and to the plugin (which would otherwise open the URL again for each). A database URL
is opened as Optuna's ``RDBStorage`` with its heartbeat on: while a trial runs, the search records every
``HEARTBEAT_S`` seconds that it is alive, and a search of the study that starts a batch of trials first marks
``FAIL`` each ``RUNNING`` trial whose heartbeat is more than ``GRACE_S`` seconds old: one a killed search (SIGKILL,
a machine gone) left, which Optuna would keep ``RUNNING`` for good. It is not retried: the search draws new trials.
Optuna 2 records heartbeats only in ``study.optimize`` and never in the plugin's ask-and-tell loop, so the sweeper
records them itself (``Heartbeat``); and it reads a heartbeat's age modulo a day (``timedelta.seconds``), which
``RunnerStorage`` reads whole. A trial without a heartbeat (stored by a search without one) is left as it is: nothing
tells whether it still runs. An in-memory study (``storage: null``) dies with its search and needs none of this.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from optuna.storages import RDBStorage

from .errors import causes, first_line
from .sweep_checks import mask_password, refuse

log = logging.getLogger("runner.sweeps")

HEARTBEAT_S = 60  # how often a search records that its running trials are alive
GRACE_S = 180  # a RUNNING trial whose heartbeat is older is a killed search's: failed when a batch starts


class RunnerStorage(RDBStorage):
    """Optuna's database storage with the heartbeat on, shown as its URL without the password (the plugin logs
    ``Storage: <storage>``), and a heartbeat's age read whole (Optuna 2 reads it modulo a day)."""

    def __str__(self) -> str:
        return mask_password(str(self.url))

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        from optuna.storages._rdb import models
        from optuna.trial import TrialState
        from sqlalchemy import func, orm

        session = self.scoped_session()
        try:
            now = session.execute(func.now()).scalar().replace(tzinfo=None)
            running = (session.query(models.TrialModel).options(orm.selectinload(models.TrialModel.heartbeats))
                       .filter(models.TrialModel.state == TrialState.RUNNING)
                       .filter(models.TrialModel.study_id == study_id).all())
            return [t.trial_id for t in running
                    if t.heartbeats and (now - t.heartbeats[0].heartbeat).total_seconds() > self.grace_period]
        finally:
            session.close()


def open_storage(storage: Any) -> tuple[Any, str | None]:
    """(the opened storage, None), or (None, why Optuna cannot open or write ``hydra.sweeper.storage``); (None, None)
    for a study kept in memory. Opening a database URL creates its database (``sqlite:///optuna.db``: the file)."""
    if storage is None:
        return None, None
    fix = "give a database URL Optuna can open (e.g. sqlite:///optuna.db) or null for a study kept in memory"
    if not isinstance(storage, str) or not storage.strip():
        return None, f"hydra.sweeper.storage={storage!r} is not a database URL: {fix}"
    import optuna

    done = "opened"
    try:
        if storage.startswith("redis"):  # Optuna 2's RedisStorage keeps no heartbeat
            return optuna.storages.get_storage(storage), None
        opened = RunnerStorage(storage, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
        done = "written"
        _write_nothing(opened)
        return opened, None
    except Exception as e:  # noqa: BLE001 - SQLAlchemy's and the database drivers' errors vary
        return None, mask_password(  # the URL's password is not for the terminal or a log
            f"hydra.sweeper.storage={storage} cannot be {done} ({type(e).__name__}: {first_line(e)}): {fix}")


def _write_nothing(storage: RDBStorage) -> None:
    """Raises if ``storage`` cannot be written (a read-only database opens and reads, and would fail the search at
    its first write): an update of no row, rolled back."""
    from sqlalchemy import text

    with storage.engine.connect() as con:
        transaction = con.begin()
        try:
            con.execute(text("UPDATE version_info SET schema_version = schema_version WHERE 1 = 0"))
        finally:
            transaction.rollback()


def sqlite_file(storage: Any) -> Path | None:
    """The file of a SQLite database URL (``sqlite:///study.db``: ``study.db``, as opening it resolves it, from the
    current folder); None for another database, a database kept in memory, or what is not a URL."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(storage) if isinstance(storage, str) and storage.startswith("sqlite") else None
    except Exception:  # noqa: BLE001 - not a URL: open_storage names it
        return None
    name = url.database if url is not None else None
    if not name or name == ":memory:" or name.startswith("file::memory:"):
        return None
    if name.startswith("file:") and str(url.query.get("uri", "")).lower() == "true":  # an SQLite URI
        name = name[len("file:"):].split("?", 1)[0]
    return Path(name).absolute()


def opened_or_refused(storage: Any) -> Any:
    """The opened storage (None for a study kept in memory); exit code 2 with one message before the first trial if
    it cannot be opened. A SQLite database that opening it created is noted (``outputs.note_created``): a search
    that ends before its first trial (refused by its checks) leaves no database it made."""
    from .outputs import note_created

    path = sqlite_file(storage)
    new = path is not None and not path.exists()
    opened, problem = open_storage(storage)
    if new and path.is_file():
        note_created(path)
    refuse([problem] if problem else [])
    return opened


def storage_error(error: BaseException) -> BaseException | None:
    """The database's own error behind ``error`` (SQLAlchemy's, which names the driver's: ``(sqlite3.OperationalError)
    unable to open database file``), or Optuna's ``StorageInternalError`` where it holds none; None when ``error``
    is not the storage's. Optuna wraps a failed commit in ``StorageInternalError`` ("An exception is raised during
    the commit. This typically happens due to invalid data ..."), a line that names neither the cause nor the fix."""
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import SQLAlchemyError

    found = None
    for e in causes(error):
        if isinstance(e, SQLAlchemyError):
            return e
        if isinstance(e, StorageInternalError) and found is None:
            found = e
    return found


def failed_during_search(error: BaseException, storage: Any, sweep_dir: Any) -> str | None:
    """The line ending a search whose ``storage`` (``hydra.sweeper.storage``'s URL) failed as the search wrote a
    trial into it (the database file deleted or made read-only, its folder removed, the disk full, the server
    gone), naming what failed and the fix; None when ``error`` is not the storage's. The trials' folders under
    ``sweep_dir`` stay, and so does every trial the study took before it failed: resuming the search with the same
    storage and study continues it."""
    cause = storage_error(error) if storage is not None else None
    if cause is None:
        return None
    path = sqlite_file(storage)
    fix = (f"free the disk, or restore {path} (its folder, its write permission)" if path is not None
           else "bring the database back (the server, its disk, the connection)")
    return mask_password(
        f"sweep: the study storage hydra.sweeper.storage={storage} failed during the search ({type(cause).__name__}: "
        f"{first_line(cause)}): the trials so far are in {sweep_dir} and in the study as far as it was written; "
        f"{fix}, then resume the search with the same hydra.sweeper.storage and hydra.sweeper.study_name")


class Heartbeat:
    """Records, every ``HEARTBEAT_S`` seconds from a thread of the search's process, that the trials of the batch it
    runs are alive; ``batch(trials)``, as a batch starts, first fails the study's stale trials (a killed search's)."""

    def __init__(self, storage: Any):
        self.on = isinstance(storage, RDBStorage) and storage.is_heartbeat_enabled()
        self.storage, self.trials, self.stop_event = storage, [], threading.Event()
        self.thread = threading.Thread(target=self._beat, name="optuna-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def batch(self, trials: list[Any]) -> None:
        """A batch of ``trials`` (Optuna trials just asked for) starts: fail the stale trials, then beat for these."""
        if not self.on or not trials:
            return
        study = trials[0].study
        try:
            failed = study._storage.fail_stale_trials(study._study_id)
        except Exception as e:  # noqa: BLE001 - a storage busy: the next batch looks again
            log.warning("could not look for trials a killed search left running: %s: %s", type(e).__name__, e)
            failed = []
        if failed:
            numbers = sorted(study._storage.get_trial(i).number for i in failed)
            log.warning("marked FAIL %d trial(s) of study %s a killed search left running (no heartbeat for %d s): "
                        "#%s", len(failed), study.study_name, GRACE_S, ", #".join(map(str, numbers)))
        self.trials = list(trials)
        self._record()

    def _record(self) -> None:
        for trial in self.trials:
            try:
                self.storage.record_heartbeat(trial._trial_id)
            except Exception as e:  # noqa: BLE001 - a storage busy or gone: the next beat tries again
                log.warning("could not record trial #%s's heartbeat: %s: %s", trial.number, type(e).__name__, e)

    def _beat(self) -> None:
        while not self.stop_event.wait(HEARTBEAT_S):
            self._record()
