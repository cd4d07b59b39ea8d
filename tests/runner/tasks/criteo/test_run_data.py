"""What a run does with Criteo data that is damaged or named oddly: a shard damaged in place, a manifest of
the wrong shape, a broken click-probability file beside raw logs, a data.cache it cannot write, one label
only in an evaluation, an empty data.path, ``~`` in data.path and data.cache, a converted folder it cannot
write. Each is one message naming the value and the fix (or, for the read-only folder, a run as asked)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runner.core.feed import Feed
from runner.errors import PreflightError, TrainingError
from runner.tasks import make_task
from runner.tasks.criteo.prepare import PrepareError, convert
from runner.tasks.criteo.synthetic import CriteoSpec, write_logs
from runner.tasks.criteo.task import CONVERT_AGAIN
from tests.runner.support import compose_config

ROOT = Path(__file__).resolve().parents[4]
BASE = ["data=criteo", "model=dlrm", "logger=none"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Generated logs (train.txt and its train.txt.p.npy) and their conversion."""
    root = tmp_path_factory.mktemp("made")
    (log,) = write_logs(CriteoSpec(lines=3000), root / "logs")
    convert([log], root / "conv")
    return log, root / "conv"


def task_of(*overrides):
    return make_task(compose_config([*BASE, *overrides], tiny=False))


def copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def damage(folder: Path, split: str, field: str, value, index=slice(None)) -> Path:
    shard = folder / split / "shard-00000.npy"
    a = np.load(shard, mmap_mode="r+")
    if field == "count":
        a[field][index, 3] = value
    elif field == "dense":
        a[field][index, 5] = value
    else:
        a[field][index] = value
    a.flush()
    del a
    return shard


@pytest.mark.parametrize("field, value, what", [("label", 5, "the label 5, not 0 or 1"),
                                                ("count", 2, "more values than a feature's bag"),
                                                ("dense", np.inf, "an integer feature not finite or below 0"),
                                                ("dense", -1.0, "an integer feature not finite or below 0"),
                                                ("p", 2.0, "a click probability outside [0, 1]")])
def test_a_shard_damaged_in_place_stops_the_run_naming_it(made, tmp_path, field, value, what):
    """Same size, other contents: the training batch that reads a damaged record stops the run (through the
    feed that reads ahead too); a damaged evaluation shard is refused before anything compiles."""
    folder = copy(made[1], tmp_path / "conv")
    shard = damage(folder, "train", field, value)
    task = task_of(f"data.path={folder}")
    want = f"{shard}: record {{}} holds {what}, which no conversion writes: the converted folder is damaged: " \
           f"{CONVERT_AGAIN}"
    with pytest.raises(TrainingError) as e:
        task.batch(0, 64)
    first = int(str(e.value).split("record ")[1].split(" ")[0].replace(",", ""))
    assert str(e.value) == want.format(f"{first:,}")
    feed = Feed(task, 0, 10, 64)
    try:
        with pytest.raises(TrainingError, match="the converted folder is damaged"):
            next(feed)
    finally:
        feed.close()
    held_out = damage(copy(made[1], tmp_path / "held_out"), "valid", field, value, index=7)
    with pytest.raises(PreflightError) as e:
        task_of(f"data.path={tmp_path / 'held_out'}")
    assert str(e.value) == f"{held_out}: record 7 holds {what}, which no conversion writes: the converted folder " \
                           f"is damaged: {CONVERT_AGAIN}"


def test_a_damaged_run_conversion_names_its_own_fix(made, tmp_path):
    """A run's own conversion under data.cache: remove it and the run converts the logs again."""
    cache = tmp_path / "cache"
    task = task_of(f"data.path={made[0]}", f"data.cache={cache}")
    damage(task.folder, "train", "label", 3)
    with pytest.raises(TrainingError, match=rf"the converted folder is damaged: remove {task.folder} and the run "
                                            rf"converts {made[0]} again$"):
        task_of(f"data.path={made[0]}", f"data.cache={cache}").batch(0, 64)


MANIFESTS = {"empty": "", "a list": "[]", "bags null": None, "splits missing": None, "a folder": None}


@pytest.mark.parametrize("case", MANIFESTS)
@pytest.mark.parametrize("skip", [[], ["data.max_bad_lines=1"]])
def test_a_manifest_of_the_wrong_shape_is_one_message(made, tmp_path, case, skip):
    folder = copy(made[1], tmp_path / "conv")
    manifest = folder / "manifest.json"
    m = json.loads(manifest.read_text())
    if case == "a folder":
        manifest.unlink()
        manifest.mkdir()
    elif MANIFESTS[case] is not None:
        manifest.write_text(MANIFESTS[case])
    else:
        m.pop("splits") if case == "splits missing" else m.update(bags=None)
        manifest.write_text(json.dumps(m))
    with pytest.raises(PreflightError) as e:
        task_of(f"data.path={folder}", *skip)
    assert str(e.value).startswith(f"{folder}: the converted logs cannot be read (")
    assert str(e.value).endswith(f"the folder is damaged or incomplete: {CONVERT_AGAIN}")
    if case in ("bags null", "splits missing"):
        assert f"{manifest}: {case.split()[0]} not as the converter writes it" in str(e.value)


@pytest.mark.parametrize("content", [b"garbage\n", "2-d"])
def test_a_damaged_click_probability_file_beside_raw_logs_is_one_message(made, tmp_path, content):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(made[0], logs / "train.txt")
    truth = logs / "train.txt.p.npy"
    if content == "2-d":
        np.save(truth, np.zeros((3000, 2), np.float32))
    else:
        truth.write_bytes(content)
    with pytest.raises(PreflightError) as e:
        task_of(f"data.path={logs}", f"data.cache={tmp_path / 'cache'}")
    problem = "2-d float32, not 1-d floats" if content == "2-d" else "ValueError: "
    assert str(e.value).startswith(f"{truth}: not an array of click probabilities ({problem}")
    assert str(e.value).endswith("the true click probability of each line that generated logs come with (python -m "
                                 "runner.prepare criteo-synthetic), read only for the Bayes-optimal AUC: remove it "
                                 "(the logs then convert without bayes/ metrics) or generate the logs again")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    with pytest.raises(PrepareError) as converting:  # python -m runner.prepare criteo says the same
        convert([logs / "train.txt"], tmp_path / "shards")
    assert str(converting.value) == str(e.value) and not (tmp_path / "shards").exists()


def test_a_data_cache_that_cannot_be_written_is_one_message(made, tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    in_the_way = f"(a file stands where a folder is needed: {afile}); move that file away, or set data.cache to " \
                 f"another folder"
    with pytest.raises(PreflightError) as e:
        task_of("data.lines=3000", f"data.cache={afile}")
    assert str(e.value).startswith(f"generating Criteo logs (data.path unset) into {afile}/generated-")
    assert str(e.value).endswith(f" failed {in_the_way}")
    with pytest.raises(PreflightError) as e:
        task_of(f"data.path={made[0]}", f"data.cache={afile}")
    assert str(e.value).startswith(f"data.path={made[0]}: converting the logs into {afile}/logs-")
    assert str(e.value).endswith(f" failed {in_the_way}")

    def refused(*args, **kwargs):  # a folder this user may not write (root may write any, so it is simulated)
        raise PermissionError(13, "Permission denied", str(tmp_path / "locked"))

    monkeypatch.setattr("runner.tasks.criteo.logs.tempfile.mkdtemp", refused)
    with pytest.raises(PreflightError) as e:
        task_of("data.lines=3000", f"data.cache={tmp_path / 'locked'}")
    assert str(e.value).endswith(f"failed (permission denied: {tmp_path / 'locked'}); let this user write there (as "
                                 f"its owner: chmod u+w), or set data.cache to a folder it may write")


def test_a_conversion_refused_while_generating_logs_is_one_message(tmp_path, monkeypatch):
    """A ``PrepareError`` from converting the generated logs, other than a disk's, was not caught: the run ended in
    a traceback. It is now the run's refusal (``PreflightError``, said as one line), and the cache keeps no half
    folder."""
    def refuses(*args, **kwargs):
        raise PrepareError("too few examples for a run to train and evaluate on; give more lines")

    monkeypatch.setattr("runner.tasks.criteo.task.convert", refuses)
    cache = tmp_path / "cache"
    with pytest.raises(PreflightError) as e:
        task_of("data.lines=3000", f"data.cache={cache}")
    assert str(e.value).startswith(f"generating Criteo logs (data.path unset) into {cache}/generated-")
    assert str(e.value).endswith(": too few examples for a run to train and evaluate on; give more lines")
    assert "\n" not in str(e.value)
    assert not cache.exists() or list(cache.iterdir()) == []  # the temporary folder of the attempt was removed


def test_an_evaluation_of_one_label_is_refused_before_training(made, tmp_path):
    log = tmp_path / "clicks_none.txt"
    log.write_text("".join("0" + line[1:] for line in made[0].read_text().splitlines(keepends=True)))
    folder = tmp_path / "zero"
    convert([log], folder)
    valid = len(np.load(folder / "valid" / "shard-00000.npy"))
    with pytest.raises(PreflightError) as e:
        task_of(f"data.path={folder}")
    assert str(e.value) == (f"{folder}: every one of the valid split's {valid:,} examples has label 0 (no click), so "
                            f"its AUC is undefined: give logs that hold both clicks and non-clicks")
    labels = np.load(made[1] / "valid" / "shard-00000.npy")["label"]
    other = int(np.flatnonzero(labels != labels[0])[0])
    with pytest.raises(PreflightError) as e:
        task_of(f"data.path={made[1]}", "data.eval_examples=1")
    assert str(e.value) == (f"{made[1]}: the valid split's first 1 examples (data.eval_examples=1) all have label "
                            f"{labels[0]} ({'no click' if labels[0] == 0 else 'every one a click'}), so its AUC is "
                            f"undefined: raise data.eval_examples to {other + 1} or more, or unset it (all of the "
                            f"split)")
    assert task_of(f"data.path={made[1]}", f"data.eval_examples={other + 1}").evaluated("valid") == other + 1


@pytest.mark.parametrize("key, fix", [("path", "give the Criteo logs or a converted folder, or leave data.path out "
                                               "(null) to train on generated logs"),
                                      ("cache", "give a folder for the run's conversions, or leave data.cache out "
                                                "(null: outputs/criteo_data)")])
@pytest.mark.slow
def test_an_empty_data_path_or_cache_is_refused(tmp_path, key, fix):
    """As an unset shell variable gives them (data.path=$LOGS): refused, not read as unset."""
    message = f"data.{key} is empty (data.{key}= with nothing after it, as from an unset shell variable): {fix}"
    with pytest.raises(PreflightError) as e:
        task_of(f"data.{key}=")
    assert str(e.value) == message
    proc = subprocess.run([sys.executable, "-m", "runner", "debug=tiny_criteo", "logger=none", f"data.{key}=",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {message}"], proc.stderr[-1500:]


def test_a_home_folder_in_data_path_and_data_cache_is_expanded(made, tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    copy(made[1], home / "conv")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert task_of("data.path='~/conv'").folder == home / "conv"
    with pytest.raises(PreflightError, match="data.max_bad_lines=1 applies when a run converts raw logs"):
        task_of("data.path='~/conv'", "data.max_bad_lines=1")
    assert task_of(f"data.path={made[0]}", "data.cache='~/cc'").folder.parent == home / "cc"
    assert task_of("data.lines=3000", "data.cache='~/cc'").folder.parent == home / "cc"
    assert os.listdir(work) == []  # no folder named ~ where the run started


def test_processes_deriving_one_vocabulary_at_once_leave_it_whole(made, tmp_path):
    """They wrote one shared .partial name: their writes mixed, and a rename found the other's file gone."""
    import threading

    from runner.tasks.criteo.ids import derive_vocabulary, save_vocabulary

    folder = copy(made[1], tmp_path / "conv")
    errors, start = [], threading.Barrier(6)

    def save():
        start.wait()
        try:
            for _ in range(5):
                save_vocabulary(folder, 2)
        except Exception as e:  # noqa: BLE001 - what the test looks for
            errors.append(e)

    workers = [threading.Thread(target=save) for _ in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == [] and not [p for p in os.listdir(folder) if p.endswith(".partial")]
    want = derive_vocabulary(folder, 2)
    with np.load(folder / "vocab_min2.npz") as z:
        assert sorted(z.files) == sorted(want) and all(np.array_equal(z[k], want[k]) for k in want)


def test_a_converted_folder_that_cannot_be_written_still_trains_with_a_new_min_count(made, tmp_path, monkeypatch):
    """data.min_count=3 on a read-only folder: its vocabulary derived for the run (the rows it would have saved),
    the folder neither written nor called damaged."""
    writable = copy(made[1], tmp_path / "writable")
    want = task_of(f"data.path={writable}", "data.min_count=3").ids
    assert (writable / "vocab_min3.npz").exists()

    def refused(folder, min_count, values=None):
        raise PermissionError(13, "Permission denied", str(Path(folder) / f"vocab_min{min_count}.npz.partial"))

    monkeypatch.setattr("runner.tasks.criteo.ids.save_vocabulary", refused)
    before = sorted(os.listdir(made[1]))
    got = task_of(f"data.path={made[1]}", "data.min_count=3").ids
    assert sorted(os.listdir(made[1])) == before
    assert got.table_rows() == want.table_rows() and got.table_rows() != task_of(f"data.path={made[1]}").ids.table_rows()
    assert all(np.array_equal(a, b) for a, b in zip(got.values, want.values))


def test_a_min_count_other_than_the_conversions_is_noted(made, tmp_path):
    """python -m runner.prepare criteo --min-count 3 saves that vocabulary; a run keeps its own data.min_count
    (the vocabulary is derived for any threshold), and says which it uses when they differ."""
    folder = tmp_path / "mc3"
    convert([made[0]], folder, min_count=3)
    notes = task_of(f"data.path={folder}", "data.ids=vocab").warnings()
    assert notes == [f"note: {folder} was converted with --min-count 3, and this run maps ids with data.min_count=1 "
                     f"(the vocabulary is derived from the counts for any threshold): set data.min_count=3 for the "
                     f"conversion's"]
    assert task_of(f"data.path={folder}", "data.ids=vocab", "data.min_count=3").warnings() == []
    assert task_of(f"data.path={folder}", "data.ids=hash").warnings() == []  # hashed ids use no vocabulary
