"""The leave-one-out sequence dataset: remapping, splits, batches, popularity."""
from __future__ import annotations

import numpy as np
import pytest

from runner.tasks.sequential.dataset import SequenceDataset, cold_targets, popularity_scores
from runner.tasks.sequential.interactions import DataError, Interactions


def tiny_inter() -> Interactions:
    rows = [  # (user, item, timestamp) in file order
        (7, 100, 5), (3, 200, 10), (7, 300, 1), (5, 100, 1), (7, 200, 3), (3, 100, 20),
        (7, 400, 3), (5, 600, 2), (3, 300, 30), (7, 500, 9),
    ]
    u, i, t = (np.array(c, np.int64) for c in zip(*rows))
    return Interactions(user=u, item=i, timestamp=t, rating=None, source="tiny", fmt="test")


def test_remap_and_leave_one_out_split():
    ds = SequenceDataset.from_interactions(tiny_inter(), max_len=3)
    # user 5 has 2 interactions -> dropped, and item 600 (only user 5's) with it
    assert ds.user_ids.tolist() == [3, 7]
    assert ds.item_ids.tolist() == [-1, 100, 200, 300, 400, 500]
    assert ds.num_users == 2 and ds.num_items == 5
    # user 7 by time: 300@1, 200@3, 400@3 (tie: file order), 100@5, 500@9
    assert ds.offsets.tolist() == [0, 3, 8]
    assert ds.items.tolist() == [2, 1, 3, 3, 2, 4, 1, 5]
    assert ds.items.dtype == np.int32
    assert ds.train_sequence(0).tolist() == [2] and ds.train_sequence(1).tolist() == [3, 2, 4]
    assert ds.valid_target.tolist() == [1, 1] and ds.test_target.tolist() == [3, 5]

    (valid,) = ds.eval_batches("valid", batch_size=8)
    assert valid["user"].tolist() == [0, 1]
    assert valid["inputs"].tolist() == [[0, 0, 2], [3, 2, 4]]
    assert valid["target"].tolist() == [1, 1]
    assert valid["mask"].tolist() == [True, True]
    assert valid["history"].shape == (2, 6) and valid["history"].dtype == bool
    assert [np.flatnonzero(h).tolist() for h in valid["history"]] == [[2], [2, 3, 4]]

    (test,) = ds.eval_batches("test", batch_size=8)
    assert test["inputs"].tolist() == [[0, 2, 1], [2, 4, 1]]  # last 3 of [3, 2, 4, 1]
    assert test["target"].tolist() == [3, 5]
    assert [np.flatnonzero(h).tolist() for h in test["history"]] == [[1, 2], [1, 2, 3, 4]]
    for key in ("user", "inputs", "target"):
        assert valid[key].dtype == test[key].dtype == np.int32

    # training: only user 7 has a prefix of >= 2 items; inputs = seq[:-1], targets = seq[1:]
    b = ds.train_batch(step=0, batch_size=4, seed=0)
    assert b["user"].tolist() == [1] * 4
    assert b["inputs"].tolist() == [[0, 3, 2]] * 4
    assert b["targets"].tolist() == [[0, 2, 4]] * 4
    assert b["inputs"].dtype == b["targets"].dtype == np.int32
    short = SequenceDataset.from_interactions(tiny_inter(), max_len=1).train_batch(0, 2, 0)
    assert short["inputs"].tolist() == [[2]] * 2 and short["targets"].tolist() == [[4]] * 2
    crops = {tuple(map(tuple, ds.train_batch(s, 1, 0, random_crop=True)["targets"])) for s in range(40)}
    assert crops == {((0, 0, 2),), ((0, 2, 4),)}


def test_min_interactions_and_eval_padding():
    ds = SequenceDataset.from_interactions(tiny_inter(), max_len=2, min_interactions=4)
    assert ds.user_ids.tolist() == [7] and ds.num_items == 5  # items 100..500 all seen by user 7
    ds = SequenceDataset.from_interactions(tiny_inter(), max_len=2)
    batches = list(ds.eval_batches("test", batch_size=1, history=False))
    assert len(batches) == 2 and "history" not in batches[0]
    (padded,) = ds.eval_batches("valid", batch_size=3, pad_last=True)
    assert padded["user"].tolist() == [0, 1, 0] and padded["mask"].tolist() == [True, True, False]
    assert padded["inputs"].shape == (3, 2)
    with pytest.raises(ValueError, match="min_interactions"):
        SequenceDataset.from_interactions(tiny_inter(), max_len=2, min_interactions=2)
    with pytest.raises(DataError, match="no user"):
        SequenceDataset.from_interactions(tiny_inter(), max_len=2, min_interactions=50)


def random_dataset(max_len=8, users=200, items=60, seed=0) -> SequenceDataset:
    rng = np.random.default_rng(seed)
    n = users * 12
    inter = Interactions(user=rng.integers(1000, 1000 + users, n), item=rng.integers(1, items + 1, n) * 3,
                         timestamp=rng.integers(0, 50, n), rating=None, source="random", fmt="test")
    return SequenceDataset.from_interactions(inter, max_len=max_len)


def test_train_batch_deterministic_and_consistent():
    ds = random_dataset()
    a, b = ds.train_batch(5, 32, seed=1), ds.train_batch(5, 32, seed=1)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["user"], ds.train_batch(6, 32, seed=1)["user"])
    assert not np.array_equal(a["user"], ds.train_batch(5, 32, seed=2)["user"])
    for crop in (False, True):
        batch = ds.train_batch(3, 64, seed=0, random_crop=crop, num_negatives=2)
        assert batch["inputs"].shape == batch["targets"].shape == (64, ds.max_len)
        assert batch["negatives"].shape == (64, ds.max_len, 2)
        for u, x, y, neg in zip(batch["user"], batch["inputs"], batch["targets"], batch["negatives"]):
            seq = ds.train_sequence(u)
            n = int((x > 0).sum())
            assert n >= 1 and (x[: ds.max_len - n] == 0).all() and (y[: ds.max_len - n] == 0).all()
            assert (neg[: ds.max_len - n] == 0).all() and (neg[ds.max_len - n:] >= 1).all()
            window = np.concatenate([x[ds.max_len - n:], y[-1:]])
            np.testing.assert_array_equal(y[ds.max_len - n:], window[1:])
            # the window is a contiguous run of the training prefix (never valid/test items) ...
            starts = [s for s in range(len(seq) - n) if np.array_equal(seq[s:s + n + 1], window)]
            assert starts, (seq, window)
            if not crop:  # ... and without cropping it is the end of the prefix
                np.testing.assert_array_equal(seq[-(n + 1):], window)
                assert n == min(ds.max_len, len(seq) - 1)


def test_eval_batches_cover_every_user():
    ds = random_dataset(max_len=5)
    for split, shift in (("valid", 2), ("test", 1)):
        got = list(ds.eval_batches(split, batch_size=64))
        users = np.concatenate([g["user"] for g in got])
        np.testing.assert_array_equal(users, np.arange(ds.num_users))
        target = np.concatenate([g["target"] for g in got])
        np.testing.assert_array_equal(target, ds.valid_target if split == "valid" else ds.test_target)
        inputs = np.concatenate([g["inputs"] for g in got])
        for u in range(0, ds.num_users, 17):
            seq = ds.items[ds.offsets[u]:ds.offsets[u + 1] - shift]
            np.testing.assert_array_equal(inputs[u][-min(5, len(seq)):], seq[-5:])
            hist = np.concatenate([g["history"] for g in got])[u]
            assert set(np.flatnonzero(hist).tolist()) == set(seq.tolist())


def test_popularity_baseline():
    ds = SequenceDataset.from_interactions(tiny_inter(), max_len=3)
    pop = popularity_scores(ds)
    # training prefixes: user 3 -> [2], user 7 -> [3, 2, 4]; valid/test targets not counted
    assert pop.tolist() == [0, 0, 2, 1, 1, 0] and pop.dtype == np.float32

    from runner.tasks.sequential.metrics import rank_of_target, ranking_report
    (test,) = ds.eval_batches("test", batch_size=8)
    scores = np.broadcast_to(pop, (2, ds.num_items + 1))
    # user 3, target 3 (count 1): item 2 higher, item 4 tied -> pessimistic rank 2
    # user 7, target 5 (count 0): items 2, 3, 4 higher, item 1 tied -> rank 4
    assert rank_of_target(scores, test["target"]).tolist() == [2, 4]
    # excluding history: user 3 only competes with {4, 5}; user 7 with nothing
    ranks = rank_of_target(scores, test["target"], exclude=test["history"])
    assert ranks.tolist() == [1, 0]
    assert ranking_report(ranks, ks=(1,)) == {"hr@1": 0.5, "ndcg@1": 0.5, "mrr": 0.75}


def test_cold_targets_are_targets_never_in_a_training_prefix():
    ds = SequenceDataset.from_interactions(tiny_inter(), max_len=3)
    # training prefixes [2] and [3, 2, 4]; valid targets 1, 1 (never trained on); test targets 3 (seen), 5 (not)
    assert cold_targets(ds) == {"data/cold_valid_targets": 2, "data/cold_test_targets": 1, "data/cold_items": 2}
    rng = np.random.default_rng(0)  # against a plain set-based count on random data
    u, i = rng.integers(0, 40, 600), rng.zipf(1.3, 600) % 300
    ds = SequenceDataset.from_interactions(Interactions(user=u, item=i, timestamp=np.arange(600), rating=None,
                                                        source="r", fmt="test"), max_len=5)
    seqs = [ds.items[ds.offsets[k]:ds.offsets[k + 1]].tolist() for k in range(ds.num_users)]
    trained = {x for s in seqs for x in s[:-2]}
    want_v, want_t = [s[-2] not in trained for s in seqs], [s[-1] not in trained for s in seqs]
    got = cold_targets(ds)
    assert got["data/cold_valid_targets"] == sum(want_v) and got["data/cold_test_targets"] == sum(want_t)
    assert got["data/cold_items"] == len({s[-2] for s, c in zip(seqs, want_v) if c}
                                         | {s[-1] for s, c in zip(seqs, want_t) if c})
    assert sum(want_v) + sum(want_t) > 0


def test_all_windows_cover_every_training_target_once():
    """``train_windows="all"``: the windows' targets are every training target exactly once, and a batch's
    rows are those windows (inputs and targets shifted by one)."""
    rng = np.random.default_rng(0)
    lengths = [3, 4, 7, 12, 13, 30]  # prefixes 1 (no window), 2, 5, 10, 11, 28 with max_len 5
    user = np.repeat(np.arange(len(lengths)), lengths)
    inter = Interactions(user=user, item=rng.integers(1, 40, user.size), timestamp=np.arange(user.size), rating=None,
                         source="t", fmt="test")
    data = SequenceDataset.from_interactions(inter, max_len=5)
    users, ends = data.train_windows()
    covered = {}
    for u, end in zip(users, ends):
        seq = data.train_sequence(u)
        for pos in range(max(1, end - 5), end):  # targets seq[pos] of the window ending at `end`
            covered[(u, pos)] = covered.get((u, pos), 0) + 1
    want = {(u, p) for u in range(data.num_users) for p in range(1, data.train_lengths[u]) if data.train_lengths[u] >= 2}
    assert set(covered) == want and set(covered.values()) == {1}
    assert list(np.bincount(users, minlength=data.num_users)) == [0, 1, 1, 2, 2, 6]

    b = data.train_batch(3, 64, seed=1, windows="all")
    for u, inp, tgt in zip(b["user"], b["inputs"], b["targets"]):
        seq = data.train_sequence(u)
        n = np.count_nonzero(tgt)
        k = next(e for uu, e in zip(users, ends) if uu == u and np.array_equal(seq[e - n:e], tgt[-n:]))
        np.testing.assert_array_equal(inp[-n:], seq[k - n - 1:k - 1])
