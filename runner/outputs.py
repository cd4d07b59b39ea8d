"""The run folder's file names, in one place: the loop and trackers write them, sweeps and the report read them.

A run's output folder (Hydra's ``outputs/<date>/<time>``, or one trial of a ``multirun/``) holds::

    metrics.jsonl        one JSON object per logged step (runner.tracking.JsonlTracker)
    summary.json         the last/best values and the run's status
    wandb_run.json       the W&B run's id, group, tags and directory (runner.sweeps)
    FAILED               a sweep trial that failed: the error and its traceback
    .hydra/overrides.yaml  the command-line overrides of the run (Hydra)
    wandb/               the offline W&B run, to ``wandb sync`` later
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
RUN_INFO_FILE = "wandb_run.json"
FAILED_MARKER = "FAILED"
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"


def set_aside(run_dir: Path, names: tuple[str, ...] = (METRICS_FILE, SUMMARY_FILE, RUN_INFO_FILE)) -> dict[str, Path]:
    """An earlier run's record in ``run_dir`` that a run starting there must not append to or overwrite: each of
    ``names`` there (the metrics, the summary, the record naming its W&B run) is moved to ``<name>.before-restart``
    (``.1``, ``.2``, ... when taken), kept whole. Returns
    where each one that existed went. Used for a run without checkpoints (``runner.app``: a ``hydra.run.dir`` given
    again, a sweep into the same ``hydra.sweep.dir``) and a checkpointed one starting from step 0
    (``runner.checkpoint.opening``)."""
    from .checkpoint.trash import vacant  # noqa: PLC0415 (the checkpoint package is imported only when used)

    moved = {}
    for name in names:
        path = Path(run_dir) / name
        if path.is_file():
            moved[name] = vacant(path.with_name(path.name + ".before-restart"))
            path.replace(moved[name])
    return moved


def listed(names) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    names = list(names)
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


class NotRegularFile(OSError):
    """A run-folder file (read by the report, ``read_overrides``) that is a FIFO, a folder, a device or a socket:
    its ``strerror`` says which."""

    def __init__(self, path: Path, mode: int):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
                "no file")
        super().__init__(errno.EINVAL, f"{kind}, not a regular file", str(path))


def open_regular(path: Path, errors: str = "replace") -> IO[str]:
    """``path`` opened to read as UTF-8 text (``errors``: what bytes that are not UTF-8 become; ``"strict"``
    raises ``UnicodeDecodeError`` as they are read), or ``NotRegularFile`` when it is no
    regular file: opening a FIFO waits for a writer that may never come, and a device such as /dev/zero never
    ends. The open itself does not wait (``O_NONBLOCK``) and what is checked is what was opened, not the name
    looked at a moment before. A missing file raises ``FileNotFoundError``, like ``open``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
        os.set_blocking(fd, True)
        return open(fd, encoding="utf-8", errors=errors)
    except BaseException:
        os.close(fd)
        raise


def read_overrides(run_dir: Path, errors: str = "replace") -> list[str]:
    """The command-line overrides Hydra recorded for a run (``[]`` when there are none). ``errors``: how bytes
    that are not UTF-8 are decoded; ``"strict"`` raises ``UnicodeDecodeError`` (the report names such a file
    rather than show a trial without overrides). A FIFO, folder or device of that name raises ``NotRegularFile``
    (``open_regular``) rather than block the reader or pass for no overrides; the caller names it."""
    try:
        with open_regular(Path(run_dir) / OVERRIDES_FILE, errors=errors) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    try:
        import yaml

        data = yaml.safe_load(text)
        if isinstance(data, list):
            return [str(x) for x in data]
        if data is None:
            return []
    except Exception:  # noqa: BLE001 - fall through to a line-based parse
        pass
    return [ln.strip()[2:].strip() for ln in text.splitlines() if ln.strip().startswith("- ")]


def unusable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be a run's output folder (created if missing, then written), or None if it can.
    Creating it is the check: a read-only file system, a file in the way or a missing permission all show."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def in_the_way(run_dir: Path, subdir: str | None = ".hydra") -> str | None:
    """What in a run folder has a name the run writes and the wrong kind (a folder where it writes a file, a file
    where Hydra writes its config folder), in words; None when nothing does."""
    for name in (METRICS_FILE, SUMMARY_FILE, RUN_INFO_FILE):
        if (run_dir / name).is_dir():
            return f"a folder named {name}"
    if subdir and (run_dir / subdir).exists() and not (run_dir / subdir).is_dir():
        return f"a file named {subdir} (Hydra's config folder, hydra.output_subdir)"
    return None


SWEEP_FILE = "multirun.yaml"  # the sweep's config, written by Hydra's basic sweeper as its trials start
_MADE: list[Path] = []  # the folders this process's sweep created for hydra.sweep.dir, outermost first


def missing(path: Path) -> list[Path]:
    """The folders of ``path`` (itself included) that do not exist yet, outermost first: those creating it makes.
    One that cannot be looked at (a parent without permission) counts as existing: nothing is made there."""
    path = path.absolute()
    try:
        return [p for p in reversed((path, *path.parents)) if not p.exists()]
    except OSError:
        return []


@contextlib.contextmanager
def kept_sweep_file(sweep_dir: Path) -> Iterator[SimpleNamespace]:
    """Hydra's basic sweeper writes the sweep's ``multirun.yaml`` before it launches the first trial: inside this,
    set ``.started`` on what it yields once a trial starts; a sweep that ends before (Ctrl-C, SIGTERM, an error of
    the launcher) puts back the ``multirun.yaml`` an earlier sweep into ``sweep_dir`` left, or removes its own
    where there was none, so that a sweep that ran no trial leaves the earlier sweep's record as it was."""
    path = sweep_dir / SWEEP_FILE
    state = SimpleNamespace(started=False)
    try:
        earlier = path.read_bytes() if path.is_file() else None
    except OSError:  # unreadable: Hydra cannot write over it either, and there is nothing to put back
        state.started = True
    try:
        yield state
    finally:
        if not state.started:
            try:
                if earlier is not None:
                    path.write_bytes(earlier)
                elif path.is_file() and not path.is_symlink():
                    path.unlink()
            except OSError:
                pass  # the folder went away or became read-only: nothing left to put back there


_CREATED: list[Path] = []  # the files a search created before its first trial (an Optuna study's SQLite database)


def note_created(path: Path) -> None:
    """``path`` was created by this process's sweep before its first trial (the database a new
    ``hydra.sweeper.storage`` names): ``remove_unused_sweep_dir`` removes it if the sweep ends before one."""
    _CREATED.append(path.absolute())


def keep_created() -> None:
    """The sweep's first trial starts: the files it created are its record now, kept whatever happens next."""
    _CREATED.clear()


def remove_unused_sweep_dir() -> None:
    """Undo the sweep folder of a sweep that ended before its first trial (refused by its checks, a sweep with no
    trial, a Ctrl-C before it started): the folders ``OutputDirCheck`` created for ``hydra.sweep.dir`` are removed
    while they hold nothing but what the sweep wrote there (its ``multirun.yaml``), innermost first. A folder that
    existed before the sweep, or that holds anything else (a trial's folder, a file another program put there), is
    left as it is, with everything in it. A file the sweep created before its first trial (``note_created``: a new
    Optuna study database, inside the sweep folder or anywhere else) is removed first; one that existed before the
    sweep is never noted, so it stays."""
    for path in _CREATED:
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                path.unlink()
    _CREATED.clear()
    made = list(_MADE)
    _MADE.clear()
    if not made:
        return
    try:
        entries = list(made[-1].iterdir())
        if any(e.name != SWEEP_FILE or not e.is_file() or e.is_symlink() for e in entries):
            return
        for e in entries:
            e.unlink()
        for folder in reversed(made):
            folder.rmdir()  # fails on a folder that is not empty: then it and the folders above it stay
    except OSError:
        return


class OutputDirCheck(Callback):
    """Before a run (or a sweep) starts, checks that Hydra's output folder can be created and written, so a bad
    ``hydra.run.dir`` / ``hydra.sweep.dir`` ends in one message instead of Hydra's traceback (exit 2). Creating a
    sweep's folder is the check; the folders it creates are noted, for ``remove_unused_sweep_dir`` to remove
    when the sweep ends before its first trial."""

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        value = str(config.hydra[key.split(".")[1]].dir)
        if not value.strip():  # Hydra would write into the current folder
            print(f"error: {key} is empty, so the run would write its files into the current folder "
                  f"({Path.cwd()}): set {key} to a folder (e.g. {key}=outputs/my_run), or leave it out for "
                  f"Hydra's dated one", file=sys.stderr, flush=True)
            raise SystemExit(2)
        why = unusable_dir(Path(value))
        subdir = config.hydra.get("output_subdir") if key == "hydra.run.dir" else None
        blocked = None if why else in_the_way(Path(value), subdir)
        if blocked:
            print(f"error: {key}={value} holds {blocked}, where the run writes its own; move it away, or set "
                  f"{key} to another folder", file=sys.stderr, flush=True)
            raise SystemExit(2)
        if why:
            print(f"error: {key}={value} cannot be used as the output folder ({why}): set {key} to a folder "
                  f"this user can create and write (e.g. {key}=outputs/my_run)", file=sys.stderr, flush=True)
            raise SystemExit(2)  # not an Exception: Hydra would print its traceback

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _MADE[:] = missing(Path(str(config.hydra.sweep.dir)))  # the sweep folder a refused sweep removes again
        _CREATED.clear()  # noted afresh for this sweep
        self._check(config, "hydra.sweep.dir")
