"""Interaction loaders (every supported format, errors) and the leave-one-out sequence dataset."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner import movielens
from runner.movielens import (DataError, Interactions, SequenceDataset, load_interactions,
                              popularity_scores)

# (user, item, rating, timestamp), in file order
ROWS = [(1, 10, 4, 100), (1, 20, 3, 50), (2, 10, 5, 70), (1, 30, 2, 200), (2, 40, 1, 80),
        (3, 20, 4, 90), (3, 30, 5, 90), (10, 1000, 1, 1_500_000_000)]
EXPECTED = sorted((u, i, t) for u, i, _, t in ROWS)


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_u_data(d):
    return _write(d / "u.data", "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ROWS))


def write_ratings_dat(d):
    return _write(d / "ratings.dat", "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in ROWS))


def write_ratings_csv(d):
    return _write(d / "ratings.csv", "userId,movieId,rating,timestamp\n"
                  + "".join(f"{u},{i},{r:.1f},{t}\n" for u, i, r, t in ROWS))


def write_inter(d):  # columns deliberately out of order, timestamps as floats
    return _write(d / "ml.inter", "item_id:token\ttimestamp:float\tuser_id:token\trating:float\n"
                  + "".join(f"{i}\t{t}.0\t{u}\t{r}.0\n" for u, i, r, t in ROWS))


def write_parquet(d):
    d.mkdir(parents=True, exist_ok=True)
    u, i, r, t = map(list, zip(*ROWS))
    table = pa.table({"user_id": pa.array(u, pa.int32()), "item_id": pa.array(i, pa.int64()),
                      "timestamp": pa.array(t, pa.int64()), "rating": pa.array(r, pa.float32())})
    pq.write_table(table, d / "inter.parquet")
    return d / "inter.parquet"


def write_generic_csv(d):  # no rating column, alias names
    return _write(d / "events.csv", "user,itemId,timestamp\n"
                  + "".join(f"{u},{i},{t}\n" for u, i, _, t in ROWS))


def write_generic_tsv(d):  # extra column, CRLF line ends, quoted strings
    return _write(d / "events.tsv", "ts\tUser_ID\tsession\titem\r\n"
                  + "".join(f'{t}\t{u}\t"s x"\t{i}\r\n' for u, i, _, t in ROWS))


WRITERS = {
    "ml-100k": write_u_data,
    "ml-dat": write_ratings_dat,
    "ml-csv": write_ratings_csv,
    "recbole": write_inter,
    "parquet": write_parquet,
    "csv": write_generic_csv,
    "tsv": write_generic_tsv,
}


def triples(inter: Interactions):
    return sorted(zip(inter.user.tolist(), inter.item.tolist(), inter.timestamp.tolist()))


@pytest.mark.parametrize("name", list(WRITERS))
def test_every_format_loads_the_same_interactions(tmp_path, name):
    path = WRITERS[name](tmp_path)
    inter = load_interactions(path)
    assert inter.fmt == ("csv" if name == "tsv" else name)
    assert inter.source == str(path)
    assert triples(inter) == EXPECTED
    assert inter.user.dtype == inter.item.dtype == inter.timestamp.dtype == np.int64
    assert len(inter) == len(ROWS)
    if name in ("csv", "tsv"):
        assert inter.rating is None
    else:
        assert inter.rating.dtype == np.float32
        np.testing.assert_array_equal(inter.rating, [r for *_, r, _ in ROWS])
    # file order is kept (it breaks timestamp ties later)
    assert inter.item.tolist() == [i for _, i, _, _ in ROWS]


def test_directory_input(tmp_path):
    d = tmp_path / "ml-1m"
    write_ratings_dat(d)
    _write(d / "movies.dat", "1::Toy Story (1995)::Animation|Children's|Comedy\n")
    _write(d / "users.dat", "1::F::1::10::48067\n")
    inter = load_interactions(d)
    assert inter.fmt == "ml-dat" and inter.source == str(d / "ratings.dat")
    assert triples(inter) == EXPECTED
    # the folder a zip was extracted into
    assert triples(load_interactions(tmp_path)) == EXPECTED
    # ml-20m layout: ratings.csv next to other csv files
    d20 = tmp_path / "x" / "ml-20m"
    write_ratings_csv(d20)
    _write(d20 / "movies.csv", "movieId,title,genres\n1,Toy Story (1995),Comedy\n")
    assert load_interactions(d20).fmt == "ml-csv"
    # RecBole dataset folder
    rb = tmp_path / "rb" / "ml-100k"
    write_inter(rb)
    _write(rb / "ml-100k.item", "item_id:token\tmovie_title:token_seq\n1\tToy Story\n")
    assert load_interactions(rb).fmt == "recbole"


def test_string_ids_get_codes_and_vocab(tmp_path):
    p = _write(tmp_path / "a.inter", "user_id:token\titem_id:token\ttimestamp:float\n"
               "A1\tB9\t3\nA2\tB9\t1\nA1\tB7\t2\n")
    inter = load_interactions(p)
    assert inter.user.tolist() == [0, 1, 0] and inter.user_vocab.tolist() == ["A1", "A2"]
    assert inter.item.tolist() == [0, 0, 1] and inter.item_vocab.tolist() == ["B9", "B7"]
    assert inter.timestamp.tolist() == [3, 1, 2] and inter.rating is None


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match=r"not found: .*nope\.dat"):
        load_interactions(tmp_path / "nope.dat")


@pytest.mark.parametrize("name,text", [
    ("movies.dat", "1::Toy Story (1995)::Animation\n"),
    ("notes.txt", "hello world\nsecond line\n"),
    ("movies.csv", "movieId,title,genres\n1,Toy Story,Comedy\n"),
    ("plain.csv", "1,2,3,4\n5,6,7,8\n"),
])
def test_unknown_format(tmp_path, name, text):
    p = _write(tmp_path / name, text)
    with pytest.raises(DataError) as e:
        load_interactions(p)
    msg = str(e.value)
    assert name in msg and "unknown interaction file format" in msg and "supported:" in msg
    assert "ratings.dat" in msg and "RecBole" in msg and "Parquet" in msg
    assert "\n" not in msg


def test_directory_without_interactions(tmp_path):
    _write(tmp_path / "movies.dat", "1::Toy Story::Comedy\n")
    with pytest.raises(DataError, match="no interaction file"):
        load_interactions(tmp_path)


@pytest.mark.parametrize("name,text,lineno,shown,reason", [
    ("ratings.dat", "1::10::4::100\n2::20::5::200\n3::20::5\n4::1::1::1\n", 3, "3::20::5",
     "expected 4 fields"),
    ("u.data", "1\t10\t4\t100\n2\tabc\t5\t200\n", 2, "2\\tabc\\t5\\t200", "'item' must be an integer"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,10,4.0,100\n\n2,20,five,200\n", 4,
     "2,20,five,200", "'rating' must be a number"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,10,4.0,100\n2,,5.0,200\n", 3, "2,,5.0,200",
     "'movieId' must be an integer"),
    ("x.inter", "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n1\t2\tlate\n", 3,
     "1\\t2\\tlate", "'timestamp:float' must be a number"),
    ("x.csv", "user,item\n1,2\n1,\n", 3, "1,", "item id is empty"),
    ("y.csv", "user,item,timestamp\n1,2,3\n1,2,soon\n", 3, "1,2,soon", "timestamp must be"),
])
def test_malformed_line(tmp_path, name, text, lineno, shown, reason):
    p = _write(tmp_path / name, text)
    with pytest.raises(DataError) as e:
        load_interactions(p)
    msg = str(e.value)
    assert f"{p}:{lineno}: malformed" in msg, msg
    assert shown in msg and reason in msg, msg
    assert "\n" not in msg


def test_malformed_line_found_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(movielens, "_LOCATE_CHUNK", 64)
    lines = [f"{u}::{u % 7 + 1}::3::{1000 + u}" for u in range(1, 300)]
    lines[240] = "241::1::3"
    p = _write(tmp_path / "ratings.dat", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"ratings\.dat:241: malformed ml-dat line .*'241::1::3'"):
        load_interactions(p)


@pytest.mark.parametrize("name,text", [("ratings.dat", ""), ("u.data", "\n\n"),
                                       ("ratings.csv", "userId,movieId,rating,timestamp\n"),
                                       ("e.parquet", None)])
def test_empty_file(tmp_path, name, text):
    p = tmp_path / name
    if text is None:
        pq.write_table(pa.table({"user": pa.array([], pa.int64()), "item": pa.array([], pa.int64())}), p)
    else:
        p.write_text(text)
    with pytest.raises(DataError, match=rf"{name}: file is empty"):
        load_interactions(p)


# ------------------------------------------------------------------------------------------
# sequences

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

    from runner.ranking_metrics import rank_of_target, ranking_report
    (test,) = ds.eval_batches("test", batch_size=8)
    scores = np.broadcast_to(pop, (2, ds.num_items + 1))
    # user 3, target 3 (count 1): item 2 higher, item 4 tied -> pessimistic rank 2
    # user 7, target 5 (count 0): items 2, 3, 4 higher, item 1 tied -> rank 4
    assert rank_of_target(scores, test["target"]).tolist() == [2, 4]
    # excluding history: user 3 only competes with {4, 5}; user 7 with nothing
    ranks = rank_of_target(scores, test["target"], exclude=test["history"])
    assert ranks.tolist() == [1, 0]
    assert ranking_report(ranks, ks=(1,)) == {"hr@1": 0.5, "ndcg@1": 0.5, "mrr": 0.75}
