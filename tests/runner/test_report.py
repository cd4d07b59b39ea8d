"""runner.report over a fake Hydra multirun tree."""
import csv
import json
from pathlib import Path

import pytest

from runner.report import build_report, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_trial(d: Path, overrides: list[str], records: list[dict], *, tail: str = "", summary=None, failed=False):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / ".hydra" / "config.yaml").write_text("seed: 0\n")
    with open(d / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if failed:
        (d / "FAILED").write_text("Traceback ...\n")


@pytest.fixture
def multirun(tmp_path) -> Path:
    root = tmp_path / "multirun" / "2026-11-29" / "12-00-00"
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    _write_trial(
        root / "0",
        ["optimizer=adagrad", "optimizer.lr=0.1"],
        [
            {"step": 10, "train/loss": 0.70, "train/auc_click": 0.60, "eval/auc_mean": 0.65, "eval/auc_click": 0.66},
            {"step": 20, "train/loss": 0.60, "train/auc_click": 0.70, "eval/auc_mean": 0.75, "eval/auc_click": 0.76},
            {"step": 30, "train/loss": 0.55, "train/auc_click": 0.72, "eval/auc_mean": 0.72, "eval/auc_click": 0.73},
        ],
        summary={"status": "ok", "exit_code": 0},
    )
    _write_trial(
        root / "1",
        ["optimizer=adam", "optimizer.lr=0.01"],
        [
            {"step": 10, "train/loss": 0.65, "train/auc_click": None, "eval/auc_mean": 0.70},
            {"step": 20, "train/loss": 0.50},  # no eval this step
            {"step": 30, "train/loss": 0.45, "eval/auc_mean": 0.80, "grad_norm": "Infinity"},
        ],
        tail='{"step": 40, "train/lo',  # truncated by a kill
    )
    _write_trial(
        root / "2",
        ["optimizer=sgd", "optimizer.lr=1.0"],
        [
            {"step": 10, "train/loss": 0.90, "eval/auc_mean": 0.52},
            {"step": 20, "train/loss": "NaN", "eval/auc_mean": None},
        ],
        summary={"status": "failed", "exit_code": 1},
    )
    return root


def _rows(out: Path) -> list[dict]:
    with open(out / "report.csv", newline="") as f:
        return list(csv.DictReader(f))


def _assert_png(path: Path, min_bytes: int = 5_000):
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > min_bytes, (path, len(data))


def test_build_report(multirun, tmp_path):
    out = tmp_path / "report"
    md = build_report(multirun, out)
    assert md == out / "report.md" and md.is_file()

    rows = _rows(out)
    assert [r["trial"] for r in rows] == ["0", "1", "2"]
    r0, r1, r2 = rows
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert r0["overrides"] == "optimizer=adagrad optimizer.lr=0.1"
    assert r1["overrides"] == "optimizer=adam optimizer.lr=0.01"
    assert r0["steps"] == "30" and r1["steps"] == "30" and r2["steps"] == "20"
    assert r1["records"] == "3"  # truncated line skipped
    assert float(r0["final_loss"]) == pytest.approx(0.55)
    assert float(r1["final_loss"]) == pytest.approx(0.45)
    assert r2["final_loss"].lower() == "nan"
    assert r0["objective"] == "eval/auc_mean"
    assert float(r0["best_objective"]) == pytest.approx(0.75) and r0["best_step"] == "20"
    assert float(r0["final_objective"]) == pytest.approx(0.72)
    assert float(r1["best_objective"]) == pytest.approx(0.80) and r1["best_step"] == "30"
    assert float(r1["final_objective"]) == pytest.approx(0.80)
    assert float(r2["best_objective"]) == pytest.approx(0.52)
    assert float(r2["final_objective"]) == pytest.approx(0.52)  # null at step 20 ignored

    for name in ("loss.png", "auc.png", "final_metric.png"):
        _assert_png(out / name)

    text = md.read_text()
    assert "3 (2 ok, 1 failed)" in text
    assert "best trial: `1` 0.8" in text  # failed trial never wins
    assert "eval/auc_click" in text and "train/auc_click" in text and "eval/auc_mean" in text
    for name in ("loss.png", "auc.png", "final_metric.png"):
        assert f"({name})" in text


def test_failed_marker_and_default_out(multirun):
    (multirun / "0" / "FAILED").write_text("")
    md = build_report(multirun.parent.parent)  # whole multirun/ tree, report written there
    assert md == multirun.parent.parent / "report.md"
    rows = _rows(md.parent)
    assert [r["trial"] for r in rows] == [f"2026-11-29/12-00-00/{i}" for i in range(3)]
    assert [r["status"] for r in rows] == ["failed", "ok", "failed"]


def test_other_metric_and_single_run_cli(multirun, tmp_path, capsys):
    out = tmp_path / "single"
    assert main([str(multirun / "1"), "--out", str(out), "--metric", "train/loss", "--goal", "minimize"]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.md")
    (row,) = _rows(out)
    assert row["trial"] == "1" and row["objective"] == "train/loss"
    assert float(row["best_objective"]) == pytest.approx(0.45) and row["best_step"] == "30"
    for name in ("loss.png", "auc.png", "final_metric.png"):
        _assert_png(out / name, min_bytes=2_000)


def test_empty_and_missing_metrics(tmp_path):
    root = tmp_path / "mr"
    (root / "0" / ".hydra").mkdir(parents=True)
    (root / "0" / ".hydra" / "overrides.yaml").write_text("[]\n")
    (root / "0" / "FAILED").write_text("")  # crashed before logging anything
    md = build_report(root)
    (row,) = _rows(root)
    assert row["status"] == "failed" and row["steps"] == "" and row["final_objective"] == ""
    for name in ("loss.png", "auc.png", "final_metric.png"):
        _assert_png(root / name, min_bytes=1_000)
    assert md.is_file()
