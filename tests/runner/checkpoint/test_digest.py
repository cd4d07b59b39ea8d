"""Checkpoint digests equal a plain numpy evaluation of their formula, on one device and sharded by rows or
columns, whole or shard by shard in chunks, over the logical rows only; any single-bit change of any element
changes them; checkpoints written with the first scheme still verify with it."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from runner.checkpoint import digest as cd
from runner.core.mesh import MeshPlan, build_mesh

M32 = np.uint64(2**32 - 1)


def _words(a: np.ndarray) -> np.ndarray:
    """The element bit patterns as uint64 holding uint32 values (8-byte dtypes: a trailing axis of 2 words)."""
    if a.dtype == np.bool_:
        return a.astype(np.uint64)
    if a.dtype.itemsize == 8:
        return a.view(np.uint32).reshape(a.shape + (2,)).astype(np.uint64)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).astype(np.uint64)


def _mix(h: np.ndarray) -> np.ndarray:  # murmur3 fmix32, in uint64 arithmetic masked to 32 bits
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & M32
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & M32
    return h ^ (h >> np.uint64(16))


def reference(a: np.ndarray, rows: int | None = None) -> int:
    """sum(mix(bits ^ where(index))) mod 2**32, where(index) folding mix(h + i_d * K) over the axes."""
    a = np.asarray(a)[:rows] if rows is not None else np.asarray(a)
    bits = _words(a)
    if bits.ndim == 0:
        return int(_mix(bits ^ np.uint64(cd.SEED)))
    where = np.full((1,) * bits.ndim, cd.SEED, np.uint64)
    for d, n in enumerate(bits.shape):
        idx = np.arange(n, dtype=np.uint64).reshape([n if e == d else 1 for e in range(bits.ndim)])
        where = _mix((where + idx * np.uint64(cd.K)) & M32)
    return int(_mix(bits ^ where).sum() % np.uint64(2**32))


def reference_v1(a: np.ndarray, rows: int | None = None) -> int:
    """Scheme 1: sum(bits * (pos * K + 1)) mod 2**32 over row-major positions of a[:rows]."""
    a = np.asarray(a)[:rows] if rows is not None else np.asarray(a)
    bits = _words(a).ravel()
    weight = (np.arange(bits.size, dtype=np.uint64) * np.uint64(cd.K) + np.uint64(1)) % np.uint64(2**32)
    return int(((bits * weight) % np.uint64(2**32)).sum() % np.uint64(2**32))


ARRAYS = {
    "f32": np.random.default_rng(0).normal(size=(1001, 8)).astype(np.float32),
    "bf16": np.random.default_rng(1).normal(size=(37, 16)).astype(ml_dtypes.bfloat16),
    "i32": np.random.default_rng(2).integers(-2**31, 2**31, size=(513,), dtype=np.int32),
    "u8-3d": np.random.default_rng(5).integers(0, 256, size=(5, 3, 4), dtype=np.uint8),
    "bool": np.random.default_rng(3).random(size=(77,)) < 0.5,
    "scalar": np.float32(3.25),
}


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.slow
def test_whole_array_matches_numpy(name):
    a = ARRAYS[name]
    assert int(cd.digest(jnp.asarray(a))) == reference(a)
    assert int(cd.digest(jnp.asarray(a), scheme=1)) == reference_v1(a)
    if np.ndim(a):
        assert int(cd.digest(jnp.asarray(a), rows=len(a) - 2)) == reference(a, rows=len(a) - 2)
        assert int(cd.digest(jnp.asarray(a), rows=len(a) - 2, scheme=1)) == reference_v1(a, rows=len(a) - 2)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, ml_dtypes.bfloat16, np.uint8],
                         ids=["f32", "i32", "bf16", "u8"])
def test_every_single_bit_flip_changes_the_digest(dtype):
    """Flip each bit of each element of a 4x8 array in turn (sign bits included): every flip is seen.
    All flips go through one jitted call; the reference formula is checked against numpy above."""
    a = np.random.default_rng(7).normal(size=(4, 8)).astype(dtype)
    if dtype == np.int32:
        a = np.random.default_rng(7).integers(-2**31, 2**31, size=(4, 8), dtype=np.int32)
    if dtype == np.uint8:
        a = np.random.default_rng(7).integers(0, 256, size=(4, 8), dtype=np.uint8)
    width = 8 * a.dtype.itemsize
    flipped = []
    for i in range(a.size):
        for b in range(width):
            f = a.copy()
            u = f.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize]).reshape(-1)
            u[i] ^= u.dtype.type(1 << b)
            flipped.append(f)
    stack = jnp.asarray(np.stack(flipped))
    got = np.asarray(jax.jit(jax.vmap(cd.digest))(stack))
    base = int(cd.digest(jnp.asarray(a)))
    unchanged = [(i // width, i % width) for i, g in enumerate(got) if int(g) == base]
    assert len(got) == a.size * width and unchanged == [], f"(element, bit) flips not seen: {unchanged}"


def test_the_first_scheme_missed_sign_flips_at_odd_positions():
    """Why scheme 2 exists: scheme 1's weights are even at odd positions, so bit 31 there vanished."""
    a = ARRAYS["f32"][:4]
    missed = []
    for i in range(a.size):
        f = a.copy()
        f.view(np.uint32).reshape(-1)[i] ^= np.uint32(1 << 31)
        missed += [i] if reference_v1(f) == reference_v1(a) else []
    assert missed == list(range(1, a.size, 2))
    assert all(reference(np.where(np.arange(a.size).reshape(a.shape) == i, -a, a)) != reference(a) for i in missed)


def test_padding_rows_do_not_count_and_moves_do():
    a = ARRAYS["f32"]
    padded = np.concatenate([a, np.full((7, 8), 9.0, np.float32)])
    assert int(cd.digest(jnp.asarray(padded), rows=len(a))) == reference(a)
    swapped_rows, swapped_signs = a.copy(), a.copy()
    swapped_rows[[3, 4]] = swapped_rows[[4, 3]]
    swapped_signs[0, :2] = [1.0, -1.0]
    other = swapped_signs.copy()
    other[0, :2] = [-1.0, 1.0]  # x and -x trade places: the sum of bits * even weight difference missed this
    assert reference(a) != reference(swapped_rows) and reference(swapped_signs) != reference(other)


@pytest.mark.parametrize("spec", [P("table", None), P(None, "table"), P()], ids=["rows", "columns", "replicated"])
@pytest.mark.slow
def test_sharded_and_chunked_match_numpy(monkeypatch, spec):
    monkeypatch.setattr(cd, "CHUNK_BYTES", 3 * 8 * 4 * 7 + 4)  # tiny chunks: 7 rows of 8 floats, overlapping tail
    mesh = build_mesh(MeshPlan((("data", 2), ("table", 4)), "table", "row"))
    a = np.random.default_rng(4).normal(size=(1004, 8)).astype(np.float32)  # 251 rows per row shard
    x = jax.device_put(a, NamedSharding(mesh, spec))
    info = [("t", x, 1001), ("whole", x, None), ("small", jnp.asarray(a[:3]), None)]
    assert cd.digests(info) == {"t": reference(a, rows=1001), "whole": reference(a), "small": reference(a[:3])}
    assert cd.digests(info, scheme=1) == {"t": reference_v1(a, rows=1001), "whole": reference_v1(a),
                                          "small": reference_v1(a[:3])}


@pytest.mark.parametrize("spec", [P("table", None), P()], ids=["rows", "replicated"])
@pytest.mark.slow
def test_padding_columns_do_not_count(monkeypatch, spec):
    """A table stored wider than its rows (``stored_width``) digests as the narrow one: its first ``cols`` columns,
    whole, sharded by rows or chunked; a change inside them still shows."""
    monkeypatch.setattr(cd, "CHUNK_BYTES", 3 * 8 * 4 * 7 + 4)
    mesh = build_mesh(MeshPlan((("data", 2), ("table", 4)), "table", "row"))
    a = np.random.default_rng(5).normal(size=(1004, 8)).astype(np.float32)
    padded = np.concatenate([a, np.full((1004, 5), 9.0, np.float32)], axis=1)
    x = jax.device_put(padded, NamedSharding(mesh, spec))
    info = [("big", x, 1001, 8), ("small", jnp.asarray(padded[:3]), None, 8), ("narrow", jnp.asarray(a[:3]), None)]
    assert cd.digests(info) == {"big": reference(a, rows=1001), "small": reference(a[:3]), "narrow": reference(a[:3])}
    assert int(cd.digest(jnp.asarray(padded), rows=1001, cols=8)) == reference(a, rows=1001)
    changed = padded.copy()
    changed[5, 7] = -changed[5, 7]
    assert int(cd.digest(jnp.asarray(changed), cols=8)) != reference(a)
