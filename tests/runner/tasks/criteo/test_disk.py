"""What ``python -m runner.prepare`` (and a run's own conversion) says when the disk refuses a read or a write
midway: one line naming the file, what was being done and the fix, never ``[Errno 28] ...`` alone, and no
half-written folder a later conversion or run would take as finished. The refusals are simulated (tests run as
root here, which any chmod lets through): a write that fails as a full disk does, an open that is refused."""
import builtins
import errno
import os
import pathlib
from pathlib import Path

import pytest

import runner.tasks.criteo.disk as disk_lib
import runner.tasks.criteo.ids as ids_lib
import runner.tasks.criteo.prepare as prepare_lib
import runner.tasks.criteo.synthetic as synthetic_lib
import runner.tasks.criteo.tsv as tsv_lib
from runner.errors import PreflightError
from runner.prepare import main
from runner.tasks.criteo.logs import converted
from runner.tasks.criteo.synthetic import CriteoSpec, write_logs


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return write_logs(CriteoSpec(lines=4000, seed=5), tmp_path_factory.mktemp("logs") / "one")[0]


def refused(code: int) -> OSError:
    """The error a write or an open gets from the system: an errno and its words, no file (as a write's)."""
    return OSError(code, os.strerror(code))


class Failing:
    """A file whose first write goes through and every later one fails with ``error`` (a disk filling up)."""

    def __init__(self, file, error: OSError):
        self.file, self.error, self.writes = file, error, 0

    def write(self, data):
        self.writes += 1
        if self.writes > 1:
            raise self.error
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def fail_writes(monkeypatch, module, suffix: str, error: OSError) -> None:
    """``module``'s ``open`` gives files ending in ``suffix`` whose writes fail after the first."""
    def fake(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        return Failing(f, error) if str(path).endswith(suffix) and "b" in mode else f

    monkeypatch.setattr(module, "open", fake, raising=False)


FULL = "no space left on the device); free space there, or give --out a folder on a file system with room"
STAGES = {"shard": (prepare_lib, ".npy.partial", "train/shard-00000.npy.partial", "writing a shard"),
          "counts": (prepare_lib, "counts.npz.partial", "counts.npz.partial", "writing counts.npz"),
          "vocabulary": (ids_lib, ".partial", "vocab_min1.npz", "writing the vocabulary")}


@pytest.mark.parametrize("stage", [*STAGES, "manifest"])
def test_a_disk_filling_up_midway_names_the_file_and_leaves_no_conversion(log, tmp_path, monkeypatch, capsys, stage):
    out = tmp_path / "s"
    if stage == "manifest":
        write_text = pathlib.Path.write_text

        def full(self, *args, **kwargs):
            if self.name == "manifest.json.partial":
                write_text(self, "{")  # a torn manifest: written in part, then the disk is full
                raise refused(errno.ENOSPC)
            return write_text(self, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "write_text", full)
        file, doing = "manifest.json.partial", "writing the manifest"
    else:
        module, suffix, file, doing = STAGES[stage]
        fail_writes(monkeypatch, module, suffix, refused(errno.ENOSPC))
    assert main(["criteo", str(log), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"runner.prepare: {out / file}: {doing} failed ({FULL}. --out {out} was left "
                                       f"as it was found\n")
    assert not out.exists()


@pytest.mark.parametrize("code, why, fix", [
    (errno.EACCES, "permission denied", "let this user write there (as its owner: chmod u+w), or give --out a "
                                        "folder it may write"),
    (errno.EROFS, "a read-only file system", "give --out a folder on a writable file system")])
def test_a_folder_no_longer_writable_keeps_its_marker_so_nothing_takes_it_as_finished(log, tmp_path, monkeypatch,
                                                                                      capsys, code, why, fix):
    out = tmp_path / "s"
    out.mkdir()  # given empty: emptied again on a failure, which the folder now refuses
    fail_writes(monkeypatch, prepare_lib, ".npy.partial", refused(code))
    monkeypatch.setattr(disk_lib.shutil, "rmtree", lambda *a, **k: None)

    def unlink(self, missing_ok=False):
        raise refused(code)

    monkeypatch.setattr(pathlib.Path, "unlink", unlink)
    assert main(["criteo", str(log), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"runner.prepare: {out / 'train/shard-00000.npy.partial'}: writing a shard "
                                       f"failed ({why}); {fix}. The partial files in --out {out} could not be removed "
                                       f"(it holds .converting, so nothing takes them for a finished conversion): "
                                       f"remove {out} before starting again\n")
    monkeypatch.undo()
    assert not (out / "manifest.json").exists() and (out / "train/shard-00000.npy.partial").exists()
    assert main(["criteo", str(log), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"runner.prepare: {out} holds .converting: another conversion is "
                                              f"writing into it, or one was killed before it finished")


def test_a_log_the_system_will_not_open_or_read_is_named_with_the_fix(log, tmp_path, monkeypatch, capsys):
    out = tmp_path / "s"

    def denied(*args, **kwargs):  # pyarrow's own error names no file
        raise PermissionError(errno.EACCES, f"Failed to open local file. Detail: [errno {errno.EACCES}]")

    monkeypatch.setattr(tsv_lib.pa, "input_stream", denied)
    assert main(["criteo", str(log), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"runner.prepare: {log}: reading the log failed (permission denied); let this "
                                       f"user read it (chmod +r {log}, as its owner), or run as a user who may read "
                                       f"it\n")
    assert not out.exists()
    monkeypatch.undo()

    def failing(self, n=-1):  # the disk fails under the reader
        raise refused(errno.EIO)

    monkeypatch.setattr(tsv_lib.Lines, "read", failing)
    assert main(["criteo", str(log), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"runner.prepare: {log}: reading the log failed (an input/output error (a "
                                       f"failing disk or a broken network mount)); check the disk it is on, copy it "
                                       f"again, or leave it out\n")
    assert not out.exists()


@pytest.mark.parametrize("gzip", [False, True])
def test_generated_logs_on_a_disk_filling_up_name_the_file_and_leave_nothing(tmp_path, monkeypatch, capsys, gzip):
    out = tmp_path / "g"

    def full(*args, **kwargs):
        raise refused(errno.ENOSPC)

    monkeypatch.setattr(synthetic_lib.pacsv, "write_csv", full)
    argv = ["criteo-synthetic", "--out", str(out), "--lines", "100"] + ["--gzip"] * gzip
    assert main(argv) == 2
    name = "train.txt.gz" if gzip else "train.txt"
    file = f"{name}.tsv.partial" if gzip else f"{name}.partial"
    assert capsys.readouterr().err == (f"runner.prepare: {out / file}: writing a generated log failed ({FULL}. --out "
                                       f"{out} was left as it was found\n")
    monkeypatch.undo()
    monkeypatch.setattr(synthetic_lib.np, "save", full)
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"runner.prepare: {out / name}.p.npy: writing a generated log's click "
                                       f"probabilities failed ({FULL}. --out {out} was left as it was found\n")
    assert not out.exists()


def test_an_os_error_no_check_words_still_names_its_file_and_a_fix(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x"))

    monkeypatch.setattr("runner.prepare.convert", full)
    assert main(["criteo", "train.txt", "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == (f"runner.prepare: {tmp_path / 'x'}: no space left on the device; free space "
                                       f"there, or give --out a folder on a file system with room\n")


def test_a_run_converting_on_a_full_disk_names_the_file_and_data_cache(log, tmp_path, monkeypatch):
    fail_writes(monkeypatch, prepare_lib, ".npy.partial", refused(errno.ENOSPC))
    cache = tmp_path / "cache"
    with pytest.raises(PreflightError) as e:
        converted(str(log), [Path(log)], str(cache), 0, None)
    message = str(e.value)
    folder = message.split(" into ", 1)[1].split(": ", 1)[0]
    assert message.startswith(f"data.path={log}: converting the logs into {cache}/logs-")
    assert message.endswith(f"/shards/train/shard-00000.npy.partial failed (no space left on the device); free space "
                            f"there, or set data.cache to a folder on a file system with room")
    assert f"{folder}: writing a shard {cache}/.logs-" in message
    assert sorted(p.name for p in cache.iterdir()) == []  # the work folder removed, nothing named as finished
