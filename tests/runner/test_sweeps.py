"""Sweeps: W&B group/tags/names per trial, failed trials recorded (FAILED, summary.json, W&B exit code) without
stopping the sweep, the end-of-sweep summary, the experiment and search configs; and, in subprocesses, a real
multirun, a multirun with a bad trial, and an Optuna search. W&B offline files are read back record by record."""
from __future__ import annotations

import csv
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.types import RunMode
from omegaconf import OmegaConf

from runner import sweep_checks, sweep_launch, sweep_storage, sweeps
from runner.errors import PreflightError
from tests.runner.support import CONF, TINY, compose_config

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SEARCHES = sorted(p.stem for p in (CONF / "hparams_search").glob("*.yaml"))


# --------------------------------------------------------------------------- reading W&B offline files


def wandb_records(path: Path):
    """The protobuf records of an offline ``run-<id>.wandb`` file: a 7-byte header (``:W&B``, magic, version),
    then 32 KiB blocks of chunks ``crc32 u32 | length u16 | type u8 | data`` (1 full, 2 first, 3 middle, 4 last);
    a block tail shorter than a chunk header is zero padding."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", data[:7]
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def wandb_run(trial: Path) -> dict:
    """id, group, tags, config, summary (last value per key) and exit code of the one offline W&B run under
    ``trial/wandb``."""
    runs = sorted((trial / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (file,) = runs[0].glob("run-*.wandb")
    out: dict = {"dir": runs[0], "summary": {}}
    for r in wandb_records(file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(id=r.run.run_id, group=r.run.run_group, tags=list(r.run.tags), name=r.run.display_name,
                       config={u.key: json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "summary":
            for u in r.summary.update:
                out["summary"][u.key or "/".join(u.nested_key)] = json.loads(u.value_json)
        elif kind == "exit":
            out["exit_code"] = r.exit.exit_code
    return out


# --------------------------------------------------------------------------- naming and tags


def fake_hydra(sweeper="hydra._internal.core_plugins.basic_sweeper.BasicSweeper", out="/tmp/x", **choices):
    return OmegaConf.create({
        "runtime": {"choices": {"optimizer": "async_adam", "async_emb": "on", "experiment": None,
                                "hydra/sweeper": "basic", **choices}, "output_dir": str(out)},
        "overrides": {"task": ["optimizer=async_adam", "optimizer.learning_rate=0.01", "x." + "y" * 80 + "=1"]},
        "job": {"name": "runner", "num": 3},
        "sweep": {"dir": "multirun/2026-11-29/12-00-00"},
        "sweeper": {"_target_": sweeper},
    })


def test_trial_tags_are_choices_then_overrides_deduplicated_and_cut_to_64():
    tags = sweeps.trial_tags(fake_hydra(**{"schema/logger@logger": "logger"}))  # a schema an option extends: no tag
    assert tags == ["optimizer=async_adam", "async_emb=on", "optimizer.learning_rate=0.01", ("x." + "y" * 80)[:64]]


def test_group_and_name_come_from_the_sweep_unless_set():
    from runner.notices import unused_settings

    hc = fake_hydra(experiment="async_vs_sync_adam")
    assert sweeps.sweep_group(hc) == "runner-async_vs_sync_adam-2026-11-29_12-00-00"
    assert sweeps.sweep_group(fake_hydra()) == "runner-2026-11-29_12-00-00"
    cfg = compose_config(["logger=wandb"])
    sweeps.name_trial(cfg, hc)
    assert cfg.logger.group == "runner-async_vs_sync_adam-2026-11-29_12-00-00"
    assert cfg.logger.name.startswith("#3 optimizer=async_adam optimizer.learning_rate=0.01")
    cfg = compose_config()  # debug=tiny: logger=none, no W&B run to name (a sweep's names were warned about)
    sweeps.name_trial(cfg, hc)
    assert (cfg.logger.group, cfg.logger.name) == (None, None) and unused_settings(cfg, 6) == []
    cfg = compose_config(["logger=wandb", "logger.group=mine", "logger.name=trial"])
    sweeps.name_trial(cfg, hc)
    assert (cfg.logger.group, cfg.logger.name) == ("mine", "trial")


def test_long_derived_names_keep_their_ends_within_128_and_a_stale_failed_record_is_dropped(tmp_path):
    """A sweep dir or overrides long enough to pass the 128 characters a group or name may have: the derived ones
    are cut in the middle (a set one is the user's, checked by the preflight). A ``FAILED`` record an earlier
    sweep into the same directory left is removed when the trial starts."""
    hc = fake_hydra(out=tmp_path)
    hc.sweep.dir = "multirun/" + "x" * 140 + "/12-00-00"
    (tmp_path / "FAILED").write_text("PreflightError: an earlier sweep's trial\n")
    cfg = compose_config(["logger=wandb"])
    sweeps.name_trial(cfg, hc)
    assert len(cfg.logger.name) <= 128
    assert cfg.logger.group.startswith("runner-xxx") and cfg.logger.group.endswith("x_12-00-00")
    assert "..." in cfg.logger.group and len(cfg.logger.group) == 128
    assert not (tmp_path / "FAILED").exists()
    assert sweeps.fit_name("a" * 128) == "a" * 128 and sweeps.fit_name("ab" * 100) == "ab" * 31 + "...b" + "ab" * 31


def test_optuna_settings_that_cannot_work_are_named(capsys):
    problems = sweeps.optuna_problems(OmegaConf.create({"n_trials": 0, "n_jobs": -1, "direction": "maximise",
                                                        "max_failure_rate": 2.0}))
    assert problems == ["hydra.sweeper.n_trials=0 must be an integer >= 1", "hydra.sweeper.n_jobs=-1 must be an integer >= 1",
                        "hydra.sweeper.direction=maximise must be minimize or maximize",
                        "hydra.sweeper.max_failure_rate=2.0 must be in [0, 1]"]
    assert sweeps.optuna_problems(OmegaConf.create({"direction": ["maximize", "minimize"]})) == [
        "hydra.sweeper.direction=['maximize', 'minimize'] must be minimize or maximize: a run's objective "
        "(trainer.objective) is one number, so a search has one direction"]
    assert sweeps.optuna_problems(OmegaConf.create({"n_trials": 20, "n_jobs": 1, "direction": "maximize",
                                                    "max_failure_rate": 1.0})) == []
    cfg = OmegaConf.create({"hydra": {"sweeper": {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper."
                                                              "OptunaSweeper", "n_trials": 0}}})
    with pytest.raises(SystemExit) as e:
        sweeps.SweepSummary().on_multirun_start(cfg)
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: invalid sweep:\n  - hydra.sweeper.n_trials=0 must be an integer >= 1\n"
    sweeps.SweepSummary().on_multirun_start(OmegaConf.create({"hydra": {"sweeper": {"_target_": "basic", "n_jobs": 0}}}))


# --------------------------------------------------------------------------- failed trials


def _tracker_factory(cfg, out):
    from runner.app import run_tracker

    return lambda: run_tracker(cfg, out, ["optimizer=adam"], process_index=0)


@pytest.mark.slow
def test_failure_before_the_tracker_existed_gets_a_failed_wandb_run(tmp_path):
    cfg = compose_config(["logger=wandb"], tiny=False)
    try:
        raise PreflightError("optimizer=adam cannot run with async_emb=on")
    except PreflightError as e:
        error = e
    hc = fake_hydra(out=tmp_path)
    assert math.isnan(sweeps.trial_failed(cfg, hc, error, _tracker_factory(cfg, tmp_path)))
    failed = (tmp_path / "FAILED").read_text()
    assert failed.startswith("PreflightError: optimizer=adam cannot run with async_emb=on\n")
    assert "Traceback" in failed and "test_sweeps.py" in failed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 1
    assert summary["error"] == "PreflightError: optimizer=adam cannot run with async_emb=on"
    import wandb

    assert wandb.run is None  # nothing left open for the next trial
    wandb.teardown()  # finish() can return before wandb-core has written the exit record; this waits for it
    run = wandb_run(tmp_path)
    assert run["exit_code"] == 1 and "optimizer=adam" in run["tags"]
    assert run["config"]["optimizer"]["_target_"] == "optimizers.AsyncRowwiseAdagrad"  # the resolved config (model=ranking's)
    info = json.loads((tmp_path / sweeps.RUN_INFO_FILE).read_text())
    assert info["id"] == run["id"] and info["dir"] == str(run["dir"]) and info["mode"] == "offline"


def test_optuna_trials_reraise_and_nonfinite_objectives_fail_only_for_optuna(tmp_path):
    cfg = compose_config()
    optuna = fake_hydra(sweeper="hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper", out=tmp_path)
    make = _tracker_factory(cfg, tmp_path)
    with pytest.raises(ValueError, match="bad lr"):
        sweeps.trial_failed(cfg, optuna, ValueError("bad lr"), make)
    assert (tmp_path / "FAILED").read_text().startswith("ValueError: bad lr")

    basic_dir, optuna_dir = tmp_path / "basic", tmp_path / "optuna"
    for d in (basic_dir, optuna_dir):
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"status": "ok", "eval/auc_mean": "NaN"}))
    assert math.isnan(sweeps.checked_objective(cfg, fake_hydra(out=basic_dir), float("nan"), make))
    assert not (basic_dir / "FAILED").exists()
    assert sweeps.checked_objective(cfg, fake_hydra(sweeper=optuna.sweeper._target_, out=optuna_dir), 0.7, make) == 0.7
    with pytest.raises(sweeps.TrialFailed, match="the task's objective is nan: nothing to compare"):
        sweeps.checked_objective(cfg, fake_hydra(sweeper=optuna.sweeper._target_, out=optuna_dir), float("nan"), make)
    assert json.loads((optuna_dir / "summary.json").read_text())["status"] == "failed"
    assert (optuna_dir / "FAILED").read_text().startswith("TrialFailed: the task's objective is nan")


def _fake_trial(root: Path, num: int, overrides: list[str], error: str | None = None) -> None:
    d = root / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if error:
        (d / "FAILED").write_text(f"{error}\n\nTraceback (most recent call last): ...\n")


def test_a_subdir_that_gives_two_trials_one_folder_stops_the_sweep_and_nested_trials_are_counted(tmp_path, capsys):
    """hydra.sweep.subdir=same: trial #1 wrote over #0's record, and the summary counted one trial; with a nested
    subdir (t/${hydra.job.num}) the summary found none and said no trial ran."""
    sweeps.note_earlier_trials(tmp_path)  # a sweep starts
    hc = fake_hydra(out=tmp_path / "same")
    hc.sweep.subdir = "same"
    assert sweeps.name_trial(compose_config(), hc) is None
    hc.job.num = 4
    assert sweeps.name_trial(compose_config(), hc) == (
        f"hydra.sweep.subdir=same gives trials #3 and #4 the same folder {tmp_path / 'same'}: #4 would write over "
        f"#3's record; name each trial's folder apart, e.g. with ${{hydra.job.num}} (Hydra's default subdir)")
    for i in range(3):
        _fake_trial(tmp_path / "t", i, [f"trainer.seed={i}"], "RuntimeError: diverged" if i == 1 else None)
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    sweeps.SweepSummary().on_multirun_end(cfg)
    assert capsys.readouterr().out.splitlines() == [f"sweep: 3 trials, 2 ok, 1 failed ({tmp_path})",
                                                    "  FAILED #1 [trainer.seed=1]: RuntimeError: diverged"]


def test_sweep_summary_names_failed_trials_and_exits_only_if_all_failed(tmp_path, capsys):
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    for i, opt in enumerate(["async_adam", "adam", "async_sgd"]):
        error = "PreflightError: no fused update" if opt == "adam" else None
        _fake_trial(tmp_path, i, [f"optimizer={opt}", "async_emb=on"], error)
    (tmp_path / "multirun.yaml").write_text("{}\n")
    sweeps.SweepSummary().on_multirun_end(cfg)
    out = capsys.readouterr().out.splitlines()
    assert out == [f"sweep: 3 trials, 2 ok, 1 failed ({tmp_path})",  # async_emb=on, every trial's, is not shown
                   "  FAILED #1 [optimizer=adam]: PreflightError: no fused update"]

    (tmp_path / "1" / "FAILED").write_text("PreflightError: invalid config:\n  - model.emb_width=0 is outside\n")
    sweeps.SweepSummary().on_multirun_end(cfg)  # a list's first item beside its heading: the line names the value
    assert capsys.readouterr().out.splitlines()[1] == ("  FAILED #1 [optimizer=adam]: PreflightError: "
                                                       "invalid config: - model.emb_width=0 is outside")
    for i in (0, 2):
        (tmp_path / str(i) / "FAILED").write_text("RuntimeError: diverged\n")
    with pytest.raises(SystemExit) as e:
        sweeps.SweepSummary().on_multirun_end(cfg)
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert f"sweep: 3 trials, 0 ok, 3 failed ({tmp_path})" in err and "FAILED #2 [optimizer=async_sgd" in err


def test_failed_lines_show_the_overrides_that_differ_and_a_lone_trial_all_of_its_own(tmp_path, capsys):
    """The FAILED lines listed every override of a trial, the ones all trials share as well, which buried the
    values that differ; they now show those that differ (as the report's labels do), in the trial's order."""
    fixed = ["trainer.batch_size=30", "data.num_items=600"]
    sweeps.note_earlier_trials(tmp_path / "three")  # a sweep starts (no trial refused in this process yet)
    for i, (opt, lr) in enumerate([("adam", "0.1"), ("adam", "0.01"), ("async_sgd", "0.1")]):
        _fake_trial(tmp_path / "three", i, [f"optimizer={opt}", fixed[0], f"optimizer.lr={lr}", fixed[1]],
                    "RuntimeError: diverged" if i else None)
    lines, failed = sweeps.summary_lines(tmp_path / "three")
    assert not failed and lines[1:] == ["  FAILED #1 [optimizer=adam optimizer.lr=0.01]: RuntimeError: diverged",
                                        "  FAILED #2 [optimizer=async_sgd optimizer.lr=0.1]: RuntimeError: diverged"]
    _fake_trial(tmp_path / "one", 0, ["optimizer=adam", *fixed], "RuntimeError: diverged")
    lines, failed = sweeps.summary_lines(tmp_path / "one")
    assert failed and lines[1:] == [f"  FAILED #0 [optimizer=adam {' '.join(fixed)}]: RuntimeError: diverged"]


def test_an_unseeded_search_over_several_processes_is_refused():
    """Each process runs the search itself (runner.launch -n 2 -- hparams_search=...): unseeded, their trials drew
    other values and failed in their first collective with a traceback."""
    from runner.sweep_checks import BASIC_LAUNCHER, processes_problems

    def cfg(kind="local", seed=None, launcher=BASIC_LAUNCHER):
        return OmegaConf.create({"distributed": {"kind": kind}, "hydra": {"launcher": {"_target_": launcher},
                                                                         "sweeper": {"sampler": {"seed": seed}}}})

    assert processes_problems(cfg(), optuna=True) == [
        "hydra.sweeper.sampler.seed=null with distributed=local: every process runs this search itself, and unseeded "
        "samplers would give their trials other values; set hydra.sweeper.sampler.seed=0 (the processes then draw "
        "alike), or search with one process (distributed=none)"]
    assert processes_problems(cfg(seed=0), optuna=True) == []
    grid = OmegaConf.merge(cfg(), {"hydra": {"sweeper": {"sampler": {"_target_": "optuna.samplers.GridSampler"}}}})
    assert processes_problems(grid, optuna=True) == [  # no seed to set: it used to be told to set one
        "hydra/sweeper/sampler=grid with distributed=local: every process runs this search itself, and the grid "
        "sampler (no seed) would give their trials other points; search with one process (distributed=none), or "
        "with a seeded sampler (e.g. hydra/sweeper/sampler=tpe hydra.sweeper.sampler.seed=0)"]
    assert processes_problems(cfg(kind="none"), optuna=True) == []
    assert processes_problems(cfg(), optuna=False) == []  # the basic sweeper lists the same trials in every process
    assert processes_problems(cfg(launcher="hydra_plugins.hydra_submitit_launcher.submitit_launcher."
                                           "SlurmLauncher"), optuna=True) == []  # trials are jobs of their own


def test_sweep_overrides_that_cannot_make_trials_are_named_before_the_first(capsys):
    cfg = compose_config()
    assert isinstance(cfg.model.emb_width, int) and isinstance(cfg.optimizer.learning_rate, float)
    texts = ["optimizer.learning_rate=range(1,2,0)", "model.emb_width=interval(8,32)",
             "model.emb_width=tag(log,interval(8,32))", "model.emb_width=int(interval(8,32))",
             "optimizer.learning_rate=tag(log,interval(0.001,0.1))", "optimizer=choice(async_adam,async_sgd)",
             "logger=none"]
    width = cfg.model.emb_width
    fix = "use model.emb_width=int(interval(8, 32)) (tag(log, int(interval(8, 32))) on a log scale)"
    assert sweeps.override_problems(texts, cfg, optuna=True) == [
        "optimizer.learning_rate=range(1,2,0): range() arg 3 must not be zero",
        f"model.emb_width=interval(8,32): an interval of real numbers, but model.emb_width is an integer (now {width}): {fix}",
        f"model.emb_width=tag(log,interval(8,32)): an interval of real numbers, but model.emb_width is an integer (now {width}): {fix}"]
    assert sweeps.override_problems(texts, cfg, optuna=False) == [texts[0] + ": range() arg 3 must not be zero"]
    basic = sweeps.override_problems(texts, cfg, optuna=False, basic=True)  # Hydra's -m lists values only
    assert len(basic) == 5 and basic[4] == (  # range(1,2,0) and the four intervals
        "optimizer.learning_rate=tag(log,interval(0.001,0.1)): an interval is a range to search, and the basic sweeper "
        "(-m) runs listed values only: list them (a,b,c), or use range(...) or choice(...), or search it with Optuna "
        "(hydra/sweeper=optuna, as the hparams_search configs do)")
    full = OmegaConf.create({**OmegaConf.to_container(cfg), "hydra": {  # as Hydra hands it to the callback
        "sweeper": {"_target_": sweeps.PLUGIN_OPTUNA, "params": {"model.emb_width": "interval(8,32)"}},
        "overrides": {"task": ["logger=none"]}}})
    with pytest.raises(SystemExit) as e:
        sweeps.SweepSummary().on_multirun_start(full)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[1].startswith("  - model.emb_width=interval(8,32): an interval of")


def storage_problem(storage):
    """Why the search would refuse ``hydra.sweeper.storage`` (``open_storage``'s second part)."""
    return sweep_storage.open_storage(storage)[1]


def test_an_optuna_search_runs_with_the_runners_sweeper_and_a_storage_is_opened_first(tmp_path, capsys):
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    cfg = OmegaConf.create({"hydra": {"sweeper": {"_target_": sweeps.PLUGIN_OPTUNA, "n_trials": 2}}})
    sweeps.SweepSummary().on_multirun_start(cfg)
    assert cfg.hydra.sweeper._target_ == sweeps.RUNNER_OPTUNA  # what Hydra instantiates next
    assert sweeps.RUNNER_OPTUNA in {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)}

    fix = "give a database URL Optuna can open (e.g. sqlite:///optuna.db) or null for a study kept in memory"
    assert storage_problem(None) is None
    url = f"sqlite:///{tmp_path}/study.db"  # a study kept in a file (SQLAlchemy 2 breaks optuna 2's; pyproject.toml)
    assert storage_problem(url) is None and (tmp_path / "study.db").is_file()
    import optuna

    study = optuna.create_study(storage=url, study_name="s", direction="maximize", load_if_exists=True)
    study.tell(study.ask(), 0.75)
    assert optuna.load_study(storage=url, study_name="s").best_value == 0.75  # what a resumed search reads
    missing = f"sqlite:///{tmp_path}/no/such/folder/study.db"
    assert storage_problem(missing) == (
        f"hydra.sweeper.storage={missing} cannot be opened (OperationalError: (sqlite3.OperationalError) unable to "
        f"open database file): {fix}")
    assert storage_problem("optuna.db").startswith(
        "hydra.sweeper.storage=optuna.db cannot be opened (Argument")
    assert storage_problem("  ") == f"hydra.sweeper.storage='  ' is not a database URL: {fix}"
    capsys.readouterr()  # optuna's own log lines
    with pytest.raises(SystemExit) as e:
        sweep_storage.opened_or_refused(missing)
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"error: invalid sweep:\n  - hydra.sweeper.storage={missing}")


def test_optuna_directions_are_minimize_or_maximize_as_optuna_takes_them():
    """The plugin's own default (its enum ``Direction.minimize``) and a one-item list are one direction; another
    spelling, which Optuna refuses with a traceback, and null are named with the fix."""
    plain = compose_with_hydra(["hydra/sweeper=optuna"]).hydra.sweeper  # no direction given: the plugin's enum
    assert type(plain.direction).__name__ == "Direction" and sweeps.optuna_problems(plain) == []
    for fine in ("minimize", "maximize", ["maximize"]):
        assert sweeps.optuna_problems(OmegaConf.create({"direction": fine})) == [], fine
    assert sweeps.optuna_problems(OmegaConf.create({"direction": "MAXIMIZE"})) == [
        "hydra.sweeper.direction=MAXIMIZE must be minimize or maximize, in lower case: write "
        "hydra.sweeper.direction=maximize"]
    assert sweeps.optuna_problems(OmegaConf.create({"direction": None})) == [
        "hydra.sweeper.direction=null must be minimize or maximize: a search needs one (maximize for an objective "
        "such as an AUC, minimize for a loss)"]


def test_optuna_search_ranges_it_would_take_otherwise_than_meant_are_named():
    cfg = compose_config()
    texts = ["optimizer.learning_rate=interval(0.3,0.002)", "model.emb_width=int(interval(32,8))",
             "optimizer.learning_rate=tag(log,interval(0.0,0.1))", "model.emb_width=range(8,10)",
             "model.emb_width=range(8,16,4)", "optimizer.learning_rate=range(0.1,0.3,0.1)",
             "model.emb_width=range(10,8,-1)", "model.emb_width=range(8,8)",
             "model.emb_width=range(8,15,4)", "model.emb_width=shuffle(range(8,10))",  # Optuna's values are -m's
             "optimizer.learning_rate=tag(log,interval(0.002,0.3))", "model.emb_width=int(interval(8,10))"]
    assert sweeps.override_problems(texts, cfg, optuna=True) == [
        "optimizer.learning_rate=interval(0.3,0.002): the interval starts above its end (0.3 > 0.002): give the "
        "lower bound first (0.002, 0.3)",
        "model.emb_width=int(interval(32,8)): the interval starts above its end (32 > 8): give the lower bound "
        "first (8, 32)",
        "optimizer.learning_rate=tag(log,interval(0.0,0.1)): a log-scale interval must start above 0, and this one "
        "starts at 0: give a start above 0, or drop tag(log, ...) for a linear scale",
        "model.emb_width=range(8,10): Optuna searches a range with its end 10 included (under -m it is left out): "
        "write model.emb_width=int(interval(8, 9)) or model.emb_width=choice(8, 9)",
        "model.emb_width=range(8,16,4): Optuna searches a range with its end 16 included (under -m it is left "
        "out): write model.emb_width=choice(8, 12)",
        "optimizer.learning_rate=range(0.1,0.3,0.1): Optuna makes its own steps over a range of real numbers, "
        "which can gain or lose a value to rounding: write optimizer.learning_rate=choice(0.1, 0.2)",
        "model.emb_width=range(10,8,-1): Optuna searches a range upwards only, and this one counts down: write "
        "model.emb_width=choice(10, 9)",
        "model.emb_width=range(8,8): a range with no value: give the values to search, e.g. choice(a, b)"]
    grid = OmegaConf.create({"hydra": {"sweeper": {"sampler": {"_target_": "optuna.samplers.GridSampler"}}}})
    assert sweeps.override_problems(["model.emb_width=range(8,10)", "optimizer.learning_rate=interval(0.002,0.3)",
                                     "model.emb_width=int(interval(8,10))"], grid, optuna=True) == [
        "optimizer.learning_rate=interval(0.002,0.3): the grid sampler tries listed values only, and an interval "
        "lists none: write optimizer.learning_rate=choice(...) with the values to try, or use another sampler "
        "(hydra/sweeper/sampler=tpe)",
        "model.emb_width=int(interval(8,10)): the grid sampler tries listed values, and the plugin's list of an "
        "integer interval leaves out its end 10: write model.emb_width=choice(8, 9, 10)"]  # its range(8,10) is 8, 9


class _Launcher:
    """Stands in for Hydra's launcher: notes each batch it is handed, then stops as ``stop`` says."""

    def __init__(self, stop: BaseException):
        self.batches, self.stop = [], stop

    def launch(self, overrides, initial_job_idx):
        self.batches.append(list(overrides))
        raise self.stop


def optuna_search(tmp_path, arguments, launcher, **settings):
    """Run the runner's Optuna sweeper in this process over ``arguments`` with Hydra's own config loader."""
    import optuna
    from hydra import compose, initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from hydra_plugins.runner_optuna.sweeper import RunnerOptunaSweeper
    from runner.config import register

    register()
    sweeper = RunnerOptunaSweeper(**{"sampler": optuna.samplers.RandomSampler(seed=0), "direction": "maximize",
                                     "storage": None, "study_name": "s", "n_trials": 2, "n_jobs": 1,
                                     "max_failure_rate": 1.0, "search_space": None, "custom_search_space": None,
                                     "params": None, **settings})
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
        impl = sweeper.sweeper
        impl.config = compose("config", overrides=[*TINY, f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
        impl.hydra_context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=Callbacks())
        impl.launcher = launcher
        return sweeper.sweep(arguments)


@pytest.mark.slow
def test_optuna_values_a_trial_cannot_take_are_refused_before_the_first(tmp_path, capsys):
    """Hydra composes an Optuna trial's config only when it launches it, so a bad ``choice`` value would end the
    search there; every value a trial could get is composed first, each named with Hydra's reason."""
    launcher = _Launcher(AssertionError("no trial is launched"))
    with pytest.raises(SystemExit) as e:
        optuna_search(tmp_path, ["model.emb_width=choice(8,abc)", "optimizer=choice(async_adam,async_sgdd)",
                                 "optimizer.learning_rate=tag(log,interval(0.002,0.3))", *TINY], launcher)
    assert e.value.code == 2 and launcher.batches == []
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == ["error: invalid sweep:", "  - model.emb_width=choice(8,abc): model.emb_width=abc cannot be "
                       "applied (Value 'abc' of type 'str' could not be converted to Integer): drop it from the "
                       "search, or search values model.emb_width takes"]
    assert err[2].startswith("  - optimizer=choice(async_adam,async_sgdd): optimizer=async_sgdd cannot be applied "
                             "(Could not find 'optimizer/async_sgdd' (options: adagrad, adam, async_adagrad, async_adam,")
    assert err[2].endswith(")): drop it from the search, or search values optimizer takes") and len(err) == 3
    with pytest.raises(SystemExit):  # a key the config does not have: one line for it, not one per value
        optuna_search(tmp_path, ["no_such_key=interval(0,1)", *TINY], launcher)
    assert capsys.readouterr().err.splitlines() == [
        "error: invalid sweep:", "  - no_such_key=interval(0,1): no value of no_such_key can be applied (Could not "
        "override 'no_such_key'.): check the key (python -m runner --cfg job prints the config's keys), or drop it "
        "from the search"]


class _TrialLauncher:
    """Stands in for Hydra's launcher running runner trials: a trial with ``mesh=data`` and
    ``trainer.batch_size=30`` fails as the runner's preflight fails it; any other returns 0.5."""

    def __init__(self):
        self.launched = []

    def launch(self, overrides, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus

        out = []
        for i, trial in enumerate(overrides):
            self.launched.append((initial_job_idx + i, list(trial)))
            ret = JobReturn(overrides=list(trial), status=JobStatus.COMPLETED)
            ret.return_value = 0.5
            if {"mesh=data", "trainer.batch_size=30"} <= set(trial):
                ret.status, ret.return_value = JobStatus.FAILED, PreflightError("trainer.batch_size=30 does not divide")
            out.append(ret)
        return out


@pytest.mark.slow
def test_an_optuna_trial_whose_values_clash_fails_alone_and_the_search_goes_on(tmp_path, capsys, caplog):
    """Values each fine alone (checked before the first trial) can clash in one trial: a config that does not compose
    (async_sgd has no b1) is refused alone, as the preflight refuses a batch that does not divide; each is one line,
    a FAIL trial, and a FAILED line of the summary, and the other trials run (it used to end the search in Hydra's
    multi-line error, and a refused trial printed Hydra's 'Error executing job' line twice)."""
    import optuna
    from optuna.trial import TrialState

    url, launcher = f"sqlite:///{tmp_path}/study.db", _TrialLauncher()
    grid = optuna.samplers.GridSampler({"optimizer": ["async_adam", "async_sgd"], "optimizer.b1": [0.8],
                                        "mesh": ["single", "data"]})
    caplog.set_level("ERROR", logger="runner.sweeps")
    optuna_search(tmp_path, ["optimizer=choice(async_adam,async_sgd)", "optimizer.b1=choice(0.8)",
                             "mesh=choice(single,data)", "trainer.batch_size=30", *TINY], launcher,
                  storage=url, n_trials=4, sampler=grid)
    trials = optuna.load_study(storage=url, study_name="s").trials
    states = {(t.params["optimizer"], t.params["mesh"]): t.state for t in trials}
    assert states == {("async_adam", "single"): TrialState.COMPLETE, ("async_adam", "data"): TrialState.FAIL,
                      ("async_sgd", "single"): TrialState.FAIL, ("async_sgd", "data"): TrialState.FAIL}
    assert sorted(n for n, _ in launcher.launched) == sorted(t.number for t in trials if t.params["optimizer"] ==
                                                             "async_adam")  # each keeps its job number
    err = capsys.readouterr().err
    assert "Error executing job" not in err and "Failed experiment" not in caplog.text + err
    lines = [r.getMessage() for r in caplog.records]
    clash = ("failed: TrialRefused: its values do not compose into one config (Could not override 'optimizer.b1': "
             "Key 'b1' not in 'AsyncSGDConfig'): drop the clashing values from the search, or search keys every "
             "choice has")
    assert len(lines) == 2 and all(ln.startswith("trial #") and ln.endswith(clash) and "optimizer=async_sgd "
                                   "optimizer.b1=0.8" in ln for ln in lines)
    summary, failed = sweeps.summary_lines(tmp_path)
    assert failed and summary[0] == f"sweep: 2 trials, 0 ok, 2 failed ({tmp_path})"  # the stand-in made no folder
    assert sorted(ln.split(": ", 1)[0].split(" [")[1] for ln in summary[1:]) == ["mesh=data]", "mesh=single]"]
    assert all(ln.startswith("  FAILED #") and ln.endswith(clash.split(": ", 1)[1]) for ln in summary[1:])
    with pytest.raises(SystemExit) as e:  # the plugin's own max_failure_rate=0.0: the first clash stops the search
        optuna_search(tmp_path, ["optimizer=choice(async_sgd)", "optimizer.b1=choice(0.8)", *TINY], launcher,
                      n_trials=2, max_failure_rate=0.0)
    assert e.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"sweep: 1 trials, 0 ok, 1 failed ({tmp_path})" and err[1].startswith("  FAILED #0 [")
    assert err[-1].startswith("sweep: stopped early: a batch of trials failed more often than "
                              "hydra.sweeper.max_failure_rate=0.0 allows")


class _BasicLauncher:
    """Stands in for Hydra's launcher under the basic sweeper: notes each batch and its first job number, and
    returns 0.5 for every trial."""

    def __init__(self):
        self.batches = []

    def launch(self, overrides, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus

        self.batches.append((initial_job_idx, [list(t) for t in overrides]))
        out = []
        for trial in overrides:
            ret = JobReturn(overrides=list(trial), status=JobStatus.COMPLETED)
            ret.return_value = 0.5
            out.append(ret)
        return out


def basic_sweep(tmp_path, arguments, launcher, max_batch_size=None):
    """Run the runner's basic sweeper in this process over ``arguments`` with Hydra's own config loader."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from hydra_plugins.runner_basic.sweeper import RunnerBasicSweeper
    from runner.config import register

    register()
    sweeper = RunnerBasicSweeper(max_batch_size=max_batch_size)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
        sweeper.config = compose("config", overrides=[*TINY, f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=Callbacks())
        sweeper.launcher = launcher
        return sweeper.sweep(arguments)


B1_CLASH = ("its values do not compose into one config (Could not override 'optimizer.b1': Key 'b1' not in "
            "'AsyncSGDConfig'): drop optimizer=async_sgd from the sweep, or sweep keys every choice has")


@pytest.mark.slow
def test_a_basic_sweeps_combinations_that_do_not_compose_are_refused_before_the_first_trial(tmp_path, capsys):
    """Values each fine can clash in one combination (async_sgd has no b1). Hydra's basic sweeper stopped at the
    first such batch in its multi-line error, exit code 1, naming no combination, and with max_batch_size only
    after the earlier batches' trials had run; every combination is composed before the first trial now, and
    the bad ones named (exit code 2), before multirun.yaml is written."""
    launcher = _BasicLauncher()
    for batch_size in (None, 1):  # with batches of one, the clash is in the third batch: still no trial runs
        with pytest.raises(SystemExit) as e:
            basic_sweep(tmp_path, [*TINY, "optimizer=async_adam,async_sgd", "optimizer.b1=0.8,0.9"], launcher,
                        max_batch_size=batch_size)
        assert e.value.code == 2 and launcher.batches == [] and not (tmp_path / "multirun.yaml").exists()
        assert capsys.readouterr().err.splitlines() == [
            "error: invalid sweep:",
            f"  - trial #2 [debug=tiny optimizer=async_sgd optimizer.b1=0.8] and 1 more with optimizer=async_sgd: "
            f"{B1_CLASH}"]
    with pytest.raises(SystemExit):  # no value is to blame alone: each combination is named, with the general fix
        basic_sweep(tmp_path, [*TINY, "optimizer=async_sgd,async_rowwise_adagrad", "optimizer.b1=0.8"], launcher)
    assert capsys.readouterr().err.splitlines()[1:] == [
        f"  - trial #{n} [debug=tiny optimizer={o} optimizer.b1=0.8]: its values do not compose into one config "
        f"(Could not override 'optimizer.b1': Key 'b1' not in '{c}'): drop the clashing value from the sweep, or "
        f"sweep keys every choice has"
        for n, o, c in ((0, "async_sgd", "AsyncSGDConfig"), (1, "async_rowwise_adagrad", "AsyncRowwiseAdagradConfig"))]


@pytest.mark.slow
def test_a_basic_sweep_whose_combinations_all_compose_runs_every_batch_as_hydras_does(tmp_path, capsys):
    launcher = _BasicLauncher()
    returns = basic_sweep(tmp_path, [*TINY, "optimizer=async_adam,async_rowwise_adagrad", "trainer.seed=0,1,2"],
                          launcher, max_batch_size=4)
    assert capsys.readouterr().err == "" and (tmp_path / "multirun.yaml").is_file()
    assert [(first, len(batch)) for first, batch in launcher.batches] == [(0, 4), (4, 2)]  # job numbers kept
    assert [t for _, batch in launcher.batches for t in batch] == [
        ["debug=tiny", f"optimizer={o}", f"trainer.seed={s}"] for o in ("async_adam", "async_rowwise_adagrad")
        for s in (0, 1, 2)]
    assert [r.return_value for batch in returns for r in batch] == [0.5] * 6


def test_a_basic_sweep_with_no_trial_leaves_an_earlier_sweeps_multirun_yaml_as_it_was(tmp_path, capsys):
    """Hydra wrote the sweep's multirun.yaml, over the one an earlier sweep into the folder left, and launched an
    empty batch; a sweep with no trial launches nothing and writes nothing now."""
    (tmp_path / "multirun.yaml").write_text("earlier sweep's config\n")
    launcher = _BasicLauncher()
    assert basic_sweep(tmp_path, [*TINY, "trainer.seed=range(1,1)"], launcher) == []
    assert launcher.batches == [] and capsys.readouterr().err == ""
    assert (tmp_path / "multirun.yaml").read_text() == "earlier sweep's config\n"
    basic_sweep(tmp_path, [*TINY, "trainer.seed=1"], launcher)  # a trial starts: the record is this sweep's
    assert "trainer" in OmegaConf.load(tmp_path / "multirun.yaml")


def test_a_basic_sweep_runs_with_the_runners_sweeper():
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    cfg = OmegaConf.create({"hydra": {"sweeper": {"_target_": sweeps.BASIC, "max_batch_size": None}}})
    sweeps.SweepSummary().on_multirun_start(cfg)
    assert cfg.hydra.sweeper._target_ == sweeps.RUNNER_BASIC  # what Hydra instantiates next
    assert sweeps.RUNNER_BASIC in {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)}


def test_combination_problems_name_the_value_to_drop_and_count_past_the_listing():
    trials = [[f"a={a}", f"b={b}"] for a in range(3) for b in range(30)]

    def compose(overrides):  # a=2 breaks every combination it is in; a=1 clashes with b=0 and b=1 only
        if "a=2" in overrides:
            raise ValueError("Could not find 'a/2'\nmore lines")
        if "a=1" in overrides and overrides[1] in ("b=0", "b=1"):
            raise ValueError("clash")

    lines = sweep_checks.combination_problems(trials, compose)
    general = "drop the clashing value from the sweep, or sweep keys every choice has"
    assert lines == [f"trial #30 [a=1 b=0]: its values do not compose into one config (clash): {general}",
                     f"trial #31 [a=1 b=1]: its values do not compose into one config (clash): {general}",
                     "trial #60 [a=2 b=0] and 29 more with a=2: its values do not compose into one config (Could not "
                     "find 'a/2'): drop a=2 from the sweep, or sweep keys every choice has"]
    every = sweep_checks.combination_problems(trials, lambda o: 1 / 0)  # nothing composes: no value alone to blame
    assert len(every) == sweep_checks.COMBINATIONS_LISTED + 1 and every[0] == (
        f"trial #0 [a=0 b=0]: its values do not compose into one config (division by zero): {general}")
    assert every[-1] == (f"and {90 - sweep_checks.COMBINATIONS_LISTED} more of the sweep's 90 trials whose values do "
                         f"not compose into one config")
    assert sweep_checks.combination_problems(trials, lambda o: None) == []


def test_a_failed_trials_line_names_its_values_and_the_whole_error():
    error = PreflightError("invalid config:\n  - trainer.steps=0 is outside [1, inf)\n  - model.emb_width=0 too small")
    assert sweep_launch.failure_line(2, ["mesh=data", "trainer.batch_size=30"], error) == (
        "trial #2 [mesh=data trainer.batch_size=30] failed: PreflightError: invalid config: trainer.steps=0 is outside "
        "[1, inf); model.emb_width=0 too small")
    assert sweep_launch.one_line("no fused update.\nWays out: (1) pick one") == "no fused update. Ways out: (1) pick one"


@pytest.mark.slow
def test_a_stored_study_searched_otherwise_is_refused_and_unfinished_trials_are_failed(tmp_path, capsys):
    import optuna
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(storage=url, study_name="s", direction="maximize")
    trial = study.ask()
    trial.suggest_categorical("optimizer", ["async_adam", "async_rowwise_adagrad"])
    study.tell(trial, 0.7)
    with pytest.raises(SystemExit) as e:
        optuna_search(tmp_path, ["optimizer=choice(async_adam,async_sgd)"], _Launcher(AssertionError("launched")),
                      storage=url, direction="minimize")
    assert e.value.code == 2
    where = f"hydra.sweeper.study_name=s (in {url})"
    refused = capsys.readouterr().err.split("error: invalid sweep:\n")  # after optuna's own log lines
    assert len(refused) == 2 and refused[1].splitlines() == [
        f"  - {where} is a study that searched to maximize, and this search would minimize: give another "
        f"hydra.sweeper.study_name for a new study, or hydra.sweeper.direction=maximize to resume it",
        f"  - {where} searched optimizer=choice(async_adam, async_rowwise_adagrad), and this search gives it "
        f"choice(async_adam, async_sgd): give another hydra.sweeper.study_name for a new study, or search "
        f"optimizer=choice(async_adam, async_rowwise_adagrad) to resume it"]
    launcher = _Launcher(SystemExit(143))  # SIGTERM (or Ctrl-C) in a trial: the runner exits, the sweep with it
    with pytest.raises(SystemExit) as e:
        optuna_search(tmp_path, ["optimizer=choice(async_adam,async_rowwise_adagrad)"], launcher, storage=url)
    assert e.value.code == 143 and len(launcher.batches) == 1
    kept = optuna.load_study(storage=url, study_name="s").trials
    assert [t.state for t in kept] == [TrialState.COMPLETE, TrialState.FAIL]  # not RUNNING for good
    assert kept[1].params["optimizer"] in launcher.batches[0][0][0]


def _heartbeat_age(db: Path, trial_id: int) -> float | None:
    """Seconds since ``trial_id``'s last heartbeat in the sqlite study ``db`` (None: it has none), by the database's
    own clock, as Optuna reads it."""
    import sqlite3

    with sqlite3.connect(db) as con:
        row = con.execute("SELECT (julianday('now') - julianday(heartbeat)) * 86400 FROM trial_heartbeats "
                          "WHERE trial_id = ?", (trial_id,)).fetchone()
    return None if row is None else row[0]


def _age_heartbeat(db: Path, trial_id: int, *modifiers: str) -> None:
    import sqlite3

    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE trial_heartbeats SET heartbeat = datetime('now', {', '.join('?' * len(modifiers))}) "
                    f"WHERE trial_id = ?", (*modifiers, trial_id))


class _Beating(_Launcher):
    """A trial that runs a while: its heartbeat, aged 10 minutes as it starts, is read back after a second."""

    def launch(self, overrides, initial_job_idx):
        import time

        self.trial_id = self.ids()[-1]
        _age_heartbeat(self.db, self.trial_id, "-10 minutes")
        time.sleep(1.0)
        self.age = _heartbeat_age(self.db, self.trial_id)
        return super().launch(overrides, initial_job_idx)


@pytest.mark.slow
def test_a_killed_searchs_running_trials_are_failed_when_its_study_resumes(tmp_path, monkeypatch, caplog):
    """A search killed mid-trial (SIGKILL, a machine gone) left the trial RUNNING in its stored study for good. A
    search now records a heartbeat for its running trials, and one of the same study marks FAIL, as a batch starts,
    each RUNNING trial whose heartbeat is over GRACE_S old; a trial that beats (a search running elsewhere) or never
    beat is left alone. Optuna 2's own check reads an age modulo a day: 1 day and 30 s looked 30 s old. The storage
    is opened once (the storage check, the stored-study check, a seeded search's seed note and the plugin each opened
    it)."""
    import logging

    import optuna
    from optuna.storages._rdb import storage as rdb
    from optuna.trial import TrialState

    db, url = tmp_path / "study.db", f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(storage=url, study_name="s", direction="maximize")
    trials = [study.ask() for _ in range(4)]  # a killed search's, one more search's still running, and one without
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=60)
    for trial in trials:
        trial.suggest_categorical("optimizer", ["async_adam", "async_rowwise_adagrad"])
    for trial in trials[:3]:
        storage.record_heartbeat(trial._trial_id)
    _age_heartbeat(db, trials[0]._trial_id, "-10 minutes")
    _age_heartbeat(db, trials[1]._trial_id, "-1 day", "-30 seconds")
    _age_heartbeat(db, trials[2]._trial_id, "-60 seconds")  # within the grace period: its search still runs
    monkeypatch.setattr(sweep_storage, "HEARTBEAT_S", 0.2)
    engines, create_engine = [], rdb.create_engine
    monkeypatch.setattr(rdb, "create_engine", lambda *a, **k: engines.append(a) or create_engine(*a, **k))
    launcher = _Beating(SystemExit(143))
    launcher.db, launcher.ids = db, lambda: [t._trial_id for t in storage.get_all_trials(study._study_id)]
    with caplog.at_level(logging.WARNING, logger="runner.sweeps"), pytest.raises(SystemExit):
        optuna_search(tmp_path, ["optimizer=choice(async_adam,async_rowwise_adagrad)"], launcher, storage=url)
    assert len(engines) == 1
    kept = optuna.load_study(storage=url, study_name="s").trials
    assert [t.state for t in kept] == [TrialState.FAIL, TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING,
                                       TrialState.FAIL]  # the resumed search's own trial: failed as it stopped
    assert "marked FAIL 2 trial(s) of study s a killed search left running (no heartbeat for 180 s): #0, #1" in [
        r.getMessage() for r in caplog.records]
    assert launcher.trial_id == kept[4]._trial_id and launcher.age < 5  # it beat while its trial ran


def test_a_seeded_search_resuming_a_stored_study_is_told_its_draws_repeat(tmp_path):
    """The sampler's random draws restart from the seed: a resumed search drew the earlier session's values again."""
    import optuna

    url = f"sqlite:///{tmp_path}/study.db"
    assert sweep_checks.resumed_seed_note(url, "s", 0) is None  # no such study yet: a new one
    study = optuna.create_study(storage=url, study_name="s", direction="maximize")
    assert sweep_checks.resumed_seed_note(url, "s", 0) is None  # no trial in it
    for value in (0.7, 0.8):
        trial = study.ask()
        trial.suggest_float("lr", 0.01, 0.1)
        study.tell(trial, value)
    assert sweep_checks.resumed_seed_note(url, "s", 0) == (
        "warning: hydra.sweeper.study_name=s resumes a study of 2 trials, and hydra.sweeper.sampler.seed=0 starts the "
        "sampler's random draws again: the new trials' first random draws repeat the earlier session's; give another "
        "seed (e.g. hydra.sweeper.sampler.seed=2) to draw new ones")
    assert sweep_checks.resumed_seed_note(url, "s", None) is None and sweep_checks.resumed_seed_note(None, "s", 0) is None


def test_a_storage_that_opens_but_cannot_be_written_is_refused_before_the_first_trial(tmp_path):
    """A read-only database opened and read, and the search ended in a traceback at its first write
    (StorageInternalError: An exception is raised during the commit)."""
    import optuna

    url = f"sqlite:///{tmp_path}/study.db"
    optuna.create_study(storage=url, study_name="s", direction="maximize")
    before = (tmp_path / "study.db").read_bytes()
    assert storage_problem(url) is None and (tmp_path / "study.db").read_bytes() == before
    read_only = f"sqlite:///file:{tmp_path}/study.db?mode=ro&uri=true"
    assert storage_problem(read_only) == (
        f"hydra.sweeper.storage={read_only} cannot be written (OperationalError: (sqlite3.OperationalError) attempt "
        f"to write a readonly database): give a database URL Optuna can open (e.g. sqlite:///optuna.db) or null for a "
        f"study kept in memory")


class _MovingAway(_TrialLauncher):
    """Trials that return 0.5; the second one moves the study's database away as it runs (deleted, its disk
    unmounted), so the plugin's ``study.tell`` after it finds an empty database (``no such table``)."""

    def launch(self, overrides, initial_job_idx):
        if initial_job_idx == 1:
            self.db.rename(self.db.with_name("kept.db"))
        return super().launch(overrides, initial_job_idx)


@pytest.mark.slow
def test_a_storage_failing_during_the_search_ends_in_one_line_and_keeps_the_trials(tmp_path, capsys, caplog):
    """A search whose storage fails between trials ended in Optuna's traceback (StorageInternalError: An exception is
    raised during the commit ...); it ends with one line naming the storage, the failure and the fix, exit code 1,
    and the trials the study took before stay in it: put back, the study resumes."""
    import optuna
    from optuna.trial import TrialState

    db = tmp_path / "study.db"
    url, launcher = f"sqlite:///{db}", _MovingAway()
    launcher.db = db
    with pytest.raises(SystemExit) as e:
        optuna_search(tmp_path, ["optimizer=choice(async_adam,async_rowwise_adagrad)", *TINY], launcher,
                      storage=url, n_trials=3)
    assert e.value.code == 1 and [n for n, _ in launcher.launched] == [0, 1]
    assert not [r for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("runner")]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"sweep: the study storage hydra.sweeper.storage={url} failed during the search (OperationalError: "
        f"(sqlite3.OperationalError) no such table: trials): the trials so far are in {tmp_path} and in the study as "
        f"far as it was written; free the disk, or restore {db} (its folder, its write permission), then resume the "
        f"search with the same hydra.sweeper.storage and hydra.sweeper.study_name")
    kept = optuna.load_study(storage=f"sqlite:///{tmp_path}/kept.db", study_name="s").trials
    assert [(t.state, t.value) for t in kept] == [(TrialState.COMPLETE, 0.5), (TrialState.RUNNING, None)]
    assert sweep_storage.failed_during_search(KeyError("trials"), url, tmp_path) is None  # not the storage's
    assert sweep_storage.failed_during_search(e.value, None, tmp_path) is None


def test_a_storage_refused_does_not_show_its_password():
    problem = storage_problem("mysql://u:secret@host/db")
    assert problem.startswith("hydra.sweeper.storage=mysql://u:***@host/db cannot be opened (") and "secret" not in problem


def test_the_plugins_storage_log_line_does_not_show_its_password(tmp_path, caplog):
    """The plugin logs ``Storage: <URL>`` as a search starts; the runner's sweeper masks a URL's password in the
    plugin's log records (a sqlite URL, the only database here, carries none: the line is logged as the plugin
    would log a server's)."""
    import logging

    plugin_log = logging.getLogger("hydra_plugins.hydra_optuna_sweeper._impl")
    with caplog.at_level(logging.INFO, logger=plugin_log.name), pytest.raises(SystemExit):
        optuna_search(tmp_path, ["optimizer=choice(async_adam,async_sgd)"], _Launcher(SystemExit(143)))
    with caplog.at_level(logging.INFO, logger=plugin_log.name):
        plugin_log.info("Storage: %s", "mysql://user:secret@db.example:3306/optuna")
    lines = [r.getMessage() for r in caplog.records if r.name == plugin_log.name]
    assert lines[1] == "Storage: None" and lines[-1] == "Storage: mysql://user:***@db.example:3306/optuna"


def test_an_optuna_search_the_plugin_stops_ends_with_the_summary_and_the_cause(tmp_path, capsys):
    _fake_trial(tmp_path, 0, ["optimizer=adam"], "PreflightError: no fused update")
    _fake_trial(tmp_path, 1, ["optimizer=adagrad"], "PreflightError: no fused update")
    with pytest.raises(SystemExit) as e:
        sweeps.optuna_stopped(tmp_path, ValueError("No trials are completed yet."), 1.0)
    assert e.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"sweep: 2 trials, 0 ok, 2 failed ({tmp_path})",
        "  FAILED #0 [optimizer=adam]: PreflightError: no fused update",
        "  FAILED #1 [optimizer=adagrad]: PreflightError: no fused update",
        "sweep: no trial completed, so there is no best one (optimization_results.yaml not written): fix what the "
        "failed trials name and run the search again"]
    (tmp_path / "1" / "FAILED").unlink()  # one of two failed, and the plugin re-raised its error
    with pytest.raises(SystemExit) as e:
        sweeps.optuna_stopped(tmp_path, PreflightError("no fused update"), 0.0)
    assert e.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "sweep: stopped early: a batch of trials failed more often than hydra.sweeper.max_failure_rate=0.0 allows "
        "(the share of a batch that may fail); fix what they name, or set hydra.sweeper.max_failure_rate=1.0 to "
        "record failed trials and go on")
    with pytest.raises(KeyError, match="not a trial's"):  # any other error keeps its traceback
        sweeps.optuna_stopped(tmp_path, KeyError("not a trial's"), 0.0)
    assert capsys.readouterr().err == ""


def test_report_of_a_sweep_with_one_ok_and_one_failed_trial(tmp_path):
    """One finite objective used to give a 1e-6-wide axis with the failed trial's label far outside it, which
    matplotlib cannot rasterise ("FT_Render_Glyph ... raster overflow")."""
    from runner.report import build_report

    _fake_trial(tmp_path, 0, ["optimizer=adam"], "PreflightError: no fused update")
    (tmp_path / "0" / "metrics.jsonl").write_text("")
    _fake_trial(tmp_path, 1, ["optimizer=async_sgd"])
    (tmp_path / "1" / "summary.json").write_text('{"status": "ok"}')
    (tmp_path / "1" / "metrics.jsonl").write_text(
        json.dumps({"step": 3, "train/loss": 0.7, "valid/auc_mean": 0.36}) + "\n"
        + json.dumps({"step": 6, "train/loss": 0.6, "valid/auc_mean": 0.3611}) + "\n")
    md = build_report(tmp_path).read_text()
    assert "- trials: 2 (1 ok, 1 failed)" in md and "- best trial: `1` 0.3611 at step 6" in md
    assert "| 0 | failed | `optimizer=adam` |" in md
    assert (tmp_path / "final_metric.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- the configs


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.slow
def test_experiments_are_documented_and_compose(name):
    text = (CONF / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    for field in (f"# Run:    python -m runner experiment={name}", "\n# Takes:  ", "\n# Expect: "):
        assert field in header, field
    assert "TAKES" not in text and "EXPECT" not in text
    trainer = compose_config([f"experiment={name}"], tiny=False).trainer
    budget = [trainer.steps, trainer.epochs, trainer.default_epochs]  # default_epochs: a budget a command line overrides
    assert any((b or 0) > 0 for b in budget), "an experiment says how long it trains"


def compose_with_hydra(overrides):
    from hydra import compose, initialize_config_dir

    from runner.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def test_async_vs_sync_adam_is_a_four_trial_sweep():
    cfg = compose_with_hydra(["experiment=async_vs_sync_adam"])
    assert cfg.hydra.mode == RunMode.MULTIRUN and cfg.optimizer._target_ == "optimizers.AsyncAdam"
    params = cfg.hydra.sweeper.params
    assert {k: str(v).split(",") for k, v in params.items()} == {"async_emb": ["on", "off"], "trainer.seed": ["0", "1"]}


@pytest.mark.parametrize("name", SEARCHES)
@pytest.mark.slow
def test_searches_are_optuna_over_existing_keys_and_async_optimizers(name):
    text = (CONF / "hparams_search" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n") and "TAKES" not in text and "EXPECT" not in text
    cfg = compose_with_hydra([f"hparams_search={name}"])
    sw = cfg.hydra.sweeper
    assert "optuna" in sw._target_ and sw.direction == "maximize" and cfg.hydra.mode == RunMode.MULTIRUN
    assert sw.max_failure_rate == 1.0  # a failed trial does not end the search
    assert (cfg.trainer.objective or "valid/").startswith("valid/")  # scored on validation (null: the task's own)
    choices = str(sw.params.get("optimizer", "choice(async_adam)"))  # a search may keep the recipe's optimizer
    assert choices.startswith("choice(")
    for opt in choices[len("choice("):-1].split(","):
        trial = compose_config([f"hparams_search={name}", f"optimizer={opt.strip()}"], tiny=False)
        assert trial.optimizer._target_.startswith("optimizers.Async") and trial.async_emb.enabled
        for key in sw.params:
            if key != "optimizer":
                assert OmegaConf.select(trial, key) is not None, key


STARTUP = {"optuna_emb_lr": 8, "optuna_ml100k": 8, "optuna_ranking": 5}  # each search's random trials before TPE


@pytest.mark.parametrize("name", SEARCHES)
def test_a_search_draws_its_tpe_trials_and_takes_another_sampler(name):
    """A search's sampler is chosen in its defaults list (conf/hydra/sweeper/sampler/), so another sampler replaces
    it whole: ``hydra/sweeper/sampler=grid`` used to stop at composing (Key 'seed' not in 'SamplerConfig')."""
    import optuna
    from hydra.utils import instantiate

    sampler = compose_with_hydra([f"hparams_search={name}"]).hydra.sweeper.sampler
    assert (sampler._target_, sampler.seed, sampler.n_startup_trials) == ("optuna.samplers.TPESampler", 0, STARTUP[name])

    def drawn(made):  # the values a sampler draws for a few trials, each told a value
        study = optuna.create_study(sampler=made, direction="maximize")
        for i in range(STARTUP[name] + 2):
            trial = study.ask()
            study.tell(trial, trial.suggest_float("x", 0.001, 0.3, log=True) + trial.suggest_int("w", 8, 64) / 100)
        return [t.params for t in study.trials]

    reference = optuna.samplers.TPESampler(seed=0, n_startup_trials=STARTUP[name])  # the preset's sampler as it was
    assert drawn(instantiate(sampler)) == drawn(reference)
    grid = compose_with_hydra([f"hparams_search={name}", "hydra/sweeper/sampler=grid"]).hydra.sweeper.sampler
    assert OmegaConf.to_container(grid) == {"_target_": "optuna.samplers.GridSampler", "_partial_": True}
    other = compose_with_hydra([f"hparams_search={name}", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=3"])
    assert OmegaConf.to_container(other.hydra.sweeper.sampler) == {"_target_": "optuna.samplers.RandomSampler", "seed": 3}


def test_a_grid_over_a_searchs_intervals_names_each_and_a_key_given_on_the_command_line_is_searched_as_given(capsys):
    cfg = compose_with_hydra(["hparams_search=optuna_ranking", "hydra/sweeper/sampler=grid"])
    with pytest.raises(SystemExit) as e:
        sweeps.SweepSummary().on_multirun_start(cfg)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: invalid sweep:"] + [
        f"  - {key}=tag(log, interval({low}, {high})): the grid sampler tries listed values only, and an interval on "
        f"a log scale lists none: write {key}=choice(...) with the values to try, or use another sampler "
        f"(hydra/sweeper/sampler=tpe)"
        for key, low, high in (("optimizer.learning_rate", 0.005, 0.15), ("dense_optimizer.learning_rate", 0.0005, 0.01))]
    given = ["optimizer.learning_rate=choice(0.01,0.02)", "dense_optimizer.learning_rate=0.001"]  # replace the
    cfg.hydra.overrides.task += given  # search's own (as the plugin searches them): no refusal
    sweeps.SweepSummary().on_multirun_start(cfg)
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- end to end (subprocesses)


def runner_cli(*args, cwd=ROOT, timeout=900):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HYDRA_FULL_ERROR": "0"}
    tiny = TINY + ([] if any(a.startswith("logger=") for a in args) else ["logger=wandb"])  # the default logger
    return subprocess.run([sys.executable, "-m", "runner", *args, *tiny], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def trial_dirs(root: Path) -> list[Path]:
    return sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))


@pytest.mark.slow
def test_multirun_one_wandb_run_per_trial_in_one_group_and_a_report(tmp_path):
    sweep = tmp_path / "sweep"
    proc = runner_cli("-m", "optimizer=async_adam,async_rowwise_adagrad", "async_emb=on,off",
                      f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep: 4 trials, 4 ok, 0 failed" in proc.stdout
    trials = trial_dirs(sweep)
    assert len(trials) == 4
    combos = set()
    runs = [wandb_run(d) for d in trials]
    assert len({r["id"] for r in runs}) == 4 and len({r["dir"] for r in runs}) == 4
    assert {r["group"] for r in runs} == {f"runner-{tmp_path.name}_sweep"}
    for d, run in zip(trials, runs):
        overrides = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())
        combos.add(tuple(overrides[:2]))
        assert set(overrides) <= set(run["tags"]) and "mesh=single" in run["tags"]
        assert run["exit_code"] == 0 and not (d / "FAILED").exists()
        opt = overrides[0].split("=")[1]
        assert run["config"]["optimizer"]["_target_"] == "optimizers." + "".join(
            w.capitalize() for w in opt.split("_"))
        assert run["config"]["async_emb"]["enabled"] == (overrides[1] == "async_emb=on")
        info = json.loads((d / sweeps.RUN_INFO_FILE).read_text())
        assert (info["id"], info["group"], info["tags"]) == (run["id"], run["group"], run["tags"])
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "train/loss" in r] == [3, 6]
        summary = json.loads((d / "summary.json").read_text())
        final = [r for r in rows if "valid/auc_mean" in r][-1]["valid/auc_mean"]
        assert summary["status"] == "ok" and summary["valid/auc_mean"] == final
        assert summary["valid/auc_mean/best"] == max(r["valid/auc_mean"] for r in rows if "valid/auc_mean" in r)
        # W&B keeps the best and the final objective (define_metric summary="max,last"), the lowest loss too
        assert run["summary"]["valid/auc_mean"] == {"max": summary["valid/auc_mean/best"], "last": final}
        assert run["summary"]["train/loss"]["min"] == min(r["train/loss"] for r in rows if "train/loss" in r)
    assert combos == {(f"optimizer={o}", f"async_emb={a}")
                      for o in ("async_adam", "async_rowwise_adagrad") for a in ("on", "off")}

    rep = subprocess.run([sys.executable, "-m", "runner.report", str(sweep)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    md = (sweep / "report.md").read_text()
    assert "- trials: 4 (4 ok, 0 failed)" in md
    assert f"- common: `{' '.join(TINY)} logger=wandb`" in md  # what every trial shares, once
    for d in trials:  # each row shows what differs: the swept choices
        overrides = " ".join(yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())[:2])
        assert f"| {d.name} | ok | `{overrides}` | 6 |" in md
    assert "- Bayes-optimal (dotted lines in auc.png): `bayes/test/auc_click` " in md
    assert "`bayes/" not in md.split("AUC keys:")[1]  # a reference line on its metric's panel, not a panel
    with open(sweep / "report.csv", newline="") as f:
        table = {r["trial"]: r for r in csv.DictReader(f)}
    for d in trials:
        summary = json.loads((d / "summary.json").read_text())
        assert float(table[d.name]["final_objective"]) == pytest.approx(summary["valid/auc_mean"], rel=1e-5)
    for png in ("loss.png", "auc.png", "final_metric.png"):
        assert (sweep / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_bad_trial_is_recorded_and_the_next_one_still_completes(tmp_path):
    proc = runner_cli("-m", "optimizer=async_sgd,adam", "async_emb=on", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep: 2 trials, 1 ok, 1 failed" in proc.stdout
    assert "FAILED #1 [optimizer=adam]: PreflightError" in proc.stdout
    good, bad = trial_dirs(tmp_path)
    assert "PreflightError: use_async_emb requires an embedding optimizer" in (bad / "FAILED").read_text()
    assert json.loads((bad / "summary.json").read_text())["status"] == "failed"
    assert (bad / "metrics.jsonl").read_text() == ""  # refused before training
    assert json.loads((good / "summary.json").read_text())["status"] == "ok" and not (good / "FAILED").exists()
    runs = [wandb_run(d) for d in (bad, good)]
    assert [r["exit_code"] for r in runs] == [1, 0]
    assert runs[0]["id"] != runs[1]["id"] and runs[0]["group"] == runs[1]["group"]
    assert "optimizer=async_sgd" in runs[1]["tags"] and "optimizer=adam" not in runs[1]["tags"]
    rep = subprocess.run([sys.executable, "-m", "runner.report", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0 and "- trials: 2 (1 ok, 1 failed)" in (tmp_path / "report.md").read_text()
    # the same folder again, its one trial refused where the earlier sweep's #0 trained and #1 failed: it counts
    # alone (it used to count #1 with it and report 2 trials) and carries none of #0's numbers
    again = runner_cli("-m", "optimizer=async_sgd", "trainer.batch_size=0", f"hydra.sweep.dir={tmp_path}")
    assert again.returncode == 1, again.stderr[-3000:]
    assert (f"sweep: 1 trials, 0 ok, 1 failed ({tmp_path}; 1 more trial folders there are an earlier sweep's, left "
            f"as they were, not counted)") in again.stderr
    assert json.loads((good / "summary.json.before-restart").read_text())["status"] == "ok"
    summary = json.loads((good / "summary.json").read_text())
    assert summary["status"] == "failed" and "final/train_loss" not in summary and "trainer.batch_size=0" in (
        good / "FAILED").read_text()


@pytest.mark.slow
def test_a_multirun_whose_combinations_do_not_compose_stops_before_its_first_trial_naming_them(tmp_path):
    proc = runner_cli("-m", "optimizer=async_adam,async_sgd", "optimizer.b1=0.8", "logger=none",
                      f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [  # it was Hydra's multi-line error, exit code 1, naming no combination
        "error: invalid sweep:",
        "  - trial #1 [optimizer=async_sgd optimizer.b1=0.8 logger=none debug=tiny]: its values do not compose into "
        "one config (Could not override 'optimizer.b1': Key 'b1' not in 'AsyncSGDConfig'): drop optimizer=async_sgd "
        "from the sweep, or sweep keys every choice has"]
    assert list(tmp_path.iterdir()) == []  # no trial ran, no multirun.yaml


@pytest.mark.slow
def test_optuna_search_writes_the_best_of_its_trials(tmp_path):
    study = f"sqlite:///{tmp_path}/optuna.db"  # a study kept in a file, as docs/guide/sweeps.md shows
    proc = runner_cli("hparams_search=optuna_emb_lr", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={tmp_path}",
                      "logger=none", f"hydra.sweeper.storage={study}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import optuna

    kept = optuna.load_study(storage=study, study_name="emb_lr")
    assert len(kept.trials) == 2 and {t.state.name for t in kept.trials} == {"COMPLETE"}
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    trials = trial_dirs(tmp_path)
    assert len(trials) == 2
    values = {}
    for d in trials:
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()))
        values[d.name] = (json.loads((d / "summary.json").read_text())["valid/auc_mean"], overrides)
    best_value, best_overrides = max(values.values(), key=lambda v: v[0])
    assert result["best_value"] == pytest.approx(best_value) == kept.best_value
    assert set(result["best_params"]) == {"optimizer", "optimizer.learning_rate", "dense_optimizer.learning_rate"}
    for key, value in result["best_params"].items():
        assert str(value) == best_overrides[key] or float(value) == pytest.approx(float(best_overrides[key]))


def test_a_sweep_with_no_trial_exits_1_saying_so(tmp_path, capsys):
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "never_made")}}})
    with pytest.raises(SystemExit) as e:
        sweeps.SweepSummary().on_multirun_end(cfg)
    assert e.value.code == 1
    assert capsys.readouterr().err.startswith(f"sweep: no trial ran ({tmp_path / 'never_made'}): the sweep's "
                                              f"overrides gave none (e.g. an empty range or choice)")


@pytest.mark.slow
def test_optuna_goes_on_after_failed_trials_and_fails_if_none_completed(tmp_path):
    proc = runner_cli("hparams_search=optuna_emb_lr", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={tmp_path}",
                      "optimizer=choice(adam,adagrad)", "logger=none")  # dense optimizers: refused with async_emb=on
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "No trials are completed yet" not in proc.stderr
    assert proc.stderr.rstrip().endswith("sweep: no trial completed, so there is no best one (optimization_results"
                                         ".yaml not written): fix what the failed trials name and run the search again")
    assert f"sweep: 2 trials, 0 ok, 2 failed ({tmp_path})" in proc.stderr
    trials = trial_dirs(tmp_path)
    assert len(trials) == 2  # the first failure did not end the search
    for d in trials:
        assert "PreflightError: use_async_emb requires" in (d / "FAILED").read_text()
    assert not (tmp_path / "optimization_results.yaml").exists()


@pytest.mark.slow
def test_an_optuna_trial_the_preflight_refuses_is_one_line_and_fail_and_all_refused_exits_1(tmp_path):
    """mesh=data and trainer.batch_size=30 are each fine, not together on 4 devices: that trial ends in one line naming
    its values and the refusal, is FAIL in the study, and the search goes on; a search all of whose trials are
    refused exits 1 saying so."""
    import optuna
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path}/optuna.db"
    search = ["hparams_search=optuna_ranking", "hydra/sweeper/sampler=grid", "mesh.cpu_devices=4", "model.emb_width=8",
              "optimizer.learning_rate=0.01", "dense_optimizer.learning_rate=0.001", f"hydra.sweeper.storage={url}"]
    refusal = ("failed: PreflightError: trainer.batch_size=30 does not divide over the 4 devices of "
               "mesh.axes={'data': -1} with mesh.cpu_devices=4; use a multiple of 4")
    proc = runner_cli(*search, "mesh=choice(single,data)", "trainer.batch_size=30", f"hydra.sweep.dir={tmp_path}/a")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "Error executing job" not in out and "Failed experiment" not in out
    (line,) = [ln for ln in out.splitlines() if "PreflightError" in ln and "ERROR] - trial #" in ln]
    assert "trial #" in line and "[mesh=data " in line and " trainer.batch_size=30" in line and line.endswith(refusal)
    assert f"sweep: 2 trials, 1 ok, 1 failed ({tmp_path}/a)" in proc.stdout
    states = {t.params["mesh"]: t.state for t in optuna.load_study(storage=url, study_name="ranking").trials}
    assert states == {"single": TrialState.COMPLETE, "data": TrialState.FAIL}
    proc = runner_cli(*search, "mesh=data", "trainer.batch_size=choice(30,34)", "hydra.sweeper.study_name=all",
                      f"hydra.sweep.dir={tmp_path}/b")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"sweep: 2 trials, 0 ok, 2 failed ({tmp_path}/b)" in proc.stderr
    assert proc.stderr.rstrip().endswith("sweep: no trial completed, so there is no best one (optimization_results"
                                         ".yaml not written): fix what the failed trials name and run the search again")
    assert {t.state for t in optuna.load_study(storage=url, study_name="all").trials} == {TrialState.FAIL}


@pytest.mark.slow
def test_a_plain_optuna_search_with_a_value_hydra_cannot_apply_stops_before_its_first_trial(tmp_path):
    """``hydra/sweeper=optuna`` as the plugin configures it (its own default direction) runs, and a ``choice`` value
    no trial could compose stops it before the first trial instead of ending it in a traceback trials in."""
    proc = runner_cli("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "logger=none",
                      "optimizer=choice(async_adam,async_sgdd)", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-2:][0] == "error: invalid sweep:"
    assert proc.stderr.splitlines()[-1].startswith("  - optimizer=choice(async_adam,async_sgdd): optimizer=async_sgdd "
                                                   "cannot be applied (Could not find 'optimizer/async_sgdd'")
    assert trial_dirs(tmp_path) == []


@pytest.mark.slow
def test_a_search_runs_its_grid_when_the_grid_sampler_is_chosen(tmp_path):
    proc = runner_cli("hparams_search=optuna_ranking", "hydra/sweeper/sampler=grid", f"hydra.sweep.dir={tmp_path}",
                      "dense_optimizer.learning_rate=choice(0.001,0.002)", "optimizer.learning_rate=0.01",
                      "model.emb_width=8", "logger=none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Sampler: GridSampler" in proc.stderr + proc.stdout
    tried = sorted(yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())[0] for d in trial_dirs(tmp_path))
    assert tried == ["dense_optimizer.learning_rate=0.001", "dense_optimizer.learning_rate=0.002"]  # the grid, once
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert set(result["best_params"]) == {"dense_optimizer.learning_rate"}


@pytest.mark.slow
def test_a_search_killed_mid_trial_leaves_a_trial_its_resumed_study_marks_failed(tmp_path):
    import time

    import optuna
    from optuna.trial import TrialState

    db, url = tmp_path / "optuna.db", f"sqlite:///{tmp_path}/optuna.db"
    search = ["hparams_search=optuna_emb_lr", "hydra.sweeper.n_trials=1", f"hydra.sweeper.storage={url}", "logger=none"]
    killed = subprocess.Popen([sys.executable, "-m", "runner", *search, *TINY, f"hydra.sweep.dir={tmp_path}/killed"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "killed" / "0" / ".hydra").is_dir():  # Hydra has made the trial's folder: it runs
            assert killed.poll() is None and time.monotonic() < deadline, killed.returncode
            time.sleep(0.1)
    finally:
        killed.kill()  # SIGKILL: nothing of the search runs on
        killed.wait()
    (trial,) = optuna.load_study(storage=url, study_name="emb_lr").trials
    assert trial.state == TrialState.RUNNING and _heartbeat_age(db, trial._trial_id) < 60
    _age_heartbeat(db, trial._trial_id, "-10 minutes")  # as if it was killed 10 minutes ago
    resumed = runner_cli(*search, f"hydra.sweep.dir={tmp_path}/resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ("marked FAIL 1 trial(s) of study emb_lr a killed search left running (no heartbeat for 180 s): #0"
            in resumed.stdout + resumed.stderr)
    assert [t.state for t in optuna.load_study(storage=url, study_name="emb_lr").trials] == [
        TrialState.FAIL, TrialState.COMPLETE]
