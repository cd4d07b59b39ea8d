"""benchmarks.hash_tables stores both tables as a run of the runner would on the backend it runs on;
benchmarks.hash_runner times the runner's step with hash tables against modulo tables of as many rows."""
import json

import jax
import pytest

from benchmarks import hash_runner, hash_tables


def test_tables_are_stored_as_the_runner_stores_them(monkeypatch):
    """Unpadded on a CPU; 64-wide rows padded to 128 columns on a TPU (faked here), 128-wide ones kept."""
    assert hash_tables.stored_width(64) is None
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert hash_tables.stored_width(64) == 128 and hash_tables.stored_width(16) is None
    assert hash_tables.stored_width(128) is None


@pytest.mark.slow
def test_the_runner_comparison_writes_both_variants_with_as_many_rows(tmp_path):
    hash_runner.run(True, tmp_path)
    data = json.loads((tmp_path / "hash_runner.json").read_text())
    got = {r["variant"]: r for r in data["results"]}
    assert set(got) == {"hash", "modulo"}
    assert got["hash"]["table_rows"] == got["modulo"]["table_rows"]  # the same memory: slots + 2 rows, vocab rows
    assert got["hash"]["table_rows"]["items"] == hash_runner.QUICK["item_rows"] + 2
    assert got["modulo"]["x_modulo"]["median"] == 1.0 and got["hash"]["x_modulo"]["n"] == hash_runner.QUICK["rounds"]
    assert "| hash | authors" in (tmp_path / "hash_runner.md").read_text()


def test_the_quality_flag_is_on_the_command_line_and_reaches_the_run(monkeypatch, capsys, tmp_path):
    """``--help`` shows ``--quality`` (it was read from argv by hand, so argparse's help left it out), and the
    flag reaches ``run``; an unknown option is argparse's refusal, exit code 2."""
    with pytest.raises(SystemExit) as e:
        hash_tables.main(["--help"])
    assert e.value.code == 0 and "--quality" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(hash_tables, "run", lambda quick, out, with_quality=False: calls.append((quick, with_quality)))
    hash_tables.main(["--quick", "--out", str(tmp_path), "--quality"])
    hash_tables.main(["--quick", "--out", str(tmp_path)])
    assert calls == [(True, True), (True, False)]
    with pytest.raises(SystemExit) as e:
        hash_tables.main(["--qualty"])
    assert e.value.code == 2 and "unrecognized arguments: --qualty" in capsys.readouterr().err
