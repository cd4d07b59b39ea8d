"""Static-size dedupe against ``np.unique``, and the update record it builds."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers
from optimizers import record

dedupe = jax.jit(record.dedupe, static_argnums=(1, 2, 3, 4))


def expected(ids: np.ndarray, vocab: int, pad_id: int | None):
    """numpy: sorted distinct valid ids padded with ``vocab``; each token's index into them, -1 if invalid."""
    flat = ids.reshape(-1)
    valid = (flat >= 0) & (flat < vocab)
    if pad_id is not None:
        valid &= flat != pad_id
    distinct = np.unique(flat[valid])
    size = record.num_unique_for(flat.size, vocab)
    unique = np.full(size, vocab, np.int64)
    unique[: distinct.size] = distinct
    segments = np.where(valid, np.searchsorted(distinct, flat), -1)
    return unique, segments


def draw(kind: str, tokens: int, vocab: int, rng) -> np.ndarray:
    if kind == "random":  # repeats, padding, and ids below 0 and at or above vocab
        return rng.integers(-2, vocab + 3, size=tokens)
    if kind == "zipf":  # few hot ids, many repeats
        return np.minimum(rng.zipf(1.3, size=tokens) - 1, vocab + 1)
    if kind == "all_padding":
        return np.zeros(tokens, np.int64)
    if kind == "all_distinct":  # as many distinct non-padding ids as fit
        n = min(tokens, vocab - 1)
        ids = np.zeros(tokens, np.int64)
        ids[:n] = rng.permutation(np.arange(1, vocab))[:n]
        return rng.permutation(ids)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "zipf", "all_padding", "all_distinct"])
@pytest.mark.parametrize("tokens,vocab", [(24, 1000), (40, 16), (16, 17)])
@pytest.mark.parametrize("pad_id", [0, None])
@pytest.mark.parametrize("method", ["native", "packed", "search"])
def test_dedupe_matches_np_unique(kind, tokens, vocab, pad_id, method):
    rng = np.random.default_rng(tokens * vocab)
    ids = draw(kind, tokens, vocab, rng).reshape(4, -1).astype(np.int32)
    size = record.num_unique_for(tokens, vocab)
    unique, segments = dedupe(jnp.asarray(ids), vocab, size, pad_id, method)

    want_unique, want_segments = expected(ids, vocab, pad_id)
    assert unique.shape == (size,) and unique.dtype == jnp.int32
    assert segments.shape == (tokens,) and segments.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(unique), want_unique)
    np.testing.assert_array_equal(np.asarray(segments), want_segments)
    seg = np.asarray(segments)
    np.testing.assert_array_equal(np.asarray(unique)[seg[seg >= 0]], ids.reshape(-1)[seg >= 0])  # round trip


def test_every_id_distinct_fills_the_buffer():
    """tokens >= vocab and every id present (no padding id): all vocab slots used, one padding slot left."""
    vocab = 12
    ids = np.random.default_rng(0).permutation(np.concatenate([np.arange(vocab), np.arange(vocab)]))
    size = record.num_unique_for(ids.size, vocab)
    assert size == vocab + 1
    unique, segments = dedupe(jnp.asarray(ids, jnp.int32), vocab, size, None)
    np.testing.assert_array_equal(np.asarray(unique), np.append(np.arange(vocab), vocab))
    np.testing.assert_array_equal(np.asarray(segments), ids)


def test_num_unique_for_fits_every_distinct_id_plus_padding():
    assert record.num_unique_for(5, 100) == 6
    assert record.num_unique_for(200, 10) == 11


def test_make_update_and_empty_update_share_shapes():
    """A pending and a non-pending update have the same shapes, so one compiled step serves both."""
    ctx = optimizers.AsyncEmbContext(stored_rows=20, emb_width=3, tokens_per_batch=12)
    ids = np.array([[0, 3, 3, 7], [19, 0, 3, 25], [1, 1, 2, -4]], np.int32)
    grads = np.arange(12 * 3, dtype=np.float32).reshape(3, 4, 3)
    update = optimizers.make_update(ctx, ids, grads)
    empty = optimizers.empty_update(ctx)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), update) == jax.tree.map(lambda a: (a.shape, a.dtype), empty)
    assert bool(update.pending) and not bool(empty.pending)
    np.testing.assert_array_equal(np.asarray(update.grads), grads.reshape(12, 3))
    want_unique, want_segments = expected(ids, 20, 0)
    np.testing.assert_array_equal(np.asarray(update.unique_tokens), want_unique)
    np.testing.assert_array_equal(np.asarray(update.segment_ids), want_segments)
    np.testing.assert_array_equal(np.asarray(empty.unique_tokens), np.full(ctx.num_unique, 20))
    np.testing.assert_array_equal(np.asarray(empty.segment_ids), np.full(12, -1))
    assert not bool(optimizers.make_update(ctx, ids, grads, pending=False).pending)


@pytest.mark.parametrize("vocab", [2**31 // 1024 - 1, 2**31 // 1024, 10_000_000])
def test_packed_keys_never_overflow(vocab):
    """The default picks "packed" only while (vocab + 1) * tokens fits in int32; ids at the top of the
    vocabulary, out of range and padding still come out exactly as np.unique says, on either side of the line."""
    tokens = 1024
    fits = (vocab + 1) * tokens - 1 <= 2**31 - 1
    assert optimizers.kernels.xla_dedupe_method(tokens, vocab) == ("packed" if fits else "search")
    rng = np.random.default_rng(vocab)
    ids = np.concatenate([rng.integers(vocab - 40, vocab + 3, size=tokens - 24), [0] * 8, [-1] * 8,
                          rng.integers(1, 50, size=8)]).astype(np.int32)
    unique, segments = dedupe(jnp.asarray(ids), vocab, record.num_unique_for(tokens, vocab), 0, None)
    want_unique, want_segments = expected(ids, vocab, 0)
    np.testing.assert_array_equal(np.asarray(unique), want_unique)
    np.testing.assert_array_equal(np.asarray(segments), want_segments)
    if not fits:
        with pytest.raises(ValueError, match="needs \\(vocab \\+ 1\\) \\* tokens <= 2\\*\\*31"):
            dedupe(jnp.asarray(ids), vocab, record.num_unique_for(tokens, vocab), 0, "packed")
