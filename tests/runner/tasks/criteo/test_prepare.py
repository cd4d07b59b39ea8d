"""Conversion into shards (splits, records, counts, refusals), the id maps against a Python reference, the
shard reader, the generator and the ``python -m runner.prepare`` command."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runner.tasks.criteo.ids import HashIds, mix64, vocabulary
from runner.tasks.criteo.prepare import PrepareError, convert
from runner.tasks.criteo.shards import Shards
from runner.tasks.criteo.synthetic import ClickModel, CriteoSpec, bayes_auc, write_logs
from runner.tasks.criteo.tsv import FormatError, read_blocks

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    return {"days": write_logs(CriteoSpec(lines=6000, days=3, gzip=True, chunk=1000), folder / "days"),
            "one": write_logs(CriteoSpec(lines=5000, seed=3), folder / "one")}


def all_records(paths, bags=None):
    blocks = [b for p in paths for b in read_blocks(p, bags=bags)]
    return {k: np.concatenate([getattr(b, k) for b in blocks]) for k in ("label", "dense", "cat", "missing", "count")}


def test_generated_files_are_deterministic_and_carry_their_click_probabilities(logs, tmp_path):
    again = write_logs(CriteoSpec(lines=6000, days=3, gzip=True, chunk=1000), tmp_path)
    for a, b in zip(logs["days"], again):
        assert [p.name for p in logs["days"]] == ["day_0.gz", "day_1.gz", "day_2.gz"]
        assert np.array_equal(np.load(f"{a}.p.npy"), np.load(f"{b}.p.npy"))
        assert np.array_equal(all_records([a])["cat"], all_records([b])["cat"])
    rec = all_records(logs["one"])
    p = np.load(f"{logs['one'][0]}.p.npy")
    assert len(p) == len(rec["label"]) == 5000
    assert 0.15 < rec["label"].mean() < 0.4  # about the planted click rate
    assert 0.75 < bayes_auc(rec["label"], p) < 0.95  # learnable, not trivial
    assert 0.02 < rec["missing"].mean() < 0.08  # the spec's 5 percent


def test_day_split_trains_on_every_day_but_the_last_and_halves_it(logs, tmp_path):
    m = convert(logs["days"], tmp_path / "s", shard_lines=1500)
    assert m["split"] == "day" and m["splits"]["train"]["examples"] == 4000
    assert (m["splits"]["valid"]["examples"], m["splits"]["test"]["examples"]) == (1000, 1000)
    last = all_records(logs["days"][2:])
    valid, test = Shards(tmp_path / "s", "valid"), Shards(tmp_path / "s", "test")
    np.testing.assert_array_equal(valid.records(np.arange(1000))["cat"], last["cat"][:1000])
    np.testing.assert_array_equal(test.records(np.arange(1000))["cat"], last["cat"][1000:])
    train = Shards(tmp_path / "s", "train")
    assert len(train.arrays) == 3  # 4000 examples in shards of 1500
    first = all_records(logs["days"][:2])
    np.testing.assert_array_equal(train.records(np.arange(4000))["label"], first["label"])
    np.testing.assert_allclose(train.records(np.arange(4000))["dense"], first["dense"])


@pytest.mark.slow
def test_seeded_split_is_90_5_5_of_lines_and_does_not_depend_on_blocks(logs, tmp_path):
    a = convert(logs["one"], tmp_path / "a", seed=1)
    b = convert(logs["one"], tmp_path / "b", seed=1, block_bytes=4096, shard_lines=700)
    c = convert(logs["one"], tmp_path / "c", seed=2)
    n = {s: a["splits"][s]["examples"] for s in ("train", "valid", "test")}
    assert a["split"] == "seeded" and sum(n.values()) == 5000
    assert abs(n["train"] - 4500) < 100 and abs(n["valid"] - 250) < 60
    for s in ("train", "valid", "test"):
        x, y = Shards(tmp_path / "a", s), Shards(tmp_path / "b", s)
        np.testing.assert_array_equal(x.records(np.arange(len(x))), y.records(np.arange(len(y))))
    assert Shards(tmp_path / "c", "valid").records(np.arange(10)).tobytes() != \
        Shards(tmp_path / "a", "valid").records(np.arange(10)).tobytes()


def test_vocabulary_counts_the_training_split_only_against_a_python_count(logs, tmp_path):
    convert(logs["days"], tmp_path / "s", min_count=3)
    train = all_records(logs["days"][:2])
    vocab = vocabulary(tmp_path / "s", 3)
    assert (tmp_path / "s" / "vocab_min3.npz").exists()
    for j in (0, 5, 25):
        counts = {}
        for v, miss in zip(train["cat"][:, j], train["missing"][:, j]):
            if not miss:
                counts[int(v)] = counts.get(int(v), 0) + 1
        want = sorted(v for v, c in counts.items() if c >= 3)
        assert vocab.values[j].tolist() == want
    # mapping: row i+2 for the i-th kept value, 1 for rare, unseen and missing (0 pads bags only)
    last = all_records(logs["days"][2:])
    rows = vocab(last["cat"], last["count"])
    for j in (0, 5):
        index = {v: i + 2 for i, v in enumerate(vocab.values[j].tolist())}
        want = [1 if m else index.get(int(v), 1) for v, m in zip(last["cat"][:, j], last["missing"][:, j])]
        assert rows[:, j].tolist() == want
    assert rows.min() == 1 and vocab.table_rows()[0] == len(vocab.values[0]) + 2
    assert vocabulary(tmp_path / "s", 1).table_rows()[0] > vocab.table_rows()[0]  # min_count 1 keeps more


def test_hash_ids_against_a_python_splitmix(logs):
    def splitmix(x):
        m = (1 << 64) - 1
        z = (x + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    rec = all_records(logs["one"])
    rows = [10 + 7 * j for j in range(26)]
    got = HashIds(rows)(rec["cat"][:200], rec["count"][:200])
    for i in range(0, 200, 17):
        for j in range(26):
            want = 1 if rec["missing"][i, j] else 2 + splitmix(int(rec["cat"][i, j])) % (rows[j] - 2)
            assert got[i, j] == want
    assert int(mix64(np.uint64(12345))) == splitmix(12345)
    with pytest.raises(ValueError, match="26 row counts >= 3"):
        HashIds([2] * 26)


BAGS = (3,) + (1,) * 10 + (5,) + (1,) * 13 + (2,)


def test_multi_hot_logs_round_trip_through_the_converter_and_the_id_maps(tmp_path):
    """Generated bags: each line's values (the click model's, by value index) come back from the shards in
    their order, padded with row 0 past a bag's count, a missing bag one row 1; the vocabulary counts every
    value of a bag."""
    spec = CriteoSpec(lines=3000, bags=BAGS, chunk=1000)
    paths = write_logs(spec, tmp_path / "logs")
    model = ClickModel(spec)
    idx = np.concatenate([model.draw(np.random.default_rng([spec.seed, 2, 0, s]), 1000)[0] for s in (0, 1000, 2000)])
    m = convert(paths, tmp_path / "s", bags=BAGS)
    assert m["bags"] == list(BAGS)
    start = np.concatenate([[0], np.cumsum(BAGS)])
    rec = all_records(paths, BAGS)
    for j in (0, 11, 25):
        slots = idx[:, start[j]:start[j + 1]]
        np.testing.assert_array_equal(rec["count"][:, j], (slots >= 0).sum(1))
        values = np.where(slots >= 0, model.hashes[j][np.maximum(slots, 0)], 0)
        np.testing.assert_array_equal(rec["cat"][:, start[j]:start[j + 1]], values)
    assert (rec["count"][:, 11] > 1).mean() > 0.5 and rec["count"].max() == 5
    train = Shards(tmp_path / "s", "train")
    vocab = vocabulary(tmp_path / "s", 1, BAGS)
    r = train.records(np.arange(len(train)))
    seen = {int(v) for row, k in zip(r["cat"][:, start[11]:start[12]], r["count"][:, 11]) for v in row[:k]}
    assert vocab.values[11].tolist() == sorted(seen)
    batch = train.take(np.arange(200), vocab)
    index = {v: i + 2 for i, v in enumerate(vocab.values[11].tolist())}
    for i in range(200):
        k = int(r["count"][i, 11])
        want = [index[int(v)] for v in r["cat"][i, start[11]:start[11] + k]] + [0] * (5 - k) if k else [1, 0, 0, 0, 0]
        assert batch["cat"][i, start[11]:start[12]].tolist() == want


def test_bad_values_and_used_folders_are_refused(logs, tmp_path):
    convert(logs["one"], tmp_path / "done")
    with pytest.raises(PrepareError, match="already holds converted shards"):
        convert(logs["one"], tmp_path / "done")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("mine")
    with pytest.raises(PrepareError, match="busy is not empty"):
        convert(logs["one"], tmp_path / "busy")
    assert (tmp_path / "busy" / "x").read_text() == "mine"
    for kw, msg in [({"min_count": 0}, "min_count=0: must be an integer >= 1"),
                    ({"max_bad_lines": -1}, "max_bad_lines=-1: must be an integer >= 0"),
                    ({"shard_lines": 0}, "shard_lines=0: must be an integer >= 1")]:
        with pytest.raises(PrepareError, match=msg):
            convert(logs["one"], tmp_path / "new", **kw)
    for seed in (-1, 2**32):
        with pytest.raises(PrepareError, match=rf"--seed {seed}: must be an integer in 0..4294967295"):
            convert(logs["one"], tmp_path / "new", seed=seed)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(PrepareError, match="--out .*file is a file; give a new or empty output folder"):
        convert(logs["one"], tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "new").exists()
    with pytest.raises(PrepareError, match="no input files"):
        convert([], tmp_path / "new")
    with pytest.raises(PrepareError, match=r"--bag-sizes: bag sizes \[0, 1, .*26 integers in 1..255"):
        convert(logs["one"], tmp_path / "new", bags=(0,) + (1,) * 25)
    with pytest.raises(ValueError, match="days=0: must be 1..lines"):
        write_logs(CriteoSpec(days=0), tmp_path / "gen")
    with pytest.raises(ValueError, match="seed=-1: must be in 0..4294967295"):
        write_logs(CriteoSpec(seed=-1), tmp_path / "gen")


def test_a_failed_conversion_leaves_the_output_folder_as_it_was(logs, tmp_path):
    """A new folder is removed again, an empty one emptied again (no shard, no manifest), so the same command
    runs again there once the input is fixed."""
    good = Path(logs["one"][0]).read_text()
    cut = good.index("\n", len(good) - 200_000) + 1  # a bad line after blocks and shards of good ones
    bad = tmp_path / "train.txt"
    bad.write_text(good[:cut] + "x\n" + good[cut:])
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty"):
        with pytest.raises(FormatError, match=r"line \d+: 1 tab-separated fields, a Criteo line has 40"):
            convert([bad], out, block_bytes=1 << 16, shard_lines=100)
        assert not out.exists() if out.name == "new" else list(out.iterdir()) == []
        with pytest.raises(FileNotFoundError, match="no manifest.json"):
            Shards(out, "train")
        bad.write_text(good)
        assert convert([bad], out)["splits"]["train"]["examples"] > 0
        bad.write_text(good[:cut] + "x\n" + good[cut:])


def test_logs_whose_every_line_was_skipped_are_refused(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("a\tb\n" * 20)
    with pytest.raises(PrepareError, match=r"train.txt: no example: every line was bad and skipped under --max-bad-lines "
                                           r"100 \(the first: .*train.txt:1: 2 tab-separated fields"):
        convert([path], tmp_path / "s", max_bad_lines=100)
    assert not (tmp_path / "s").exists()


def test_a_skipped_file_among_good_ones_is_refused_by_name(logs, tmp_path):
    """Every line of one file bad (another file's examples would hide it): that file is named, nothing kept."""
    days = tmp_path / "days"
    days.mkdir()
    good = [days / p.name for p in logs["days"]]
    for src, dst in zip(logs["days"], good):
        dst.write_bytes(Path(src).read_bytes())
    (days / "day_1.gz").write_bytes(gzip.compress(b"a\tb\n" * 20))
    with pytest.raises(PrepareError, match=r"day_1.gz: no example: every line was bad and skipped under "
                                           r"--max-bad-lines 100 .*Leave it out, or replace it"):
        convert(good, tmp_path / "s", max_bad_lines=100)
    assert not (tmp_path / "s").exists()


def test_a_file_or_a_day_given_twice_is_refused(logs, tmp_path):
    one, (day0, day1, _) = logs["one"][0], logs["days"]
    plain = tmp_path / "day_0"
    plain.write_bytes(gzip.decompress(Path(day0).read_bytes()))
    zero_one = tmp_path / "day_01"
    zero_one.write_bytes(Path(day1).read_bytes())
    for inputs, same in [([one, one], "the same file"), ([day0, day1, plain], "day 0 twice"),
                         ([day0, day1, zero_one], "day 1 twice")]:
        with pytest.raises(PrepareError) as e:
            convert(inputs, tmp_path / "s")
        assert str(e.value) == (f"{inputs[-2] if same == 'day 1 twice' else inputs[0]} and {inputs[-1]} are {same}: "
                                f"its lines would be read twice (and a day could be trained and evaluated on). Give "
                                f"each file and each day once")
        assert not (tmp_path / "s").exists()


def test_a_folder_another_conversion_is_writing_into_is_refused_and_left_alone(logs, tmp_path):
    """Two conversions into one folder: the second is refused by the first's marker and removes nothing of it
    (a later one, or one killed, says what the marker means)."""
    out = tmp_path / "cc"
    out.mkdir()
    (out / ".converting").write_text("")
    (out / "train").mkdir()
    (out / "train" / "shard-00000.npy.partial").write_bytes(b"the first conversion's")
    for write in (lambda: convert(logs["one"], out),
                  lambda: write_logs(CriteoSpec(lines=100), out)):
        with pytest.raises(PrepareError, match=r"cc holds .converting: another (conversion|generation) is writing into "
                                               r"it, or one was killed before it finished"):
            write()
        assert (out / "train" / "shard-00000.npy.partial").read_bytes() == b"the first conversion's"
    convert(logs["one"], tmp_path / "done")
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == ["counts.npz", "manifest.json", "test", "train",
                                                                    "valid", "vocab_min1.npz"]  # no marker left


def test_generated_logs_never_replace_a_users_files(logs, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.txt").write_text("a user's own logs\n")
    with pytest.raises(ValueError, match=r"mine is not empty; give a new or empty output folder"):
        write_logs(CriteoSpec(lines=100), mine)
    assert sorted(p.name for p in mine.iterdir()) == ["train.txt"]
    assert (mine / "train.txt").read_text() == "a user's own logs\n"


@pytest.mark.parametrize("what", ["criteo", "criteo-synthetic"])
def test_a_conversion_stopped_by_sigterm_leaves_its_folder_as_found_and_says_so(logs, tmp_path, monkeypatch, capsys,
                                                                                what):
    import os
    import signal

    import runner.tasks.criteo.prepare as prepare_lib
    import runner.tasks.criteo.synthetic as synthetic_lib
    from runner.prepare import main

    stop = lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731 (midway, after files were written)
    if what == "criteo":
        monkeypatch.setattr(prepare_lib, "save_vocabulary", stop)
        argv = ["criteo", str(logs["one"][0]), "--out", str(tmp_path / "k")]
    else:
        monkeypatch.setattr(synthetic_lib.np, "save", stop)
        argv = ["criteo-synthetic", "--out", str(tmp_path / "k"), "--lines", "100"]
    before = signal.getsignal(signal.SIGTERM)
    assert main(argv) == 143
    assert capsys.readouterr().err == (f"runner.prepare: stopped (SIGTERM); --out {tmp_path / 'k'} was left as it was "
                                       f"found (new: removed; empty: emptied). Run the same command again to start "
                                       f"over\n")
    assert not (tmp_path / "k").exists()
    assert signal.getsignal(signal.SIGTERM) == before  # the handler was given back


def test_shards_read_any_order_and_map_ids(logs, tmp_path):
    convert(logs["one"], tmp_path / "s", shard_lines=500)
    train = Shards(tmp_path / "s", "train")
    order = np.random.default_rng(0).permutation(len(train))[:300]
    batch = train.take(order, HashIds([100] * 26))
    whole = train.records(np.arange(len(train)))
    np.testing.assert_array_equal(batch["label"], whole["label"][order])
    assert batch["cat"].shape == (300, 26) and batch["cat"].dtype == np.int32 and batch["cat"].max() < 100
    assert train[int(order[0])].tobytes() == whole[order[0]].tobytes()
    with pytest.raises(IndexError):
        train.records(np.array([len(train)]))


@pytest.mark.slow
def test_the_command_converts_and_refuses_with_one_message(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "runner.prepare", *a], cwd=ROOT,  # noqa: E731
                                    capture_output=True, text=True)
    gen = run("criteo-synthetic", "--out", str(tmp_path / "g"), "--lines", "3000", "--days", "2")
    assert gen.returncode == 0, gen.stderr
    ok = run("criteo", str(tmp_path / "g" / "day_0"), str(tmp_path / "g" / "day_1"), "--out", str(tmp_path / "s"))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["splits"] == {"train": 1500, "valid": 750, "test": 750}
    bags = run("criteo-synthetic", "--out", str(tmp_path / "m"), "--lines", "3000", "--bag-sizes", "3")
    assert bags.returncode == 0, bags.stderr
    flat = run("criteo", str(tmp_path / "m" / "train.txt"), "--out", str(tmp_path / "flat"))
    assert flat.returncode == 2 and "not 8 hex digits (a multi-hot feature: set the bag sizes" in flat.stderr
    multi = run("criteo", str(tmp_path / "m" / "train.txt"), "--out", str(tmp_path / "multi"), "--bag-sizes", "3")
    assert multi.returncode == 0, multi.stderr
    assert json.loads((tmp_path / "multi" / "manifest.json").read_text())["bags"] == [3] * 26
    wrong = run("criteo", str(tmp_path / "m" / "train.txt"), "--out", str(tmp_path / "w"), "--bag-sizes", "3,2")
    assert wrong.returncode == 2 and "bag sizes [3, 2]: 26 integers in 1..255" in wrong.stderr
    again = run("criteo", str(tmp_path / "g" / "day_0"), "--out", str(tmp_path / "s"))
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.strip().startswith("runner.prepare: ") and "already holds converted shards" in again.stderr
    bad = run("criteo", str(tmp_path / "nope"), "--out", str(tmp_path / "t"))
    assert bad.returncode == 2 and "nope: no such file" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("argv, needle", [
    (["criteo", "x", "--max-bad-lines", "-1"], "--max-bad-lines -1: must be an integer in 0..2,147,483,647"),
    (["criteo", "x", "--min-count", str(10**20)], f"--min-count {10**20}: must be an integer in 1..2,147,483,647"),
    (["criteo-synthetic", "--lines", "0"], "--lines 0: must be an integer in 1..2,147,483,647"),
])
def test_the_commands_counts_are_refused_by_their_flags_in_a_runs_ranges(tmp_path, capsys, argv, needle):
    from runner.prepare import main

    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and f"python -m runner.prepare: error: {needle}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_shards_are_streamed_to_disk_and_read_back_as_written(tmp_path):
    from runner.tasks.criteo.prepare import HEADER_BYTES, RECORD, _Writer

    rng = np.random.default_rng(0)
    recs = np.zeros(23, RECORD)
    recs["label"], recs["cat"] = rng.integers(0, 2, 23), rng.integers(0, 2**32, recs["cat"].shape, dtype=np.uint64)
    w = _Writer(tmp_path / "train", 10)
    for part in np.split(recs, [4, 9, 21]):  # blocks across shard boundaries
        w.add(part)
    assert len(w.shards) == 2 and len(list((tmp_path / "train").glob("*.partial"))) == 1  # the third, still open
    w.flush()
    assert [s["examples"] for s in w.shards] == [10, 10, 3] and not list((tmp_path / "train").glob("*.partial"))
    back = [np.load(tmp_path / s["file"]) for s in w.shards]
    assert all(b.dtype == RECORD for b in back)
    np.testing.assert_array_equal(np.concatenate(back), recs)
    assert (tmp_path / w.shards[2]["file"]).stat().st_size == HEADER_BYTES + 3 * RECORD.itemsize
    import hashlib  # each shard's digest in the manifest: SHA-256 of its records, recomputed from the file

    assert [s["sha256"] for s in w.shards] == [hashlib.sha256(b.tobytes()).hexdigest() for b in back]


def test_logs_differing_only_in_labels_convert_to_different_manifests(logs, tmp_path):
    """A checkpoint fingerprints a converted folder by its manifest (runner.checkpoint.data): the manifest must
    change with any record, not only with the counts of lines and examples."""
    lines = Path(logs["one"][0]).read_text().splitlines(keepends=True)[:400]
    flipped = [("0" if ln[0] == "1" else "1") + ln[1:] for ln in lines]
    (tmp_path / "a.txt").write_text("".join(lines))
    (tmp_path / "b.txt").write_text("".join(flipped))
    a, b = convert([tmp_path / "a.txt"], tmp_path / "A"), convert([tmp_path / "b.txt"], tmp_path / "B")
    strip = lambda m: {k: v for k, v in m.items() if k != "files"}  # noqa: E731 (the files' names differ)
    assert [s["examples"] for s in a["splits"]["train"]["shards"]] == [s["examples"] for s in b["splits"]["train"]["shards"]]
    assert strip(a) != strip(b)
    assert (tmp_path / "A" / "manifest.json").read_bytes() != (tmp_path / "B" / "manifest.json").read_bytes()


def test_day_files_with_any_other_file_are_refused_not_split_at_random(logs, tmp_path, capsys):
    """A stray non-day file once sent day files to the seeded 90/5/5 split (days mixed across train and
    evaluation); now the odd files are named with the fix, nothing written. Days alone, or one file, convert."""
    from runner.prepare import main

    (day0, day1, _), one = logs["days"], logs["one"][0]
    stray = tmp_path / "day_2.txt"
    stray.write_bytes(gzip.decompress(Path(logs["days"][2]).read_bytes()))
    assert main(["criteo", str(day0), str(day1), str(stray), "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == (
        f"runner.prepare: {stray}: not named day_<d> (or day_<d>.gz) while {day0}, {day1} are: day files are split by "
        f"day (the last one evaluates), any other input by a random 90/5/5 split of its lines, which would mix the "
        f"days; rename it day_<d> (day_<d>.gz if gzipped) for the day it holds, or leave it out\n")
    truth = f"{day0}.p.npy"  # what a shell glob such as day_* picks up beside generated day files
    with pytest.raises(PrepareError, match=rf"^{truth}, {one}: not named day_<d> .*rename it day_<d> .*; leave out "
                                           r"the .p.npy files \(generated logs' click probabilities"):
        convert([day0, truth, day1, one], tmp_path / "s")
    assert not (tmp_path / "s").exists()
    assert convert([day0], tmp_path / "one")["split"] == "seeded"  # a single day file: the seeded split, as before


def test_a_conversion_no_run_could_use_is_refused_and_leaves_nothing(logs, tmp_path, capsys):
    """Fewer than a run's MIN_EXAMPLES (the run's own check, too_few) in a split: refused by the command, its
    --out left as found (new: removed; empty: emptied)."""
    from runner.prepare import main

    five = tmp_path / "five.txt"
    five.write_text("".join(Path(logs["one"][0]).read_text().splitlines(keepends=True)[:5]))
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty"):
        assert main(["criteo", str(five), "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"runner.prepare: {five}: too few examples for a run to train and evaluate on ({{'train': 5, 'valid': 0, "
            f"'test': 0}}; each split needs >= 100, or a run refuses the folder); valid and test get 5% of the lines "
            f"each: give at least 3,000 lines (the split is random: 5% of 2,000 is 100 only on average)\n")
    assert not (tmp_path / "new").exists() and list((tmp_path / "empty").iterdir()) == []
    last = tmp_path / "day_1"
    last.write_text(five.read_text().splitlines(keepends=True)[0])
    assert main(["criteo", str(logs["days"][0]), str(last), "--out", str(tmp_path / "days")]) == 2
    assert capsys.readouterr().err.endswith(f"({{'train': 2000, 'valid': 0, 'test': 1}}; each split needs >= 100, or "
                                            f"a run refuses the folder); the last day, {last}, is halved into valid "
                                            f"and test: give a last day of at least 200 lines\n")
    assert not (tmp_path / "days").exists()
    assert convert([five], tmp_path / "lib")["splits"]["train"]["examples"] == 5  # the library converts as asked
    from runner.tasks.criteo import task
    from runner.tasks.criteo.prepare import MIN_EXAMPLES, too_few

    assert task.too_few is too_few and MIN_EXAMPLES == 100  # one threshold, the run's


def test_a_folder_or_an_empty_name_is_refused_by_name_not_by_a_python_repr(logs, tmp_path, capsys, monkeypatch):
    from runner.prepare import main

    monkeypatch.chdir(tmp_path)
    for given in (".", "/", str(tmp_path)):
        assert main(["criteo", given, "--out", "s"]) == 2
        assert capsys.readouterr().err == (f"runner.prepare: {given}: a folder; give the Criteo-format files in it "
                                           f"(train.txt, or day_0 ... day_23, .gz too)\n")
    assert main(["criteo", "", "--out", "s"]) == 2
    assert capsys.readouterr().err == ("runner.prepare: an input named '': an empty name; give the path of a "
                                       "Criteo-format file (train.txt, or day_0 ... day_23, .gz too)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def denied(path: Path) -> bool:
    """Whether this process is refused ``path`` after a chmod: not as root with its usual capabilities (it reads
    anything), so the permission tests skip there; under ``setpriv --inh-caps=-dac_override,-dac_read_search``
    (tests/runner/test_output_dir.py) or as another user they run."""
    try:
        path.is_file() and open(path, "rb").close()
    except PermissionError:
        return True
    return False


def test_an_input_this_user_may_not_read_is_named_with_the_fix(logs, tmp_path, capsys):
    """Not ``[Errno 13] Permission denied``, nor a side file the user never gave, nor "not an array"."""
    from runner.prepare import main

    shut, locked, side = tmp_path / "shut", tmp_path / "locked", tmp_path / "side"
    for folder in (shut, locked, side):
        folder.mkdir()
        (folder / "train.txt").write_bytes(Path(logs["one"][0]).read_bytes())
    (side / "train.txt.p.npy").write_bytes(Path(f"{logs['one'][0]}.p.npy").read_bytes())
    (shut / "train.txt").chmod(0)
    (side / "train.txt.p.npy").chmod(0)
    locked.chmod(0)
    try:
        if not denied(shut / "train.txt"):
            pytest.skip("this user reads any file (root with its capabilities): no way to be refused one")
        expect = {shut / "train.txt": "permission denied, this user may not read the file; let it (chmod +r "
                                      f"{shut / 'train.txt'}, as its owner), or run as a user who may read it",
                  locked / "train.txt": "permission denied, a folder above it may not be searched by this user (so "
                                        "not even whether the file exists is known); let it (chmod +x on that "
                                        "folder, as its owner), or run as a user who may read the file",
                  side / "train.txt": None}
        for path, why in expect.items():
            assert main(["criteo", str(path), "--out", str(tmp_path / "s")]) == 2
            err = capsys.readouterr().err
            if why:
                assert err == f"runner.prepare: {path}: {why}\n"
            else:
                assert err.startswith(f"runner.prepare: {path}.p.npy: cannot be read (permission denied). A file of "
                                      f"that name is the true click probability") and "not an array" not in err
                assert err.endswith(f": let this user read it (chmod +r {path}.p.npy, as its owner), run as a user "
                                    f"who may, or remove it (the logs then convert without bayes/ metrics)\n")
            assert not (tmp_path / "s").exists()
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("out", ["", " "])
def test_an_empty_out_is_refused_not_taken_as_the_current_folder(logs, tmp_path, capsys, monkeypatch, out):
    from runner.prepare import main

    monkeypatch.chdir(tmp_path)  # empty: an --out of "" would have converted into it
    with pytest.raises(SystemExit) as e:
        main(["criteo", str(logs["one"][0]), "--out", out])
    assert e.value.code == 2
    assert f"python -m runner.prepare: error: --out {out!r}: an empty name; give a new or empty output folder" in \
        capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PrepareError, match=rf"--out {out!r}: an empty name"):
        convert(logs["one"], out)


def test_a_stray_carriage_return_is_one_bad_line_and_leaves_the_split_of_every_other_line(logs, tmp_path, capsys):
    """A "\\r" inside two lines of a "\\r\\n" copy of a log: two bad lines (pyarrow alone read four, and numbered
    every later line one too high, which moved it to another split). The shards are those of the "\\n" log with
    the same two lines bad another way, byte for byte."""
    from runner.prepare import main

    rows = Path(logs["one"][0]).read_text().splitlines()
    (tmp_path / "cr").mkdir()
    (tmp_path / "tab").mkdir()
    cr, tab = list(rows), list(rows)
    for i in (99, 2999):
        cr[i] = cr[i].replace("\t", "\t\r", 1)  # a "\r" opening int_1 of line 100 (and 3000)
        tab[i] = tab[i] + "\t"
    (tmp_path / "cr" / "train.txt").write_bytes("".join(r + "\r\n" for r in cr).encode())
    (tmp_path / "tab" / "train.txt").write_text("".join(r + "\n" for r in tab))
    for name in ("cr", "tab"):
        assert main(["criteo", str(tmp_path / name / "train.txt"), "--out", str(tmp_path / f"{name}.s"),
                     "--max-bad-lines", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["bad_lines"] == 2
    m = json.loads((tmp_path / "cr.s" / "manifest.json").read_text())
    assert m["files"][0]["first_bad"].startswith(f"{tmp_path / 'cr' / 'train.txt'}:100: a carriage return (\\r) "
                                                 f"inside the line, in integer feature int_1")
    for split in ("train", "valid", "test"):
        a, b = Shards(tmp_path / "cr.s", split), Shards(tmp_path / "tab.s", split)
        assert len(a) == len(b) and a.records(np.arange(len(a))).tobytes() == b.records(np.arange(len(b))).tobytes()
    assert main(["criteo", str(tmp_path / "cr" / "train.txt"), "--out", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith(f"runner.prepare: {tmp_path / 'cr' / 'train.txt'}, line 100: a carriage "
                                              f"return (\\r) inside the line, in integer feature int_1; ")


def test_generated_logs_that_cannot_fit_are_refused_before_a_byte_is_written(tmp_path, capsys, monkeypatch):
    """criteo-synthetic --lines 2,147,483,647 ran for hours towards about 500 GB before a full disk stopped it; a
    lower bound of the files' size (230 bytes a line, 80 gzipped) against the free space of --out's file system
    refuses it at once, and so does a run generating its logs (data.lines) into data.cache."""
    import shutil as shutil_module

    from omegaconf import OmegaConf

    from runner.errors import PreflightError
    from runner.prepare import main
    from runner.tasks.criteo import synthetic
    from runner.tasks.criteo.task import generated

    free = {"bytes": 10**9}
    monkeypatch.setattr(synthetic.shutil, "disk_usage", lambda p: shutil_module._ntuple_diskusage(2 * 10**9, 0,
                                                                                                   free["bytes"]))
    out = tmp_path / "new" / "logs"  # not made yet: the nearest existing folder's file system is the one counted
    assert main(["criteo-synthetic", "--out", str(out), "--lines", "5000000"]) == 2
    assert capsys.readouterr().err == (
        f"runner.prepare: --lines 5000000: 5,000,000 generated lines take at least 1.1 GB uncompressed, and the file "
        f"system of {tmp_path} has 1.0 GB free; give fewer --lines, add --gzip (about a third of the size), or an "
        f"--out on a file system with room. Nothing was written\n")
    assert not (tmp_path / "new").exists()
    assert synthetic.room_problem(CriteoSpec(lines=5_000_000, gzip=True), out) is None  # 0.4 GB gzipped: it fits
    free["bytes"] = 10**8
    assert main(["criteo-synthetic", "--out", str(tmp_path / "gz"), "--lines", "5000000", "--gzip"]) == 2
    assert "5,000,000 generated lines take at least 0.4 GB gzipped" in capsys.readouterr().err
    data = OmegaConf.create({"lines": 5_000_000, "days": 1, "seed": 0, "bags": None, "cache": str(tmp_path / "c")})
    with pytest.raises(PreflightError, match=r"^data.lines=5000000: 5,000,000 generated lines take at least 1.1 GB "
                                             r"uncompressed, and the file system of .* has 0.1 GB free; lower "
                                             r"data.lines, or set data.cache to a folder on a file system with room$"):
        generated(OmegaConf.create({"data": data}))
