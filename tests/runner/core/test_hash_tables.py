"""Hash tables' mapping against a plain Python dict reference of the same policy (``runner/core/hash_tables.py``):
identical slots, admissions and evictions over a drifting id stream, for every eviction policy, with and
without admission."""
from __future__ import annotations

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.core import hash_rows as hr, hash_tables as ht
from runner.core import hash_ops, id_sort

M32 = 0xFFFFFFFF


def _mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _hash(key: int, salt: int) -> int:
    hi, lo = key >> 32, key & M32
    h = _mix32(hi ^ ((salt * 0x9E3779B9 + 0x7F4A7C15) & M32))
    return _mix32(h ^ (((lo * 0x85EBCA77) & M32) + salt) & M32)


class DictTable:
    """The policy in plain Python: a dict from id to slot, lists of per-slot metadata, a count-min sketch; with
    ``partitions`` > 1, an id's partition ``hash(id, PART_SALT) mod partitions`` holds its window (wrapping within
    the partition's slots) and its own sketch."""

    def __init__(self, spec: ht.HashSpec):
        self.spec = spec
        c = spec.capacity
        self.slot_of: dict[int, int] = {}
        self.key_of: list[int | None] = [None] * c
        self.last, self.count = [-1] * c, [0] * c
        self.width = spec.sketch_width if spec.partitions == 1 else spec.part_sketch_width
        self.sketches = np.zeros((spec.partitions, spec.sketch_depth, self.width), np.int64)

    @property
    def sketch(self):
        return self.sketches[0] if self.spec.partitions == 1 else self.sketches

    def part(self, k: int) -> int:
        return 0 if self.spec.partitions == 1 else _hash(k, ht.PART_SALT) % self.spec.partitions

    def window(self, k: int) -> list[int]:
        cp = self.spec.part_capacity
        return [self.part(k) * cp + (_hash(k, 0) % cp + j) % cp for j in range(min(self.spec.probes, cp))]

    def cell(self, k: int, d: int):
        return self.part(k), d, _hash(k, d + 1) % self.width

    def step(self, ids: list[int], s: int):
        sp = self.spec
        occ = Counter(k for k in ids if k != 0)
        for k in sorted(occ):
            if k in self.slot_of:
                sl = self.slot_of[k]
                self.last[sl], self.count[sl] = s, self.count[sl] + occ[k]
        misses = [k for k in sorted(occ) if k not in self.slot_of]
        if sp.admit_after > 1 and sp.admit_window and s > 0 and s % sp.admit_window == 0:
            self.sketches //= 2
        if sp.admit_after > 1:
            for k in misses:
                for d in range(sp.sketch_depth):
                    self.sketches[self.cell(k, d)] += occ[k]
            np.minimum(self.sketches, sp.admit_after, out=self.sketches)
            wants = [k for k in misses if min(self.sketches[self.cell(k, d)]
                                              for d in range(sp.sketch_depth)) >= sp.admit_after]
        else:
            wants = misses
        evicted, admitted, taken = 0, 0, set()
        for _ in range(sp.rounds):  # the ids that lost a slot to a smaller id choose again
            choice = {}
            for k in wants:
                window = self.window(k)
                empty = [sl for sl in window if self.last[sl] < 0]
                if empty:
                    choice[k] = empty[0]
                    continue
                limit = s - sp.ttl if sp.evict == "ttl" else s
                old = [(j, sl) for j, sl in enumerate(window) if self.last[sl] < limit]
                if old:
                    rank = (lambda js: (self.count[js[1]], self.last[js[1]], js[0])) if sp.evict == "lfu" else (
                        lambda js: (self.last[js[1]], js[0]))
                    choice[k] = min(old, key=rank)[1]
            winner = {}
            for k, sl in choice.items():  # keys in ascending order: the first to choose a slot keeps it
                winner.setdefault(sl, k)
            for sl, k in winner.items():
                if self.key_of[sl] is not None:
                    evicted += 1
                    del self.slot_of[self.key_of[sl]]
                self.key_of[sl], self.slot_of[k] = k, sl
                self.last[sl], self.count[sl] = s, occ[k]
            admitted += len(winner)
            wants = [k for k in wants if k not in self.slot_of]
        slots = [self.slot_of.get(k, -1) if k else -1 for k in ids]
        return slots, admitted, evicted


def drifting_stream(steps: int, batch: int, population: int, active: int, drift: float, seed: int = 0):
    """[steps, batch] uint64 raw ids: Zipf draws from a window of ``active`` ids sliding ``drift`` ids per step
    over a population of random 64-bit ids; about a tenth of the positions are padding (0)."""
    rng = np.random.default_rng(seed)
    pop = rng.integers(1, 2**63, size=population, dtype=np.int64).astype(np.uint64)
    ranks = np.minimum(rng.zipf(1.3, size=(steps, batch)) - 1, active - 1)
    offset = (np.arange(steps) * drift).astype(np.int64)[:, None]
    ids = pop[(offset + ranks) % population]
    ids[rng.random((steps, batch)) < 0.1] = 0
    return ids


jit_find = jax.jit(ht.find, static_argnums=0)  # one program, not an operation at a time


def run_jax(spec: ht.HashSpec, ids: np.ndarray):
    keys = jnp.asarray(ht.fingerprint(ids.view(np.int64)))

    def body(state, x):
        s, k = x
        state, a = ht.assign(spec, state, k, s)
        return state, (a.slots, a.admitted, a.evicted, a.unadmitted)

    steps = jnp.arange(ids.shape[0], dtype=jnp.int32)
    state, out = jax.jit(lambda st: jax.lax.scan(body, st, (steps, keys)))(ht.init_state(spec))
    return state, jax.tree.map(np.asarray, out)


def run_dict(spec: ht.HashSpec, ids: np.ndarray):
    ref = DictTable(spec)
    out = [ref.step([int(k) for k in row], s) for s, row in enumerate(ids)]
    return ref, out


SLOW = pytest.mark.slow  # make test-fast keeps one policy of each kind
POLICIES = [dict(evict="lru"), pytest.param(dict(evict="lfu"), marks=SLOW),
            pytest.param(dict(evict="ttl", ttl=20), marks=SLOW),
            pytest.param(dict(evict="lru", admit_after=3, admit_window=7), marks=SLOW),
            pytest.param(dict(evict="lfu", admit_after=2, sketch_width=64), marks=SLOW),
            pytest.param(dict(evict="ttl", ttl=5, admit_after=2), marks=SLOW)]


PARTITIONED = [dict(evict="lru", partitions=4),
               pytest.param(dict(evict="lfu", partitions=3, admit_after=2, sketch_width=192), marks=SLOW),
               pytest.param(dict(evict="ttl", ttl=5, partitions=2), marks=SLOW)]


@pytest.mark.parametrize("policy", POLICIES + PARTITIONED,
                         ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_mapping_matches_the_dict_reference(policy):
    policy = dict(policy)
    spec = ht.HashSpec(capacity=48, probes=6, sketch_width=policy.pop("sketch_width", 1024), **policy)
    ids = drifting_stream(steps=1500, batch=40, population=2000, active=300, drift=0.3, seed=1)
    state, (slots, admitted, evicted, unadmitted) = run_jax(spec, ids)
    ref, out = run_dict(spec, ids)
    assert [list(map(int, r)) for r in slots] == [o[0] for o in out]
    assert list(admitted) == [o[1] for o in out]
    assert list(evicted) == [o[2] for o in out]
    assert list(unadmitted) == [sum(1 for k, sl in zip(row, o[0]) if k and sl < 0) for row, o in zip(ids, out)]
    # the final table, slot by slot
    keys = np.asarray(state.keys).astype(np.uint64)
    held = [int((keys[i, 0] << np.uint64(32)) | keys[i, 1]) or None for i in range(spec.capacity)]
    assert held == ref.key_of
    assert list(np.asarray(state.last)) == ref.last and list(np.asarray(state.count)) == ref.count
    assert sum(evicted) > 50 and sum(admitted) > 100, "the stream must exercise eviction"
    if spec.admit_after > 1:
        assert (np.asarray(state.sketch) == ref.sketch).all()
        assert sum(unadmitted) > 0


@pytest.mark.parametrize("chunk,share", [(1, 0), (3, 8), (3, 1)])
@pytest.mark.slow
def test_rounds_packed_or_whole_match_the_dict_reference(monkeypatch, chunk, share):
    """A round after the first packs the positions still wanting a slot when at most ``ROUND_CHUNK`` of them are
    left, else runs on the whole batch; the first round packs them into ``FIRST_ROUND_SHARE`` eighths of the
    batch when they fit (0: one position, 8: never packed): with these sizes both happen in both, and the slots
    are the reference's."""
    monkeypatch.setattr(ht, "ROUND_CHUNK", chunk)
    monkeypatch.setattr(ht, "FIRST_ROUND_SHARE", share)
    spec = ht.HashSpec(capacity=48, probes=3, evict="lru")
    ids = drifting_stream(steps=300, batch=40, population=2000, active=300, drift=0.3, seed=4)
    _, (slots, admitted, evicted, _) = run_jax(spec, ids)
    _, out = run_dict(spec, ids)
    assert [list(map(int, r)) for r in slots] == [o[0] for o in out]
    assert list(admitted) == [o[1] for o in out] and list(evicted) == [o[2] for o in out]


def test_windows_read_as_slices_or_slot_by_slot_equal_plain_indexing():
    """``windows`` reads a batch whose used windows do not wrap as one slice each, else slot by slot: both give
    every used window's values as numpy's indexing does (an unused window may wrap without changing the path)."""
    rng = np.random.default_rng(11)
    keys = rng.integers(0, 2**32, (50, 2), dtype=np.uint32)
    last = rng.integers(-1, 99, 50).astype(np.int32)
    read = jax.jit(hash_ops.windows)
    start = rng.integers(0, 50 - 6, 30)
    win = (start[:, None] + np.arange(6)[None]).astype(np.int32)
    wrapped = win.copy()
    wrapped[4] = (47 + np.arange(6)) % 50  # slots 47, 48, 49, 0, 1, 2
    used = np.ones(30, bool)
    for w, u in [(win, used), (wrapped, used), (wrapped, np.arange(30) != 4)]:
        wk, wl = read(jnp.asarray(w), jnp.asarray(u), jnp.asarray(keys), jnp.asarray(last))
        np.testing.assert_array_equal(np.asarray(wk)[u], keys[w][u])
        np.testing.assert_array_equal(np.asarray(wl)[u], last[w][u])


@pytest.mark.parametrize("policy", [dict(evict="lru"), pytest.param(dict(evict="lfu"), marks=SLOW)],
                         ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.slow
def test_a_large_table_whose_windows_rarely_wrap_matches_the_dict_reference(policy):
    """Windows read as slices (no id's window wraps in most steps of a 4,096-slot table) give the reference's
    slots, admissions, evictions and final table, as the slot-by-slot reads of small tables do."""
    spec = ht.HashSpec(capacity=4096, probes=2, **policy)
    ids = drifting_stream(steps=600, batch=24, population=40_000, active=8_000, drift=6, seed=5)
    held = [[k for k in row if k] for row in ids]
    ref = DictTable(spec)
    wraps = [any(ref.window(int(k))[-1] < ref.window(int(k))[0] for k in row) for row in held]
    assert 0 < sum(wraps) < len(wraps) // 10  # both ways of reading happen, slices in most steps
    state, (slots, admitted, evicted, _) = run_jax(spec, ids)
    ref, out = run_dict(spec, ids)
    assert [list(map(int, r)) for r in slots] == [o[0] for o in out]
    assert list(admitted) == [o[1] for o in out] and list(evicted) == [o[2] for o in out]
    assert sum(evicted) > 100
    assert list(np.asarray(state.last)) == ref.last and list(np.asarray(state.count)) == ref.count


@pytest.mark.slow
def test_new_ids_rows_and_state_are_reset_chunk_by_chunk(monkeypatch):
    """``reset_rows`` packs the new ids and resets them ``RESET_CHUNK`` at a time (the last chunk overlapping the
    one before): each new id's row is its fresh row, each per-row state leaf its initial row, nothing else moves."""
    monkeypatch.setattr(hr, "RESET_CHUNK", 4)
    spec = ht.HashSpec(capacity=40)
    rng = np.random.default_rng(5)
    n, width = 24, 3
    keys = ht.fingerprint(rng.integers(1, 2**62, n, dtype=np.int64))
    fresh = np.full(n, spec.capacity, np.int32)
    new_at = rng.choice(n, 11, replace=False)  # 11 new ids: chunks of 4, the third overlapping the second
    fresh[new_at] = rng.choice(spec.capacity, 11, replace=False)
    got = ht.Assigned(jnp.zeros(n, jnp.int32), jnp.asarray(fresh), jnp.asarray(keys), 0, 0, 0)
    table = rng.normal(size=(spec.rows, width)).astype(np.float32)
    state = {"acc": rng.normal(size=(spec.rows,)).astype(np.float32), "step": np.float32(7)}
    initial = {"acc": np.full((1,), 0.5, np.float32), "step": np.float32(0)}
    seed = jnp.asarray([3, 9], jnp.uint32)
    t, st = jax.jit(lambda t, s: hr.reset_rows(spec, t, s, initial, got, seed, 0.1))(table, state)
    rows = np.asarray(hr.slot_rows(spec, jnp.asarray(fresh[new_at])))
    want_acc = state["acc"].copy()
    want_acc[rows] = 0.5
    kept = np.setdiff1d(np.arange(spec.rows), rows)
    np.testing.assert_array_equal(np.asarray(t)[kept], table[kept])
    # the same draws computed apart (eagerly, all at once): equal up to float32 rounding of erf_inv
    np.testing.assert_allclose(np.asarray(t)[rows], np.asarray(hr.fresh_rows(spec, seed, jnp.asarray(keys[new_at]),
                                                                            width, 0.1)), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(st["acc"]), want_acc)
    assert float(st["step"]) == 7


@pytest.mark.slow
def test_ten_thousand_steps_of_a_drifting_stream():
    """The issue's horizon: 10,000 steps, ids 10x the capacity, LRU with admission after 2 sightings."""
    spec = ht.HashSpec(capacity=256, probes=8, admit_after=2, sketch_width=4096, admit_window=50)
    ids = drifting_stream(steps=10_000, batch=64, population=2560, active=600, drift=0.25, seed=2)
    _, (slots, admitted, evicted, _) = run_jax(spec, ids)
    _, out = run_dict(spec, ids)
    assert np.array_equal(slots, np.asarray([o[0] for o in out]))
    assert list(admitted) == [o[1] for o in out] and list(evicted) == [o[2] for o in out]
    assert sum(evicted) > 1000


@pytest.mark.slow
def test_no_collisions_while_there_is_room():
    """Distinct ids never share a slot, and an id keeps its slot while nothing evicts it."""
    spec = ht.HashSpec(capacity=1024, probes=16)
    ids = np.arange(1, 401, dtype=np.int64).reshape(4, 100) * 7919
    state = ht.init_state(spec)
    first = None
    assign = jax.jit(lambda st, k, s: ht.assign(spec, st, k, s))
    for s, row in enumerate(np.concatenate([ids, ids])):  # 100 new ids a step, then the same again
        state, a = assign(state, jnp.asarray(ht.fingerprint(row)), s)
        assert int(a.unadmitted) == 0
        sl = np.asarray(a.slots)
        assert len(set(sl.tolist())) == 100
        if s == 0:
            first = sl
    assert np.array_equal(sl, np.asarray(jit_find(spec, state, jnp.asarray(ht.fingerprint(ids[3])))))
    assert np.array_equal(first, np.asarray(jit_find(spec, state, jnp.asarray(ht.fingerprint(ids[0])))))
    assert float(ht.occupancy(state)) == pytest.approx(400 / 1024)


def test_fingerprints():
    fp = ht.fingerprint(np.array([0, 1, -1, 2**40 + 3], np.int64))
    assert fp.dtype == np.uint32 and fp.tolist() == [[0, 0], [0, 1], [M32, M32], [256, 3]]
    s = ht.fingerprint(np.array(["", "user-1", "user-2", "user-1"]))
    assert s[0].tolist() == [0, 0] and s[1].tolist() == s[3].tolist() != s[2].tolist() and (s[1:] != 0).any(-1).all()
    with pytest.raises(TypeError, match="integers or strings"):
        ht.fingerprint(np.array([1.5]))


def test_an_id_has_one_fingerprint_whatever_array_holds_it():
    ints = ht.fingerprint(np.array([0, 7, -1, 2**40 + 3], np.int64))
    # a pandas column of Python ints is an object array: its ids are the integers, 0 still padding (not "0" hashed)
    assert ht.fingerprint(np.array([0, 7, -1, 2**40 + 3], object)).tolist() == ints.tolist()
    assert ht.fingerprint(np.array([2**64 - 1], object)).tolist() == ht.fingerprint(np.array([-1])).tolist()
    strings = ht.fingerprint(np.array(["", "user-1"]))
    assert ht.fingerprint(np.array([b"", b"user-1"])).tolist() == strings.tolist()  # bytes hashed as they are
    assert ht.fingerprint(np.array(["", b"user-1"], object)).tolist() == strings.tolist()


@pytest.mark.parametrize("ids, message", [
    (np.array([None, "a"], object), "raw ids must be integers or strings, not NoneType (None at index 0)"),
    (np.array([1, 2.5], object), "raw ids must be integers or strings, not float (2.5 at index 1)"),
    (np.array([True]), "raw ids must be integers or strings, not bool"),
    (np.array([2**64], object), "raw id 18446744073709551616 at index 0 does not fit in 64 bits"),
])
def test_an_id_that_is_no_integer_or_string_is_refused_by_name(ids, message):
    with pytest.raises(TypeError) as e:
        ht.fingerprint(ids)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("n", [4096, 46_341])  # the rank-packed sort (N * N < 2**31) and the tuple sort above it
def test_the_batch_dedupe_is_numpys_unique_of_the_64_bit_ids(n):
    rng = np.random.default_rng(n)
    pool = np.concatenate([rng.integers(1, 2**63, 500, dtype=np.int64),  # halves shared: same hi, same lo
                           (rng.integers(1, 5, 300, dtype=np.int64) << 32) | rng.integers(0, 5, 300)])
    ids = rng.choice(pool, n)
    ids[rng.random(n) < 0.2] = 0  # padding
    uh, ul, valid, occ, inverse = map(np.asarray, jax.jit(id_sort.distinct_keys)(jnp.asarray(ht.fingerprint(ids))))
    want, counts = np.unique(ids[ids != 0].view(np.uint64), return_counts=True)
    m = len(want)
    assert valid.sum() == m and valid[:m].all()
    got = (uh[:m].astype(np.uint64) << np.uint64(32)) | ul[:m].astype(np.uint64)
    np.testing.assert_array_equal(got, want)  # ascending 64-bit order
    np.testing.assert_array_equal(occ[:m], counts)
    assert (uh[m:] == 0).all() and (ul[m:] == 0).all() and (occ[m:] == 0).all()
    np.testing.assert_array_equal(inverse, np.where(ids == 0, n, np.searchsorted(want, ids.view(np.uint64))))


@pytest.mark.parametrize("policy", [dict(evict="lru"),
                                    pytest.param(dict(evict="lfu", admit_after=2, admit_window=9), marks=SLOW)],
                         ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.slow
def test_each_partition_run_on_its_own_equals_the_whole_table(policy):
    """What a row shard does with its partition (``first``: the state it holds is one partition) equals the
    whole table's step restricted to that partition: slots, counts, keys, metadata and sketch."""
    spec = ht.HashSpec(capacity=48, probes=6, partitions=4, sketch_width=256, **policy)
    cp = spec.part_capacity
    ids = drifting_stream(steps=300, batch=40, population=2000, active=300, drift=0.3, seed=3)
    whole = ht.init_state(spec)
    parts = [jax.tree.map(lambda x, p=p: x[p * cp:(p + 1) * cp] if x.shape and x.shape[0] == 48 else x[p:p + 1],
                          whole) for p in range(4)]
    step_whole = jax.jit(lambda st, k, s: ht.assign(spec, st, k, s))
    step_part = jax.jit(lambda st, k, s, p: ht.assign(spec, st, k, s, p))
    for s, row in enumerate(ids):
        keys = jnp.asarray(ht.fingerprint(row.view(np.int64)))
        whole, a = step_whole(whole, keys, s)
        got = [step_part(parts[p], keys, s, p) for p in range(4)]
        parts = [g[0] for g in got]
        mine = np.asarray(ht.partition_of(spec, keys[:, 0], keys[:, 1]))
        slots = np.where(np.asarray(a.slots) >= 0, np.asarray(a.slots), -1)
        for p, (_, b) in enumerate(got):  # each partition's own ids get the whole table's slots; the others -1
            np.testing.assert_array_equal(np.asarray(b.slots), np.where(mine == p, slots, -1))
        assert sum(int(b.admitted) for _, b in got) == int(a.admitted)
        assert sum(int(b.evicted) for _, b in got) == int(a.evicted)
        assert sum(int(b.unadmitted) for _, b in got) == int(a.unadmitted)
    for leaf, name in zip(whole, ht.HashState._fields):
        joined = np.concatenate([np.asarray(getattr(p, name)) for p in parts])
        np.testing.assert_array_equal(joined, np.asarray(leaf), err_msg=name)
    assert int(np.sum(whole.filled)) > 0


def _first_admission(spec: ht.HashSpec, lookups: int, steps: int) -> int | None:
    """The first step at which one id looked up at every one of ``lookups`` positions, every step, gets a slot."""
    state, keys = ht.init_state(spec), jnp.tile(jnp.array([[0, 7]], jnp.uint32), (lookups, 1))
    step = jax.jit(lambda s, t: ht.assign(spec, s, keys, t))
    for t in range(steps):
        state, got = step(state, t)
        if int(got.admitted):
            return t
    return None


@pytest.mark.parametrize("window, lookups", [(1, 1), (1, 3), (2, 3), (3, 2)])
@pytest.mark.slow
def test_the_top_estimate_is_the_largest_admit_after_an_id_ever_reaches(window, lookups):
    """``top_estimate`` (the bound the preflight refuses above) against the step itself: the id seen at every
    lookup of every step reaches an ``admit_after`` of exactly the bound (after a few windows) and never one more."""
    spec = ht.HashSpec(8, admit_after=2, admit_window=window, probes=4, sketch_width=64)
    top = ht.top_estimate(spec, lookups)
    assert top == 2 * window * lookups - 1
    assert _first_admission(dataclasses.replace(spec, admit_after=top), lookups, 12 * window) is not None
    assert _first_admission(dataclasses.replace(spec, admit_after=top + 1), lookups, 12 * window) is None
    assert ht.top_estimate(dataclasses.replace(spec, admit_window=0), lookups) is None
    assert ht.top_estimate(dataclasses.replace(spec, admit_after=1), lookups) is None
