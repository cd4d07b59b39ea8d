import numpy as np
import pytest

from runner.tasks.ranking.synthetic import SyntheticRanking, SyntheticSpec
from runner.tasks.ranking.auc import auc

KEYS_INT = ("user", "hist_items", "hist_authors", "cand_item", "cand_author")
KEYS = KEYS_INT + ("labels", "probs")


@pytest.fixture(scope="module")
def ds():
    return SyntheticRanking(SyntheticSpec())


@pytest.fixture(scope="module")
def big(ds):
    """~50k training examples of the default spec."""
    bs = [ds.batch(s, 4096) for s in range(12)]
    return {k: np.concatenate([b[k] for b in bs]) for k in KEYS}


def _equal(a, b):
    return all(np.array_equal(a[k], b[k]) for k in KEYS)


def test_shapes_and_dtypes(ds):
    spec = ds.spec
    b = ds.batch(3, 64)
    assert set(b) == set(KEYS)
    for k in ("user", "cand_item", "cand_author"):
        assert b[k].shape == (64,) and b[k].dtype == np.int32
    for k in ("hist_items", "hist_authors"):
        assert b[k].shape == (64, spec.history_len) and b[k].dtype == np.int32
    for k in ("labels", "probs"):
        assert b[k].shape == (64, len(spec.actions)) and b[k].dtype == np.float32


def test_deterministic_across_instances():
    spec = SyntheticSpec(num_users=500, num_items=2000, num_authors=100, seed=7)
    a, b = SyntheticRanking(spec), SyntheticRanking(spec)
    for split in ("train", "valid", "test"):
        assert _equal(a.batch(5, 300, split=split), b.batch(5, 300, split=split))
    # order of calls does not matter (no stateful stream)
    x = a.batch(9, 128)
    a.batch(2, 128)
    assert _equal(x, a.batch(9, 128))
    other = SyntheticRanking(SyntheticSpec(num_users=500, num_items=2000, num_authors=100, seed=8))
    assert not np.array_equal(other.batch(5, 300)["cand_item"], a.batch(5, 300)["cand_item"])


def test_steps_and_splits_differ(ds):
    b0, b1 = ds.batch(0, 512), ds.batch(1, 512)
    v0, t0 = ds.batch(0, 512, split="valid"), ds.batch(0, 512, split="test")
    for a, b in ((b0, b1), (b0, v0), (b0, t0), (v0, t0)):  # each split its own stream: valid is not test
        assert not np.array_equal(a["hist_items"], b["hist_items"])
        assert not np.array_equal(a["labels"], b["labels"])
        assert np.mean(a["cand_item"] == b["cand_item"]) < 0.2  # only popular-item coincidences


@pytest.mark.parametrize("batch_size,num_shards", [(4096, 1), (4096, 2), (4096, 8), (600, 3), (1000, 5)])
def test_shards_concatenate_to_global_batch(ds, batch_size, num_shards):
    full = ds.batch(11, batch_size, split="valid")
    shards = [ds.batch(11, batch_size, split="valid", shard=k, num_shards=num_shards) for k in range(num_shards)]
    for b in shards:
        assert len(b["user"]) == batch_size // num_shards
    assert _equal(full, {k: np.concatenate([b[k] for b in shards]) for k in KEYS})


def test_batch_is_prefix_of_larger_batch(ds):
    small, large = ds.batch(4, 300), ds.batch(4, 1000)
    assert _equal(small, {k: v[:300] for k, v in large.items()})


def test_bad_arguments(ds):
    with pytest.raises(ValueError, match=r"split must be one of \['test', 'train', 'valid'\], got 'eval'"):
        ds.batch(0, 10, split="eval")
    with pytest.raises(ValueError):
        ds.batch(0, 10, num_shards=3)
    with pytest.raises(ValueError):
        ds.batch(0, 10, shard=2, num_shards=2)
    with pytest.raises(ValueError):
        ds.batch(-1, 10)


def test_ids_in_range_and_padding_consistent(ds, big):
    spec = ds.spec
    assert big["user"].min() >= 1 and big["user"].max() <= spec.num_users
    assert big["cand_item"].min() >= 1 and big["cand_item"].max() <= spec.num_items
    assert big["cand_author"].min() >= 1 and big["cand_author"].max() <= spec.num_authors
    hi, ha = big["hist_items"], big["hist_authors"]
    assert hi.min() >= 0 and hi.max() <= spec.num_items
    assert ha.min() >= 0 and ha.max() <= spec.num_authors
    np.testing.assert_array_equal(hi == 0, ha == 0)
    # left-aligned: once padding starts it continues
    pad = hi == 0
    assert not np.any(pad[:, :-1] & ~pad[:, 1:])
    lengths = (~pad).sum(axis=1)
    assert lengths.min() == 0 and lengths.max() == spec.history_len
    assert len(np.unique(lengths)) == spec.history_len + 1  # variable lengths
    # every item has one fixed author, the same in histories and as candidate
    items = np.concatenate([big["cand_item"], hi[~pad]])
    authors = np.concatenate([big["cand_author"], ha[~pad]])
    order = np.argsort(items, kind="stable")
    items, authors = items[order], authors[order]
    same_item = items[1:] == items[:-1]
    np.testing.assert_array_equal(authors[1:][same_item], authors[:-1][same_item])


def test_zipf_popularity_scattered_over_ids(ds, big):
    for key, n in (("cand_item", ds.spec.num_items), ("user", ds.spec.num_users)):
        counts = np.bincount(big[key], minlength=n + 1)
        top = np.argsort(counts)[::-1][:20]
        assert counts[top[0]] / counts.sum() > 0.05  # heavy head
        assert np.max(top) > 100  # not just the small ids
        assert np.count_nonzero(counts) > 1000  # long tail


def test_labels_and_base_rates(ds, big):
    labels, probs = big["labels"], big["probs"]
    assert set(np.unique(labels)) == {0.0, 1.0}
    assert probs.min() > 0 and probs.max() < 1
    rates = labels.mean(axis=0)
    for got, want in zip(rates, (0.30, 0.10, 0.033)):
        assert abs(got - want) < 0.15 * want
    # labels are draws from probs: mean prob matches the label rate
    np.testing.assert_allclose(probs.mean(axis=0), rates, rtol=0.1)
    # probs carry signal that is not just the base rate
    assert np.all(probs.std(axis=0) > 0.05 * probs.mean(axis=0))


def test_bayes_auc(ds):
    result = ds.bayes_auc(num_examples=100_000)
    assert set(result) == set(ds.spec.actions)
    for a, v in result.items():
        assert 0.72 < v < 0.93, (a, v)
    # bayes_auc matches a direct computation on the same examples of each split, and beats a random score
    rng = np.random.default_rng(0)
    for split in ("valid", "test"):
        b = ds.batch(0, 8192, split=split)
        sub = ds.bayes_auc(num_examples=8192, split=split)
        for k, a in enumerate(ds.spec.actions):
            assert sub[a] == pytest.approx(auc(b["labels"][:, k], b["probs"][:, k]))
            random_auc = auc(b["labels"][:, k], rng.random(len(b["labels"])))
            assert sub[a] > random_auc + 0.15
