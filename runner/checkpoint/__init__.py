"""Checkpoints and exact resume: Orbax + tensorstore (zarr3) arrays, JSON metadata, per-array digests.

- ``manager.py``: when to save, what to restore, corrupt-checkpoint recovery;
- ``opening.py``: a run's start (``open_with_orbax``, which ``open_checkpoints`` here calls when checkpoints
  are on): lock, leftovers of interrupted saves and cleanups, the resume, the metrics history;
- ``trash.py``: old checkpoints removed so that a kill at any moment leaves only whole steps;
- ``quiet.py``: Orbax's echoes of a failure the manager reports once; ``drills.py``: the tests' kill drills;
- ``meta.py``: the metadata a checkpoint carries and the compatibility checks on restore;
- ``digest.py``: order-sensitive digests of the arrays, computed on the devices (any single-bit change shows);
- ``lock.py``: ``<checkpoint.dir>/run.lock``, so one run at a time writes a checkpoint directory.

Orbax takes about 0.6 s to import, so ``manager`` (and Orbax) are imported only by a run that checkpoints or
resumes; checkpoints are off by default.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from . import meta as _meta

if TYPE_CHECKING:
    from .manager import Checkpoints


def open_checkpoints(cfg: DictConfig, program: Any, plan: Any, output_dir: str | os.PathLike,
                     data_file: str | os.PathLike | None = None) -> Checkpoints | None:
    """Check the checkpoint settings; None when checkpoints are off (``checkpoint.interval=0`` and nothing to
    resume from), else ``opening.open_with_orbax``: lock ``checkpoint.dir``, restore per ``checkpoint.resume``
    and carry the metrics history over. ``data_file``: the file the task read (``task.data_file``), whose
    fingerprint each checkpoint records and a resume checks (``data.py``)."""
    _meta.check_settings(cfg)
    if not _meta.wanted(cfg):
        return None
    from .opening import open_with_orbax  # noqa: PLC0415 - Orbax only when it is used

    return open_with_orbax(cfg, program, plan, output_dir, data_file=data_file)


def __getattr__(name: str):
    if name == "Checkpoints":
        from .manager import Checkpoints  # noqa: PLC0415

        return Checkpoints
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Checkpoints", "open_checkpoints"]
