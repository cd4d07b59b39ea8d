"""A run on raw Criteo logs (``data.path=train.txt``, a folder of day files, a glob): converted once into
``data.cache`` and reused, a changed file converted again; bad input refused by the run's preflight with one
message naming the file, the line and the fix; ``data.max_bad_lines`` skips and counts; the settings that do
not fit the data refused by name."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runner.errors import PreflightError
from runner.tasks import make_task
from runner.tasks.criteo.prepare import convert
from runner.tasks.criteo.shards import Shards
from runner.tasks.criteo.synthetic import CriteoSpec, write_logs
from tests.runner.support import compose_config

ROOT = Path(__file__).resolve().parents[4]
BASE = ["data=criteo", "model=dlrm", "logger=none"]


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """The 3,000 lines of a generated train.txt (with a newline each)."""
    (log,) = write_logs(CriteoSpec(lines=3000), tmp_path_factory.mktemp("gen") / "logs")
    return log.read_text().splitlines(keepends=True)


def task_of(cache, path, *overrides):
    return make_task(compose_config([*BASE, f"data.cache={cache}", f"data.path={path}", *overrides], tiny=False))


def folders(cache: Path) -> list[str]:
    """What the cache holds: conversions, and any temporary folder a conversion left behind (hidden)."""
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_raw_logs_are_converted_once_into_the_cache_and_reused(lines, tmp_path):
    """The run's conversion is python -m runner.prepare criteo's (same shards); a second build, by the file or
    by its folder, reuses it; a changed file gets a new conversion."""
    from runner.build import build

    log = tmp_path / "logs" / "train.txt"
    log.parent.mkdir()
    log.write_text("".join(lines))
    cache = tmp_path / "cache"
    first = task_of(cache, log)
    (name,) = folders(cache)
    assert first.folder == cache / name and name.startswith("logs-")
    manifest = json.loads((first.folder / "manifest.json").read_text())
    assert [f["file"] for f in manifest["files"]] == [str(log)] and manifest["bad_lines"] == 0
    want = convert([log], tmp_path / "ahead")
    assert manifest["splits"] == want["splits"]
    for split in ("train", "valid"):
        a, b = Shards(first.folder, split), Shards(tmp_path / "ahead", split)
        assert a.records(np.arange(len(a))).tobytes() == b.records(np.arange(len(b))).tobytes()
    assert first.warnings() == [] and first.data_metrics() == {"data/bad_lines": 0}
    written = os.stat(first.folder / "manifest.json").st_mtime_ns
    _, again, _ = build(compose_config([*BASE, f"data.cache={cache}", f"data.path={log.parent}",
                                        "trainer.batch_size=64", "model.emb_width=4"], tiny=False))
    assert again.folder == first.folder and folders(cache) == [name]
    assert os.stat(again.folder / "manifest.json").st_mtime_ns == written  # reused, not converted again
    with open(log, "a") as f:
        f.write(lines[0])
    changed = task_of(cache, log)
    assert changed.folder != first.folder and len(folders(cache)) == 2
    assert changed.num_train_examples + len(changed.splits["valid"]) + len(changed.splits["test"]) == 3001


def test_a_folder_of_day_files_and_a_glob_are_split_by_day(tmp_path):
    days = write_logs(CriteoSpec(lines=3000, days=3, gzip=True), tmp_path / "tb")
    cache = tmp_path / "cache"
    folder = task_of(cache, tmp_path / "tb")
    m = folder.splits["train"].manifest
    assert m["split"] == "day" and [f["file"] for f in m["files"]] == [str(p) for p in days]
    assert (folder.num_train_examples, len(folder.splits["valid"])) == (2000, 500)
    some = task_of(cache, tmp_path / "tb" / "day_?.gz", "data.logs=terabyte")
    assert some.folder == folder.folder  # the glob names the same 3 files: the same conversion
    (tmp_path / "tb" / "day_1").write_text("")
    with pytest.raises(PreflightError, match=r"a day twice, plain and gzipped \(.*day_1, .*day_1.gz\)"):
        task_of(cache, tmp_path / "tb")


BAD_LINE = "fix or remove the line, or set data.max_bad_lines=N to skip and count up to N bad lines per file"
FIELDS = "2 tab-separated fields, a Criteo line has 40 (the label, 13 integer and 26 categorical features)"


def bad_file(lines, folder: Path, case: str) -> tuple[Path, str]:
    """A small log with one bad thing in it, and the start of the message a run refuses it with."""
    folder.mkdir()
    name = folder / ("train.txt.gz" if case == "truncated gz" else "train.txt")
    good = lines[:40]
    if case == "empty file":
        name.write_text("")
        return name, f"{name}: the file is empty; a Criteo-format file has one example per line: copy it again"
    if case == "truncated gz":
        data = gzip.compress("".join(lines).encode())
        name.write_bytes(data[: len(data) // 2])
        return name, f"{name}: the gzip stream ends or breaks within its first "  # 40 lines: the first block
    fields = good[7].rstrip("\n").split("\t")
    bad, why = {"fields": ("1\tx\n", FIELDS),
                "hex": ("\t".join(fields[:14] + ["0000000g"] + fields[15:]) + "\n",
                        "categorical feature cat_1 is '0000000g', not 8 hex digits"),
                "label": ("\t".join(["yes"] + fields[1:]) + "\n", "the label 'yes' is not 0 or 1")}[case]
    name.write_text("".join(good[:7] + [bad] + good[7:]))
    return name, f"{name}, line 8: {why}; {BAD_LINE}"


@pytest.mark.parametrize("case", ["fields", "hex", "label", "empty file", "truncated gz"])
def test_bad_input_refuses_the_run_by_one_message(lines, tmp_path, case):
    """Through the run's preflight (build, before anything compiles): one message naming the file, the line,
    what is wrong and the fix; no conversion and no half folder is left in the cache."""
    from runner.build import build

    path, message = bad_file(lines, tmp_path / "logs", case)
    with pytest.raises(PreflightError) as e:
        build(compose_config([*BASE, f"data.cache={tmp_path / 'cache'}", f"data.path={path}"], tiny=False))
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value) and "--max-bad-lines" not in str(e.value)
    if case == "truncated gz":
        assert "the file is truncated or damaged: download or copy it again" in str(e.value)
    assert folders(tmp_path / "cache") == []


def test_max_bad_lines_skips_and_counts_them(lines, tmp_path):
    """data.max_bad_lines=2: two bad lines skipped and counted (data/bad_lines, which the run's summary carries)
    and named in the note the run prints; one more than allowed is refused by its number. A whole run that
    reports them: test_task.py's test_a_short_run_beats_a_constant_predictor[dlrm]."""
    log = tmp_path / "logs" / "train.txt"
    log.parent.mkdir()
    log.write_text("".join(lines[:1500] + ["2" + "\t" * 39 + "\n"] + lines[1500:] + ["1\tx" + "\t" * 38 + "\n"]))
    cache = tmp_path / "cache"
    with pytest.raises(PreflightError, match=r"train.txt, line 3002: integer feature int_1 is 'x', not an integer; it "
                                             r"is bad line 2 of the file, over data.max_bad_lines=1: fix or remove"):
        task_of(cache, log, "data.max_bad_lines=1")
    task = task_of(cache, log, "data.max_bad_lines=2")
    assert task.data_metrics() == {"data/bad_lines": 2}
    assert task.num_train_examples + len(task.splits["valid"]) + len(task.splits["test"]) == 3000
    (note,) = task.warnings()
    assert note.startswith(f"note: the Criteo logs of data.path={log} were converted into {cache}/logs-")
    assert "skipping 2 bad input lines (data.max_bad_lines=2 per file; counted in data/bad_lines); the first: " \
           f"{log}:1501: the label '2' is not 0 or 1" in note


def test_settings_that_do_not_fit_the_data_are_refused_by_name(lines, tmp_path):
    """data.max_bad_lines applies to raw logs only: a converted folder settled its bad lines at conversion,
    generated logs have none. The Terabyte preset refuses a single file before converting it."""
    log = tmp_path / "train.txt"
    log.write_text("".join(lines))
    convert([log], tmp_path / "ahead")
    cache = tmp_path / "cache"
    with pytest.raises(PreflightError, match=r"data.max_bad_lines=5 applies when a run converts raw logs, but "
                                             r"data.path=.*ahead is a converted folder, whose bad lines were settled at "
                                             r"conversion \(--max-bad-lines 0: 0 skipped\); unset data.max_bad_lines"):
        task_of(cache, tmp_path / "ahead", "data.max_bad_lines=5")
    with pytest.raises(PreflightError, match=r"data.bags=\[2\] describes generated or raw logs, but "
                                             r"data.path=.*ahead is a converted folder, whose bags were fixed at "
                                             r"conversion"):
        task_of(cache, tmp_path / "ahead", "data.bags=[2]")
    with pytest.raises(PreflightError, match=r"data.max_bad_lines=5 applies to raw logs in data.path, and data.path "
                                             r"is unset: generated logs have no bad lines"):
        make_task(compose_config([*BASE, f"data.cache={cache}", "data.max_bad_lines=5"], tiny=False))
    with pytest.raises(PreflightError, match=r"data.logs=terabyte evaluates on the last day, but data.path=.*train.txt "
                                             r"names .*train.txt, not two or more day_<d> files"):
        task_of(cache, log, "data.logs=terabyte")
    with pytest.raises(PreflightError, match=r"data.path=.*nothing: the folder holds neither a conversion"):
        (tmp_path / "nothing").mkdir()
        task_of(cache, tmp_path / "nothing")
    with pytest.raises(PreflightError, match=r"data.path=.*day_\*.gz: the pattern matches no file"):
        task_of(cache, tmp_path / "day_*.gz")
    assert folders(cache) == []  # refused before anything was converted
    with pytest.raises(PreflightError, match=r"data.bags: bag sizes \[2\]: 26 integers in 1..255"):
        task_of(cache, log, "data.bags=[2]")
    bags = [2] + [1] * 25
    multi = task_of(cache, log, f"data.bags={bags}")  # raw logs take data.bags: converted with them
    assert multi.ids.bags == tuple(bags) and multi.splits["train"].manifest["bags"] == bags


@pytest.mark.slow
def test_a_bad_line_on_the_command_line_exits_with_one_message(lines, tmp_path):
    path, message = bad_file(lines, tmp_path / "logs", "fields")
    proc = subprocess.run([sys.executable, "-m", "runner", *BASE, f"data.path={path}",
                           f"data.cache={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert proc.stderr.strip().splitlines() == [f"error: {message} (a run reports those it skipped as data/bad_lines)"]


def test_a_damaged_converted_folder_is_one_message_with_the_fix(lines, tmp_path):
    """A converted folder given as data.path, or this run's own conversion under data.cache, that was damaged
    after the conversion (a broken manifest, a shard removed or truncated, the counts and vocabulary removed) is refused by one
    message naming the folder, what failed and how to get a good one."""
    log = tmp_path / "train.txt"
    log.write_text("".join(lines))
    damage = {
        "manifest": lambda f: (f / "manifest.json").write_text('{"format": 2,'),
        "shard removed": lambda f: (f / "valid" / "shard-00000.npy").unlink(),
        "shard truncated": lambda f: os.truncate(f / "train" / "shard-00000.npy", 5000),
        "counts removed": lambda f: [(f / n).unlink() for n in ("counts.npz", "vocab_min1.npz")],
    }
    for what, hurt in damage.items():
        folder = tmp_path / what.replace(" ", "_")
        convert([log], folder)
        hurt(folder)
        with pytest.raises(PreflightError) as e:
            task_of(tmp_path / "cache", folder)
        assert str(e.value).startswith(f"{folder}: the converted logs cannot be read ("), what
        assert str(e.value).endswith("the folder is damaged or incomplete: convert the logs again into a new folder "
                                     "(python -m runner.prepare criteo <files> --out <folder>), or set data.path to "
                                     "the raw logs"), what
    cache = tmp_path / "cache"
    task_of(cache, log)  # converted into the cache; then its shard is cut short
    (conversion,) = [cache / n for n in folders(cache)]
    os.truncate(conversion / "train" / "shard-00000.npy", 5000)
    with pytest.raises(PreflightError, match=rf"the folder is damaged or incomplete: remove {conversion} and the run "
                                             rf"converts {log} again$"):
        task_of(cache, log)


def test_sigterm_while_a_run_converts_removes_the_partial_conversion_and_says_so(tmp_path):
    """A scheduler's SIGTERM before training (a run converting its logs into data.cache): the temporary folder
    goes (a kill used to leave it, tens of MB, for no later run to remove) and the run stops in one line."""
    import signal

    from runner.errors import Preempted
    from runner.tasks.criteo.logs import once

    before = signal.getsignal(signal.SIGTERM)

    def make(work):
        (work / "shards").mkdir()
        (work / "shards" / "part").write_bytes(b"x" * 1000)
        os.kill(os.getpid(), signal.SIGTERM)
        return work / "shards"

    with pytest.raises(Preempted) as e:
        once(tmp_path / "cache" / "logs-abc", make)
    assert e.value.code == 143 and str(e.value).startswith("stopped on SIGTERM while converting the Criteo logs")
    assert list((tmp_path / "cache").iterdir()) == [] and signal.getsignal(signal.SIGTERM) == before


def test_a_pipe_as_the_logs_is_refused_as_such():
    """data.path=<(zcat day_0.gz): the shell gives /dev/fd/N, which exists; it was called no such file."""
    from runner.tasks.criteo.logs import raw_logs

    read, write = os.pipe()
    try:
        with pytest.raises(PreflightError) as e:
            raw_logs(f"/dev/fd/{read}")
    finally:
        os.close(read)
        os.close(write)
    assert str(e.value) == (f"data.path=/dev/fd/{read} is a pipe or a device, not a file: logs are read by name (their "
                            f"path, size and modification time name the conversion, which a later run finds); write "
                            f"them to a file first, or give a .gz as it is (it is read compressed)")
