"""A hash table placed again for another partition count (``runner/checkpoint/rebucket.py``), against a plain
Python reference of the same rounds: the same slots, every id kept with its key, metadata, row and optimizer
state bit for bit, the filled counts, a sketch that lowers no id's estimate, and the ids whose new window is full
dropped by priority (the most recently seen, then the most often seen, then the smallest id, keep theirs)."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from runner.checkpoint.rebucket import rebucket, remap_tokens
from runner.core import hash_rows as hr, hash_tables as ht
from tests.runner.core.test_hash_tables import DictTable, drifting_stream, jit_find, run_jax


def _ints(keys: np.ndarray) -> list[int]:
    k = keys.astype(np.uint64)
    return [int(x) for x in (k[:, 0] << np.uint64(32)) | k[:, 1]]


def _reference(new: ht.HashSpec, held: dict[int, tuple[int, int]]) -> dict[int, int]:
    """id -> new slot, by the rounds in plain Python: each id still waiting takes the first free slot of its
    window; of the ids taking one slot the first in priority order keeps it; an id with no free slot is out."""
    windows = DictTable(new).window
    waiting = sorted(held, key=lambda k: (-held[k][0], -held[k][1], k))
    taken, out = set(), {}
    while waiting:
        choice = {}
        for k in waiting:
            free = [s for s in windows(k) if s not in taken]
            if free:
                choice[k] = free[0]
        keeper = {}
        for k in waiting:  # priority order
            if k in choice:
                keeper.setdefault(choice[k], k)
        for s, k in keeper.items():
            out[k] = s
            taken.add(s)
        waiting = [k for k in waiting if k in choice and k not in out]
    return out


def _estimate(spec: ht.HashSpec, sketch: np.ndarray, k: int) -> int:
    ref = DictTable(spec)
    s = np.asarray(sketch).reshape(spec.partitions, spec.sketch_depth, -1)
    return min(int(s[ref.cell(k, d)]) for d in range(spec.sketch_depth))


@pytest.mark.parametrize("parts", [(1, 4), (4, 1), pytest.param((4, 2), marks=pytest.mark.slow),
                                   pytest.param((2, 3), marks=pytest.mark.slow)], ids=lambda p: f"{p[0]}to{p[1]}")
def test_rebucket_matches_the_reference_and_keeps_every_placed_id_whole(parts):
    capacity = 48
    old = ht.HashSpec(capacity, admit_after=2, evict="lru", probes=4, sketch_width=96, partitions=parts[0])
    new = dataclasses.replace(old, partitions=parts[1])
    ids = drifting_stream(60, 32, population=400, active=120, drift=2.0, seed=3)
    state, _ = run_jax(old, ids)
    state = ht.HashState(*(np.asarray(x) for x in state))
    rng = np.random.default_rng(0)
    table = rng.normal(size=(old.rows, 5)).astype(np.float32)
    moment = rng.random((old.rows, 5)).astype(np.float32)
    rowwise = rng.random((old.rows,)).astype(np.float32)

    r = rebucket(old, new, state, table, [moment, rowwise])

    held_slots = np.flatnonzero(state.last >= 0)
    keys = _ints(state.keys[held_slots])
    held = {k: (int(state.last[s]), int(state.count[s])) for k, s in zip(keys, held_slots)}
    want = _reference(new, held)
    got_slots = np.flatnonzero(r.hashed.last >= 0)
    got = dict(zip(_ints(r.hashed.keys[got_slots]), got_slots.tolist()))
    assert got == want
    assert r.ids == len(held) and r.dropped == len(held) - len(want)
    old_slot = dict(zip(keys, held_slots.tolist()))
    old_rows = np.asarray(hr.slot_rows(old, np.asarray([old_slot[k] for k in want])))
    new_rows = np.asarray(hr.slot_rows(new, np.asarray([want[k] for k in want])))
    np.testing.assert_array_equal(r.table[new_rows], table[old_rows])
    np.testing.assert_array_equal(r.states[0][new_rows], moment[old_rows])
    np.testing.assert_array_equal(r.states[1][new_rows], rowwise[old_rows])
    np.testing.assert_array_equal(r.table[new.shared_row], table[old.shared_row])
    np.testing.assert_array_equal(r.row_map[old_rows], new_rows)
    for k, s in want.items():  # the step's own lookup finds each id at its new slot, with its metadata
        assert (int(r.hashed.last[s]), int(r.hashed.count[s])) == held[k]
    found = np.asarray(jit_find(new, ht.HashState(*map(jnp.asarray, r.hashed)), jnp.asarray(r.hashed.keys[got_slots])))
    np.testing.assert_array_equal(found, got_slots)
    filled = np.bincount(got_slots // new.part_capacity, minlength=new.partitions)
    np.testing.assert_array_equal(np.atleast_1d(r.hashed.filled), filled if new.partitions > 1 else [filled.sum()])
    for k in map(int, np.unique(ids[ids != 0])):  # count-min's guarantee kept: no estimate goes down
        assert _estimate(new, r.hashed.sketch, k) >= _estimate(old, state.sketch, k)


@pytest.mark.slow
def test_a_full_window_drops_the_least_recently_seen_and_the_update_drops_their_gradients():
    old = ht.HashSpec(16, probes=4, partitions=1)
    new = dataclasses.replace(old, partitions=4)  # windows of 4 slots: a partition takes at most 4 ids
    ids = drifting_stream(40, 8, population=200, active=60, drift=3.0, seed=1)
    state, _ = run_jax(old, ids)
    state = ht.HashState(*(np.asarray(x) for x in state))
    table = np.arange(old.rows * 2, dtype=np.float32).reshape(old.rows, 2)
    r = rebucket(old, new, state, table, [])
    assert r.dropped > 0 and r.ids == int((state.last >= 0).sum())
    held_slots = np.flatnonzero(state.last >= 0)
    kept = set(_ints(r.hashed.keys[r.hashed.last >= 0]))
    for p in range(new.partitions):  # in a partition that overflowed, every dropped id was seen before every kept
        mine = [s for s, k in zip(held_slots, _ints(state.keys[held_slots])) if DictTable(new).part(k) == p]
        lost = [state.last[s] for s in mine if _ints(state.keys[[s]])[0] not in kept]
        stay = [state.last[s] for s in mine if _ints(state.keys[[s]])[0] in kept]
        if lost:
            assert len(stay) == new.part_capacity and max(lost) <= min(stay)
    dropped_rows = [int(hr.slot_rows(old, s)) for s in held_slots if _ints(state.keys[[s]])[0] not in kept]
    tokens = np.asarray([dropped_rows[0], 0, -1, int(hr.slot_rows(old, held_slots[0]))])
    moved = remap_tokens(tokens, r.row_map)
    assert moved[0] == -1 and moved[1] == 0 and moved[2] == -1
    k0 = _ints(state.keys[held_slots[:1]])[0]
    assert moved[3] == (int(hr.slot_rows(new, np.flatnonzero(np.asarray(_ints(r.hashed.keys)) == k0)[0]))
                        if k0 in kept else -1)


def test_a_resumed_capacity_that_does_not_split_over_this_mesh_names_where_it_resumes():
    from runner.checkpoint.rebucket import refuse_resumed_capacity
    from runner.errors import PreflightError

    saved = ("ck/3", {"items": {"kind": "hash", "vocab": 201 + 2, "partitions": 1}, "users": {"kind": "dense"}})
    with pytest.raises(PreflightError) as e:
        refuse_resumed_capacity(saved, "items", 201, 2)
    assert str(e.value) == ("model.tables.items.capacity=201 does not split into the 2 partitions of this mesh (one or "
                            "more a row shard), and the checkpoint ck/3 holds the table with that capacity, which a "
                            "resume keeps: resume it on one device, or a mesh whose table axis divides it (3, 67, "
                            "201, ...), or start a new run in another checkpoint.dir")
    refuse_resumed_capacity(saved, "items", 203, 2)  # another capacity: the config's own refusal says how to fix it
    refuse_resumed_capacity(None, "items", 201, 2)  # no checkpoint to resume
    with pytest.raises(PreflightError, match=r"resume it on one device, or start a new run"):  # a prime: no axis
        refuse_resumed_capacity(("ck/3", {"items": {"kind": "hash", "vocab": 5003 + 4, "partitions": 2}}), "items",
                                5003, 4)
