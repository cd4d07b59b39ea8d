"""The data file a checkpoint was trained on: its fingerprint, recorded in the checkpoint's meta (``data``),
and the check a resume runs on it.

A task that reads a file (the sequential task's ``data.path``) names it (``task.data_file``); generated data
has none (its seeds are in the config). The fingerprint is the file's absolute path, its size and a SHA-256:
of the whole file up to ``WHOLE_BYTES``, of a larger one ``BLOCKS`` blocks of ``BLOCK_BYTES`` evenly spaced
from its first byte to its last (the first and last MiB among them), so it costs at most 64 MiB of reading.
What it covers is recorded with it (``covers``). A change of size is always seen; an edit of a larger file
that keeps its size and falls between the blocks is not.

A resume on a file whose size or hash differs from the checkpoint's is refused, naming the file, unless
``checkpoint.allow_data_change=true`` (then one warning). The same content at another path resumes (a moved
data folder). A checkpoint written before fingerprints were recorded has none: it resumes with a warning
that its data could not be checked.

The ids a hash or modulo table is keyed by are part of its data too: a resume that turns ``data.raw_ids`` on or
off (the checkpoint's rows keyed by the other kind of id, none of which this run's ids would find) is refused
the same way (``check_ids``).
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Mapping

from ..errors import PreflightError

WHOLE_BYTES = 64 << 20
BLOCK_BYTES = 1 << 20
BLOCKS = 64
SETTING = "checkpoint.allow_data_change"


def fingerprint(path: str | Path) -> dict[str, Any]:
    """{path, size, sha256, covers} of one data file (see the module docstring)."""
    p = Path(path).absolute()
    try:
        size = p.stat().st_size
        h = hashlib.sha256()
        with open(p, "rb") as f:
            if size <= WHOLE_BYTES:
                for chunk in iter(lambda: f.read(BLOCK_BYTES), b""):
                    h.update(chunk)
                covers = "the whole file"
            else:
                for k in range(BLOCKS):
                    f.seek(k * (size - BLOCK_BYTES) // (BLOCKS - 1))
                    h.update(f.read(BLOCK_BYTES))
                covers = f"{BLOCKS} blocks of {BLOCK_BYTES} bytes evenly spaced from the first byte to the last"
    except OSError as e:
        raise PreflightError(f"data file {p} cannot be read for the checkpoint's fingerprint of it: "
                             f"{e.strerror or e}") from None
    return {"path": str(p), "size": size, "sha256": h.hexdigest(), "covers": covers}


def _shown(fp: Mapping[str, Any]) -> str:
    return f"{fp['path']} ({fp['size']:,} bytes, sha256 {fp['sha256'][:16]}... of {fp['covers']})"


def check(meta: Mapping[str, Any], ours: Mapping[str, Any] | None, where: str, allow: bool,
          notes: list[tuple[int, str]]) -> None:
    """Refuse (a PreflightError naming the file and ``SETTING``) a resume whose data file differs from the one
    checkpoint ``where`` recorded; with ``allow``, warn instead. ``ours``: this run's fingerprint, or None.
    What it would log is appended to ``notes`` as (level, message): the resume says it once it is certain, on
    process 0 alone (``opening._resume``), not on every process nor before a later refusal."""
    theirs = meta.get("data")
    if theirs is None:
        if ours is not None:
            notes.append((logging.WARNING, f"checkpoint {where} records no fingerprint of its data (written before "
                          f"checkpoints recorded one): cannot check that {ours['path']} is the data it was trained on"))
        return
    same = ours is not None and all(ours[k] == theirs.get(k) for k in ("size", "sha256", "covers"))
    if same:
        if ours["path"] != theirs.get("path"):
            notes.append((logging.INFO, f"data file {ours['path']} has the content checkpoint {where} was "
                          f"trained on, at {theirs.get('path')}"))
        return
    now = f"this run reads {_shown(ours)}" if ours is not None else "this run reads no data file"
    what = f"checkpoint {where} was trained on {_shown(theirs)}, but {now}"
    if allow:
        notes.append((logging.WARNING, f"{what}; resuming on it anyway ({SETTING}=true)"))
        return
    raise PreflightError(
        f"{what}: the data changed since the checkpoint was written, and a resume would go on training on other "
        f"data than the run started on. Put back the file the run started on, start a new run "
        f"(checkpoint.resume=never with another checkpoint.dir or trainer.run_id), or set {SETTING}=true to "
        f"resume on this data on purpose.")


def check_ids(meta: Mapping[str, Any], data: Any, where: str, allow: bool, notes: list[tuple[int, str]]) -> None:
    """Refuse (as ``check``) a resume whose ``data.raw_ids`` (``data``: this run's data config) differs from the
    checkpoint's while the checkpoint holds hash or modulo tables: their slots and rows are keyed by the ids the
    run started on, and the other kind of id finds none of them (the tables would start over, unseen). Its warning
    with ``allow`` goes to ``notes``, as ``check``'s."""
    config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    theirs = bool((config.get("data") or {}).get("raw_ids", False))
    ours = bool(data.get("raw_ids", False)) if hasattr(data, "get") else False
    keyed = sorted(n for n, t in (meta.get("tables") or {}).items()
                   if isinstance(t, Mapping) and t.get("kind") in ("hash", "modulo"))
    if theirs == ours or not keyed:
        return
    ids = ("raw 64-bit ids", "the data's ids")
    what = (f"checkpoint {where} was trained with data.raw_ids={str(theirs).lower()}, and this run has "
            f"data.raw_ids={str(ours).lower()}: its hash and modulo tables {keyed} hold rows keyed by "
            f"{ids[not theirs]}, which {ids[not ours]} would never find")
    if allow:
        notes.append((logging.WARNING, f"{what}; resuming on them anyway ({SETTING}=true): those tables start over"))
        return
    raise PreflightError(
        f"{what} (the tables would start over while the run resumes). Resume with "
        f"data.raw_ids={str(theirs).lower()}, start a new run (checkpoint.resume=never with another checkpoint.dir "
        f"or trainer.run_id), or set {SETTING}=true to resume on these ids on purpose.")
