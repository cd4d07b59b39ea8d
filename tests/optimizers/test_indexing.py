"""``take_rows`` against a plain Python reference: rows of the leading axis, negative indices from the end,
the fill value for anything outside ``[-n, n)``; any index shape, any dtype, under jit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optimizers.indexing import take_rows


def reference(a: np.ndarray, idx: np.ndarray, fill) -> np.ndarray:
    n = a.shape[0]
    out = np.empty(idx.shape + a.shape[1:], a.dtype)
    for pos in np.ndindex(*idx.shape):
        i = int(idx[pos])
        out[pos] = a[i] if -n <= i < n else fill
    return out


@pytest.mark.parametrize("dtype, fill", [(np.float32, 0), (np.float32, -2.5), (np.int32, 7), (np.bool_, False),
                                         (jnp.bfloat16, 1)])
@pytest.mark.parametrize("shape, idx_shape", [((11,), (9,)), ((11, 5), (9,)), ((11, 3), (4, 6)), ((6, 2, 3), (5,))])
def test_take_rows_reads_rows_and_fills_outside(dtype, fill, shape, idx_shape):
    rng = np.random.default_rng(len(shape) * 10 + len(idx_shape))
    a = (rng.normal(size=shape) * 4).astype(dtype) if dtype != np.bool_ else rng.random(shape) > 0.5
    n = shape[0]
    idx = rng.integers(-2 * n, 2 * n, size=idx_shape).astype(np.int32)
    idx.flat[:4] = [-n - 1, -n, n - 1, n]  # the edges: just outside, first from the end, last, just past
    got = jax.jit(take_rows, static_argnums=2)(jnp.asarray(a), jnp.asarray(idx), fill)
    want = reference(np.asarray(a), idx, np.asarray(fill).astype(np.asarray(a).dtype))
    assert got.dtype == jnp.asarray(a).dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)


def test_take_rows_of_an_empty_index_and_a_one_row_table():
    a = jnp.arange(3, dtype=jnp.float32)[None, :]  # one row
    np.testing.assert_array_equal(take_rows(a, jnp.array([0, -1, 1, -2], jnp.int32), 9),
                                  [[0, 1, 2], [0, 1, 2], [9, 9, 9], [9, 9, 9]])
    assert take_rows(a, jnp.zeros((0,), jnp.int32)).shape == (0, 3)
