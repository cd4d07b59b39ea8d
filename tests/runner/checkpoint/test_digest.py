"""Checkpoint digests equal a plain numpy evaluation of their formula, on one device and sharded by rows or
columns, whole or shard by shard in chunks, over the logical rows only."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from runner.checkpoint import digest as cd
from runner.core.mesh import MeshPlan, build_mesh


def reference(a: np.ndarray, rows: int | None = None) -> int:
    """sum(bits * (pos * K + 1)) mod 2**32 over row-major positions of a[:rows], in numpy uint64."""
    a = np.asarray(a)[:rows] if rows is not None else np.asarray(a)
    if a.dtype == np.bool_:
        bits = a.astype(np.uint64)
    else:
        bits = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).astype(np.uint64)
    bits = bits.ravel()
    weight = (np.arange(bits.size, dtype=np.uint64) * np.uint64(cd.K) + np.uint64(1)) % np.uint64(2**32)
    return int(((bits * weight) % np.uint64(2**32)).sum() % np.uint64(2**32))


ARRAYS = {
    "f32": np.random.default_rng(0).normal(size=(1001, 8)).astype(np.float32),
    "bf16": np.random.default_rng(1).normal(size=(37, 16)).astype(ml_dtypes.bfloat16),
    "i32": np.random.default_rng(2).integers(-2**31, 2**31, size=(513,), dtype=np.int32),
    "bool": np.random.default_rng(3).random(size=(77,)) < 0.5,
    "scalar": np.float32(3.25),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_whole_array_matches_numpy(name):
    a = ARRAYS[name]
    assert int(cd.digest(jnp.asarray(a))) == reference(a)
    if np.ndim(a):
        assert int(cd.digest(jnp.asarray(a), rows=len(a) - 5)) == reference(a, rows=len(a) - 5)


def test_padding_rows_do_not_count_and_any_change_does():
    a = ARRAYS["f32"]
    padded = np.concatenate([a, np.full((7, 8), 9.0, np.float32)])
    assert int(cd.digest(jnp.asarray(padded), rows=len(a))) == reference(a)
    swapped = a.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    flipped = a.copy()
    flipped.view(np.uint32)[500, 2] ^= 1  # one bit
    assert len({reference(a), reference(swapped), reference(flipped)}) == 3


@pytest.mark.parametrize("spec", [P("table", None), P(None, "table"), P()], ids=["rows", "columns", "replicated"])
def test_sharded_and_chunked_match_numpy(monkeypatch, spec):
    monkeypatch.setattr(cd, "CHUNK_BYTES", 3 * 8 * 4 * 7 + 4)  # tiny chunks: 7 rows of 8 floats, overlapping tail
    mesh = build_mesh(MeshPlan((("data", 2), ("table", 4)), "table", "row"))
    a = np.random.default_rng(4).normal(size=(1004, 8)).astype(np.float32)  # 251 rows per row shard
    x = jax.device_put(a, NamedSharding(mesh, spec))
    got = cd.digests([("t", x, 1001), ("whole", x, None), ("small", jnp.asarray(a[:3]), None)])
    assert got == {"t": reference(a, rows=1001), "whole": reference(a), "small": reference(a[:3])}
