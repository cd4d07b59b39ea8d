"""Removing old checkpoints so that a kill at any moment leaves only readable steps behind.

Orbax deletes the steps past ``checkpoint.keep``; told ``todelete_subdir=TRASH`` it instead renames each one
to ``<checkpoint.dir>/_deleting/<step>``: one atomic rename, after which the step is no longer a checkpoint
of the directory. The files are removed here, from ``_deleting/``, before the next save and as the run ends;
a kill in the middle leaves a half-removed folder under ``_deleting/`` that no restore looks at and the next
launch finishes removing. Steps half-deleted in place (by a runner before this one) are recognised by the
entries every committed step has (``half_deleted``) and skipped by the restore.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from . import drills

log = logging.getLogger("runner")
TRASH = "_deleting"
COMMITTED = ("_CHECKPOINT_METADATA", "meta", "state")  # in every step directory Orbax has committed


STEP_ENTRIES = (*COMMITTED, "best", "commit_success.txt")  # all a step directory holds (best: trainer.select_best)


def half_deleted(step_dir: Path) -> list[str]:
    """The entries a committed step has and this one lacks (empty for a whole step)."""
    return [name for name in COMMITTED if not (step_dir / name).exists()]


def unreadable(step_dir: Path) -> Path | None:
    """The first file or folder of a step this user may not read (a folder: list and enter), or None. Such a
    step is not damaged: it is refused, never moved aside or removed as a corrupt one would be."""
    todo = [step_dir]
    while todo:
        folder = todo.pop()
        if not os.access(folder, os.R_OK | os.X_OK):
            return folder
        try:
            entries = list(os.scandir(folder))
        except PermissionError:
            return folder
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                todo.append(Path(entry.path))
            elif not os.access(entry.path, os.R_OK):
                return Path(entry.path)
    return None


def unreadable_problem(step_dir: Path) -> str | None:
    """Why this user cannot resume from ``step_dir`` (a file or folder of it not readable), or None."""
    locked = unreadable(step_dir)
    if locked is None:
        return None
    return (f"checkpoint {step_dir} cannot be read by this user: {locked} is not readable (permission denied). "
            f"Give read access (chmod -R u+rX {step_dir}) and re-launch, or move that step out of checkpoint.dir "
            f"to resume from the one before it")


def foreign(step_dir: Path) -> list[str]:
    """What a numbered folder holds that no checkpoint step does (a user's own folder named like a step)."""
    try:
        return sorted(p.name for p in step_dir.iterdir() if p.name not in STEP_ENTRIES)
    except OSError:
        return []


def foreign_steps_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be a checkpoint.dir as it is: a numbered folder in it that is not a step (Orbax
    takes every numbered folder for one, and would remove it as an old step past checkpoint.keep, or as a
    half-deleted one). None: there is none."""
    try:
        numbered = sorted((p for p in directory.iterdir() if p.name.isdigit() and p.is_dir()), key=lambda p: int(p.name))
    except OSError:
        return None
    for folder in numbered:
        others = foreign(folder)
        if others:
            shown = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
            return (f"checkpoint.dir={directory} holds a folder {folder.name} that is not a checkpoint (it holds "
                    f"{shown}): every numbered folder there is taken for a checkpoint step, and old steps are "
                    f"removed. Move it out of checkpoint.dir, or give checkpoint.dir a folder of its own")
    return None


def empty(directory: Path, *, report: bool = False) -> list[str]:
    """Remove everything under ``<directory>/_deleting/``; returns the names removed. ``report``: say so in
    a warning (at the start of a launch, what is there was left by a kill during an earlier cleanup)."""
    trash = directory / TRASH
    if not trash.is_dir():
        return []
    names = sorted(p.name for p in trash.iterdir())
    for name in names:
        _remove(trash / name)
    if report and names:
        log.warning("%s held old checkpoints %s whose removal was interrupted (a kill during cleanup); they "
                    "were already out of the checkpoint directory and are removed now", trash, names)
    return names


def vacant(path: Path) -> Path:
    """``path``, or the first of ``path.1``, ``path.2``, ... that does not exist: where to move something
    aside without overwriting what an earlier launch moved there."""
    dest, n = path, 0
    while dest.exists():
        n += 1
        dest = path.with_name(f"{path.name}.{n}")
    return dest


def discard(step_dir: Path) -> None:
    """Move a step out of its checkpoint directory (one rename), then remove it."""
    dest = vacant(step_dir.parent / TRASH / step_dir.name)
    dest.parent.mkdir(exist_ok=True)
    os.replace(step_dir, dest)
    _remove(dest)


def _remove(path: Path) -> None:
    """Delete a folder's files one by one, then its folders (the order a kill drill can interrupt)."""
    if not path.is_dir():
        path.unlink(missing_ok=True)
        return
    files = [Path(root) / f for root, _, names in os.walk(path) for f in names]
    for i, f in enumerate(files, 1):
        f.unlink(missing_ok=True)
        drills.in_cleanup(path.name, i, len(files))
    for root, dirs, _ in os.walk(path, topdown=False):
        for d in dirs:
            os.rmdir(Path(root) / d)
    os.rmdir(path)
