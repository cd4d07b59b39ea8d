"""A hash table's slots moved to another partition count: a checkpoint resumed on a mesh with other row shards.

An id lives in the partition of its hash (``hash_tables.partition_of``), within a window of its partition's
slots, so a table saved with ``P`` partitions cannot be read slot for slot by a run with ``P'``. On such a
resume each id held is placed again, on the host, before the state is put on the mesh (``rebucket``):

- **Order.** In rounds: every id still without a slot takes the first free slot of its window in its new
  partition; when several take one slot, the most recently seen keeps it (then the most often seen, then the
  smallest id), and the others try again in the next round. An id whose window has no free slot left is
  dropped, as an eviction would drop it, and counted in the warning the resume logs.
- **What moves with an id:** its key, last step seen, count, its row and every per-row leaf of its optimizer
  state, bit for bit. A deferred update (async mode) follows its rows; its gradients for a dropped id's row
  are dropped.
- **The admission sketch** cannot be split by id (its counters sum ids), so each new counter starts at the
  largest old counter an id of it could have been counted in (the old and new columns agree modulo the gcd
  of their widths; any old partition): no id's estimate goes down, some may be admitted sooner.
- Slots left empty get the padding row's values (they are reset when an id takes them); the shared default
  row moves to the new shared row.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from ..core import hash_rows, hash_tables as ht
from ..errors import PreflightError


# The policy's functions compiled once per table spec (run op by op, each operation would be a program of its
# own); they take the host's numpy arrays as they are
_window_slots = jax.jit(ht.window_slots, static_argnums=0)
_slot_rows = jax.jit(hash_rows.slot_rows, static_argnums=0)


def moved(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Whether a hash table was saved with another partition count than this run's (same capacity)."""
    return (ours.get("kind") == "hash" == theirs.get("kind", "dense")
            and int(theirs.get("partitions", 1)) != int(ours["partitions"]))


def capacity(t: Mapping[str, Any]) -> int:
    """A hash table's slots, from its rows: a padding and a shared row per partition besides the slots."""
    return int(t["vocab"]) - 2 * int(t.get("partitions", 1))


def rebucketed(meta: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, int]:
    """The hash tables the checkpoint saved with another partition count than this run's: name -> its count
    (``rebucket.py`` places their ids again on restore)."""
    theirs = meta["tables"]
    return {n: int(theirs[n].get("partitions", 1)) for n in sorted(set(ours) & set(theirs))
            if moved(theirs[n], ours[n])}


class Rebucketed(NamedTuple):
    hashed: ht.HashState  # numpy leaves, the new partitions' layout
    table: np.ndarray
    states: list  # the per-row state leaves, in the order given
    row_map: np.ndarray  # int32 [old rows]: each old row's new row, -1 for a dropped id's (and unused rows)
    ids: int  # ids held, each placed again or dropped
    dropped: int  # ids whose new window had no free slot


def placement(new: ht.HashSpec, keys: np.ndarray, last: np.ndarray, count: np.ndarray) -> np.ndarray:
    """int [M]: the new (global) slot of each of the M ids ``keys`` [M, 2] (with their ``last`` and ``count``),
    -1 for an id dropped; the rounds of the module docstring."""
    m = keys.shape[0]
    slot_of = np.full(m, -1, np.int64)
    if m == 0:
        return slot_of
    order = np.lexsort((keys[:, 1], keys[:, 0], -count.astype(np.int64), -last.astype(np.int64)))
    windows = np.asarray(_window_slots(new, keys[order, 0], keys[order, 1]))  # [M, window], in priority order
    taken = np.zeros(new.capacity, bool)
    waiting = np.arange(m)  # ascending: the highest priority first
    while waiting.size:
        win = windows[waiting]
        free = ~taken[win]
        can = free.any(axis=1)
        waiting, win, free = waiting[can], win[can], free[can]
        choice = win[np.arange(waiting.size), free.argmax(axis=1)]
        _, first = np.unique(choice, return_index=True)  # the first (highest priority) taker of each slot keeps it
        slot_of[order[waiting[first]]] = choice[first]
        taken[choice[first]] = True
        lost = np.ones(waiting.size, bool)
        lost[first] = False
        waiting = waiting[lost]
    return slot_of


def sketch_for(old: ht.HashSpec, new: ht.HashSpec, sketch: np.ndarray) -> np.ndarray:
    """The new partitions' sketch: each counter the largest old one an id of it could have been counted in."""
    s = np.asarray(sketch).reshape(old.partitions, old.sketch_depth, -1)
    w_old = s.shape[-1]
    w_new = new.sketch_width if new.partitions == 1 else new.part_sketch_width
    g = math.gcd(w_old, w_new)
    per_residue = s.max(axis=0).reshape(old.sketch_depth, w_old // g, g).max(axis=1)  # [depth, g]
    one = per_residue[:, np.arange(w_new) % g]
    if new.partitions == 1:
        return one.astype(np.int32)
    return np.broadcast_to(one, (new.partitions, *one.shape)).astype(np.int32).copy()


def rebucket(old: ht.HashSpec, new: ht.HashSpec, hashed: ht.HashState, table: Any, states: list) -> Rebucketed:
    """``hashed``, ``table`` and the per-row state leaves ``states`` (leading dim = ``old.rows``) of a table saved
    with ``old.partitions`` partitions, laid out for ``new.partitions`` (same capacity and window)."""
    keys, last, count = (np.asarray(x) for x in (hashed.keys, hashed.last, hashed.count))
    held = np.flatnonzero(last >= 0)
    slot_of = placement(new, keys[held], last[held], count[held])
    placed = slot_of >= 0
    src, dst = held[placed], slot_of[placed]
    new_keys = np.zeros_like(keys)
    new_last = np.full_like(last, -1)
    new_count = np.zeros_like(count)
    new_keys[dst], new_last[dst], new_count[dst] = keys[src], last[src], count[src]
    per_part = np.bincount(dst // new.part_capacity, minlength=new.partitions).astype(np.int32)
    filled = np.int32(per_part.sum()) if new.partitions == 1 else per_part
    old_rows = np.asarray(_slot_rows(old, src.astype(np.int32)))
    new_rows = np.asarray(_slot_rows(new, dst.astype(np.int32)))
    row_map = np.full(old.rows, -1, np.int32)
    row_map[old_rows] = new_rows
    row_map[0] = 0
    row_map[old.shared_row] = new.shared_row

    def move(x):
        x = np.asarray(x)
        out = np.broadcast_to(x[0], (new.rows, *x.shape[1:])).copy()
        out[new_rows] = x[old_rows]
        out[new.shared_row] = x[old.shared_row]
        return out

    state = ht.HashState(new_keys, new_last, new_count, sketch_for(old, new, hashed.sketch), filled)
    return Rebucketed(state, move(table), [move(s) for s in states], row_map, int(held.size), int((~placed).sum()))


def remap_tokens(token_ids: np.ndarray, row_map: np.ndarray) -> np.ndarray:
    """A deferred update's per-token rows (``optimizers.record_token_ids``; -1 dropped) on the new rows: a
    dropped id's row becomes -1 (its gradient is dropped)."""
    t = np.asarray(token_ids)
    inside = (t >= 0) & (t < row_map.size)
    return np.where(inside, row_map[np.clip(t, 0, row_map.size - 1)], -1).astype(np.int32)


def place(program: Any, state: Any, moves: Mapping[str, int], shardings: Any, where: Any,
          notes: list[tuple[int, str]]) -> tuple[Any, dict]:
    """The hash tables saved with other partitions (``moves``: name -> the checkpoint's count), read at their
    stored shapes, placed again for this run's partitions (``rebucket.py``) and put on the mesh with this
    run's shardings. Returns the state and each such table's map from old rows to new ones (the deferred
    updates follow it in ``_refit``). Each table placed again is named in a warning appended to ``notes``, which the
    resume says once it is certain (``opening._resume``)."""
    if not moves:
        return state, {}
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    sh = jax.tree_util.tree_leaves(shardings)
    out, row_maps = [x for _, x in flat], {}
    whole = lambda x: np.asarray(x.addressable_data(0))  # noqa: E731  (read replicated: whole)
    at = {i: tuple(getattr(k, "name", getattr(k, "key", None)) for k in p) for i, (p, _) in enumerate(flat)}
    for n, parts in sorted(moves.items()):
        new = program.tables[n].hash
        old = dataclasses.replace(new, partitions=parts)
        table_i = next(i for i, k in at.items() if k[:2] == ("tables", n))
        state_is = [i for i, k in at.items() if k[:2] == ("emb_states", n) and flat[i][1].ndim >= 1
                    and flat[i][1].shape[0] == old.rows]
        hashed_is = {k[2]: i for i, k in at.items() if k[:2] == ("hashed", n)}
        before = ht.HashState(*(whole(flat[hashed_is[f]][1]) for f in ht.HashState._fields))
        r = rebucket(old, new, before, whole(flat[table_i][1]), [whole(flat[i][1]) for i in state_is])
        new_leaves = {table_i: r.table, **dict(zip(state_is, r.states)),
                      **{hashed_is[f]: np.asarray(getattr(r.hashed, f)) for f in ht.HashState._fields}}
        for i, k in at.items():  # every leaf of the table was read whole: each goes on with this run's sharding
            if k[:2] in (("tables", n), ("emb_states", n), ("hashed", n)):
                x = new_leaves[i] if i in new_leaves else whole(flat[i][1])
                out[i] = jax.make_array_from_callback(x.shape, sh[i], lambda idx, x=x: x[idx])
        row_maps[n] = r.row_map
        notes.append((logging.WARNING, f"checkpoint {where}: hash table '{n}' was saved with {parts} partitions and "
                      f"this run has {new.partitions}: its {r.ids} ids were placed again by their new partitions"
                      + (f"; {r.dropped} found no free slot in their window and were dropped" if r.dropped
                         else " (none dropped)")))
    return jax.tree_util.tree_unflatten(treedef, out), row_maps


def refuse_resumed_capacity(resumed: tuple[str, Mapping[str, Any]] | None, name: str, slots: int,
                            parts: int, given: int | None = None) -> None:
    """A resume keeps a hash table's capacity: when the checkpoint's (``resumed``: its step directory and its
    tables, ``meta.resumed_tables``) does not split into this run's ``parts``, refuse naming where it does resume
    (``runner.build.keyed_table``'s advice, to change the capacity, would not). ``given``: the
    ``model.tables.<name>.partitions`` set on the command line (None: the count followed the mesh), then named."""
    saved = resumed[1].get(name) if resumed is not None else None
    if not isinstance(saved, dict) or saved.get("kind") != "hash" or capacity(saved) != slots:
        return
    axes = [str(d) for d in range(2, min(slots, 4096) + 1) if slots % d == 0][:3]
    if given is not None:
        raise PreflightError(
            f"model.tables.{name}.partitions={given} does not divide model.tables.{name}.capacity={slots}, which "
            f"the checkpoint {resumed[0]} holds and a resume keeps: set model.tables.{name}.partitions to a divisor "
            f"of {slots} that the mesh's row shards divide ({', '.join(['1', *axes])}, ...), or leave it unset (the "
            f"checkpoint's {int(saved.get('partitions', 1))} where the mesh's row shards divide it)")
    where = "one device" + (f", or a mesh whose table axis divides it ({', '.join(axes)}, ...)" if axes else "")
    raise PreflightError(f"model.tables.{name}.capacity={slots} does not split into the {parts} partitions of "
                         f"this mesh (one or more a row shard), and the checkpoint {resumed[0]} holds the table with "
                         f"that capacity, which a resume keeps: resume it on {where}, or start a new run in another "
                         f"checkpoint.dir")
