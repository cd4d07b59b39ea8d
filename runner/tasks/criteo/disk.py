"""The folder a conversion or a generation writes, and what the disk says while it does.

:func:`claim` takes a new or empty output folder for one writer (its ``.converting`` marker) and :func:`release`
gives it back, with what was written or as it was found. :func:`writing` turns an ``OSError`` met while writing
one file (a full disk, a folder this user may no longer write, a read-only file system, a file where a folder
is needed) into a :class:`DiskError`: one line naming the file, what was being done and the fix, where Python
says ``[Errno 28] No space left on device`` and no more (pyarrow's errors do not even name the file).
:func:`reason` and :func:`fix` word an ``OSError`` for any caller (the reader of the logs, a run's cache).
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator


class PrepareError(ValueError):
    """A conversion that cannot run as asked; the message names the value and the fix."""


_REASONS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "this user's disk quota is used up",
            errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.EROFS: "a read-only file system", errno.EEXIST: "a file stands where a folder is needed",
            errno.ENOTDIR: "a file stands where a folder is needed", errno.EISDIR: "a folder, not a file",
            errno.EIO: "an input/output error (a failing disk or a broken network mount)"}


def reason(e: OSError) -> str:
    """What went wrong, in words (``no space left on the device``), not ``[Errno 28] ...``."""
    return _REASONS.get(e.errno) or e.strerror or str(e)


def fix(e: OSError, to: str) -> str:
    """How to get past ``e`` met writing into a folder; ``to`` says how another is chosen (``give --out``,
    ``set data.cache to``)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space there, or {to} a folder on a file system with room"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"let this user write there (as its owner: chmod u+w), or {to} a folder it may write"
    if e.errno == errno.EROFS:
        return f"{to} a folder on a writable file system"
    if e.errno in (errno.EEXIST, errno.ENOTDIR):
        return f"move that file away, or {to} another folder"
    return f"{to} another folder"


class DiskError(PrepareError):
    """An ``OSError`` met writing ``path`` (``doing`` it): ``error`` keeps it, for a caller to word its own fix;
    the message is ``python -m runner.prepare``'s, the fix in terms of ``--out``."""

    def __init__(self, error: OSError, path: Path, doing: str, after: str = ""):
        self.error, self.path, self.doing = error, Path(error.filename or path), doing
        super().__init__(f"{self.path}: {doing} failed ({reason(error)}); {fix(error, 'give --out')}{after}")

    def left(self, out: Path, clean: bool) -> DiskError:
        """The same error, saying what became of ``out`` (``clean``: left as it was found)."""
        after = (f". --out {out} was left as it was found" if clean else
                 f". The partial files in --out {out} could not be removed (it holds {CLAIM}, so nothing takes them "
                 f"for a finished conversion): remove {out} before starting again")
        return DiskError(self.error, self.path, self.doing, after)


@contextlib.contextmanager
def writing(path: Path, doing: str) -> Iterator[None]:
    """Runs the body; an ``OSError`` in it is a :class:`DiskError` (``doing``: ``writing a shard``)."""
    try:
        yield
    except OSError as e:
        raise DiskError(e, path, doing) from None


CLAIM = ".converting"  # in an output folder while a conversion or generation writes into it


def claim(out: Path, what: str) -> bool:
    """Take ``out`` (a new or empty folder) for one writer: its ``.converting`` marker, created exclusively, so
    a second conversion started into the same folder is refused and never removes the first one's files.
    Returns whether the folder was made here."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out} is a file; give a new or empty output folder")
    if (out / CLAIM).exists():
        raise PrepareError(f"{out} holds {CLAIM}: another {what} is writing into it, or one was killed before it "
                           f"finished (its files are incomplete); wait for it, or remove {out} and start again")
    if out.exists() and any(out.iterdir()):
        raise PrepareError(f"{out} is not empty; give a new or empty output folder")
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        os.close(os.open(out / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        raise PrepareError(f"{out} holds {CLAIM}: another {what} started writing into it just now; give each its "
                           f"own output folder") from None
    except OSError as e:
        raise PrepareError(f"--out {out} cannot be made or written ({e.strerror or e}); give a new or empty folder "
                           f"that can be written") from None
    return made


def release(out: Path, made: bool, keep: bool) -> bool:
    """Give ``out`` back: with what was written (``keep``), or as it was found (new: removed; empty: emptied).
    Returns whether that worked: a folder this user may no longer write keeps its files and its ``.converting``
    marker, which tells a later conversion they are incomplete. Kept, the marker beside a finished conversion
    (its ``manifest.json``) blocks nothing, and is left where it cannot be removed."""
    try:
        if keep:
            (out / CLAIM).unlink(missing_ok=True)
        elif made:
            shutil.rmtree(out, ignore_errors=True)
        elif out.is_dir():
            for p in out.iterdir():
                if p.name != CLAIM:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            (out / CLAIM).unlink(missing_ok=True)
        return keep or not out.exists() or not any(out.iterdir())
    except OSError:
        return keep
