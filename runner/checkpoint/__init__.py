"""Checkpoints and exact resume: Orbax + tensorstore (zarr3) arrays, JSON metadata, per-array digests.

- ``manager.py``: when to save, what to restore, corrupt-checkpoint recovery (:func:`open_checkpoints`);
- ``meta.py``: the metadata a checkpoint carries and the compatibility checks on restore;
- ``digest.py``: order-sensitive digests of the arrays, computed on the devices (any single-bit change shows);
- ``lock.py``: ``<checkpoint.dir>/run.lock``, so one run at a time writes a checkpoint directory.
"""
from .manager import CheckpointError, Checkpoints, open_checkpoints

__all__ = ["CheckpointError", "Checkpoints", "open_checkpoints"]
