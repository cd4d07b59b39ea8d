"""runner.report over a fake Hydra multirun tree."""
import csv
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from runner.report import build_report, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_trial(d: Path, overrides: list[str], records: list[dict], *, tail: str = "", summary=None, failed=False,
                 finished=True):
    """A trial's folder; ``finished``: its summary.json records a status, as a run's does when it ends."""
    if finished:
        summary = {"status": "failed" if failed else "ok", **(summary or {})}
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
            {"step": 10, "train/loss": 0.70, "train/auc_click": 0.60, "valid/auc_mean": 0.65, "valid/auc_click": 0.66},
            {"step": 20, "train/loss": 0.60, "train/auc_click": 0.70, "valid/auc_mean": 0.75, "valid/auc_click": 0.76},
            {"step": 30, "train/loss": 0.55, "train/auc_click": 0.72, "valid/auc_mean": 0.72, "valid/auc_click": 0.73},
        ],
        summary={"status": "ok", "exit_code": 0},
    )
    _write_trial(
        root / "1",
        ["optimizer=adam", "optimizer.lr=0.01"],
        [
            {"step": 10, "train/loss": 0.65, "train/auc_click": None, "valid/auc_mean": 0.70},
            {"step": 20, "train/loss": 0.50},  # no eval this step
            {"step": 30, "train/loss": 0.45, "valid/auc_mean": 0.80, "grad_norm": "Infinity"},
        ],
        tail='{"step": 40, "train/lo',  # truncated by a kill
    )
    _write_trial(
        root / "2",
        ["optimizer=sgd", "optimizer.lr=1.0"],
        [
            {"step": 10, "train/loss": 0.90, "valid/auc_mean": 0.52},
            {"step": 20, "train/loss": "NaN", "valid/auc_mean": None},
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
    assert r0["objective"] == "valid/auc_mean"
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
    assert "valid/auc_click" in text and "train/auc_click" in text and "valid/auc_mean" in text
    for name in ("loss.png", "auc.png", "final_metric.png"):
        assert f"({name})" in text


def test_failed_marker_and_default_out(multirun):
    (multirun / "0" / "FAILED").write_text("")
    md = build_report(multirun.parent.parent)  # whole multirun/ tree, report written there
    assert md == multirun.parent.parent / "report.md"
    rows = _rows(md.parent)
    assert [r["trial"] for r in rows] == [f"2026-11-29/12-00-00/{i}" for i in range(3)]
    assert [r["status"] for r in rows] == ["failed", "ok", "failed"]


def test_a_trial_without_a_status_is_unfinished_not_ok(tmp_path):
    """A sweep still running, or a trial killed: no status in summary.json, so the report does not call it ok."""
    _write_trial(tmp_path / "0", ["a=1"], [{"step": 1, "train/loss": 0.5, "valid/auc_mean": 0.7}])
    _write_trial(tmp_path / "1", ["a=2"], [{"step": 1, "train/loss": 0.6}], finished=False)
    md = build_report(tmp_path).read_text()
    assert "- trials: 2 (1 ok, 0 failed, 1 unfinished: no summary.json status, still running or stopped)" in md
    assert [r["status"] for r in _rows(tmp_path)] == ["ok", "unfinished"]


def test_an_unknown_metric_and_an_out_that_cannot_be_made_are_refused_writing_nothing(multirun, tmp_path, capsys):
    assert main([str(multirun), "--metric", "valid/nope", "--out", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --metric valid/nope: no trial logged it as a number; they logged 6 keys: exit_code, "
                   "grad_norm, train/auc_click, train/loss, valid/auc_click, valid/auc_mean. Give one of those, or "
                   "leave --metric out to rank by valid/auc_mean, the task's objective. Nothing was written\n")
    assert not (tmp_path / "r1").exists()
    (tmp_path / "afile").write_text("mine")
    assert main([str(multirun), "--out", str(tmp_path / "afile" / "sub")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {tmp_path / 'afile' / 'sub'} cannot be made or "
                                              f"written (Not a directory); give a folder that can be written. Nothing "
                                              f"was written")
    assert (tmp_path / "afile").read_text() == "mine"


RUN_KEYS = {"train/loss": 0.5, "train/auc": 0.8, "valid/auc": 0.7, "valid/logloss": 0.5, "valid/accuracy": 0.7,
            "test/auc": 0.7, "bayes/valid/auc": 0.9, "dense/grad_norm": 0.1, "emb/grad_norm": 0.1,
            "emb/stale_rows": 3, "emb/unique_rows": 40, "perf/step_time_ms": 30.0,
            **{f"emb/dropped_ids/cat_{j:02d}": 0 for j in range(1, 27)}}


@pytest.mark.parametrize("metric, closest", [
    ("valid/acu", "valid/auc, valid/accuracy, bayes/valid/auc, valid/ndcg@10"),  # a typo: the most alike first
    ("auc", "test/auc, train/auc, valid/auc, bayes/valid/auc"),  # a bare name: the keys it ends
    ("Valid/LogLoss", "valid/logloss, train/loss"),
])
def test_an_unknown_metric_names_the_closest_keys_first_and_counts_a_long_prefix(tmp_path, capsys, metric, closest):
    """A ranking run logs 60 keys and more (26 of them emb/dropped_ids/cat_NN): the message named every one on
    one line. The closest come first, the others by name, a prefix of more than 3 keys counted."""
    _write_trial(tmp_path / "0", ["a=1"], [{"step": 10, **RUN_KEYS}])
    _write_trial(tmp_path / "1", ["a=2"], [{"step": 10, **RUN_KEYS, "valid/ndcg@10": 0.4}])
    assert main([str(tmp_path), "--metric", metric, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    head = f"error: --metric {metric}: no trial logged it as a number; the closest they logged: {closest}; the "
    assert err.startswith(head) and err.count("\n") == 1 and len(err) < 600, err
    others = err[len(head):].split(": ", 1)[1].split(". Give one of those")[0].split(", ")
    assert err.split("; the ")[2].startswith(f"{len(RUN_KEYS) + 1 - len(closest.split(', '))} others: ")
    assert others == sorted(others) and "emb/* (29)" in others and not any("cat_" in k for k in others)
    shown = set(closest.split(", ")) | set(others)
    assert shown == {k for k in [*RUN_KEYS, "valid/ndcg@10"] if not k.startswith("emb/")} | {"emb/* (29)"}
    # no "leave --metric out": the default objective (valid/auc_mean, trials of unnamed data) was not logged
    assert err.endswith(". Give one of those. Nothing was written\n") and not (tmp_path / "r").exists()


def test_a_typo_of_a_key_only_summary_json_holds_is_answered_with_that_key(tmp_path, capsys):
    """A run writes some numbers only into summary.json as it ends (final/*, <key>/best, a test split's): --metric
    ranks by them, but a typo of one was answered with the keys of metrics.jsonl alone."""
    _write_trial(tmp_path / "0", ["a=1"], [{"step": 10, "train/loss": 0.5, "valid/auc_mean": 0.7}],
                 summary={"final/test/auc_mean": 0.71, "valid/auc_mean/best": 0.7, "emb/valid_step": True})
    assert main([str(tmp_path), "--metric", "final/test/auc_maen", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (
        "error: --metric final/test/auc_maen: no trial logged it as a number; the closest they logged: "
        "final/test/auc_mean, valid/auc_mean; the 2 others: train/loss, valid/auc_mean/best. Give one of those, or "
        "leave --metric out to rank by valid/auc_mean, the task's objective. Nothing was written\n")
    assert main([str(tmp_path), "--metric", "final/test/auc_mean", "--out", str(tmp_path / "r")]) == 0
    assert float(_rows(tmp_path / "r")[0]["final_objective"]) == pytest.approx(0.71)


def test_an_unknown_metric_among_keys_of_many_prefixes_names_16_and_counts_the_others():
    from runner.report.summary import unknown_metric

    text = unknown_metric("zzz", {f"g{i:02d}/k{j}" for i in range(30) for j in range(2)}, "valid/auc")
    assert text == ("--metric zzz: no trial logged it as a number; they logged 60 keys: "
                    + ", ".join(f"g{i:02d}/* (2)" for i in range(16)) + ", and 14 more prefixes. Give one of those. "
                    "Nothing was written")


def test_a_metric_that_is_no_number_is_refused_like_one_no_trial_logged(multirun, tmp_path, capsys):
    summary = json.loads((multirun / "0" / "summary.json").read_text())
    (multirun / "0" / "summary.json").write_text(json.dumps({**summary, "emb/valid_step": True}))
    assert main([str(multirun), "--metric", "emb/valid_step", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.startswith("error: --metric emb/valid_step: no trial logged it as a number")
    assert not (tmp_path / "r").exists()


def test_a_folder_in_the_way_of_a_report_file_is_refused_and_nothing_is_written(multirun, capsys):
    """The report is written whole or not at all: a folder named like one of its files stops it before any file
    is in place (report.csv is written first, the charts after it)."""
    (multirun / "loss.png").mkdir()
    assert main([str(multirun)]) == 2
    assert capsys.readouterr().err == (f"error: {multirun / 'loss.png'} is a folder where the report writes a file; "
                                       f"move it away or give another --out. Nothing was written\n")
    assert sorted(p.name for p in multirun.iterdir()) == ["0", "1", "2", "loss.png", "multirun.yaml"]


@pytest.mark.parametrize("damage, why", [
    (lambda d: (d / "summary.json").write_bytes(b'{"status": "ok\xff"}'), "summary.json (not UTF-8)"),
    (lambda d: (d / "summary.json").write_text('{"status": "o'), "summary.json (not JSON)"),
    (lambda d: (d / "summary.json").write_text("[" * 200_000), "summary.json (nested too deeply)"),
    (lambda d: (d / "summary.json").write_text("[1, 2]"), "summary.json (not a JSON object)"),
], ids=["not-utf8", "cut-short", "nested", "a-list"])
@pytest.mark.slow
def test_a_summary_that_cannot_be_read_makes_its_trial_unreadable_not_unfinished(multirun, tmp_path, damage, why):
    damage(multirun / "0")
    with open(multirun / "1" / "metrics.jsonl", "a") as f:
        f.write("[" * 200_000 + "\n")  # a line nested past the parser's recursion: skipped like a cut one
    md = build_report(multirun, tmp_path / "r").read_text()
    assert "- trials: 3 (1 ok, 1 failed, 1 unreadable)" in md
    assert f"- unreadable: `0`: {why}" in md
    assert [r["status"] for r in _rows(tmp_path / "r")] == ["unreadable", "ok", "failed"]


def test_an_out_inside_a_trial_or_empty_is_refused(multirun, tmp_path, capsys, monkeypatch):
    assert main([str(multirun), "--out", str(multirun / "0" / "report")]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {multirun / '0' / 'report'} is inside the trial {multirun / '0'} of {multirun}: the report "
        f"would be written among that trial's files and the trial left out of it. Give a folder outside the trials "
        f"(the default, {multirun}, or any other)\n")
    monkeypatch.chdir(tmp_path)
    assert main([str(multirun), "--out", ""]) == 2
    assert capsys.readouterr().err.startswith("error: --out is empty; give a folder")
    assert not (multirun / "0" / "report").exists() and not (tmp_path / "report.md").exists()
    assert main([str(multirun / "0"), "--out", str(multirun / "0" / "report")]) == 0  # inside the run it reports
    assert (multirun / "0" / "report" / "report.md").is_file()


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


# --------------------------------------------------------------------------- a sweep as the runner writes it

COMMON = ["trainer.steps=200", "trainer.log_interval=20", "logger=none"]
BAYES = {"click": 0.826, "like": 0.852, "mean": 0.839}


def _sweep(root: Path, bayes_shift=(0.0, 0.0, 0.0, 0.0)) -> Path:
    """4 trials (optimizer x async_emb) sharing three overrides; each logs train/valid AUCs and the constant
    Bayes-optimal AUCs of its valid labels, as runner.tasks.ranking does."""
    root.mkdir(parents=True)
    grid = [("async_adam", "on"), ("async_adam", "off"), ("async_sgd", "on"), ("async_sgd", "off")]
    for i, ((opt, mode), shift) in enumerate(zip(grid, bayes_shift)):
        records = []
        for step in (20, 40, 60):
            r = {"step": step, "train/loss": 0.7 - step / 1000 - i / 100, "train/auc_click": 0.6 + step / 1000,
                 "train/auc_like": 0.61 + step / 1000}
            if step % 40 == 0 or step == 60:
                r.update({f"valid/auc_{a}": 0.65 + step / 1000 + i / 100 for a in BAYES})
                r.update({f"bayes/valid/auc_{a}": v + shift for a, v in BAYES.items()})
            records.append(r)
        # Hydra records the overrides in command-line order: the sweep's own ones between the common ones.
        _write_trial(root / str(i), COMMON[:2] + [f"optimizer={opt}", f"async_emb={mode}"] + COMMON[2:], records,
                     summary={"status": "ok"})
    return root


def _loaded(root: Path):
    from runner.report import find_trials, label_trials, load_trial

    trials = [load_trial(d, label=d.relative_to(root).as_posix()) for d in find_trials(root)]
    return trials, label_trials(trials)


@pytest.mark.slow
def test_trials_are_labelled_by_what_differs_and_the_rest_is_one_header_line(tmp_path):
    root = _sweep(tmp_path / "sweep")
    md = build_report(root).read_text()
    assert "- common: `trainer.steps=200 trainer.log_interval=20 logger=none`" in md
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(table) == 4
    assert "| 0 | ok | `optimizer=async_adam async_emb=on` |" in table[0]
    assert "| 3 | ok | `optimizer=async_sgd async_emb=off` |" in table[3]
    assert not any("trainer.steps" in ln or "logger=none" in ln for ln in table)
    assert "best trial: `3`" in md and "(`optimizer=async_sgd async_emb=off`)" in md
    # The CSV keeps each trial's full overrides (data, not display).
    assert _rows(root)[1]["overrides"] == ("trainer.steps=200 trainer.log_interval=20 optimizer=async_adam "
                                           "async_emb=off logger=none")

    from runner.report import auc_figure

    trials, common = _loaded(root)
    assert common == COMMON
    assert [t.distinct for t in trials] == [["optimizer=async_adam", "async_emb=on"],
                                            ["optimizer=async_adam", "async_emb=off"],
                                            ["optimizer=async_sgd", "async_emb=on"],
                                            ["optimizer=async_sgd", "async_emb=off"]]
    fig = auc_figure(trials)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:4] == ["0: optimizer=async_adam async_emb=on", "1: optimizer=async_adam async_emb=off",
                          "2: optimizer=async_sgd async_emb=on", "3: optimizer=async_sgd async_emb=off"]
    assert not any("trainer.steps" in text for text in legend)


@pytest.mark.slow
def test_a_single_run_keeps_all_its_overrides_in_its_label(tmp_path):
    root = _sweep(tmp_path / "sweep")
    md = build_report(root / "2", out=tmp_path / "one").read_text()
    assert "common:" not in md
    assert "`trainer.steps=200 trainer.log_interval=20 optimizer=async_sgd async_emb=on logger=none`" in md


@pytest.mark.slow
def test_bayes_optimal_is_a_reference_line_on_its_metric_panel_not_a_panel(tmp_path):
    from runner.report import auc_figure, auc_panels

    trials, _ = _loaded(_sweep(tmp_path / "sweep"))
    panels = auc_panels(trials)
    assert panels.keys == ["train/auc_click", "train/auc_like", "valid/auc_click", "valid/auc_like", "valid/auc_mean"]
    assert not panels.unplaced
    for a, v in BAYES.items():
        assert panels.reference(f"valid/auc_{a}") == pytest.approx(v)
        assert set(panels.references[f"valid/auc_{a}"]) == {"0", "1", "2", "3"}

    fig = auc_figure(trials, panels)
    axes = {ax.get_title().split(" ")[0]: ax for ax in fig.axes if ax.get_visible()}
    assert sorted(axes) == panels.keys  # 5 panels: none for bayes/*

    def flat_lines(ax):
        return [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]

    for a, v in BAYES.items():
        ax = axes[f"valid/auc_{a}"]
        (ref,) = flat_lines(ax)
        assert list(ref.get_ydata()) == pytest.approx([v, v])
        assert ref.get_label() == "Bayes-optimal (same labels)"
        assert ax.get_title() == f"valid/auc_{a} (Bayes-optimal {v:.4g})"
        assert ax.get_ylim()[1] >= v  # the line is inside the panel
        assert len(ax.get_lines()) == 4 + 1  # the 4 trials and the reference
    for key in ("train/auc_click", "train/auc_like"):
        assert flat_lines(axes[key]) == [] and len(axes[key].get_lines()) == 4
    assert "Bayes-optimal (same labels)" in [t.get_text() for t in fig.legends[0].get_texts()]

    md = build_report(tmp_path / "sweep").read_text()
    assert "Bayes-optimal (dotted lines in auc.png): `bayes/valid/auc_click` 0.826, `bayes/valid/auc_like` 0.852" in md
    assert "`bayes/" not in md.split("AUC keys:")[1]


def test_trials_with_other_eval_data_get_one_reference_line_each(tmp_path):
    from runner.report import auc_figure, auc_panels

    trials, _ = _loaded(_sweep(tmp_path / "sweep", bayes_shift=(0.0, 0.0, 0.01, 0.01)))
    panels = auc_panels(trials)
    assert panels.reference("valid/auc_click") is None  # they disagree
    assert panels.references["valid/auc_click"]["2"] == pytest.approx(0.836)
    fig = auc_figure(trials, panels)
    (ax,) = [ax for ax in fig.axes if ax.get_title() == "valid/auc_click"]
    refs = sorted(ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":")
    assert refs == pytest.approx([0.826, 0.826, 0.836, 0.836])


def test_a_bayes_metric_without_its_panel_is_listed_in_the_header(tmp_path):
    root = tmp_path / "run"
    _write_trial(root, [], [{"step": 1, "valid/auc_mean": 0.7, "bayes/valid/auc_mean": 0.8,
                             "bayes/test/auc_mean": 0.9}])
    md = build_report(root).read_text()
    assert "- `bayes/test/auc_mean` (no `test/auc_mean` panel): `run` 0.9" in md
    assert "`bayes/valid/auc_mean` 0.8" in md and "AUC keys: `valid/auc_mean`\n" in md


def test_a_run_with_one_eval_split_gets_its_bayes_line_on_the_eval_panel(tmp_path):
    from runner.report import auc_panels

    root = tmp_path / "run"  # a ranking run of before the valid/test splits: eval/<metric> beside bayes/<metric>
    _write_trial(root, [], [{"step": 1, "eval/auc_mean": 0.7, "bayes/auc_mean": 0.8, "bayes/auc_view": 0.9}])
    trials, _ = _loaded(root.parent)
    panels = auc_panels(trials)
    assert panels.reference("eval/auc_mean") == 0.8 and list(panels.unplaced) == ["bayes/auc_view"]
    md = build_report(root, metric="eval/auc_mean").read_text()
    assert "`bayes/auc_mean` 0.8" in md and "- `bayes/auc_view` (no `auc_view` panel): `run` 0.9" in md


# --------------------------------------------------------------------------- refused arguments


def _tree(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*")}


def test_a_folder_without_trials_is_refused_and_nothing_is_written(tmp_path, capsys):
    root = tmp_path / "not-a-sweep"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "todo.txt").write_text("x\n")
    (root / "wandb" / "x").mkdir(parents=True)
    (root / "wandb" / "x" / "metrics.jsonl").write_text("{}\n")  # inside a skipped folder: not a trial
    before = _tree(root)
    out = tmp_path / "report-out"
    assert main([str(root), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"error: {root} holds no trial: a trial folder holds metrics.jsonl, "
                           ".hydra/overrides.yaml or a FAILED file")
    assert _tree(root) == before and not out.exists()
    assert main([str(root)]) == 2 and _tree(root) == before  # default out (the folder itself): still nothing


@pytest.mark.parametrize("make, needle", [
    (lambda d: d / "missing", "does not exist; give a run folder (outputs/<date>/<time>) or a sweep folder"),
    (lambda d: _touch(d / "0" / "metrics.jsonl"), "is a file, not a folder; give the folder that holds it: "),
    (lambda d: _touch(d / "notes.txt"), "is a file, not a folder; give a run or sweep folder"),
])
def test_bad_paths_are_refused_with_one_line(tmp_path, capsys, make, needle):
    path = make(tmp_path)
    assert main([str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {path} ") and needle in line


def test_out_that_is_a_file_is_refused_before_writing(multirun, tmp_path, capsys):
    out = _touch(tmp_path / "out.md")
    assert main([str(multirun), "--out", str(out)]) == 2
    assert f"--out {out} is a file" in capsys.readouterr().err
    assert not (multirun / "report.md").exists() and out.read_text() == ""


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


@pytest.mark.slow
def test_cli_exit_status_and_message(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "runner.report", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: {tmp_path} holds no trial") and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_next_item_run_gets_its_task_s_objective_chart_and_oracle_lines(tmp_path):
    from runner.report import auc_panels, load_trial

    root = tmp_path / "run"  # its config names data.name: the sequential task's declaration applies
    _write_trial(root, ["model=sequential"], [
        {"step": 10, "train/loss": 2.5, "valid/hr@10": 0.4, "valid/ndcg@10": 0.2, "valid/mrr": 0.18},
        {"step": 20, "train/loss": 2.3, "valid/hr@10": 0.5, "valid/ndcg@10": 0.3, "valid/mrr": 0.25,
         "popularity/valid/ndcg@10": 0.1, "oracle/valid/ndcg@10": 0.55, "best/valid/ndcg@10": 0.3}])
    (root / ".hydra" / "config.yaml").write_text("data:\n  name: synthetic_sequences\n")
    panels = auc_panels([load_trial(root)])
    assert panels.keys == ["valid/hr@10", "valid/mrr", "valid/ndcg@10"]  # no popularity/ or best/ panel
    assert panels.reference("valid/ndcg@10") == pytest.approx(0.55)
    md = build_report(root).read_text()
    assert "- objective: `valid/ndcg@10` (maximize)" in md and "- best trial: `run` 0.3 at step 20" in md
    assert "- Bayes-optimal oracle (dotted lines in ranking_metrics.png): `oracle/valid/ndcg@10` 0.55" in md
    assert (root / "ranking_metrics.png").read_bytes().startswith(PNG_MAGIC) and not (root / "auc.png").exists()


# --------------------------------------------------------------------------- what a report says of its trials


@pytest.mark.slow
def test_an_out_that_is_a_sweep_folder_inside_dir_keeps_that_sweep_s_trials(multirun, tmp_path, capsys):
    """--out is not passed over when trials are looked for: the report writes only files there, and a sweep
    folder given as --out holds trials of DIR's own (they were silently left out)."""
    import shutil

    multi = tmp_path / "multi"
    for name in ("sweepA", "sweepB"):
        shutil.copytree(multirun, multi / name)
    for _ in range(2):  # the second time, sweepA holds the first report's files: still 6 trials, no more
        assert main([str(multi), "--out", str(multi / "sweepA")]) == 0
        assert [r["trial"] for r in _rows(multi / "sweepA")] == [f"sweep{s}/{i}" for s in "AB" for i in range(3)]
        assert "- trials: 6 (4 ok, 2 failed)" in (multi / "sweepA" / "report.md").read_text()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("arg", ["", "  "])
def test_an_empty_dir_is_refused_not_taken_as_the_current_folder(multirun, monkeypatch, capsys, arg):
    monkeypatch.chdir(multirun)  # where Path("") would have walked and written
    assert main([arg]) == 2
    assert capsys.readouterr().err == ("error: DIR is empty; give a run folder (outputs/<date>/<time>) or a sweep "
                                       "folder (multirun/<date>/<time>); for the current folder, give .\n")
    assert sorted(p.name for p in multirun.iterdir()) == ["0", "1", "2", "multirun.yaml"]


def test_trials_of_another_task_are_named_in_a_warning_and_the_header(tmp_path, capsys):
    """The report is for one task (the first trial's): trials of another one are ranked by its objective and
    show – for it, so the command says which they are and how to report them apart."""
    root = tmp_path / "mixed"
    _write_trial(root / "rank" / "0", ["model.emb_width=8"], [{"step": 1, "train/loss": 0.5, "valid/auc_mean": 0.7}])
    (root / "rank" / "0" / ".hydra" / "config.yaml").write_text("data:\n  name: synthetic\n")
    for i in range(2):
        _write_trial(root / "seq" / str(i), [f"model.emb_width={8 * (i + 1)}"],
                     [{"step": 1, "train/loss": 2.5, "valid/ndcg@10": 0.2}])
        (root / "seq" / str(i) / ".hydra" / "config.yaml").write_text("data:\n  name: synthetic_sequences\n")
    assert main([str(root), "--out", str(tmp_path / "r")]) == 0
    warning = (f"2 of 3 trials ran another task than data.name=synthetic, the one this report ranks (by "
               f"`valid/auc_mean`) and charts: `seq/0`, `seq/1`, of data.name=synthetic_sequences (objective "
               f"valid/ndcg@10); what they did not log under this task's names shows –. Report each task apart: "
               f"python -m runner.report {root / 'seq'}")
    assert capsys.readouterr().err == f"warning: {warning}\n"
    assert f"- warning: {warning}\n" in (tmp_path / "r" / "report.md").read_text()
    assert main([str(root / "seq"), "--out", str(tmp_path / "s")]) == 0  # one task's folder: no warning
    assert capsys.readouterr().err == ""


def test_overrides_that_are_not_utf8_make_the_trial_unreadable_its_metrics_kept(multirun, tmp_path):
    """As docs/guide/sweeps.md says: overrides that are there but cannot be read make the trial ``unreadable``
    (it was ``ok`` with no overrides), the header names the file; its readable metrics are still reported."""
    (multirun / "0" / ".hydra" / "overrides.yaml").write_bytes(b"- optimizer=adagrad\xff\n")
    md = build_report(multirun, tmp_path / "r").read_text()
    assert "- trials: 3 (1 ok, 1 failed, 1 unreadable)" in md
    assert "- unreadable: `0`: overrides.yaml (not UTF-8)" in md
    row = _rows(tmp_path / "r")[0]
    assert row["status"] == "unreadable" and float(row["best_objective"]) == pytest.approx(0.75)


def test_ctrl_c_and_sigterm_stop_with_one_line_and_no_temporary_folder(multirun, monkeypatch, capsys):
    """Stopped while the charts are drawn: one line, exit 130 (Ctrl-C) or 143 (SIGTERM, which killed the
    command and left its .report-* folder behind), the temporary folder removed and nothing written."""
    import os
    import signal

    from runner.report import summary

    def not_handled(signum, frame):
        raise RuntimeError("SIGTERM was not handled by the report")

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    def sigterm(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, not_handled)  # the report's own handler replaces it while it runs
    try:
        for stop, how, code in ((ctrl_c, "Ctrl-C", 130), (sigterm, "SIGTERM", 143)):
            monkeypatch.setattr(summary, "_plot_metrics", stop)
            try:
                assert main([str(multirun)]) == code
            except KeyboardInterrupt:
                pytest.fail("Ctrl-C came out of main as a traceback")
            assert capsys.readouterr().err == (f"runner.report: stopped ({how}) before the report was complete; its "
                                               f"temporary folder was removed. Run the same command again to write "
                                               f"it\n")
            assert sorted(p.name for p in multirun.iterdir()) == ["0", "1", "2", "multirun.yaml"]
            assert signal.getsignal(signal.SIGTERM) is not_handled
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_unwritable_default_folder_is_named_as_dir_and_suggests_out(multirun, monkeypatch, capsys):
    """Without --out, the message names the folder as the one the report goes to by default (it said
    ``--out <DIR>``, an option not given) and says --out is how to write it elsewhere."""
    from runner.report import summary

    def refused(*a, **k):  # a read-only sweep folder (chmod does not stop root, who may run the tests)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(summary.tempfile, "mkdtemp", refused)
    assert main([str(multirun)]) == 2
    assert capsys.readouterr().err == (f"error: {multirun}, the run or sweep folder the report is written into "
                                       f"without --out, cannot be written (Permission denied); give --out a folder "
                                       f"that can be written. Nothing was written\n")


def test_a_finished_trials_final_value_is_its_summarys_when_its_metrics_were_cut_short(tmp_path):
    """metrics.jsonl's last line cut off (a full disk, a copy stopped midway): the report showed the step before's
    value as final, though summary.json holds the run's own."""
    root = tmp_path / "mr"
    rows = [{"step": 3, "train/loss": 0.7, "valid/auc_mean": 0.455}, {"step": 6, "train/loss": 0.6}]
    _write_trial(root / "0", ["model.emb_width=8"], rows, tail='{"step": 6, "valid/auc_mean": 0.4',
                 summary={"valid/auc_mean": 0.401869, "train/loss": 0.6})
    _write_trial(root / "1", ["model.emb_width=16"], rows, finished=False)  # still running: its last row is all
    build_report(root)
    finals = {r["trial"]: r["final_objective"] for r in _rows(root)}
    assert finals == {"0": "0.401869", "1": "0.455"}


# --------------------------------------------------------------------------- whose report --out holds


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


@pytest.mark.slow
def test_an_out_holding_another_folder_s_report_is_refused_unless_overwrite(multirun, tmp_path, capsys):
    """The report of B into the --out that holds A's replaced A's files without a word. A report of A there is
    updated in place; B's is refused, A's files untouched, until --overwrite says to replace it."""
    out, a, b = tmp_path / "X", multirun / "0", multirun / "1"
    assert main([str(a), "--out", str(out)]) == 0
    assert main([str(a), "--out", str(out), "--metric", "train/loss"]) == 0  # the same folder: updated
    assert _rows(out)[0]["objective"] == "train/loss"
    capsys.readouterr()
    before = _files(out)
    assert main([str(b), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out} holds the report of {a.resolve()}; the report of {b} "
                                       f"would replace it. Give another --out (a folder of its own), or add "
                                       f"--overwrite to replace it. Nothing was written\n")
    assert _files(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)  # no .report-* left
    assert main([str(b), "--out", str(out), "--overwrite"]) == 0
    assert [r["trial"] for r in _rows(out)] == ["1"] and (out / "report.md").read_text().startswith(f"# Report: {b}")
    assert main([str(a), "--out", str(out)]) == 2  # now it is B's
    assert "holds the report of " + str(b.resolve()) in capsys.readouterr().err


def test_files_of_the_report_s_names_it_did_not_write_are_refused_unless_overwrite(multirun, tmp_path, capsys):
    """A user's folder holding a loss.png (or a report.md that is no report of DIR) kept nothing of them."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "loss.png").write_bytes(b"my plot")
    (mine / "notes.txt").write_text("mine")
    assert main([str(multirun), "--out", str(mine)]) == 2
    assert capsys.readouterr().err == (f"error: --out {mine} holds loss.png, not known to be a report of {multirun}; "
                                       f"give another --out (a new folder), or add --overwrite to replace it. "
                                       f"Nothing was written\n")
    assert _files(mine) == {"loss.png": b"my plot", "notes.txt": b"mine"}
    (multirun / "report.md").write_text("# My notes\n")  # the default --out: DIR itself
    assert main([str(multirun)]) == 2
    assert capsys.readouterr().err == (f"error: {multirun} (where the report goes without --out) holds "
                                              f"report.md, not known to be a report of {multirun}; give --out a "
                                              f"new folder, or add --overwrite to replace it. Nothing was written\n")
    assert (multirun / "report.md").read_text() == "# My notes\n"
    assert main([str(multirun), "--out", str(mine), "--overwrite"]) == 0
    assert _rows(mine)[0]["trial"] == "0" and (mine / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_report_moved_with_its_folder_or_of_before_records_is_still_its_own(multirun, tmp_path):
    """A sweep copied whole (to another machine, say) keeps its report's folder; a report.md written before reports
    recorded their folder is its own folder's when it is in that folder (elsewhere: not known, refused)."""
    import shutil

    assert main([str(multirun)]) == 0
    moved = shutil.copytree(multirun, tmp_path / "copy")
    assert main([str(moved)]) == 0 and (moved / "report.md").read_text().startswith(f"# Report: {moved}")
    legacy = "# Report: multirun/2026-11-29/12-00-00\n\n- trials: 3\n"
    (moved / "report.md").write_text(legacy)
    assert main([str(moved)]) == 0 and (moved / "report.md").read_text() != legacy
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.md").write_text(legacy)
    assert main([str(moved), "--out", str(tmp_path / "old")]) == 2
    assert (tmp_path / "old" / "report.md").read_text() == legacy


def test_an_out_in_another_run_s_folder_is_refused(multirun, tmp_path, capsys):
    """The report of trial 0 written among trial 1's files (and later taken for trial 1's own report)."""
    other = multirun / "1"
    before = _files(other)
    for out, what in ((other, "is the run folder"), (other / "sub", "is inside the run folder")):
        assert main([str(multirun / "0"), "--out", str(out), "--overwrite"]) == 2
        assert capsys.readouterr().err == (f"error: --out {out} {what} {other}, not {multirun / '0'}'s: the report of "
                                           f"{multirun / '0'} would be written among another run's files. Give a "
                                           f"folder of its own (or leave --out out to write it into "
                                           f"{multirun / '0'})\n")
    assert _files(other) == before and not (other / "sub").exists()


@pytest.mark.slow
def test_a_folder_name_that_is_not_utf8_is_shown_escaped_not_a_traceback(multirun, tmp_path):
    """A trial folder whose name is not UTF-8 (bytes Python keeps as surrogates) stopped the report with a
    UnicodeEncodeError in report.csv (and matplotlib's TypeError in the charts' labels)."""
    import os

    odd = multirun.parent / os.fsdecode(b"sweep\xff")
    multirun.rename(odd)
    for _ in range(2):  # the second time, the report of the same folder is updated
        assert main([str(odd)]) == 0
    assert (odd / "report.md").read_text(encoding="utf-8").startswith("# Report: " + str(odd.parent) + "/sweep\\xff\n")
    assert [r["trial"] for r in _rows(odd)] == ["0", "1", "2"]
    os.rename(odd / "1", odd / os.fsdecode(b"1\xfe"))
    assert main([str(odd), "--out", str(tmp_path / "r")]) == 0
    assert [r["trial"] for r in _rows(tmp_path / "r")] == ["0", "1\\xfe", "2"]
    _assert_png(tmp_path / "r" / "loss.png")


def test_a_report_of_before_records_is_its_folder_s_when_its_title_names_dir(multirun, tmp_path, monkeypatch, capsys):
    """A report.md written before reports recorded their folder: updated when its title names DIR as given from
    here (the same command again), refused otherwise, and a title that is no path is no crash."""
    monkeypatch.chdir(multirun.parent)
    out = tmp_path / "X"
    out.mkdir()
    for title, code in (("12-00-00", 0), ("12-00-00/0", 2), ("a\0b", 2)):
        (out / "report.md").write_text(f"# Report: {title}\n\n- trials: 3\n")
        assert main(["12-00-00", "--out", str(out)]) == code
        err = capsys.readouterr().err
        assert err == ("" if code == 0 else f"error: --out {out} holds auc.png, final_metric.png, loss.png, "
                       f"report.csv, report.md, not known to be a report of 12-00-00; give another --out (a new folder), or add "
                       f"--overwrite to replace them. Nothing was written\n")


def test_labels_holding_dollar_signs_are_text_not_tex(tmp_path):
    """An override such as a=${x}_${y} (an interpolation) in a chart's legend was parsed as matplotlib's TeX and
    stopped the report with a ParseSyntaxException traceback."""
    from runner.report import auc_figure, load_trial

    _write_trial(tmp_path / "0", ["a=${x}_${y}"], [{"step": 1, "train/loss": 0.5, "valid/auc_mean$": 0.7}])
    _write_trial(tmp_path / "1", ["a=2"], [{"step": 1, "train/loss": 0.6, "valid/auc_mean$": 0.6}])
    build_report(tmp_path, tmp_path / "r", metric="valid/auc_mean$")
    _assert_png(tmp_path / "r" / "loss.png")
    fig = auc_figure([load_trial(tmp_path / "0")])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["0: a=${x}_${y}"]


def test_a_key_of_a_lone_surrogate_escape_is_shown_escaped_not_a_traceback(tmp_path):
    """json reads "\\ud800" as a lone surrogate, which neither a UTF-8 report.md nor the charts' font can hold."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5, "valid/auc_\\ud800": 0.7}\n')
    md = build_report(tmp_path).read_text(encoding="utf-8")
    assert "AUC keys: `valid/auc_\\ud800`" in md
    _assert_png(tmp_path / "auc.png")


def test_a_path_that_cannot_be_looked_at_is_one_line_not_a_traceback(multirun, tmp_path, capsys):
    """A name longer than the file system allows (or, for a user, a folder above it they cannot enter): the
    os.stat error came out of Path.exists as a traceback."""
    long = tmp_path / ("a" * 300)
    assert main([str(long)]) == 2
    assert capsys.readouterr().err == (f"error: {long} cannot be looked at (File name too long); give a run or "
                                       f"sweep folder that can be read\n")
    assert main([str(multirun), "--out", str(long / "r")]) == 2
    assert capsys.readouterr().err == (f"error: --out {long / 'r'} cannot be looked at (File name too long); give a "
                                       f"folder that can be written. Nothing was written\n")
    assert sorted(p.name for p in multirun.iterdir()) == ["0", "1", "2", "multirun.yaml"]


@pytest.mark.slow
def test_a_folder_name_holding_a_line_break_keeps_its_title_one_line_and_its_report_its_own(multirun, tmp_path):
    """The title spread the name over three lines, which pushed the record of the folder below where it was
    looked for: the same command again was refused as a report of another folder."""
    odd = multirun.rename(multirun.parent / "a\nb\nc")
    for _ in range(2):
        assert main([str(odd), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.md").read_text().splitlines()[0] == f"# Report: {odd.parent}/a\\nb\\nc"


# --------------------------------------------------------------------------- files that are no regular file


class _Blocked(BaseException):
    """Raised by ``_within``: no ``except OSError`` (TimeoutError is one) or ``except Exception`` takes it for a
    file that cannot be read."""


@contextmanager
def _within(seconds: float):
    """Fail, rather than hang, a call still blocked after ``seconds`` (opening a FIFO waits for a writer)."""
    def late(signum, frame):
        raise _Blocked(f"still blocked after {seconds} s")

    before = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


@pytest.mark.parametrize("name, make, kind", [
    ("metrics.jsonl", os.mkfifo, "a FIFO"),
    ("metrics.jsonl", os.mkdir, "a folder"),
    ("metrics.jsonl", lambda p: os.symlink(os.devnull, p), "a device"),
    ("summary.json", os.mkfifo, "a FIFO"),
], ids=["metrics-fifo", "metrics-folder", "metrics-device", "summary-fifo"])
def test_a_fifo_folder_or_device_in_place_of_a_trials_file_makes_it_unreadable_not_a_hang(multirun, tmp_path, name,
                                                                                            make, kind):
    """A FIFO named metrics.jsonl or summary.json blocked the report for good (opening it waits for a writer), a
    device was read as a file (/dev/zero: until memory ran out). Each is now named, and its trial unreadable."""
    (multirun / "0" / name).unlink()
    make(multirun / "0" / name)
    with _within(60):
        md = build_report(multirun, tmp_path / "r").read_text()
    assert f"- unreadable: `0`: {name} ({kind}, not a regular file)" in md
    assert [r["status"] for r in _rows(tmp_path / "r")] == ["unreadable", "ok", "failed"]


@pytest.mark.parametrize("path, make, shown", [
    (".hydra/overrides.yaml", os.mkfifo, "overrides.yaml (a FIFO, not a regular file)"),
    (".hydra/overrides.yaml", os.mkdir, "overrides.yaml (a folder, not a regular file)"),
    (".hydra/config.yaml", os.mkfifo, ".hydra/config.yaml (a FIFO, not a regular file)"),
    (".hydra/config.yaml", lambda p: os.symlink(os.devnull, p), ".hydra/config.yaml (a device, not a regular file)"),
], ids=["overrides-fifo", "overrides-folder", "config-fifo", "config-device"])
def test_a_fifo_folder_or_device_in_place_of_a_trials_hydra_file_is_named_not_missing(multirun, tmp_path, path, make,
                                                                                      shown):
    """Hydra's overrides.yaml or config.yaml as a FIFO, folder or device was taken for no file: the trial showed
    no overrides, or the default task's report, and nothing said why. Each is now named, its trial unreadable."""
    (multirun / "0" / path).unlink()
    make(multirun / "0" / path)
    with _within(60):
        md = build_report(multirun, tmp_path / "r").read_text()
    assert f"- unreadable: `0`: {shown}" in md.splitlines()
    assert [r["status"] for r in _rows(tmp_path / "r")] == ["unreadable", "ok", "failed"]


def test_a_fifo_named_report_md_in_out_is_refused_not_a_hang(multirun, tmp_path, capsys):
    """Whose report --out holds is read from its report.md: a FIFO of that name blocked the report for good."""
    out = tmp_path / "X"
    out.mkdir()
    os.mkfifo(out / "report.md")
    with _within(60):
        assert main([str(multirun), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out} holds report.md, not known to be a report of {multirun}; "
                                       f"give another --out (a new folder), or add --overwrite to replace it. "
                                       f"Nothing was written\n")
    assert [p.name for p in out.iterdir()] == ["report.md"] and (out / "report.md").is_fifo()


def test_metrics_are_read_line_by_line_with_the_results_of_the_whole_file_s_lines(tmp_path, monkeypatch):
    """metrics.jsonl was read whole into memory (a long run's log can be large); it is now read line by line,
    with what reading it whole gave: records, blank lines passed over, bad lines (a truncated last one) counted."""
    from runner.report import read_metrics, trials

    rows = [{"step": i, "train/loss": 1 / (i + 1), "valid/auc_\u00e9": 0.5 + i / 8000} for i in range(3000)]
    body = "".join(json.dumps(r, ensure_ascii=i % 2 == 0) + ("\r\n" if i % 3 else "\n") + ("\n" if i % 7 == 0 else "")
                   for i, r in enumerate(rows))
    body += '[1, 2]\n{"step": 3000, "k\\ud800": 1}\n{"step": 3001, "train/lo'  # no object; a lone surrogate; cut
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(body.encode("utf-8"))
    assert len(body) > 20 * 8192  # many of the reader's buffers, lines split between them

    class LinesOnly:
        """The file as open_regular gives it, refusing to be read whole."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def __iter__(self):
            return iter(self.f)

        def read(self, *a):
            raise AssertionError("metrics.jsonl was read whole")

    opened = trials.open_regular
    monkeypatch.setattr(trials, "open_regular", lambda p, *a, **k: LinesOnly(opened(p, *a, **k)))
    records, bad = read_metrics(path)
    assert records == [*rows, {"step": 3000, "k\\ud800": 1}] and bad == 2


# --------------------------------------------------------------------------- a report replacing one, two at once


def _next_item_run(root: Path) -> Path:
    _write_trial(root, ["model=sequential"], [{"step": 10, "train/loss": 2.5, "valid/ndcg@10": 0.2}])
    (root / ".hydra" / "config.yaml").write_text("data:\n  name: synthetic_sequences\n")
    return root


@pytest.mark.slow
def test_a_report_replacing_another_removes_the_charts_it_does_not_write_and_nothing_else(multirun, tmp_path):
    """--overwrite of a ranking report with a next-item one left auc.png beside the new report, a chart that
    is none of its. The files the report before recorded writing and this one does not are removed; a file of a
    report's name the report before did not record writing, and any other file, are kept."""
    out, run = tmp_path / "X", _next_item_run(tmp_path / "seq")
    assert main([str(multirun), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert main([str(run), "--out", str(out), "--overwrite"]) == 0
    assert sorted(_files(out)) == ["final_metric.png", "loss.png", "notes.txt", "ranking_metrics.png", "report.csv",
                                   "report.md"]
    assert (out / "notes.txt").read_text() == "mine"
    mine = tmp_path / "mine"  # a user's folder: their own auc.png and report.md, no report recorded writing them
    mine.mkdir()
    (mine / "auc.png").write_bytes(b"my plot")
    (mine / "report.md").write_text("# My notes\n")
    assert main([str(run), "--out", str(mine), "--overwrite"]) == 0
    assert (mine / "auc.png").read_bytes() == b"my plot" and (mine / "ranking_metrics.png").is_file()


@pytest.mark.slow
def test_a_second_report_into_a_folder_another_one_is_writing_is_refused(multirun, tmp_path, capsys):
    """Two reports into one --out at once mixed their files (one's report.md beside the other's charts). The one
    writing holds out/.report.lock; another is refused, nothing changed. The lock is the system's (flock), so
    the file a report killed midway left behind blocks none after it."""
    import fcntl

    out = tmp_path / "X"
    assert main([str(multirun / "0"), "--out", str(out)]) == 0
    capsys.readouterr()
    before = _files(out)
    with open(out / ".report.lock", "w") as lock:  # as the report writing the folder holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main([str(multirun / "0"), "--out", str(out), "--metric", "train/loss"]) == 2
        assert capsys.readouterr().err == (f"error: --out {out} is being written by another report (it holds "
                                           f"{out / '.report.lock'}); wait for it to end, then run the command "
                                           f"again. Nothing was written\n")
        assert main([str(multirun)]) == 0  # another folder: not held
    assert _files(out) == {**before, ".report.lock": b""}
    assert main([str(multirun / "0"), "--out", str(out), "--metric", "train/loss"]) == 0  # the lock left, not held
    assert _rows(out)[0]["objective"] == "train/loss" and sorted(_files(out)) == sorted(before)
