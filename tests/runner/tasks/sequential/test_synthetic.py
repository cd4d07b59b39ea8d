"""``python -m runner.tasks.sequential.synthetic OUT_DIR [num_users num_items num_clusters]`` (docs/guide/tasks.md):
writes the synthetic sequences as OUT_DIR/ratings.dat, or refuses a bad argument with one line and exit code 2,
writing nothing and never replacing a ratings.dat that is there."""
import runpy
import sys

import pytest

from runner.tasks.sequential.synthetic import SequenceSpec, SequenceWorld, write_ratings_dat


def command(monkeypatch, *args: str) -> int:
    """The module run as ``python -m`` with ``args``; its exit code (0 when it returns)."""
    monkeypatch.setattr(sys, "argv", ["synthetic.py", *args])
    monkeypatch.delitem(sys.modules, "runner.tasks.sequential.synthetic", raising=False)  # runpy runs it afresh
    try:
        runpy.run_module("runner.tasks.sequential.synthetic", run_name="__main__")
    except SystemExit as e:
        return e.code
    return 0


def test_it_writes_the_worlds_sequences_as_ratings_dat(tmp_path, monkeypatch, capsys):
    assert command(monkeypatch, str(tmp_path / "seq"), "50", "40", "4") == 0
    reference = write_ratings_dat(SequenceWorld(SequenceSpec(num_users=50, num_items=40, num_clusters=4))
                                  .interactions(), tmp_path / "reference.dat")
    assert (tmp_path / "seq" / "ratings.dat").read_bytes() == reference.read_bytes()
    assert sorted(p.name for p in (tmp_path / "seq").iterdir()) == ["ratings.dat"]  # no part file left
    assert capsys.readouterr().out == f"{tmp_path / 'seq' / 'ratings.dat'}\n"


def test_help_prints_the_usage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert command(monkeypatch, "--help") == 0
    assert "OUT_DIR" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # it once wrote --help/ratings.dat


@pytest.mark.parametrize("args, message", [
    (["20x"], "argument N: invalid int value: '20x'"),
    (["0"], "num_users=0 must be positive"),
    (["100", "10", "20"], "num_clusters=20 must be in 1..num_items=10"),
    (["1", "2", "3", "4"], "4 sizes given (1 2 3 4); give at most three: num_users num_items num_clusters"),
])
def test_a_bad_size_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, args, message):
    assert command(monkeypatch, str(tmp_path / "seq"), *args) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "seq").exists()


def test_a_ratings_dat_there_is_never_replaced(tmp_path, monkeypatch, capsys):
    (tmp_path / "ratings.dat").write_text("1::2::5::978300760\n")  # a user's MovieLens copy
    assert command(monkeypatch, str(tmp_path)) == 2
    assert f"error: {tmp_path / 'ratings.dat'} already exists, and it is never replaced" in capsys.readouterr().err
    assert (tmp_path / "ratings.dat").read_text() == "1::2::5::978300760\n"
    assert command(monkeypatch, str(tmp_path / "ratings.dat")) == 2  # OUT_DIR a file
    assert "is a file, not a folder" in capsys.readouterr().err
