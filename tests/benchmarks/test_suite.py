"""The benchmark suite runs end to end in --quick mode and writes what it promises: per benchmark a
markdown table with the expected rows, a JSON file with its numbers and targets, a PNG chart, and a summary
that lists every target. Plus the timing helpers, checked against plain Python references."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import common
from benchmarks.__main__ import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    only = [a for name in BENCHMARKS for a in ("--only", name)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(out), *only], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_quick_suite_writes_tables_charts_and_targets(quick_results):
    out = quick_results
    for name in BENCHMARKS:
        md = (out / f"{name}.md").read_text()
        assert md.startswith("# ") and "|---" in md, name
        json.loads((out / f"{name}.json").read_text())
    fused = json.loads((out / "fused_update.json").read_text())
    kinds = {(r["optimizer"], r["dtype"], r["vocab"]) for r in fused["results"]}
    assert ("async_rowwise_adagrad", "bfloat16", 10_000) in kinds and ("optax.adam", "float32", 1_000) in kinds
    for r in fused["results"]:
        assert r["step"]["min"] <= r["step"]["median"] <= r["step"]["max"] and r["step"]["n"] >= 2
    md = (out / "fused_update.md").read_text()
    assert "| 10,000 | async_rowwise_adagrad | bfloat16 |" in md and "numpy gather+scatter floor" in md
    mem = json.loads((out / "memory.json").read_text())["results"]
    for r in mem:  # a bf16 table: 2 bytes a value; row-wise Adagrad state: an f32 and an int32 per row
        assert r["table_bytes"] == r["vocab"] * r["width"] * 2 and r["state_bytes"] == r["vocab"] * 8 + 4
        assert r["peak"] >= r["peak_init"] >= r["base"] > 0 and r["temp_bytes"] > 0
        # the peak is also noted after the early steps the run reaches (quick: 2 steps, so after the first)
        assert list(r["peak_early"]) == ["1"] and r["peak_init"] <= r["peak_early"]["1"] <= r["peak"]
    bags = json.loads((out / "bags.json").read_text())
    for r in bags["results"]:  # a bag of L holds 1..L ids, padded: B x L ids reach the update, fewer are real
        assert r["ids"] == bags["config"]["bags"] * r["bag"] and r["unique_rows"] <= r["real_ids"] <= r["ids"]
        assert (r["real_ids"] < r["ids"]) == (r["bag"] > 1)
    trainer = json.loads((out / "trainer.json").read_text())["results"]
    assert {(r["devices"], r["mode"]) for r in trainer} == {(1, "sync"), (1, "async"), (8, "sync"), (8, "async")}
    for r in trainer:  # quick runs both device counts in one 8-device process: each row's devices are its mesh's
        assert r["mesh"] == ("data=1" if r["devices"] == 1 else "data=1xtable=8"), r
    sharded = json.loads((out / "sharded.json").read_text())["results"]
    assert {r["layout"] for r in sharded} == {"single", "row", "column"}
    # the runner's default mesh settings per layout: routed, 1.2 x the sampled peak, ids permuted on the row layout
    assert {r["variant"] for r in sharded if r["default"] is True} == {"single", "row-a2a-perm", "column"}
    assert all(r["default"] is False for r in sharded if r["variant"] not in ("single", "row-a2a-perm", "column"))
    assert "| async_rowwise_adagrad | row-a2a-perm | yes |" in (out / "sharded.md").read_text()
    prec = json.loads((out / "precision.json").read_text())
    assert prec["memory_ratio_bf16_over_f32"] == 0.5
    assert {r["dtypes"]["items"] for r in prec["results"]} == {"float32", "bfloat16"}
    cost = json.loads((out / "async_cost.json").read_text())
    assert {r["optimizer"] for r in cost["fused"]} == {"async_rowwise_adagrad"}
    steps = {r["name"]: r for r in cost["steps"]}
    assert set(steps) == {"k=1", "k=2", "k=1 dc"}
    assert steps["k=2"]["queue_bytes"] == 2 * steps["k=1"]["queue_bytes"]  # the queue is k records
    # compensation adds each token's row (float32, the gradients' shape) to every record
    assert steps["k=1 dc"]["queue_bytes"] - steps["k=1"]["queue_bytes"] == steps["k=1"]["grads_bytes"] > 0
    hashed = json.loads((out / "hash_tables.json").read_text())["cost"]
    assert hashed["slot_bytes_per_slot"] == 16 and 0 < hashed["occupancy"] <= 1  # key 8, last step 4, count 4
    assert hashed["dense"]["n"] == hashed["hash"]["n"] == hashed["x_dense"]["n"] >= 2
    assert hashed["hash_map"]["n"] == hashed["hash_reset"]["n"] == hashed["map_x_dense"]["n"] >= 2  # its parts
    assert 0 < hashed["admitted_per_step"] <= 512  # the quick batch's lookups
    assert hashed["full_occupancy"] > 0.9 and hashed["full_x_dense"]["n"] >= 2  # the full table's step, evicting
    conv = json.loads((out / "convert.json").read_text())
    assert conv["results"]["convert"]["examples"] == conv["results"]["pyarrow read"]["examples"] == 20_000
    assert all(r["peak_rss"] > 0 and r["mb_per_s"] > 0 for r in conv["results"].values())
    for name in ("fused_update", "memory", "sharded", "trainer"):
        w, h = png_size(out / f"{name}.png")
        assert w > 200 and h > 200, name
    summary = (out / "summary.md").read_text()
    targets = [t for name in BENCHMARKS for t in json.loads((out / f"{name}.json").read_text()).get("targets", [])]
    assert len(targets) >= 5
    for t in targets:
        assert t["target"] in summary
        lower = t["measured"] <= t["threshold"]
        assert t["met"] == (lower if t["better"] == "lower" else t["measured"] >= t["threshold"])
    assert summary.count("| ok |") == len(BENCHMARKS)


class _Bench:
    """A stand-in benchmark module: ``main`` records its arguments, and raises for the one named bad."""

    def __init__(self, name, ran):
        self.name, self.ran = name, ran

    def main(self, argv):
        self.ran.append((self.name, argv))
        if self.name == "bad":
            raise ValueError("boom")


def test_quick_one_process_reports_a_benchmark_that_raises_and_runs_the_next(monkeypatch, capsys, tmp_path):
    from benchmarks import __main__ as suite

    ran = []
    monkeypatch.setattr(suite, "importlib", SimpleNamespace(import_module=lambda m: _Bench(m.split(".")[-1], ran)))
    assert suite.run_here(["bad", "good"], True, tmp_path) == 1
    assert ran == [(n, ["--quick", "--out", str(tmp_path)]) for n in ("bad", "good")]
    captured = capsys.readouterr()
    took = [json.loads(line[len(suite.TOOK):]) for line in captured.out.splitlines() if line.startswith(suite.TOOK)]
    assert [(name, rc) for name, _, rc in took] == [("bad", 1), ("good", 0)]
    assert "ValueError: boom" in captured.err


def test_quick_marks_what_its_process_did_not_finish_failed(monkeypatch, capsys, tmp_path):
    from benchmarks import __main__ as suite

    class Proc:  # the one process: finishes "a", prints a line, then dies (killed) before "b" reports
        stdout = iter(["== a\n", suite.TOOK + json.dumps(["a", 1.5, 0]) + "\n", "== b\n"])
        returncode = -9

        def wait(self):
            return self.returncode

    monkeypatch.setattr(suite.subprocess, "Popen", lambda *a, **k: Proc())
    took = {"old": [3.0, 0]}
    suite.run_all(["a", "b"], True, tmp_path, took)
    assert took["a"] == [1.5, 0] and took["b"][1] == -9 and took["old"] == [3.0, 0]
    assert "== a: 2 s\n" in capsys.readouterr().out


def test_interleaved_takes_turns_and_times_each_call():
    calls = []
    times = common.interleaved({"a": lambda i: calls.append(("a", i)), "b": lambda i: calls.append(("b", i))},
                               rounds=3, warmup=1)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert [len(v) for v in times.values()] == [3, 3] and all(t >= 0 for v in times.values() for t in v)


def test_stats_and_paired_ratio():
    s = common.stats([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    r = common.paired_ratio([2.0, 4.0, 9.0], [1.0, 1.0, 3.0])  # per round: 2, 4, 3
    assert (r["median"], r["min"], r["max"]) == (3.0, 2.0, 4.0)
    t = common.target("x", 1.5, 2.0, "lower")
    assert t["met"] and not common.target("y", 1.5, 2.0, "higher")["met"]


def test_zipf_ids_are_in_range_and_skewed():
    ids = common.zipf_ids(np.random.default_rng(0), 1000, 20_000)
    assert ids.dtype == np.int32 and ids.min() >= 1 and ids.max() < 1000
    counts = np.bincount(ids, minlength=1000)
    assert counts[1] > 10 * np.median(counts[1:])  # the head of a Zipf(1.1) draw is heavy
    assert 0.05 < np.unique(ids).size / 1000  # and its tail still spreads over the table


def test_md_table():
    assert common.md_table(["a", "b"], [[1, "x"], [2, "y"]]) == "| a | b |\n|---|---|\n| 1 | x |\n| 2 | y |"


@pytest.mark.slow
def test_quick_suite_times_every_phase_of_each_variant(quick_results):
    data = json.loads((quick_results / "phases.json").read_text())
    from optimizers.scopes import PHASES

    assert {r["variant"] for r in data["results"]} == {"one device", "row routed", "column"}
    for r in data["results"]:
        assert set(r["phase_ms"]) == {*PHASES, "other"} and all(v >= 0 for v in r["phase_ms"].values())
        # one device: the native kernel gathers, updates, gates and scatters in one op, named as the rule
        assert r["phase_ms"]["rule" if r["variant"] == "one device" else "scatter"] > 0, r
        assert r["phase_ms"]["dedupe"] > 0, r
        assert (r["phase_ms"]["routing"] > 0) == (r["variant"] != "one device"), r
    assert "| async_rowwise_adagrad | row routed |" in (quick_results / "phases.md").read_text()
