"""One run at a time per checkpoint directory: a lock file ``<checkpoint.dir>/run.lock`` naming its holder.

The run that writes checkpoints takes the lock before it touches the directory (Orbax's clean-up of
interrupted saves included) and releases it when its checkpoints close, on success or error. The file is
JSON: host, pid (and that process's start time, against pid reuse), when the run started, its output
directory, run id and command. It is created atomically (written beside, then hard-linked into place), so it
is never seen half-written.

A second run on the same directory is refused with the holder's name. A lock left by a run that died
(kill -9, power loss) is broken when the holder ran on this host and its process is gone; a holder on
another host cannot be checked from here, so that lock is never broken: the message says how to remove it.
In a multi-process run process 0 holds the lock for all processes.
"""
from __future__ import annotations

import datetime as dt
import gc
import json
import logging
import os
import socket
import sys
import uuid
import weakref
from pathlib import Path

from ..errors import PreflightError

log = logging.getLogger("runner")
LOCK_FILE = "run.lock"
_OPEN: dict[str, "weakref.ref[Lock]"] = {}  # locks this process holds, by path (a second open here is refused)


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from its holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    now = _proc_start(pid)
    return start is None or now is None or now == start


def describe(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}, "
            f"output dir {holder.get('output_dir')}")


class Lock:
    """A held lock; ``release`` removes the file if it is still this holder's (idempotent)."""

    def __init__(self, path: Path, record: dict):
        self.path, self.record, self.held = path, record, True
        _OPEN[str(path)] = weakref.ref(self)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        _OPEN.pop(str(self.path), None)
        try:
            if json.loads(self.path.read_text()).get("token") == self.record["token"]:
                self.path.unlink()
        except FileNotFoundError:
            pass  # already removed by hand
        except (OSError, ValueError) as e:
            log.warning("could not remove the checkpoint lock %s (%s); remove it by hand before the next run on "
                        "this checkpoint.dir", self.path, e)

    def __del__(self):  # a Checkpoints dropped without close (tests): the file stays, this process may re-take it
        if self.held:
            _OPEN.pop(str(self.path), None)


def _read(path: Path) -> dict | None:
    """The holder's record; None when the file is gone (released meanwhile)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PreflightError(f"checkpoint.dir lock {path} cannot be read ({e.strerror or e}); fix its permissions, "
                             f"or remove it if no other run uses this checkpoint.dir, and re-launch") from None
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
            raise ValueError("no pid")
        return record
    except ValueError:
        raise PreflightError(f"checkpoint.dir lock {path} is not a lock this runner wrote ({text[:80]!r}); if no "
                             f"other run uses this checkpoint.dir, remove it and re-launch") from None


def _create(path: Path, record: dict) -> bool:
    """Atomically create ``path`` holding ``record``; False if it already exists."""
    tmp = path.with_name(f".{path.name}.{record['token']}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _break(path: Path, stale: dict) -> None:
    """Remove ``path`` if it still holds ``stale``: renamed aside first, so a lock another run took in the
    meantime is put back instead of deleted."""
    aside = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if json.loads(aside.read_text()) == stale:
            log.warning("checkpoint.dir lock %s was left by a run that is no longer running (%s): removed it",
                        path, describe(stale))
            aside.unlink()
            return
    except (OSError, ValueError):
        pass
    try:  # not the lock we judged stale: put it back where it was
        os.link(aside, path)
    except FileExistsError:
        pass
    aside.unlink(missing_ok=True)


def acquire(directory: Path, *, output_dir: str, run_id: str) -> Lock:
    """Take ``<directory>/run.lock`` for this process, or raise a PreflightError naming the holder."""
    path = directory / LOCK_FILE
    record = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _proc_start(os.getpid()),
              "started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
              "output_dir": output_dir, "run_id": run_id, "command": " ".join(sys.argv),
              "token": uuid.uuid4().hex}
    for _ in range(5):
        if _create(path, record):
            return Lock(path, record)
        holder = _read(path)
        if holder is None:  # released between our attempt and the read
            continue
        same_host = holder.get("host") == record["host"]
        ours = same_host and holder["pid"] == os.getpid()
        if ours:
            gc.collect()  # a dropped, unclosed Checkpoints in a reference cycle lets go of its lock here
            live = _OPEN.get(str(path))
            if live is None or live() is None or live().record.get("token") != holder.get("token"):
                _break(path, holder)  # left by an earlier, unclosed open in this process: ours to take over
                continue
        elif same_host and not _alive(holder["pid"], holder.get("pid_start")):
            _break(path, holder)
            continue
        if same_host:
            raise PreflightError(
                f"checkpoint.dir={directory} is in use by another run: {describe(holder)} (lock {path}). Two runs "
                f"writing one checkpoint directory would overwrite each other's checkpoints. Wait for that run to "
                f"end or stop it, or give this run another checkpoint.dir or trainer.run_id.")
        raise PreflightError(
            f"checkpoint.dir={directory} is locked by a run on another host: {describe(holder)} (lock {path}). "
            f"Two runs writing one checkpoint directory would overwrite each other's checkpoints, and from "
            f"{record['host']} it cannot be checked whether that run is still going. If it is not, remove {path} "
            f"and re-launch; otherwise give this run another checkpoint.dir or trainer.run_id.")
    raise PreflightError(f"checkpoint.dir={directory}: could not take the lock {path} (other runs keep taking and "
                         f"releasing it); make sure only one run uses this checkpoint.dir and re-launch")
