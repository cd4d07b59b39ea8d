"""benchmarks.repeats: several runs' targets side by side, met only if met in every run; a folder without
results is refused by its name."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import repeats

ROOT = Path(__file__).resolve().parents[2]


def write_run(d: Path, values: dict[str, float], bench: str = "fused_update") -> Path:
    d.mkdir()
    targets = [{"target": name, "measured": v, "threshold": 1.5, "better": "lower", "met": v <= 1.5}
               for name, v in values.items()]
    (d / f"{bench}.json").write_text(json.dumps({"results": [], "targets": targets}))
    (d / "summary.json").write_text(json.dumps({"targets": [{"target": "ignored"}]}))  # not a benchmark's
    return d


def test_a_target_is_met_only_if_every_run_met_it(tmp_path):
    runs = [write_run(tmp_path / f"r{i}", {"steady": 1.2, "flaky": v}) for i, v in enumerate((1.4, 1.6, 1.3))]
    rows = {r["target"]: r for r in repeats.collect(runs)}
    assert set(rows) == {"steady", "flaky"}
    assert rows["steady"]["met_every_run"] and rows["steady"]["met_in"] == 3
    assert not rows["flaky"]["met_every_run"] and rows["flaky"]["met_in"] == 2
    assert (rows["flaky"]["min"], rows["flaky"]["max"]) == (1.3, 1.6)
    md = repeats.report(list(rows.values()), 3)
    assert "| flaky | 1.400 | 1.600 | 1.300 | 1.300-1.600 | <= 1.5 | 2 of 3 |" in md


def test_the_command_writes_both_files_and_refuses_a_folder_without_results(tmp_path):
    runs = [write_run(tmp_path / f"r{i}", {"t": 1.0 + i}) for i in range(2)]
    out = tmp_path / "out"
    assert repeats.main([*map(str, runs), "--out", str(out)]) == 0
    assert json.loads((out / "repeats.json").read_text())["targets"][0]["met_in"] == 1
    assert "| t | 1.000 | 2.000 |" in (out / "repeats.md").read_text()
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.repeats", str(runs[0]), str(tmp_path / "empty")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "no benchmark results" in proc.stderr and "empty" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_update_replaces_only_the_rerun_benchmarks_rows(tmp_path):
    """--update: runs of one benchmark replace its rows of the earlier repeats.json; the others stay as they
    were, in their place; without an earlier file it is refused by name."""
    out = tmp_path / "out"
    first = []
    for i in range(3):
        d = write_run(tmp_path / f"a{i}", {"fast": 1.0 + i / 10}, "fused_update")
        (d / "hash_tables.json").write_text(json.dumps({"targets": [
            {"target": "hash x dense", "measured": 2.9, "threshold": 1.3, "better": "lower", "met": False}]}))
        (d / "memory.json").write_text(json.dumps({"targets": [
            {"target": "rss", "measured": 4.0, "threshold": 5, "better": "lower", "met": True}]}))
        first.append(d)
    assert repeats.main([*map(str, first), "--out", str(out)]) == 0
    again = [write_run(tmp_path / f"b{i}", {"hash x dense": 1.9 + i / 10}, "hash_tables") for i in range(3)]
    assert repeats.main([*map(str, again), "--out", str(out), "--update"]) == 0
    rows = json.loads((out / "repeats.json").read_text())["targets"]
    assert [r["target"] for r in rows] == ["fast", "hash x dense", "rss"]
    assert rows[1]["min"] == 1.9 and rows[1]["max"] == 2.1 and rows[0]["max"] == 1.2 and rows[2]["met_in"] == 3
    md = (out / "repeats.md").read_text()
    assert "| hash x dense | 1.900 | 2.000 | 2.100 | 1.900-2.100 | <= 1.5 | 0 of 3 |" in md and "2.900" not in md
    assert "| rss | 4.000 | 4.000 | 4.000 | 4.000-4.000 | <= 5 | 3 of 3 |" in md
    proc = subprocess.run([sys.executable, "-m", "benchmarks.repeats", *map(str, again), "--out",
                           str(tmp_path / "none"), "--update"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--update needs an earlier" in proc.stderr and "none" in proc.stderr
