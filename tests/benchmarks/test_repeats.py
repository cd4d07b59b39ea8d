"""benchmarks.repeats: several runs' targets side by side, met only if met in every run; a folder without
results is refused by its name."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import repeats

ROOT = Path(__file__).resolve().parents[2]


def write_run(d: Path, values: dict[str, float]) -> Path:
    d.mkdir()
    targets = [{"target": name, "measured": v, "threshold": 1.5, "better": "lower", "met": v <= 1.5}
               for name, v in values.items()]
    (d / "fused_update.json").write_text(json.dumps({"results": [], "targets": targets}))
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
