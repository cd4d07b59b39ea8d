"""The data file a checkpoint was trained on: its fingerprint in the meta, and a resume on another file
refused naming it (``checkpoint.allow_data_change=true`` accepts it with a warning)."""
import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest

from runner.app import run
from runner.build import build
from runner.checkpoint import data as ckpt_data
from runner.checkpoint import open_checkpoints
from runner.checkpoint.lock import LOCK_FILE
from runner.errors import PreflightError
from runner.tasks.sequential.synthetic import SequenceSpec, SequenceWorld, write_ratings_dat
from tests.runner.checkpoint.test_resume import steps_in
from tests.runner.support import seq_config

OVER = ["data.max_len=10", "trainer.batch_size=16", "trainer.steps=2", "trainer.log_interval=1",
        "checkpoint.interval=1", "trainer.run_id=data-check", "model.num_negatives=8"]


def config(path: Path, ck: Path, *overrides):
    return seq_config(*OVER, f"data.path={path}", f"checkpoint.dir={ck}", *overrides, data=["data=movielens"])


def open_on(path: Path, ck: Path, *overrides):
    cfg = config(path, ck, *overrides)
    program, task, plan = build(cfg)
    return open_checkpoints(cfg, program, plan, ck.parent / "out", data_file=task.data_file)


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the ratings.dat a finished 2-step run trained on, its checkpoint dir with steps 1 and 2)."""
    d = tmp_path_factory.mktemp("trained")
    inter = SequenceWorld(SequenceSpec(num_users=64, num_items=50, num_clusters=5)).interactions()
    path = write_ratings_dat(inter, d / "data" / "ratings.dat")
    run(config(path, d / "ck"), d / "first")
    assert steps_in(d / "ck") == [1, 2]
    return path, d / "ck"


def copies(tmp_path: Path, trained) -> tuple[Path, Path]:
    path, ck = trained
    shutil.copytree(path.parent, tmp_path / "data")
    shutil.copytree(ck, tmp_path / "ck")
    return tmp_path / "data" / "ratings.dat", tmp_path / "ck"


@pytest.mark.slow
def test_each_checkpoint_records_the_fingerprint_of_its_data_file(trained):
    path, ck = trained
    meta = json.loads((ck / "2" / "meta" / "metadata").read_text())
    assert meta["data"] == {"path": str(path), "size": path.stat().st_size,
                            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "covers": "the whole file"}


@pytest.mark.slow
def test_a_resume_on_a_changed_data_file_is_refused_naming_it_and_touches_nothing(tmp_path, trained, caplog):
    """One rating changed in the middle: the same users, items and timestamps, so no table or array check can
    see it; the fingerprint does."""
    path, ck = copies(tmp_path, trained)
    lines = path.read_text().splitlines(keepends=True)
    u, i, r, t = lines[len(lines) // 2].split("::")
    lines[len(lines) // 2] = f"{u}::{i}::{6 - int(r)}::{t}"
    old = ckpt_data.fingerprint(path)
    path.write_text("".join(lines))
    new = ckpt_data.fingerprint(path)
    assert new["size"] == old["size"] and new["sha256"] != old["sha256"]
    before = tree(ck)
    with pytest.raises(PreflightError) as e:
        open_on(path, ck)
    assert str(e.value) == (
        f"checkpoint {ck / '2'} was trained on {trained[0]} ({old['size']:,} bytes, sha256 {old['sha256'][:16]}... of "
        f"the "
        f"whole file), but this run reads {path} ({new['size']:,} bytes, sha256 {new['sha256'][:16]}... of the whole "
        f"file): the data changed since the checkpoint was written, and a resume would go on training on other data "
        f"than the run started on. Put back the file the run started on, start a new run (checkpoint.resume=never "
        f"with another checkpoint.dir or trainer.run_id), or set checkpoint.allow_data_change=true to resume on this "
        f"data on purpose.")
    assert tree(ck) == before and not (ck / LOCK_FILE).exists()

    with caplog.at_level(logging.WARNING, logger="runner"):
        accepted = open_on(path, ck, "checkpoint.allow_data_change=true")
    assert accepted.resume_point()[1] == 2
    accepted.close()
    assert f"checkpoint {ck / '2'} was trained on {trained[0]} ({old['size']:,} bytes" in caplog.text
    assert "resuming on it anyway (checkpoint.allow_data_change=true)" in caplog.text


@pytest.mark.slow
def test_the_same_content_at_another_path_resumes(tmp_path, trained, caplog):
    _, ck = copies(tmp_path, trained)
    moved = tmp_path / "elsewhere" / "ratings.dat"
    moved.parent.mkdir()
    shutil.copy(trained[0], moved)
    with caplog.at_level(logging.WARNING, logger="runner"):
        ckpts = open_on(moved, ck)
    assert ckpts.resume_point()[1] == 2
    ckpts.close()
    assert "was trained on" not in caplog.text


@pytest.mark.slow
def test_a_checkpoint_without_a_fingerprint_resumes_with_a_warning(tmp_path, trained, caplog):
    """Written before checkpoints recorded one: nothing to compare, said once."""
    path, ck = copies(tmp_path, trained)
    for step in ("1", "2"):
        meta_file = ck / step / "meta" / "metadata"
        meta = json.loads(meta_file.read_text())
        del meta["data"]
        meta_file.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="runner"):
        ckpts = open_on(path, ck)
    assert ckpts.resume_point()[1] == 2
    ckpts.close()
    assert (f"checkpoint {ck / '2'} records no fingerprint of its data (written before checkpoints recorded one): "
            f"cannot check that {path} is the data it was trained on") in caplog.text


def test_a_large_file_is_fingerprinted_by_evenly_spaced_blocks(tmp_path, monkeypatch):
    """Against hashlib over the blocks the docstring names; a size change or an edit inside a block is seen,
    an edit between the blocks of a file of the same size is not (what the fingerprint covers, recorded)."""
    monkeypatch.setattr(ckpt_data, "WHOLE_BYTES", 1000)
    monkeypatch.setattr(ckpt_data, "BLOCK_BYTES", 10)
    monkeypatch.setattr(ckpt_data, "BLOCKS", 4)
    data = bytes(range(256)) * 8  # 2048 bytes: blocks at 0, 679, 1358, 2038
    path = tmp_path / "big.csv"
    path.write_bytes(data)
    fp = ckpt_data.fingerprint(path)
    expected = hashlib.sha256(b"".join(data[o:o + 10] for o in (0, 679, 1358, 2038))).hexdigest()
    assert fp == {"path": str(path), "size": 2048, "sha256": expected,
                  "covers": "4 blocks of 10 bytes evenly spaced from the first byte to the last"}
    path.write_bytes(data[:1360] + b"x" + data[1361:])  # inside the third block
    assert ckpt_data.fingerprint(path)["sha256"] != expected
    path.write_bytes(data + b"\n")
    assert ckpt_data.fingerprint(path)["size"] == 2049
    path.write_bytes(data[:100] + b"x" + data[101:])  # between the first and the second block
    assert ckpt_data.fingerprint(path) == fp


def test_a_non_boolean_allow_data_change_is_refused_when_composed(tmp_path):
    with pytest.raises(Exception) as e:
        config(tmp_path / "ratings.dat", tmp_path / "ck", "checkpoint.allow_data_change=sometimes")
    text = f"{e.value} {e.value.__cause__}"
    assert "checkpoint.allow_data_change=sometimes" in text and "'sometimes' is not a valid bool" in text, text
