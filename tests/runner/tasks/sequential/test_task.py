"""The sequential task: the synthetic world's planted pattern, the ratings.dat round trip, batches, clean
config errors, and full-ranking evaluation (model, popularity, exclude_seen) against per-user numpy loops."""
import numpy as np
import pytest

from runner.build import build
from runner.core.loop import to_device
from runner.tasks.sequential.dataset import SequenceDataset
from runner.tasks.sequential.interactions import load_interactions
from runner.errors import PreflightError
from runner.tasks.sequential.synthetic import SequenceSpec, SequenceWorld, write_ratings_dat
from tests.runner.support import compose_config, seq_config

def test_world_transitions_follow_the_planted_pattern():
    spec = SequenceSpec(num_users=3000, num_items=300, num_clusters=10, min_length=5, max_length=30, noise=0.2)
    world = SequenceWorld(spec)
    inter = world.interactions()
    assert (np.bincount(world.cluster[1:]) == 30).all()  # equal clusters
    same_user = inter.user[1:] == inter.user[:-1]
    prev, nxt = inter.item[:-1][same_user], inter.item[1:][same_user]
    follows = world.cluster[nxt] == world.succ[world.cluster[prev]]
    assert abs(follows.mean() - (0.8 + 0.2 / 10)) < 0.01  # 1 - noise + noise / C
    lengths = np.bincount(inter.user)[1:]
    assert lengths.min() >= 5 and lengths.max() <= 30
    assert (np.diff(inter.timestamp)[same_user] > 0).all()
    # the oracle's probabilities are the empirical next-item frequencies after a given item
    last = np.bincount(prev).argmax()
    freq = np.bincount(nxt[prev == last], minlength=301)[1:] / (prev == last).sum()
    probs = world.next_item_probs(np.array([last]), np.arange(-1, 301))[0]
    assert probs[0] == probs[1] == 0 and abs(probs.sum() - 1) < 1e-9
    assert np.abs(freq - probs[2:]).max() < 0.05
    again = SequenceWorld(spec).interactions()
    np.testing.assert_array_equal(again.item, inter.item)


def test_an_item_is_drawn_at_the_rank_its_uniform_falls_at_in_its_clusters_popularity():
    world = SequenceWorld(SequenceSpec(num_items=103, num_clusters=7, zipf_a=1.2))  # clusters of 14 and 15 items
    rng = np.random.default_rng(0)
    clusters = rng.integers(0, 7, 5000)
    u = np.concatenate([rng.random(4990), np.zeros(5), np.nextafter(1.0, 0.0) * np.ones(5)])
    for k in range(7):  # reference: each cluster's members in ascending raw id are the ids dealt to it
        assert np.array_equal(np.sort(world._members[k]), np.flatnonzero(world.cluster[1:] == k) + 1)
    got = world._emit(clusters, u)
    for i in range(clusters.size):  # reference: a linear scan of the cluster's cumulative popularity
        members = world._members[clusters[i]]
        cdf = np.cumsum(world.p_within[members])
        rank = min(int((cdf <= u[i]).sum()), members.size - 1)
        assert got[i] == members[rank]
    assert (world.cluster[got] == clusters).all()


def test_ratings_dat_round_trip_gives_the_same_sequences(tmp_path):
    world = SequenceWorld(SequenceSpec(num_users=50, num_items=40, num_clusters=4))
    inter = world.interactions()
    path = write_ratings_dat(inter, tmp_path / "ml" / "ratings.dat")
    loaded = load_interactions(tmp_path / "ml")
    assert loaded.fmt == "ml-dat"
    a, b = SequenceDataset.from_interactions(inter, 10), SequenceDataset.from_interactions(loaded, 10)
    for field in ("offsets", "items", "user_ids", "item_ids"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert path.read_text().splitlines()[0].count("::") == 3


def test_movielens_source_and_its_tables(tmp_path):
    write_ratings_dat(SequenceWorld(SequenceSpec(num_users=64, num_items=50, num_clusters=5)).interactions(),
                      tmp_path / "ratings.dat")
    over = [f"data.path={tmp_path}", "data.max_len=10", "trainer.batch_size=16"]
    program, task, _ = build(seq_config(*over, data=["data=movielens"]))
    assert task.data.fmt == "ml-dat" and task.data.num_items == program.tables["items"].vocab - 1
    assert task.tables() == {"items": (task.data.num_items, 2 * 10 + 32)}  # inputs, targets, negatives
    program, task, _ = build(seq_config(*over, "model.loss=full_softmax", data=["data=movielens"]))
    assert task.tables()["items"][1] == 10 + -(-task.data.num_items // 16)  # inputs + a share of the catalog


def test_batches_are_deterministic_and_shard_the_global_batch():
    _, task, _ = build(seq_config())
    a, b = task.batch(3, 64), task.batch(3, 64)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["negatives"], task.batch(4, 64)["negatives"])
    parts = [task.batch(3, 64, shard=s, num_shards=4) for s in range(4)]
    for k in a:
        np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), a[k])
    assert a["negatives"].shape == (64, 32) and 1 <= a["negatives"].min() and a["negatives"].max() <= 200
    np.testing.assert_array_equal(a["targets"][:, :-1], np.where(a["inputs"][:, :-1] != 0, a["inputs"][:, 1:], 0))


@pytest.mark.parametrize("data, overrides, needle", [
    (["data=movielens"], [], "data.path is not set"),
    (["data=movielens"], [], "(MovieLens: ml-100k.zip and ml-1m.zip from https://grouplens.org/datasets/movielens/, "
                             "unzipped)"),
    (["data=movielens"], ["data.path=/nonexistent/ml-1m"], "data.path='/nonexistent/ml-1m' cannot be used: "
                                                           "interaction data not found: /nonexistent/ml-1m"),
    (None, ["model.num_heads=3"], "model.num_heads=3 must divide model.emb_width=16"),
    (None, ["model.num_heads=2", "+model.tables.items.width=3"], "model.num_heads=2 must divide the item table's "
                                                                 "width 3 (model.tables.items.width, which sets the "
                                                                 "model's width in place of model.emb_width=16)"),
    (None, ["data.path=/tmp/u.data"], "data.path=/tmp/u.data names an interaction file, and "
                                       "data=synthetic_sequences generates its sequences: use data=movielens"),
    (None, ["model.negatives=in_batch", "trainer.batch_size=1"], "model.negatives=in_batch takes the other "
                                                                 "sequences of a batch as negatives, and "
                                                                 "trainer.batch_size=1 leaves none"),
    # model.loss is an Enum field: a wrong word fails at composition (tests/runner/test_config.py)
    (None, ["data.min_length=2"], "data.min_length=2 is outside [3, 65536]"),
    (None, ["data.min_length=9", "data.max_length=8"], "data.min_length=9, max_length=8: need 3 <= min_length"),
    (None, ["+model.tables.items.vocab=100"], "model.tables must only configure 'items', without a vocab"),
    (None, ["data.random_crop=true", "data.train_windows=all"], "data.random_crop=true crops the one window per "
                                                                "user of data.train_windows=last"),
])
def test_config_errors_name_the_value_and_the_fix(data, overrides, needle):
    with pytest.raises(PreflightError) as e:
        build(seq_config(*overrides, data=data))
    assert needle in str(e.value)


def test_data_and_model_must_match():
    with pytest.raises(PreflightError, match="data=synthetic_sequences is a next-item sequence source, but "
                                             "model=ranking; use model=sequential"):
        build(seq_config(model=["model=ranking"]))
    with pytest.raises(PreflightError, match="data=synthetic is the multi-action ranking source, but "
                                             "model=sequential; use model=ranking"):
        build(compose_config(["model=sequential", "data=synthetic"], tiny=False))


def _reference_ranks(ds, split, scores_of, exclude_seen):
    """Per user, in a plain loop: the input window, the target, and its pessimistic rank."""
    L, ranks = ds.max_len, []
    for u in range(ds.num_users):
        seq = ds.items[ds.offsets[u]:ds.offsets[u + 1]]
        hist, target = (seq[:-2], seq[-2]) if split == "valid" else (seq[:-1], seq[-1])
        window = np.zeros(L, np.int32)
        window[L - min(L, len(hist)):] = hist[-L:]
        s = scores_of(window)
        cand = np.ones(ds.num_items + 1, bool)
        cand[0] = cand[target] = False
        if exclude_seen:
            cand[hist] = False
            cand[target] = False
        ranks.append(np.sum(cand & (s >= s[target])))
    return np.array(ranks)


def _metrics(ranks):
    return {"hr@10": np.mean(ranks < 10), "ndcg@10": np.mean(np.where(ranks < 10, 1 / np.log2(ranks + 2), 0)),
            "mrr": np.mean(1 / (ranks + 1))}


@pytest.mark.parametrize("exclude_seen", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_evaluation_matches_per_user_reference(exclude_seen):
    program, task, _ = build(seq_config("data.num_users=150", "trainer.batch_size=32",
                                        f"data.exclude_seen={exclude_seen}"))
    state = program.init_state(0)
    put = lambda b: to_device(program, b)  # noqa: E731
    _, _, predict = program.compile(state, put(task.batch(0, 32)))
    got = task.evaluate(predict, state, put, 32)
    ds = task.data
    pop = np.zeros(ds.num_items + 1)
    for u in range(ds.num_users):
        np.add.at(pop, ds.items[ds.offsets[u]:ds.offsets[u + 1] - 2], 1)

    def model_scores(window):
        b = {**{k: np.zeros_like(v[:32]) for k, v in task.batch(0, 32).items()},
             "inputs": np.tile(window, (32, 1))}
        return np.asarray(predict(state, put(b)))[0]

    for split in ("valid", "test"):
        for name, scores_of in (("", model_scores), ("popularity/", lambda w: pop),
                                ("oracle/", lambda w: task.world.next_item_probs(ds.item_ids[w[-1:]],
                                                                                   ds.item_ids)[0])):
            want = _metrics(_reference_ranks(ds, split, scores_of, exclude_seen))
            for k, v in want.items():
                assert got[f"{name}{split}/{k}"] == pytest.approx(v, abs=1e-9), (name, split, k)
    assert task.objective == "valid/ndcg@10" and task.objective in got


def test_popularity_negatives_follow_the_training_counts_and_carry_their_log_q():
    from runner.tasks.sequential.dataset import popularity_scores
    _, task, _ = build(seq_config("model.negatives=popularity", "model.num_negatives=64"))
    assert task.model_keys[:4] == ("inputs", "targets", "negatives", "negatives_logq")
    counts = popularity_scores(task.data).astype(np.float64)
    q = counts / counts.sum()
    drawn = np.concatenate([task.batch(s, 64)["negatives"].ravel() for s in range(40)])
    b = task.batch(0, 64)
    np.testing.assert_allclose(b["negatives_logq"], np.log(q[b["negatives"]]), rtol=1e-5)
    assert counts[drawn].min() > 0  # an item with no training count is never drawn
    freq = np.bincount(drawn, minlength=q.size) / drawn.size
    assert np.abs(freq - q).max() < 0.01  # 163,840 draws: the empirical shares are q's within noise


def test_in_batch_negatives_add_no_ids_and_carry_the_targets_log_q():
    from runner.tasks.sequential.dataset import popularity_scores
    _, task, _ = build(seq_config("model.negatives=in_batch"))
    assert "negatives" not in task.model_keys and "targets_logq" in task.model_keys
    assert task.tables()["items"][1] == 2 * task.data.max_len
    counts = popularity_scores(task.data).astype(np.float64)
    b = task.batch(0, 64)
    t = b["targets"][b["targets"] != 0]
    np.testing.assert_allclose(b["targets_logq"][b["targets"] != 0], np.log(counts[t] / counts.sum()), rtol=1e-5)


def test_all_windows_make_an_epoch_of_every_training_target():
    _, last, _ = build(seq_config("data.max_len=8"))
    _, every, _ = build(seq_config("data.max_len=8", "data.train_windows=all"))
    users, ends = every.data.train_windows()
    assert every.num_train_examples == users.size > last.num_train_examples
    assert users.size == sum(-(-(p - 1) // 8) for p in every.data.train_lengths if p >= 2)
    b = every.batch(0, 64)
    assert b["inputs"].shape == (64, 8) and (b["targets"] > 0).any(axis=1).all()


def test_a_non_boolean_seen_bias_is_refused_when_composed():
    with pytest.raises(Exception) as e:
        seq_config("model.seen_bias=sometimes")
    text = f"{e.value} {e.value.__cause__}"
    assert "model.seen_bias=sometimes" in text and "'sometimes' is not a valid bool" in text, text


def test_a_file_appended_to_itself_trains_on_it_once_and_counts_the_rows(tmp_path):
    """The same ratings.dat twice: each duplicate would sit next to its original, so every item would follow
    itself (each test input ending with its own target). data.duplicates=drop trains on the file once and
    counts the rows (summary, data/duplicate_rows); refuse names the file, the count and the first one."""
    inter = SequenceWorld(SequenceSpec(num_users=64, num_items=50, num_clusters=5)).interactions()
    once = write_ratings_dat(inter, tmp_path / "once" / "ratings.dat")
    twice = tmp_path / "twice" / "ratings.dat"
    twice.parent.mkdir()
    twice.write_text(once.read_text() * 2)
    over = ["data.max_len=10", "trainer.batch_size=16"]
    _, single, _ = build(seq_config(*over, f"data.path={once}", data=["data=movielens"]))
    _, doubled, _ = build(seq_config(*over, f"data.path={twice}", data=["data=movielens"]))
    for field in ("offsets", "items", "user_ids", "item_ids"):
        np.testing.assert_array_equal(getattr(doubled.data, field), getattr(single.data, field))
    assert single.data_metrics()["data/duplicate_rows"] == 0 and single.warnings() == []
    assert doubled.data_metrics()["data/duplicate_rows"] == len(inter)
    assert f"{twice}: dropped {len(inter):,} rows that repeat an earlier row exactly" in doubled.warnings()[0]
    lines = doubled.summary_lines({**{f"{p}/{m}": 0.0 for p in ("test", "valid", "popularity/test")
                                      for m in ("hr@10", "ndcg@10", "mrr")}, **doubled.data_metrics()})
    assert f"dropped {len(inter):,} exact duplicate rows of {twice} (data.duplicates=drop)" in lines
    with pytest.raises(PreflightError) as e:
        build(seq_config(*over, f"data.path={twice}", "data.duplicates=refuse", data=["data=movielens"]))
    u, i, t = inter.user[0], inter.item[0], inter.timestamp[0]
    assert str(e.value) == (
        f"data.path='{twice}' cannot be used: {twice}: {len(inter):,} of its {2 * len(inter):,} rows repeat an "
        f"earlier row exactly (the same user, item and timestamp; the first at line {len(inter) + 1}: user {u}, "
        f"item {i}, timestamp {t}), e.g. the file appended to itself. A duplicate sits next to its original in the "
        f"user's sequence, so an item would follow itself and inflate the test metrics; data.duplicates=refuse "
        f"stops on them. Remove them from the file, or set data.duplicates=drop to drop them (and count them in "
        f"data/duplicate_rows).")


def test_a_refused_duplicate_of_string_ids_is_named_as_the_file_writes_it(tmp_path):
    path = tmp_path / "sd.csv"
    path.write_text("user_id,item_id,timestamp\nalice,apple,1\nalice,pear,2\nbob,kiwi,1\nalice,pear,2\n")
    with pytest.raises(PreflightError, match=r"the first at line 5: user alice, item pear, timestamp 2\)"):
        build(seq_config(f"data.path={path}", "data.duplicates=refuse", data=["data=movielens"]))


def test_a_min_interactions_no_user_reaches_names_the_setting_to_lower(tmp_path):
    path = tmp_path / "few.csv"
    path.write_text("user,item,timestamp\n" + "".join(f"{u},{i},{i}\n" for u in range(3) for i in range(5)))
    with pytest.raises(PreflightError, match=r"no user has >= 9 interactions \(data.min_interactions; the longest "
                                             r"sequence has 5\).*; use data where users have >= 4 interactions, or "
                                             r"lower data.min_interactions to 5 or less\. Fix data.path"):
        build(seq_config(f"data.path={path}", "data.min_interactions=9", data=["data=movielens"]))


def test_a_duplicates_setting_other_than_drop_or_refuse_is_refused_when_composed():
    with pytest.raises(Exception) as e:
        seq_config("data.duplicates=keep", data=["data=movielens"])
    text = f"{e.value} {e.value.__cause__}"
    assert "data.duplicates=keep" in text and "expected one of [drop, refuse]" in text, text
