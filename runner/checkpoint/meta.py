"""What a checkpoint records beside its arrays, and the checks a resume runs on it.

- ``run_id(cfg)``: ``trainer.run_id``, else a short hash of the resolved config minus the keys that do not
  change what is trained (``VOLATILE``), so a re-launch of the same command finds the same checkpoints.
- ``describe(...)``: the meta record of one checkpoint: step, data position, metrics rows, run id, the
  config and the library versions that wrote it, each table's layout, every array's shape, dtype and
  digest (``runner.checkpoint.digest``, checked after each restore), and the data file's fingerprint
  (``runner.checkpoint.data``, checked on resume).
- ``check_compatible``: refuse a checkpoint this config cannot continue (a ``PreflightError`` naming the field
  and both values); ``runner.checkpoint.target`` builds the abstract target the arrays are read into: this
  run's shapes and shardings, so a checkpoint reshards onto any mesh, table layout and stored width.
- ``check_settings`` / ``check_writable`` / ``resume_source``: the checkpoint settings, checked before
  anything compiles; ``carry_metrics``: a resumed run's metrics.jsonl continues the history, no step twice.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from . import digest as checkpoint_digest
from . import rebucket as rebucket_lib
from ..outputs import METRICS_FILE
from ..errors import PreflightError

log = logging.getLogger("runner")
FORMAT = 2  # 2: digest scheme 2 (any single-bit change is seen); 1: scheme 1, still read and verified
DIGEST_SCHEMES = {1: 1, 2: 2}  # meta format -> the digest scheme its arrays were summed with
VOLATILE = ("logger", "checkpoint", "mesh", "distributed", "hydra")  # where/how it runs, not what it learns
VOLATILE_TRAINER = ("run_id", "stop_after", "log_interval", "eval_interval", "eval_batches", "objective",
                    "progress", "epochs", "default_epochs", "max_skipped_updates", "strict_ids",
                    "data_workers")  # epochs: already in the resolved trainer.steps
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
UNIQUE_TOKENS = "unique_tokens"  # the deferred update's id list: resized and re-padded on restore
SEGMENT_IDS = "segment_ids"  # its tokens' indices into that list: read whole, rebuilt on restore if needed


def identity_config(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config without the volatile keys: what defines the run."""
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(json.dumps(cfg))
    for key in VOLATILE:
        c.pop(key, None)
    for key in VOLATILE_TRAINER:
        c.get("trainer", {}).pop(key, None)
    return c


def run_id(cfg: DictConfig) -> str:
    if cfg.trainer.get("run_id"):
        return str(cfg.trainer.run_id)
    blob = json.dumps(identity_config(cfg), sort_keys=True, default=str)
    return f"run-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@functools.cache
def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("recsys-runner", "jax", "jaxlib", "optax", "orbax-checkpoint", "tensorstore"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def tables_of(program: Any) -> dict[str, dict[str, Any]]:
    """Each table's facts a resume must match. ``permute_ids``: whether the stored rows are permuted
    (``mesh.permute_ids`` as the run resolved it; a checkpoint from before the setting has no such key:
    unpermuted)."""
    return {n: {"vocab": s.vocab, "rows": s.rows, "width": s.width, "stored_width": s.columns, "dtype": s.dtype,
                "optimizer": type(program.emb_optimizers[n]).__name__,
                "tokens_per_batch": program.contexts[n].tokens_per_batch, "permute_ids": bool(s.permute_ids),
                "kind": s.kind,
                **({"probes": s.hash.window, "partitions": s.hash.partitions} if s.hash is not None else {}),
                **({"members": list(program.stacking.stacks[n])} if n in program.stacking.stacks else {})}
            for n, s in sorted(program.tables.items())}


# ----- array facts and digests --------------------------------------------------------------------------
def table_record(path: tuple, tables: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The record (``tables_of``) of the table a leaf of ``tables`` or ``emb_states`` belongs to; else None."""
    if len(path) >= 2 and getattr(path[0], "name", None) in ("tables", "emb_states"):
        t = tables.get(getattr(path[1], "key", None))
        return t if isinstance(t, Mapping) else None
    return None


def logical_rows(path: tuple, shape: tuple, tables: Mapping[str, Mapping[str, Any]]) -> int | None:
    """For a table or per-row state leaf (leading dim = stored rows): the table's vocab; else None."""
    t = table_record(path, tables)
    return t["vocab"] if t is not None and len(shape) >= 1 and shape[0] == t["rows"] else None


def logical_cols(path: tuple, shape: tuple, tables: Mapping[str, Mapping[str, Any]]) -> int | None:
    """For a table or per-element state leaf stored wider than its rows (``stored_width``): the table's width
    (the columns past it are padding); else None. A checkpoint's digests then do not depend on the padding, so
    it restores at any stored width."""
    t = table_record(path, tables)
    if t is not None and len(shape) == 2 and shape[0] == t["rows"] and shape[1] == t.get("stored_width") != t["width"]:
        return t["width"]
    return None


def leaves(state: Any, tables: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, Any, int | None, int | None]]:
    """(key, leaf, logical rows or None, logical columns or None) for every array of the state, in pytree order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return [(jax.tree_util.keystr(p), x, logical_rows(p, tuple(x.shape), tables),
             logical_cols(p, tuple(x.shape), tables)) for p, x in flat]


def digests(state: Any, tables: Mapping[str, Mapping[str, Any]], fmt: int = FORMAT) -> dict[str, int]:
    """Every array's digest, as a checkpoint of meta format ``fmt`` records them."""
    return checkpoint_digest.digests(leaves(state, tables), scheme=DIGEST_SCHEMES[fmt])


def describe_arrays(program: Any, tree: Any) -> dict[str, dict[str, Any]]:
    """Shape, dtype, logical rows and digest of every array of ``tree`` (a TrainState or a BestState)."""
    info = leaves(tree, tables_of(program))
    sums = checkpoint_digest.digests(info, scheme=DIGEST_SCHEMES[FORMAT])
    return {k: {"shape": list(x.shape), "dtype": str(x.dtype), "rows": r, "digest": sums[k]} for k, x, r, _ in info}


def describe(cfg: DictConfig, program: Any, state: Any, *, step: int, metrics_rows: int, run: str,
             output_dir: str, mesh: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``data``: the fingerprint of the data file trained on (``runner.checkpoint.data``), recorded when given."""
    tables, arrays = tables_of(program), describe_arrays(program, state)
    return {"format": FORMAT, "step": step, "data_step": step, "metrics_rows": metrics_rows, "run_id": run,
            "output_dir": output_dir, "mesh": mesh, "async_emb": bool(program.async_emb),
            "staleness": int(program.staleness), "compensation": _compensation(program), "tables": tables,
            "arrays": arrays, "versions": versions(), "config": OmegaConf.to_container(cfg, resolve=True),
            **({"data": dict(data)} if data is not None else {})}


def _compensation(program: Any) -> str:
    """The program's ``async_emb.compensation`` word, as its contexts say."""
    return "dc" if any(c.compensates for c in program.contexts.values()) else "none"


# ----- compatibility ------------------------------------------------------------------------------------
def _field_names(name: str) -> dict[str, str]:
    return {"vocab": f"model.tables.{name}.vocab (or the data's id range)",
            "width": f"model.tables.{name}.width / model.emb_width", "dtype": f"model.tables.{name}.dtype",
            "optimizer": f"optimizer / table_optimizers.{name}",
            "tokens_per_batch": "trainer.batch_size x tokens per example (the deferred update's shape)"}


def check_compatible(meta: Mapping[str, Any], program: Any, where: str) -> None:
    """Raise a PreflightError listing every field this config cannot continue from the checkpoint."""
    unreadable = format_problem(meta)
    if unreadable:  # the rest of its record may not mean what this runner reads it as: say only this
        raise PreflightError(f"checkpoint {where} cannot be read by this runner: {unreadable}")
    problems = []
    if bool(meta["async_emb"]) != bool(program.async_emb):
        problems.append(f"async_emb.enabled: the checkpoint has {meta['async_emb']}, this config has "
                        f"{program.async_emb}")
    elif program.async_emb:  # the deferred updates' queue and records are saved as this config makes them
        staleness, comp = int(meta.get("staleness", 1)), meta.get("compensation", "none")
        if staleness != program.staleness:
            problems.append(f"async_emb.staleness: the checkpoint has {staleness}, this config has "
                            f"{program.staleness} (its queue holds {staleness} deferred updates)")
        if comp != _compensation(program):
            problems.append(f"async_emb.compensation: the checkpoint has {comp}, this config has "
                            f"{_compensation(program)} (its deferred updates carry {'the' if comp == 'dc' else 'no'} "
                            f"rows their gradients were computed on)")
    ours, theirs = tables_of(program), meta["tables"]
    if set(ours) != set(theirs):
        stacked = any("members" in t for t in theirs.values() if isinstance(t, Mapping))
        logical = lambda tables: sorted(m for n, t in tables.items()  # noqa: E731 (the model's own tables)
                                        for m in (t.get("members") if isinstance(t, Mapping) else None) or [n])
        hint = (f" (the checkpoint's tables were {'' if stacked else 'not '}stacked: model.stack_tables="
                f"{str(stacked).lower()} builds them as it has them)"
                if stacked != bool(program.stacking.stacks) and logical(theirs) == logical(ours) else "")
        problems.append(f"tables: the checkpoint has {sorted(theirs)}, this config has {sorted(ours)}{hint}")
    for name in sorted(set(ours) & set(theirs)):
        moved = rebucket_lib.moved(theirs[name], ours[name])
        for key, label in _field_names(name).items():
            if key == "tokens_per_batch" and not program.async_emb or key == "vocab" and moved:
                continue  # a hash table saved with other partitions has other rows: placed again (rebucket.py)
            if ours[name][key] != theirs[name][key] and key == "vocab" and ours[name]["kind"] == "hash":
                problems.append(f"table '{name}' capacity (model.tables.{name}.capacity): the checkpoint has "
                                f"{rebucket_lib.capacity(theirs[name])}, this config has "
                                f"{rebucket_lib.capacity(ours[name])}")  # its rows: the slots and 2 a partition
            elif ours[name][key] != theirs[name][key]:
                problems.append(f"table '{name}' {key} ({label}): the checkpoint has {theirs[name][key]!r}, "
                                f"this config has {getattr(ours[name][key], 'value', ours[name][key])!r}")
        stored = theirs[name].get("stored_width", theirs[name]["width"]), ours[name]["stored_width"]
        if moved and stored[0] != stored[1]:  # its rows are placed again as stored: one change at a time
            problems.append(f"table '{name}' stored_width (model.tables.{name}.stored_width): the checkpoint has "
                            f"{stored[0]}, this config has {stored[1]}, and its partitions change too; resume with "
                            f"model.tables.{name}.stored_width={stored[0]} first, then change it")
        slots = rebucket_lib.capacity(theirs[name]), rebucket_lib.capacity(ours[name])
        if moved and slots[0] != slots[1]:
            problems.append(f"table '{name}' capacity (model.tables.{name}.capacity): the checkpoint has "
                            f"{slots[0]}, this config has {slots[1]}")
        if theirs[name].get("members", []) != ours[name].get("members", []):
            problems.append(f"table '{name}' members (model.stack_tables: the tables stacked in it): the checkpoint "
                            f"has {theirs[name].get('members', [])}, this config has {ours[name].get('members', [])}")
        kind = theirs[name].get("kind", "dense")  # a checkpoint from before table kinds: dense tables
        if kind != ours[name]["kind"]:
            problems.append(f"table '{name}' kind (model.tables.{name}.kind): the checkpoint has {kind!r}, this "
                            f"config has {ours[name]['kind']!r}")
        elif theirs[name].get("probes") != ours[name].get("probes") and not moved:  # else placed in the new windows
            problems.append(f"table '{name}' probes (model.tables.{name}.probes, the window an id's slot is "
                            f"looked up in): the checkpoint has {theirs[name].get('probes')}, this config has "
                            f"{ours[name].get('probes')}; its ids were placed within their windows")
        permuted = bool(theirs[name].get("permute_ids", False))
        if permuted != ours[name]["permute_ids"]:
            problems.append(f"table '{name}' permute_ids (mesh.permute_ids): the checkpoint has {permuted}, this "
                            f"config has {ours[name]['permute_ids']}; its rows are stored in that order, so "
                            f"resume it with mesh.permute_ids={str(permuted).lower()} or mesh.permute_ids=auto "
                            f"(which follows the checkpoint)")
    if problems:
        raise PreflightError(incompatible(where, problems))


SHAPE = {"step": int, "data_step": int, "metrics_rows": int, "async_emb": bool, "tables": dict,
         "arrays": dict, "versions": dict, "config": dict}  # what every step's metadata holds (format: format_problem)
KINDS = {int: "a count", bool: "true or false", dict: "a JSON object"}


def malformed(meta: Any) -> str | None:
    """What makes a step's metadata (valid JSON) unusable: not an object, or a field missing or of another
    type (a file edited or damaged by hand); None when it has the shape every step's has."""
    if not isinstance(meta, Mapping):
        return f"its metadata is a JSON {type(meta).__name__}, not an object"
    for key, kind in SHAPE.items():
        value = meta.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or (kind is int and value < 0):
            return f"its metadata's {key} is {value!r}, not {KINDS[kind]}"
    return None


def format_problem(meta: Mapping[str, Any]) -> str | None:
    """What is wrong with the checkpoint's meta format, or None when this runner reads it. An older format
    and a newer one are told apart: each has its own way out."""
    fmt, known = meta.get("format"), sorted(DIGEST_SCHEMES)
    if fmt in DIGEST_SCHEMES:
        return None
    wrote = meta.get("versions", {}).get("recsys-runner") if isinstance(meta.get("versions"), Mapping) else None
    by = f" (recsys-runner {wrote})" if wrote else ""
    head = f"checkpoint format: the checkpoint has {fmt!r}, this runner reads {known}"
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > max(known):
        return (f"{head}; a newer runner{by} wrote it: resume it with that version of the runner, or start a "
                f"new run (checkpoint.resume=never with another checkpoint.dir or trainer.run_id)")
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt < min(known):
        return (f"{head}; an older runner{by} wrote it, and this one no longer reads that format: resume it "
                f"with the runner version that wrote it, or start a new run (checkpoint.resume=never with "
                f"another checkpoint.dir or trainer.run_id)")
    return (f"{head}; {fmt!r} is no format any runner writes, so its meta/ item is damaged or was not written "
            f"by this runner: start a new run (checkpoint.resume=never with another checkpoint.dir or "
            f"trainer.run_id)")


def incompatible(where: str, problems: list[str]) -> str:
    return (f"checkpoint {where} was written by an incompatible config:\n  - " + "\n  - ".join(problems)
            + "\nResume it with the config that wrote it (stored in its meta/ item), or start a new run: "
              "checkpoint.resume=never with another checkpoint.dir or trainer.run_id.")


def config_changes(old: Mapping[str, Any], cfg: DictConfig) -> list[str]:
    """Keys whose values differ between the checkpoint's config and this one (volatile keys ignored)."""
    a, b = _flat(identity_config(old)), _flat(identity_config(cfg))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: getattr(d, "value", d)}  # an Enum setting as the command line writes it (lfu, not Evict.lfu)


# ----- settings, the checkpoint directory and the metrics history ---------------------------------------
def carry_metrics(target: Path, previous_output_dir: str | None, rows: int) -> dict:
    """Start this launch's metrics.jsonl with the first ``rows`` rows of the run so far: those logged up to
    the checkpoint. Rows logged after it (the steps about to be re-run) are dropped, so no step repeats.
    Returns the last carried row with a train loss (the run's summary starts from it)."""
    prev = Path(previous_output_dir) / METRICS_FILE if previous_output_dir else None
    source = prev if prev is not None and prev.exists() else target
    lines = source.read_text().splitlines(keepends=True) if source.exists() else []
    if len(lines) < rows:
        log.warning("metrics history %s has %d rows, the checkpoint counted %d; continuing from what is there",
                    source, len(lines), rows)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text("".join(lines[:rows]))
    os.replace(tmp, target)
    train_rows = [r for r in map(json.loads, lines[:rows]) if "train/loss" in r]
    return train_rows[-1] if train_rows else {}


def resume_path(cfg: DictConfig) -> str | None:
    """``checkpoint.resume`` when it names a checkpoint (not ``auto`` or ``never``), else None."""
    resume = str(cfg.checkpoint.resume)
    return None if resume in ("auto", "never") else resume


def wanted(cfg: DictConfig) -> bool:
    """Whether the run saves checkpoints (``checkpoint.interval`` > 0) or resumes from a given path."""
    return cfg.checkpoint.interval > 0 or resume_path(cfg) is not None


def check_settings(cfg: DictConfig) -> None:
    """checkpoint.* and the trainer keys that go with it; all problems together, one line each."""
    c, t, errors = cfg.checkpoint, cfg.trainer, []
    if c.interval < 0:
        errors.append(f"checkpoint.interval={c.interval} must be >= 0 (0 turns checkpoints off)")
    if c.keep < 1:
        errors.append(f"checkpoint.keep={c.keep} must be >= 1")
    if t.get("run_id") is not None and not RUN_ID.fullmatch(str(t.run_id)):
        errors.append(f"trainer.run_id={t.run_id!r}: use 1-64 letters, digits, '.', '_' or '-' (it names a "
                      f"directory and the W&B run)")
    stop = t.get("stop_after")
    if stop is not None and not 0 < stop <= t.steps:
        errors.append(f"trainer.stop_after={stop} must be between 1 and trainer.steps={t.steps}")
    elif stop is not None and c.interval == 0:  # the example interval is only offered for a stop_after that works
        errors.append(f"trainer.stop_after={stop} stops the run to be resumed later, which needs checkpoints: "
                      f"set checkpoint.interval (e.g. {stop})")
    if errors:
        raise PreflightError("invalid config:\n  - " + "\n  - ".join(errors))


def check_writable(directory: Path) -> None:
    """Fail now, not hours in, when the checkpoint directory cannot be written."""
    if directory.exists() and not directory.is_dir():
        raise PreflightError(
            f"checkpoint.dir={directory} is a file, not a directory; point checkpoint.dir at a directory (new or "
            f"holding this run's checkpoints), or move the file away")
    probe = directory / f".write-probe-{jax.process_index()}-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            probe.write_bytes(b"\0" * 65536)
        finally:
            probe.unlink(missing_ok=True)  # also when the write failed part-way: leave nothing behind
    except OSError as e:
        raise PreflightError(
            f"checkpoint.dir={directory} is not writable ({e.strerror or e}); point checkpoint.dir at a writable "
            f"directory with free space, or turn checkpoints off with checkpoint.interval=0") from None


def directory_of(cfg: DictConfig) -> Path:
    """``checkpoint.dir``, else ``outputs/checkpoints/<run id>``: where this run saves and ``resume=auto`` looks."""
    return Path(cfg.checkpoint.dir or Path("outputs/checkpoints") / run_id(cfg)).absolute()


def resumed_tables(cfg: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """(step directory, its meta ``tables``) of the checkpoint this run would resume from, read before the
    tables are built (``mesh.permute_ids=auto`` follows the order it records), or None: a new run, or nothing
    readable there (the restore reports why). The newest step whose meta reads, as the restore picks it."""
    c = cfg.checkpoint
    try:
        if resume_path(cfg) is not None:
            directory, steps = resume_source(Path(resume_path(cfg)))
        elif str(c.resume) == "auto" and c.interval > 0 and directory_of(cfg).is_dir():
            directory = directory_of(cfg)
            steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit() and (p / "meta").is_dir()]
        else:
            return None
    except PreflightError:
        return None  # not a checkpoint: opening it says so
    for step in sorted(steps, reverse=True):
        try:
            tables = json.loads((directory / str(step) / "meta" / "metadata").read_text())["tables"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(tables, Mapping):
            return str(directory / str(step)), dict(tables)
    return None


def resume_source(path: Path) -> tuple[Path, list[int]]:
    """checkpoint.resume=<path>: a step directory, or a checkpoint directory (its steps, newest first)."""
    path = path.absolute()
    if path.is_dir() and path.name.isdigit() and (path / "meta").is_dir():
        return path.parent, [int(path.name)]
    steps = [int(p.name) for p in path.iterdir() if p.name.isdigit() and (p / "meta").is_dir()] \
        if path.is_dir() else []
    if not steps:
        raise PreflightError(
            f"checkpoint.resume={path} is not a checkpoint (no step directory with a meta/ item there); use "
            f"auto, never, or the path of a checkpoint step or checkpoint directory")
    return path, steps
