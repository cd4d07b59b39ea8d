"""Hash embedding tables: raw 64-bit ids mapped to a fixed number of slots inside the jitted step.

A table of ``kind=hash`` holds ``capacity`` slots. Each slot has a key (the 64-bit id it holds, as two uint32
halves, since JAX runs without 64-bit integers), the step it was last seen at and how often it was seen; its
row is row ``slot + 1`` of the table (row 0 is padding, as in every table; with ``default=shared`` row
``capacity + 1`` is the row every id without a slot reads and trains). The fused optimizers see only rows:
the mapping happens before the lookup, and dedupe, segment-sum, gate and scatter work on rows as for a dense
table.

The policy of one step, on the batch's distinct ids in ascending 64-bit order (``assign``; the test's plain
Python dict reference implements the same words):

1. **Lookup.** An id lives in one of the ``probes`` slots after its home ``hash(id) mod capacity`` (open
   addressing with a bounded window, so a lookup is one fixed-size gather). A hit sets the slot's last step
   to this step and adds the id's occurrences to its count.
2. **Admission.** A missing id's occurrences go into a count-min sketch (``depth`` rows of ``width``
   counters, saturating at ``admit_after``, all halved at the start of every ``admit_window``-th step, so old
   sightings fade as in TinyLFU); it asks for a slot once its estimate reaches ``admit_after`` (1: at first
   sight, no sketch).
3. **Choice.** It takes, in its window, the first empty slot; else a slot it may evict: ``lru`` the least
   recently seen, ``lfu`` the least often seen (then the least recently), ``ttl`` the least recently seen
   among those not seen for more than ``ttl`` steps (none: no slot). A slot seen this step is never evicted.
   The missing ids choose together, against the table as the lookup left it; when several choose one slot
   the smallest id gets it and the others choose again among the slots still free to take, up to ``rounds``
   times (an id still without a slot then tries again at its next sighting).
4. **Reset.** A slot given to a new id gets the key, last step = this step, count = its occurrences; its row
   is drawn afresh (a normal row of the table's ``init_scale`` that depends only on the id) and its
   optimizer state is the optimizer's initial state of a row, as if the row had never been trained. (``hash_rows.py``)

Memory: 16 bytes per slot (8 key, 4 last step, 4 count) and the sketch (``depth * width * 4`` bytes, fixed);
nothing grows with the ids seen.

Partitions (``partitions`` > 1, a row-sharded mesh's tables): the slots are split into equal partitions by a
hash of the id; an id's window wraps within its partition, each partition has its own sketch (``sketch_width /
partitions`` counters a row) and its block of rows, so a row shard holding whole partitions runs the policy
above for their ids alone (``assign``'s ``first``; ``hash_step.py`` runs it on a mesh). One partition is the
layout above, unchanged.

Async mode: the deferred update of step t-1 names rows; if step t gives one of them to another id, the
update's gradient for it is dropped (it was computed for the id that lost the slot) and counted
(``emb/stale_dropped/<table>``). Only then: an update of a row whose id kept its slot lands as in a dense table.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optimizers.indexing import take_rows
from optimizers.rounding import mix32

from .hash_ids import fingerprint  # noqa: F401 (raw ids on the host: hash_ids.py)
from .hash_ops import either, first_min, windows


EVICT_POLICIES = ("lru", "lfu", "ttl")
DEFAULTS = ("zeros", "shared")
PAD = np.uint32(0)
_GOLDEN = np.uint32(0x9E3779B9)


@dataclasses.dataclass(frozen=True)
class HashSpec:
    """One hash table's policy (``model.tables.<name>``: kind=hash and the settings below)."""

    capacity: int  # slots
    admit_after: int = 1  # occurrences (sketch estimate) before an id gets a slot; 1 = at first sight
    evict: str = "lru"  # lru | lfu | ttl
    ttl: int = 0  # evict=ttl: a slot not seen for more than ttl steps may be given to another id
    default: str = "zeros"  # what an id without a slot reads: zeros (and no update) or a shared trained row
    probes: int = 16  # window of slots an id may live in, after its home slot
    admit_window: int = 0  # the sketch's counts are halved every admit_window steps (0: never), so sightings age
    rounds: int = 16  # an id that lost its choice to a smaller id chooses again, up to this many times a step
    sketch_depth: int = 4
    sketch_width: int = 1 << 16
    partitions: int = 1  # the slots split into this many equal partitions by the id's hash (the row shards)

    @property
    def part_capacity(self) -> int:
        """Slots of one partition."""
        return self.capacity // self.partitions

    @property
    def part_rows(self) -> int:
        """Rows of one partition: a padding (or unused) row, one per slot, and the shared (or unused) row."""
        return self.part_capacity + 2

    @property
    def rows(self) -> int:
        """Rows the table stores: padding row 0, one per slot, and the shared default row (one partition); a
        block of ``part_rows`` per partition, the same three kinds in each (the first's first row pads, the
        last's last row is shared, the others' are never read)."""
        return self.partitions * self.part_rows

    @property
    def shared_row(self) -> int:
        return self.rows - 1

    @property
    def window(self) -> int:
        """Slots an id's window holds: ``probes``, at most its whole partition."""
        return min(self.probes, self.part_capacity)

    @property
    def part_sketch_width(self) -> int:
        """Counters of each row of one partition's sketch (``sketch_width`` over the partitions)."""
        return max(1, self.sketch_width // self.partitions)


class HashState(NamedTuple):
    """A hash table's slots and sketch: part of the train state (checkpointed and digested with it)."""

    keys: jax.Array  # uint32 [capacity, 2]: (high, low) halves of the id held; (0, 0) = empty
    last: jax.Array  # int32 [capacity]: step the slot's id was last seen at; -1 = empty
    count: jax.Array  # int32 [capacity]: occurrences of the slot's id since it got the slot
    sketch: jax.Array  # int32 [depth, width], or [partitions, depth, width / partitions]: count-min counts of
    # ids without a slot (saturating)
    filled: jax.Array  # int32: slots holding an id ([partitions]: per partition)


class Assigned(NamedTuple):
    """What ``assign`` did this step."""

    slots: jax.Array  # int32, the batch's shape: each id's slot, -1 for none (padding or not admitted)
    fresh: jax.Array  # int32 [N], N = batch ids: at a new id's first position, the slot it was given this step;
    # capacity elsewhere (each slot given once)
    fresh_keys: jax.Array  # uint32 [N, 2]: the batch's ids, position by position
    admitted: jax.Array  # int32: ids given a slot
    evicted: jax.Array  # int32: of those, slots that held another id
    unadmitted: jax.Array  # int32: lookups (with repeats) of ids with no slot after the step, padding excluded


def init_state(spec: HashSpec) -> HashState:
    c = spec.capacity
    if spec.partitions == 1:
        sketch, filled = jnp.zeros((spec.sketch_depth, spec.sketch_width), jnp.int32), jnp.zeros((), jnp.int32)
    else:
        sketch = jnp.zeros((spec.partitions, spec.sketch_depth, spec.part_sketch_width), jnp.int32)
        filled = jnp.zeros((spec.partitions,), jnp.int32)
    return HashState(jnp.zeros((c, 2), jnp.uint32), jnp.full((c,), -1, jnp.int32), jnp.zeros((c,), jnp.int32),
                     sketch, filled)


def top_estimate(spec: HashSpec, lookups: int) -> int | None:
    """The largest admission estimate any id can reach when the table gets at most ``lookups`` lookups a step
    (the global batch times the ids an example has in it); None where none is out of reach (``admit_after=1``
    counts nothing, ``admit_window=0`` never halves). A counter grows by at most ``lookups`` a step and is
    halved at the start of every ``admit_window``-th step, before that step's counts, so it peaks at the end of
    a window at the fixed point of ``c -> c // 2 + admit_window * lookups``: ``2 * admit_window * lookups - 1``."""
    if spec.admit_after <= 1 or not spec.admit_window:
        return None
    return 2 * spec.admit_window * lookups - 1


def held(spec: HashSpec, state: HashState) -> int:
    """How many partitions ``state`` holds: all of them, or one (a row shard's, inside ``shard_map``)."""
    return state.last.shape[0] // spec.part_capacity


# ----- ids: fingerprints on the host, hashes in the step --------------------------------------------------
def key_hash(hi: jax.Array, lo: jax.Array, salt: int) -> jax.Array:
    """uint32 hash of a 64-bit id (hi, lo) under ``salt``: 0 = the home slot, 1.. = the sketch's rows."""
    h = mix32(hi ^ jnp.uint32((salt * 0x9E3779B9 + 0x7F4A7C15) & 0xFFFFFFFF))
    return mix32(h ^ (lo * jnp.uint32(0x85EBCA77) + jnp.uint32(salt)))


def keys_of(ids: jax.Array) -> jax.Array:
    """[..., 2] uint32 keys of a table's ids: raw 64-bit ids arrive as their fingerprints ([..., 2] uint32,
    ``fingerprint``); the data's integer ids become (0, id), id <= 0 padding."""
    ids = jnp.asarray(ids)
    if ids.dtype == jnp.uint32 and ids.ndim >= 1 and ids.shape[-1] == 2:
        return ids
    i = ids.astype(jnp.int32)
    return jnp.stack([jnp.zeros_like(i, jnp.uint32), jnp.where(i > 0, i, 0).astype(jnp.uint32)], -1)


def is_pad(keys: jax.Array) -> jax.Array:
    """bool [...]: which of the keys [..., 2] are padding (id 0: both halves 0)."""
    return (keys[..., 0] | keys[..., 1]) == 0


# ----- the step's mapping ------------------------------------------------------------------------------
PART_SALT = 0x5EED  # the hash that picks an id's partition (independent of its home slot's)


def partition_of(spec: HashSpec, hi: jax.Array, lo: jax.Array) -> jax.Array:
    """int32: the partition of each id (``hash(id) mod partitions``; 0 with one partition)."""
    if spec.partitions == 1:
        return jnp.zeros(hi.shape, jnp.int32)
    return (key_hash(hi, lo, PART_SALT) % jnp.uint32(spec.partitions)).astype(jnp.int32)


def window_slots(spec: HashSpec, uh, ul):
    """[N, window] global slots: from the id's home slot in its partition on, wrapping within the partition."""
    # the home slot once per id, kept out of the [N, window] fusion (XLA would hash again for every column)
    home = lax.optimization_barrier((key_hash(uh, ul, 0) % jnp.uint32(spec.part_capacity)).astype(jnp.int32))
    return window_from(spec, home, partition_of(spec, uh, ul))


def window_from(spec: HashSpec, home: jax.Array, part: jax.Array) -> jax.Array:
    """[N, window] global slots from each home slot ``home`` (within partition ``part``) on, wrapping within it."""
    cp = spec.part_capacity
    local = home[:, None] + jnp.arange(spec.window, dtype=jnp.int32)[None, :]
    local = jnp.where(local >= cp, local - cp, local)  # the window is at most the partition: one wrap at most
    return local + (part * cp)[:, None]


def _find(spec: HashSpec, state: HashState, uh, ul, valid, first: int = 0):
    """(hit, slot, window) of each id: whether it holds a slot in its window, and which (global slots;
    ``window`` indexes ``state``, which holds the partitions from ``first`` on). ``valid``: the ids of the
    partitions ``state`` holds. An id is in at most one slot, so its slot is the window's largest match."""
    win = window_slots(spec, uh, ul) - first * spec.part_capacity
    (wk,) = windows(win, valid, state.keys)
    match = (wk[..., 0] == uh[:, None]) & (wk[..., 1] == ul[:, None]) & valid[:, None]
    local = jnp.max(jnp.where(match, win, -1), axis=1)
    hit = local >= 0
    return hit, jnp.where(hit, local + first * spec.part_capacity, -1), win


def _mine(spec: HashSpec, state: HashState, uh, ul, valid, first: int) -> jax.Array:
    """Which of the ids belong to the partitions ``state`` holds (from ``first`` on)."""
    if spec.partitions == 1:
        return valid
    part = partition_of(spec, uh, ul)
    return valid & (part >= first) & (part < first + held(spec, state))


def _choose(spec: HashSpec, last, count, win, wants, step):
    """(slot, can, evicts) of each id that wants one: its choice in its window (first empty, else the policy's
    victim among the evictable; ``last``'s length where none), whether it found one, and whether that slot
    holds another id (an eviction if it keeps it). Slots index ``last`` and ``count`` (the partitions held)."""
    c = last.shape[0]
    limit = step - spec.ttl if spec.evict == "ttl" else step  # a slot seen at or after it is kept
    big = jnp.iinfo(jnp.int32).max
    if spec.evict == "lfu":
        wl, wc = windows(win, wants, last, count)
        empty = wl < 0
        cls = jnp.where(empty, 0, jnp.where(wl < limit, 1, 2)).astype(jnp.int32)
        j = first_min([cls, wc, wl])
        kind = jnp.take_along_axis(cls, j[:, None], 1)[:, 0]
    else:  # lru, ttl: one key, the empty (last -1) first, then the least recently seen evictable, the kept last
        (wl,) = windows(win, wants, last)
        v = jnp.where(wl < 0, -1, jnp.where(wl < limit, wl, big))
        j = first_min([v])
        best = jnp.take_along_axis(v, j[:, None], 1)[:, 0]
        kind = jnp.where(best < 0, 0, jnp.where(best == big, 2, 1))
    pick = jnp.take_along_axis(win, j[:, None], 1)[:, 0]
    can = wants & (kind < 2)
    return jnp.where(can, pick, c), can, kind == 1


_NONE = np.uint32(0xFFFFFFFF)
ROUND_CHUNK = 1024  # positions a round after the first packs (when no more want a slot; else it runs on all)
FIRST_ROUND_SHARE = 4  # eighths of the batch the first round packs the positions wanting a slot into (if they fit)


def assign(spec: HashSpec, state: HashState, keys: jax.Array, step: jax.Array,
           first: int | jax.Array = 0) -> tuple[HashState, Assigned]:
    """One step of the policy (module docstring) for the ids ``keys`` [..., 2] uint32 at step ``step``.
    ``state`` holds every partition, or (a row shard's, ``first``: its index) one: the ids of the partitions
    it does not hold are left alone (slot -1, in no count), so each shard runs the step for its own.

    The batch is not deduplicated: every position looks its id up, counts it and chooses, and the positions
    of one id, which see the same window and the same table, choose alike. Who keeps a contested slot is
    settled in the slot itself: the choosers' keys are scatter-minimised into it (high half, then low), so it
    ends holding the smallest id, and that id's first position (a scatter-min of positions) counts it once.
    No sort: the work is a few scatters and gathers of the batch's size."""
    shape = keys.shape[:-1]
    keys = keys.reshape(-1, 2).astype(jnp.uint32)
    n = keys.shape[0]
    c = state.last.shape[0]  # the slots held; an index of c is none
    base = first * spec.part_capacity  # the global slot of the first one held
    step = jnp.asarray(step, jnp.int32)
    kh, kl = keys[:, 0], keys[:, 1]
    valid = _mine(spec, state, kh, kl, ~is_pad(keys), first)
    hit, slot, win = _find(spec, state, kh, kl, valid, first)
    at_hit = jnp.where(hit, slot - base, c)
    last = state.last.at[at_hit].set(step, mode="drop")  # seen this step: not evictable
    count = state.count  # the rounds read the counts of the slots they may evict, which this step leaves alone
    miss = valid & ~hit
    sketch = state.sketch
    if spec.admit_after > 1 and spec.admit_window:  # counts age: halved every admit_window steps
        sketch = jnp.where((step > 0) & (step % spec.admit_window == 0), sketch >> 1, sketch)
    if spec.admit_after > 1:
        width = spec.sketch_width if spec.partitions == 1 else spec.part_sketch_width
        cols = [(key_hash(kh, kl, d + 1) % jnp.uint32(width)).astype(jnp.int32) for d in range(spec.sketch_depth)]
        part = partition_of(spec, kh, kl) - first
        for d in range(spec.sketch_depth):
            col = jnp.where(miss, cols[d], width)
            sketch = (sketch.at[d, col].add(1, mode="drop") if spec.partitions == 1 else
                      sketch.at[part, d, col].add(1, mode="drop"))
        sketch = jnp.minimum(sketch, spec.admit_after)
        est = jnp.min(jnp.stack([sketch[d, cols[d]] if spec.partitions == 1 else
                                 sketch.at[part, d, cols[d]].get(mode="fill", fill_value=0)
                                 for d in range(spec.sketch_depth)]), axis=0)
        wants = miss & (est >= spec.admit_after)
    else:
        wants = miss
    idx = jnp.arange(n, dtype=jnp.int32)

    def window_at(start):
        """The windows (as ``win``: slots of ``state``) that start at ``start``."""
        g = start + base
        return window_from(spec, g % spec.part_capacity, g // spec.part_capacity) - base

    def claim(keys_, last_, kh, kl, win, wants_, pos):
        """One round for the positions ``pos`` (their ids ``kh``, ``kl``, windows ``win``, which of them want a
        slot ``wants_``): (keys, last, chosen, won, first, evicts, lost)."""
        chosen, can, evicting = _choose(spec, last_, count, win, wants_, step)
        at = jnp.where(can, chosen, c)
        keys_ = keys_.at[at].set(_NONE, mode="drop").at[at, 0].min(kh, mode="drop")
        top = keys_.at[at, 0].get(mode="fill", fill_value=0) == kh
        keys_ = keys_.at[jnp.where(top, at, c), 1].min(kl, mode="drop")
        won = can & top & (keys_.at[at, 1].get(mode="fill", fill_value=0) == kl)
        at = jnp.where(won, chosen, c)
        # the id's first position: step + the smallest of its positions, a value that also marks the slot taken
        # (neither empty nor evictable) in the next rounds; every taken slot's last step is the step after them
        last_ = last_.at[at].set(step + n, mode="drop").at[at].min(step + pos, mode="drop")
        first_ = won & (take_rows(last_, at, -1) == step + pos)
        return keys_, last_, chosen, won, first_, first_ & evicting, can & ~won

    def some(ops, wants_, k):
        """``claim`` for the positions that want a slot: packed into ``k`` when at most ``k`` do, else all."""
        def packed(ops):
            pos = jnp.full((k,), n, jnp.int32).at[jnp.where(wants_, jnp.cumsum(wants_) - 1, k)].set(idx, mode="drop")
            g = lambda a, fill: take_rows(a, pos, fill)  # noqa: E731
            out = claim(*ops, g(kh, 0), g(kl, 0), window_at(g(win[:, 0], 0)), g(wants_, False), pos)
            return out[:2] + tuple(jnp.zeros((n,), x.dtype).at[pos].set(x, mode="drop") for x in out[2:])

        def whole(ops):
            return claim(*ops, kh, kl, win, wants_, idx)

        if k >= n:
            return whole(ops)
        return either(jnp.sum(wants_) <= k, packed, whole, ops)

    # round 1: every position that wants a slot (packed into half the batch when they fit: most positions hit)
    keys_, last, chosen, won, firsts, evicts, lost = some((state.keys, last), wants,
                                                                 max(1, min(n, FIRST_ROUND_SHARE * n // 8)))
    got, wants = jnp.where(won, chosen, c), wants & ~won
    k = max(1, min(n, ROUND_CHUNK))

    def again(carry):  # the ids that lost a slot to a smaller id choose again among the rest: a few, packed
        i, keys_, last_, got, firsts, evicts, wants_, _ = carry
        keys_, last_, chosen, won, first_, ev, lost = some((keys_, last_), wants_, k)
        return (i + 1, keys_, last_, jnp.where(won, chosen, got), firsts | first_, evicts | ev,
                wants_ & ~won, jnp.any(lost))

    carry = (jnp.int32(1), keys_, last, got, firsts, evicts, wants, jnp.any(lost))
    _, new_keys, last, got, firsts, evicts, _, _ = lax.while_loop(
        lambda cr: (cr[0] < spec.rounds) & cr[7], again, carry)
    last = last.at[got].set(step, mode="drop")
    # a slot given to a new id counts from zero; every occurrence of a held id (hit or given a slot) adds one
    count = count.at[jnp.where(firsts, got, c)].set(0, mode="drop")
    count = count.at[jnp.where(hit, slot - base, got)].add(1, mode="drop")
    uslot = jnp.where(hit, slot, jnp.where(got < c, got + base, -1))
    admitted, evicted = jnp.sum(firsts).astype(jnp.int32), jnp.sum(evicts).astype(jnp.int32)
    out = Assigned(uslot.reshape(shape), jnp.where(firsts, got + base, spec.capacity), keys, admitted, evicted,
                   jnp.sum(valid & (uslot < 0)).astype(jnp.int32))
    if spec.partitions == 1:
        filled = state.filled + admitted - evicted
    else:  # per partition held: what each gained, less what it evicted
        p = state.filled.shape[0]
        part = got // spec.part_capacity
        gained = jnp.zeros((p,), jnp.int32).at[jnp.where(firsts, part, p)].add(1, mode="drop")
        lost = jnp.zeros((p,), jnp.int32).at[jnp.where(evicts, part, p)].add(1, mode="drop")
        filled = state.filled + gained - lost
    return HashState(new_keys, last, count, sketch, filled), out


def find(spec: HashSpec, state: HashState, keys: jax.Array, first: int | jax.Array = 0) -> jax.Array:
    """Each id's slot, -1 for none (or of a partition ``state`` does not hold): the read-only lookup
    (evaluation), which changes nothing."""
    shape = keys.shape[:-1]
    k = keys.reshape(-1, 2).astype(jnp.uint32)
    valid = _mine(spec, state, k[:, 0], k[:, 1], ~is_pad(k), first)
    _, slot, _ = _find(spec, state, k[:, 0], k[:, 1], valid, first)
    return slot.reshape(shape)


def occupancy(state: HashState) -> jax.Array:
    """The share of slots holding an id (of the slots ``state`` holds)."""
    return jnp.sum(state.filled).astype(jnp.float32) / state.last.shape[0]
