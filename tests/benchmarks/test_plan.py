"""The 1B-row plan's code (``benchmarks/plan.py``) compiles the real train step for abstract inputs: here a
scaled-down table on the 8 test devices, nothing allocated, with figures that add up."""
import pytest

from benchmarks.plan import plan


@pytest.mark.slow
def test_scaled_down_plan_compiles_and_reports_memory_and_collectives():
    rows, width = 10**6, 8
    r = plan(rows, width, batch=64)
    assert (r["devices"], r["table_shards"], r["rows"]) == (8, 8, rows)
    assert r["table_bytes"] == rows * width * 4
    # Adam: m and v per element, a per-row step count (int32) and the update count
    assert r["optimizer_state_bytes"] == 2 * rows * width * 4 + rows * 4 + 4
    pd = r["per_device"]
    # Every device holds its eighth of the table and of the Adam state (donated: aliased, not copied).
    assert pd["argument"] >= (r["table_bytes"] + r["optimizer_state_bytes"]) / 8
    assert pd["alias"] >= (r["table_bytes"] + r["optimizer_state_bytes"]) / 8 * 0.99
    assert pd["peak"] < 1.5 * pd["argument"]
    assert r["collective_bytes"]["all-to-all"] > 0 and r["collective_bytes"]["total"] < pd["argument"]


@pytest.mark.slow
def test_scaled_down_criteo_plan_stacks_26_tables_and_reports_their_bytes(tmp_path):
    """The Criteo Terabyte plan's code (``benchmarks/plan_criteo.py``) on 8 devices, its 26 tables at the
    published cardinalities capped at 5,000 rows: one stack of them all, its bytes as the rows add up."""
    from benchmarks.plan_criteo import CARDINALITIES, criteo_plan

    cards = tuple(min(c, 5_000) for c in CARDINALITIES)
    r = criteo_plan(cards, batch=64, cache=str(tmp_path))
    assert (r["devices"], r["table_shards"], r["physical_tables"], r["width"]) == (8, 8, 1, 128)
    (stack,) = r["tables"].values()
    assert stack["members"] == [f"cat_{j:02d}" for j in range(1, 27)]
    # one shared padding row, then every member's ids 1..vocab-1; padded to a multiple of the 8 shards
    rows = 1 + sum(c - 1 for c in cards)
    assert stack["rows"] == -(-rows // 8) * 8
    assert r["table_bytes"] == stack["bytes"] == stack["rows"] * 128 * 4
    # row-wise Adagrad: an accumulator (float32) and a last step (int32) a row, and the update count
    assert r["optimizer_state_bytes"] == stack["rows"] * (4 + 4) + 4
    # route slots: PLAN_CAPACITY (2) x the even share of a device's 8 x 26 tokens over 8 shards, at least 64
    assert stack["tokens_per_device"] == 64 // 8 * 26 and stack["route_slots"] == max(64, 2 * 208 // 8)
    pd = r["per_device"]
    assert pd["argument"] >= (r["table_bytes"] + r["optimizer_state_bytes"]) / 8
    assert pd["alias"] >= r["table_bytes"] / 8 and pd["peak"] >= pd["argument"]
    assert r["collective_bytes"]["all-to-all"] > 0 and r["collective_bytes"]["all-reduce"] > 0
    assert r["dearest_step_bytes"]["total"] > r["collective_bytes"]["total"]


@pytest.mark.parametrize("module, argv, needle", [
    ("plan", ["--devices", "0"], "--devices 0: a device count must be in 1..4096"),
    ("plan", ["--devices", "8", "--rows", "-1"], "--rows -1: must be in 1..1e+12"),
    ("plan", ["--devices", "8", "--width", "0"], "--width 0: must be in 1..65536"),
    ("plan", ["--quick", "--devices", "16"], "--devices: --quick sets its own sizes; give either --quick or the sizes"),
    ("plan", ["--devices", "8", "--batch", "3"], "--batch 3: must be a positive multiple of every device count (8)"),
    ("plan_criteo", ["--timeout", "-5"], "--timeout -5: must be in 1..86400"),
    ("plan_criteo", ["--quick", "--batch", "512"], "--batch: --quick sets its own sizes"),
    ("plan_criteo", ["--batch", "0"], "--batch 0: must be a positive multiple of every device count (64, 256)"),
])
def test_plan_arguments_that_cannot_compile_are_refused_before_anything_runs(tmp_path, capsys, module, argv, needle):
    import importlib

    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"python -m benchmarks.{module}: error: {needle}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_results_folder_that_cannot_be_written_is_refused_before_the_benchmark_runs(tmp_path, capsys):
    from benchmarks.__main__ import main

    (tmp_path / "afile").write_text("mine")
    with pytest.raises(SystemExit) as e:
        main(["--quick", "--only", "convert", "--out", str(tmp_path / "afile" / "res")])
    assert e.value.code == 2
    assert (f"error: --out {tmp_path / 'afile' / 'res'}: cannot be made or written (Not a directory); give a folder "
            f"this user can write") in capsys.readouterr().err


@pytest.mark.slow
def test_a_criteo_plan_that_compiles_nothing_in_time_fails_and_writes_nothing(tmp_path, capsys):
    from benchmarks.plan_criteo import main

    assert main(["--quick", "--timeout", "1", "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == ("error: nothing was compiled within --timeout 1 s, so no report was written; "
                                       "raise --timeout\n")
    assert not (tmp_path / "out" / "plan_criteo.md").exists()


def test_rounds_without_a_comparison_is_refused(capsys):
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--rounds", "3"])
    assert e.value.code == 2
    assert "error: --rounds 3: it counts --compare's rounds; give --compare REF with it" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["__main__", "plan", "plan_criteo", "kills", "memory"])
def test_quick_results_never_replace_the_committed_ones(capsys, module):
    """``--quick`` writes to outputs/benchmarks-quick unless told otherwise, and is refused in benchmarks/results,
    where its smoke-test numbers would replace the full run's (they did, summary rows included)."""
    import importlib

    from benchmarks import common

    before = {p.name: p.stat().st_mtime_ns for p in common.RESULTS.iterdir()}
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"benchmarks.{module}").main(["--quick", "--out", str(common.RESULTS)])
    assert e.value.code == 2
    assert (f"error: --out {common.RESULTS}: --quick's tiny sizes would replace the full results kept there; give "
            f"another folder, or leave --out out (--quick writes to outputs/benchmarks-quick)") in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in common.RESULTS.iterdir()} == before


def test_the_results_folder_defaults_to_a_scratch_one_for_quick_runs(tmp_path, monkeypatch):
    import argparse

    from benchmarks import __main__ as suite
    from benchmarks import common

    parser = argparse.ArgumentParser()
    assert common.results_dir(parser, None, False) == common.RESULTS
    assert common.results_dir(parser, None, True) == common.ROOT / "outputs" / "benchmarks-quick"
    assert common.results_dir(parser, tmp_path / "mine", True) == tmp_path / "mine"
    ran = []

    def run_all(names, quick, out, took):  # stands in for the benchmarks' processes
        ran.append((names, quick, out))
        took.update({n: [0.0, 0] for n in names})

    monkeypatch.setattr(common, "QUICK_RESULTS", tmp_path / "quick")
    monkeypatch.setattr(suite, "run_all", run_all)
    suite.main(["--quick", "--only", "convert", "--only", "bags", "--only", "convert"])
    assert ran == [(["convert", "bags"], True, tmp_path / "quick")]  # a name given twice runs once
    assert (tmp_path / "quick" / "summary.md").is_file()


@pytest.mark.parametrize("argv, needle", [
    (["--compare", ""], "--compare '': give a commit to time this tree against, e.g. --compare main"),
    (["--compare", "HEAD", "--only", "memory"], "--only: --compare times the fused update only and prints its "
                                                "ratios (it writes no results); leave it out, or run the suite"),
    (["--compare", "HEAD", "--only", "bags", "--out", "x"], "--only, --out: --compare times the fused update only"),
])
def test_compare_refuses_what_it_would_ignore(capsys, argv, needle):
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"error: {needle}" in capsys.readouterr().err


def test_compare_refuses_a_commit_without_the_optimizers_package(tmp_path, monkeypatch):
    """The child times whatever ``optimizers`` comes first on the path: run from a tree without one, it found the
    installed project's and timed this tree against itself (a ratio near 1, exit 0)."""
    import runpy

    from benchmarks import common

    child = runpy.run_path(str(common.ROOT / "benchmarks" / "compare_child.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"this commit has no optimizers package \(the import found .*/optimizers "
                                         r"instead\), so there is nothing of it to time"):
        child["main"]({"width": 4, "batch": 8, "steps": 1, "warmup": 0, "optimizers": ["async_sgd"], "sizes": [10]})
