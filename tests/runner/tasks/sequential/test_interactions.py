"""Interaction loaders: every supported format, and their errors."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner.tasks.sequential import interactions
from runner.tasks.sequential.interactions import DataError, Interactions, load_interactions

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


def test_date_times_with_fractions_of_a_second_are_floored_to_seconds(tmp_path):
    """A CSV of ISO date-times with fractions (pyarrow reads them as timestamp[ns]) and a Parquet timestamp[us]
    column: each floored to int64 seconds, as a float timestamp is, before 1970 too."""
    csv = _write(tmp_path / "events.csv", "user,item,timestamp\n1,16,2020-01-01T00:00:00.5\n"
                 "1,17,2020-01-01T00:00:01.999\n2,16,1969-12-31T23:59:59.5\n")
    assert load_interactions(csv).timestamp.tolist() == [1577836800, 1577836801, -1]
    t = pa.array([1_500_000, 2_999_999, -1], pa.timestamp("us"))
    pq.write_table(pa.table({"user": [1, 1, 2], "item": [5, 6, 5], "timestamp": t}), tmp_path / "e.parquet")
    assert load_interactions(tmp_path / "e.parquet").timestamp.tolist() == [1, 2, -1]


def test_timestamps_written_as_text_are_read_as_numbers_or_iso_dates(tmp_path):
    """A Parquet string column of numbers or of ISO 8601 dates (with or without a zone) is read as such; mixed
    numbers and dates, and other date layouts, are refused naming the row and what is read."""
    def ts(values):
        pq.write_table(pa.table({"user": [1] * len(values), "item": list(range(len(values))),
                                 "timestamp": values}), tmp_path / "t.parquet")
        return load_interactions(tmp_path / "t.parquet").timestamp.tolist()

    assert ts(["1000", " 1001.5", "7"]) == [1000, 1001, 7]
    assert ts(["2020-01-01", "2020-01-01T00:00:01", "2020-01-01 00:01:00"]) == [1577836800, 1577836801, 1577836860]
    assert ts(["2020-01-01T00:00:00Z", "2020-01-01T01:00:00+01:00"]) == [1577836800, 1577836800]
    with pytest.raises(DataError, match=r"row 2: timestamp column mixes numbers and dates \(the first row holds "
                                        r"'1000', this one '2020-01-01'\): write every timestamp one way"):
        ts(["1000", "2020-01-01"])
    with pytest.raises(DataError, match=r"row 2: timestamp must be a number \(seconds\) or an ISO 8601 date/time "
                                        r"such as 2020-01-31 or 2020-01-31T12:00:00, got '01/02/2020'"):
        ts(["2020-01-01", "01/02/2020"])


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
    monkeypatch.setattr(interactions, "_LOCATE_CHUNK", 64)
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


# ---- exact duplicates (data.duplicates) ------------------------------------------------------------------

def _inter(u, i, t, has_timestamp=True):
    u, i, t = (np.asarray(x, np.int64) for x in (u, i, t))
    return Interactions(user=u, item=i, timestamp=t, rating=np.arange(u.size, dtype=np.float32), source="x",
                        fmt="csv", has_timestamp=has_timestamp)


def test_exact_duplicates_are_the_rows_that_repeat_an_earlier_row():
    """Against a plain loop over the rows with a set of the (user, item, timestamp) seen so far."""
    rng = np.random.default_rng(0)
    n = 5000
    inter = _inter(rng.integers(0, 20, n), rng.integers(0, 30, n), rng.integers(0, 5, n))
    seen, expected = set(), []
    for r, key in enumerate(zip(inter.user.tolist(), inter.item.tolist(), inter.timestamp.tolist())):
        if key in seen:
            expected.append(r)
        seen.add(key)
    assert 0 < len(expected) < n
    np.testing.assert_array_equal(interactions.duplicate_rows(inter), expected)
    kept, dropped = interactions.drop_duplicates(inter)
    np.testing.assert_array_equal(dropped, expected)
    keep = np.setdiff1d(np.arange(n), expected)
    for field in ("user", "item", "timestamp", "rating"):  # the first of each kept, in file order
        np.testing.assert_array_equal(getattr(kept, field), getattr(inter, field)[keep])


def test_same_user_and_item_at_another_time_is_no_duplicate():
    inter = _inter([1, 1, 1, 2], [5, 5, 5, 5], [10, 11, 10, 10])
    np.testing.assert_array_equal(interactions.duplicate_rows(inter), [2])
    none = _inter([1, 1, 2], [5, 6, 5], [0, 0, 0])
    assert interactions.duplicate_rows(none).size == 0 and interactions.drop_duplicates(none)[0] is none


def test_a_file_without_timestamps_keeps_its_repeats(tmp_path):
    """Without a timestamp column the file's order is the sequence: a repeated (user, item) is a repeat."""
    path = _write(tmp_path / "events.csv", "user,item\n1,5\n1,6\n1,5\n")
    inter = load_interactions(path)
    assert not inter.has_timestamp and interactions.duplicate_rows(inter).size == 0
    assert load_interactions(write_u_data(tmp_path / "ml")).has_timestamp


def test_unsigned_timestamps_past_int64_are_refused_not_wrapped(tmp_path):
    """A uint64 timestamp column (Parquet) is read as int64 seconds; a value of 2**63 or more would wrap to a
    negative time and reorder the user's history silently, so it is refused naming its row."""
    def ts(values):
        pq.write_table(pa.table({"user": [1] * len(values), "item": list(range(len(values))),
                                 "timestamp": pa.array(values, pa.uint64())}), tmp_path / "u.parquet")
        return load_interactions(tmp_path / "u.parquet").timestamp.tolist()

    assert ts([5, 2**63 - 1, 7]) == [5, 2**63 - 1, 7]
    with pytest.raises(DataError, match=r"row 2: timestamp must be a finite int64-range number, got "
                                        r"9223372036854775808"):
        ts([5, 2**63, 7])
