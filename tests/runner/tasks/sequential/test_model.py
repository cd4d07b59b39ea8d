"""The SASRec-like model on its own: causal and padding-blind encoder, both losses and the full-ranking
scores against plain numpy computed from the encoder's hidden states and the raw table, and dropout."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.core.embeddings import TableSpec
from runner.tasks.sequential.model import SEEN_SCALE, SequentialModel

N, L, D, K, B = 30, 6, 8, 5, 4


def make(loss="sampled_softmax", **kw):
    c = -(-N // B) if loss == "full_softmax" else 0
    tokens = L + c if c else 2 * L if kw.get("negatives") == "in_batch" else 2 * L + K
    spec = TableSpec("items", N + 1, D, tokens, rows=N + 1)
    model = SequentialModel(spec, N, L, num_blocks=2, num_heads=2, loss_kind=loss,
                            catalog_per_example=c, **kw)
    params = model.init(jax.random.key(0))
    table = np.random.default_rng(1).normal(0, 0.3, (N + 1, D)).astype(np.float32)
    table[0] = 0
    return model, params, table


def batch(seed=0):
    rng = np.random.default_rng(seed)
    seq = rng.integers(1, N + 1, (B, L + 1)).astype(np.int32)
    for b, pad in enumerate([0, 2, 4, 5]):  # left padding of different lengths
        seq[b, :pad] = 0
    inputs, targets = seq[:, :-1], np.where(seq[:, :-1] != 0, seq[:, 1:], 0)
    neg = rng.integers(1, N + 1, (B, K)).astype(np.int32)
    neg[0, 0] = targets[0, -1]  # an accidental hit, masked out of the loss
    return {"inputs": inputs, "targets": targets, "negatives": neg}


def lookup(model, table, b):
    ids = np.asarray(model.table_ids({k: jnp.asarray(v) for k, v in b.items()})["items"])
    return {"items": jnp.asarray(table[ids])}, ids


def hidden(model, params, table, b):
    return np.asarray(model.encode(params, jnp.asarray(table[b["inputs"]]), jnp.asarray(b["inputs"])), np.float64)


@pytest.mark.slow
def test_encoder_is_causal_and_ignores_padding():
    model, params, table = make()
    b = batch()
    h = hidden(model, params, table, b)
    changed = dict(b, inputs=b["inputs"].copy())
    changed["inputs"][:, 3:] = (changed["inputs"][:, 3:] % N) + 1  # the future changes
    np.testing.assert_allclose(hidden(model, params, table, changed)[:, :3], h[:, :3], atol=1e-5)
    assert not np.allclose(hidden(model, params, table, changed)[:, 3:], h[:, 3:], atol=1e-3)
    embs = table[b["inputs"]]
    embs[b["inputs"] == 0] = 5.0  # whatever sits at padding positions is never attended to
    h2 = np.asarray(model.encode(params, jnp.asarray(embs), jnp.asarray(b["inputs"])))
    valid = b["inputs"] != 0
    np.testing.assert_allclose(h2[valid], h[valid], atol=1e-5)


def _softmax_ce(logits, target_col):
    m = logits.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(logits - m).sum(-1))
    return lse - np.take_along_axis(logits, target_col[..., None], -1)[..., 0]


def per_position_reference(b, h, rows, negatives_at, correction=lambda n: 0.0, temperature=1.0, seen=0.0):
    """Mean cross-entropy and top-1 rate over the non-padding positions, one position at a time: the
    target's logit against ``negatives_at(i, t, target)``'s, each minus ``correction(id)``, over temperature,
    plus ``seen`` for an item among the inputs up to position t."""
    losses, hits = [], []
    for i in range(B):
        for t in range(L):
            y = b["targets"][i, t]
            if y == 0:
                continue
            negs = negatives_at(i, t, y)
            off = lambda n: seen * (n in b["inputs"][i, : t + 1])  # noqa: E731
            logits = np.array([rows[y] @ h[i, t] / temperature + off(y)] +
                              [(rows[n] @ h[i, t] - correction(n)) / temperature + off(n) for n in negs])
            losses.append(_softmax_ce(logits, np.array(0)))
            hits.append(len(negs) == 0 or logits[0] > logits[1:].max())
    return np.mean(losses), np.mean(hits)


@pytest.mark.parametrize("l2_norm, temperature", [(False, 1.0), (True, 0.1)])
@pytest.mark.slow
def test_sampled_softmax_matches_numpy(l2_norm, temperature):
    model, params, table = make(l2_norm=l2_norm, temperature=temperature)
    b = batch()
    h = hidden(model, params, table, b)
    rows = table.astype(np.float64)
    if l2_norm:
        h = h / np.maximum(np.linalg.norm(h, axis=-1, keepdims=True), 1e-6)
        rows = rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-6)
    want_loss, want_top1 = per_position_reference(b, h, rows, lambda i, t, y: [n for n in b["negatives"][i] if n != y],
                                                  temperature=temperature)
    embs, _ = lookup(model, table, b)
    loss, out = model.loss(params, embs, {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)
    np.testing.assert_allclose(float(out["top1"]), want_top1, atol=1e-6)


@pytest.mark.slow
def test_full_softmax_and_predict_match_numpy():
    model, params, table = make("full_softmax")
    b = batch()
    h = hidden(model, params, table, b)
    logits = h @ table.T.astype(np.float64)  # [B, L, N+1]
    logits[..., 0] = -np.inf  # padding is never a class
    ce = _softmax_ce(logits, b["targets"])
    valid = b["targets"] != 0
    embs, ids = lookup(model, table, b)
    assert sorted(set(ids[:, L:].ravel()) - {0}) == list(range(1, N + 1))  # the whole catalog is looked up
    loss, out = model.loss(params, embs, {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(float(loss), ce[valid].mean(), rtol=1e-4)
    np.testing.assert_allclose(float(out["top1"]), (logits.argmax(-1) == b["targets"])[valid].mean(), atol=1e-6)

    padded = np.concatenate([table, np.full((3, D), 9.0, np.float32)])  # row-padded storage is ignored
    scores = np.asarray(model.predict(params, embs, {"inputs": jnp.asarray(b["inputs"])}, {"items": padded}))
    assert scores.shape == (B, N + 1)
    np.testing.assert_allclose(scores[:, 1:], (h[:, -1] @ table.T)[:, 1:], rtol=1e-4, atol=1e-5)
    assert (scores[:, 0] < -1e8).all()


def test_full_softmax_equals_a_log_softmax_cross_entropy_over_the_catalogue():
    model, params, table = make("full_softmax")
    b = batch(3)
    h = jnp.asarray(hidden(model, params, table, b), jnp.float32)
    logp = jax.nn.log_softmax(h @ jnp.asarray(table[1:]).T, axis=-1)  # classes: items 1..N, nothing else
    valid = b["targets"] != 0
    want = -np.asarray(jnp.take_along_axis(logp, jnp.asarray(np.maximum(b["targets"] - 1, 0))[..., None], -1))[..., 0]
    embs, _ = lookup(model, table, b)
    loss, _ = model.loss(params, embs, {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(float(loss), want[valid].mean(), rtol=1e-5)


LOGQ = np.log(np.random.default_rng(7).dirichlet(np.ones(N + 1))).astype(np.float32)  # any log q per item


@pytest.mark.parametrize("negatives", ["popularity", "in_batch"])
def test_logq_corrected_sampled_softmax_matches_numpy(negatives):
    """Each negative's logit minus log q of its item (the positive's as it is), accidental hits and padding
    masked; for in_batch the negatives at (b, t) are the other sequences' targets at t."""
    model, params, table = make(negatives=negatives)
    b = batch(1)
    b["negatives_logq"] = LOGQ[b["negatives"]]
    b["targets_logq"] = LOGQ[b["targets"]]
    h = hidden(model, params, table, b)
    rows = table.astype(np.float64)
    if negatives == "popularity":
        negatives_at = lambda i, t, y: [n for n in b["negatives"][i] if n != y]  # noqa: E731
    else:
        negatives_at = lambda i, t, y: [b["targets"][c, t] for c in range(B)  # noqa: E731
                                        if c != i and b["targets"][c, t] not in (0, y)]
    want_loss, want_top1 = per_position_reference(b, h, rows, negatives_at, correction=lambda n: LOGQ[n])
    embs, ids = lookup(model, table, b)
    if negatives == "in_batch":
        assert ids.shape == (B, 2 * L)  # no extra ids: the targets are the negatives
    loss, out = model.loss(params, embs, {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)
    np.testing.assert_allclose(float(out["top1"]), want_top1, atol=1e-6)


def test_dropout_is_seeded_and_only_in_training():
    model, params, table = make(dropout=0.3)
    b = batch()
    embs, _ = lookup(model, table, b)
    dev = {k: jnp.asarray(v) for k, v in b.items()}
    seeded = lambda s: float(model.loss(params, embs, {**dev, "seed": jnp.full((B,), s, jnp.int32)})[0])  # noqa
    assert seeded(1) == seeded(1) and seeded(1) != seeded(2)
    no_drop, _, _ = make()
    assert float(model.loss(params, embs, dev)[0]) == float(no_drop.loss(params, embs, dev)[0])  # no seed: off
    tables = {"items": table}
    np.testing.assert_array_equal(np.asarray(model.predict(params, embs, dev, tables)),
                                  np.asarray(no_drop.predict(params, embs, dev, tables)))


SEEN = 0.3  # params["seen"]: a logit offset of SEEN_SCALE * 0.3 = 3 for items already in the inputs


def with_seen(params):
    return {**params, "seen": jnp.float32(SEEN)}


@pytest.mark.parametrize("negatives", ["uniform", "popularity", "in_batch"])
def test_seen_bias_offsets_every_candidate_already_in_the_inputs(negatives):
    """Sampled softmax with ``seen_bias``: the target and each negative get the learned offset when the item
    occurs among the inputs up to the scored position (the batch has such repeats and such targets)."""
    model, params, table = make(negatives=negatives, seen_bias=True)
    assert float(params["seen"]) == 0.0  # starts neutral
    params = with_seen(params)
    b = batch(1)
    b["negatives_logq"] = LOGQ[b["negatives"]]
    b["targets_logq"] = LOGQ[b["targets"]]
    repeats = [(i, t) for i in range(B) for t in range(L) if b["targets"][i, t] in b["inputs"][i, : t + 1]]
    assert repeats and b["targets"][0, -1] != 0
    h = hidden(model, params, table, b)
    correction = (lambda n: 0.0) if negatives == "uniform" else (lambda n: LOGQ[n])
    if negatives == "in_batch":
        negatives_at = lambda i, t, y: [b["targets"][c, t] for c in range(B)  # noqa: E731
                                        if c != i and b["targets"][c, t] not in (0, y)]
    else:
        negatives_at = lambda i, t, y: [n for n in b["negatives"][i] if n != y]  # noqa: E731
    want_loss, want_top1 = per_position_reference(b, h, table.astype(np.float64), negatives_at, correction,
                                                  seen=SEEN_SCALE * SEEN)
    embs, _ = lookup(model, table, b)
    loss, out = model.loss(params, embs, {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)
    np.testing.assert_allclose(float(out["top1"]), want_top1, atol=1e-6)


def test_seen_bias_full_softmax_and_predict_match_numpy():
    """Full softmax: item j's logit at (b, t) gets the offset when j is among inputs[b, :t + 1]; predict adds it
    to every item anywhere in the inputs (the history is scored, not removed)."""
    model, params, table = make("full_softmax", seen_bias=True)
    params = with_seen(params)
    b = batch(2)
    h = hidden(model, params, table, b)
    seen = np.zeros((B, L, N + 1))
    for i in range(B):
        for t in range(L):
            seen[i, t, [j for j in b["inputs"][i, : t + 1] if j]] = 1.0
    logits = h @ table.T.astype(np.float64) + SEEN_SCALE * SEEN * seen
    logits[..., 0] = -np.inf
    valid = b["targets"] != 0
    embs, _ = lookup(model, table, b)
    loss, out = model.loss(params, embs, {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(float(loss), _softmax_ce(logits, b["targets"])[valid].mean(), rtol=1e-4)
    np.testing.assert_allclose(float(out["top1"]), (logits.argmax(-1) == b["targets"])[valid].mean(), atol=1e-6)
    scores = np.asarray(model.predict(params, embs, {"inputs": jnp.asarray(b["inputs"])}, {"items": table}))
    want = h[:, -1] @ table.T + SEEN_SCALE * SEEN * seen[:, -1]
    np.testing.assert_allclose(scores[:, 1:], want[:, 1:], rtol=1e-4, atol=1e-5)
    assert (scores[:, 0] < -1e8).all() and seen[:, -1, 1:].sum() > B  # padding never seen; items were


def test_seen_bias_learns_to_rank_seen_items_down_when_targets_never_repeat():
    """On sequences whose targets never occur earlier in them, raising the offset only raises wrong items'
    logits: the gradient pushes it negative (and with it the scores of the seen items)."""
    model, params, table = make("full_softmax", seen_bias=True)
    b = batch(4)
    for i in range(B):  # rewrite each sequence without repeats: then no target is among its inputs
        n = int((b["inputs"][i] != 0).sum())
        fresh = np.random.default_rng(i).permutation(np.arange(1, N + 1))[: n + 1].astype(np.int32)
        b["inputs"][i, L - n:], b["targets"][i, L - n:] = fresh[:-1], fresh[1:]
    assert not any(0 != b["targets"][i, t] in b["inputs"][i, : t + 1] for i in range(B) for t in range(L))
    embs, _ = lookup(model, table, b)
    grad = jax.jit(jax.grad(lambda p: model.loss(p, embs, {k: jnp.asarray(v) for k, v in b.items()})[0]))(params)
    assert float(grad["seen"]) > 0
    plain, plain_params, _ = make("full_softmax")
    assert "seen" not in plain_params  # off by default: no such parameter
