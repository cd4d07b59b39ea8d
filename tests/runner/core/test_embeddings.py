"""Table initialisation: Normal(0, init_scale) rows with the padding row and padded rows zero, the same
values on every layout (each shard fills only its own block), bfloat16 = float32 rounded to nearest."""
import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from runner.core.embeddings import TableSpec, init_table

SPEC = TableSpec("items", vocab=997, width=16, tokens_per_example=1, rows=1000, init_scale=0.05)


def layouts():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "table"))
    return {"rows over table": P("table", None), "columns over table": P(None, "table"),
            "rows over data x table": P(("data", "table"), None), "replicated": P()}, mesh


def test_rows_are_normal_and_padding_is_zero():
    t = np.asarray(init_table(SPEC, jax.random.key(0), None, chunk_rows=96)).astype(np.float64)
    assert t.shape == (1000, 16) and t.dtype == np.float64
    assert not t[0].any() and not t[SPEC.vocab:].any()
    body = t[1:SPEC.vocab].ravel()
    assert abs(body.mean()) < 4 * 0.05 / np.sqrt(body.size)
    assert abs(body.std() / 0.05 - 1) < 0.03
    # Normal tails: about 4.55% of draws beyond 2 sigma, 0.27% beyond 3 sigma.
    assert abs(np.mean(np.abs(body) > 0.1) - 0.0455) < 0.006 and np.mean(np.abs(body) > 0.15) < 0.006
    assert len(np.unique(body)) > 0.99 * body.size
    other = np.asarray(init_table(SPEC, jax.random.key(1), None))
    assert np.corrcoef(other[1:SPEC.vocab].ravel(), body)[0, 1] < 0.05  # another key, other values


def test_chunking_does_not_change_values():
    a = np.asarray(init_table(SPEC, jax.random.key(3), None, chunk_rows=96))  # last chunk overlaps
    b = np.asarray(init_table(SPEC, jax.random.key(3), None, chunk_rows=1 << 16))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.slow
def test_every_layout_gets_the_same_values(dtype):
    spec = TableSpec(SPEC.name, SPEC.vocab, SPEC.width, 1, SPEC.rows, dtype=dtype, init_scale=SPEC.init_scale)
    want = np.asarray(init_table(spec, jax.random.key(7), None))
    specs, mesh = layouts()
    for name, pspec in specs.items():
        sharding = NamedSharding(mesh, pspec)
        got = init_table(spec, jax.random.key(7), sharding, chunk_rows=64)
        assert got.sharding.is_equivalent_to(sharding, 2), name
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)


def test_bfloat16_is_float32_rounded_to_nearest():
    bf = TableSpec(SPEC.name, SPEC.vocab, SPEC.width, 1, SPEC.rows, dtype="bfloat16")
    f32 = np.asarray(init_table(TableSpec(SPEC.name, SPEC.vocab, SPEC.width, 1, SPEC.rows), jax.random.key(2), None))
    got = np.asarray(init_table(bf, jax.random.key(2), None))
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), f32.astype(ml_dtypes.bfloat16).astype(np.float32))
