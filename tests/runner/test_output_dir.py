"""An output folder that cannot be created or written (``hydra.run.dir`` / ``hydra.sweep.dir``) stops the run before
it starts with one message naming the key, its value and the fix (exit 2), not Hydra's traceback; nothing is
written. The check (``runner.outputs.OutputDirCheck``, a Hydra callback) runs before any JAX import, so each case
costs one Hydra compose."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omegaconf import OmegaConf

from runner import outputs
from runner.outputs import unusable_dir
from tests.runner.support import ROOT

# Root writes any folder: as root, the run is started without the capabilities that override file permissions.
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search", "--"]


def _cli(*args: str, without_override: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    prefix = NO_OVERRIDE if without_override and os.geteuid() == 0 else []
    flags = [a for a in args if a.startswith("--")]
    overrides = [a for a in args if not a.startswith("--")]
    return subprocess.run([*prefix, sys.executable, "-m", "runner", *flags, "debug=tiny", "logger=none", *overrides],
                          cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)


def _refused(proc: subprocess.CompletedProcess, key: str, value: Path, why: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and proc.stderr.count("error: ") == 1, out
    assert (f"error: {key}={value} cannot be used as the output folder ({why}): set {key} to a folder this user "
            f"can create and write (e.g. {key}=outputs/my_run)") in proc.stderr, out


@pytest.fixture
def read_only(tmp_path) -> Path:
    d = tmp_path / "read_only"
    d.mkdir(mode=0o555)
    yield d
    d.chmod(0o755)


@pytest.mark.slow
def test_a_run_dir_in_a_read_only_folder_is_refused_before_the_run(read_only):
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root without util-linux's setpriv: no way to be refused a write")
    proc = _cli(f"hydra.run.dir={read_only / 'run'}", without_override=True)
    _refused(proc, "hydra.run.dir", read_only / "run", "Permission denied")
    assert list(read_only.iterdir()) == []


@pytest.mark.slow
def test_a_run_dir_under_a_file_and_a_sweep_dir_under_a_file_are_refused(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way\n")
    _refused(_cli(f"hydra.run.dir={blocker / 'run'}"), "hydra.run.dir", blocker / "run", "Not a directory")
    proc = _cli("--multirun", "trainer.seed=0,1", f"hydra.sweep.dir={blocker / 'sweep'}")
    _refused(proc, "hydra.sweep.dir", blocker / "sweep", "Not a directory")
    assert blocker.read_text() == "in the way\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_the_check_creates_a_missing_folder_and_leaves_no_probe(tmp_path):
    assert unusable_dir(tmp_path / "a" / "b") is None
    assert (tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []


@pytest.mark.slow
def test_an_empty_run_dir_and_names_the_run_writes_taken_by_the_wrong_kind_are_refused(tmp_path):
    """An empty hydra.run.dir (an unset variable) would write into the current folder; a folder named like a
    file the run writes (it failed only after training) or a file named like Hydra's config folder (Hydra's
    traceback) stop it before it starts, each left as it is."""
    proc = _cli("hydra.run.dir=")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: hydra.run.dir is empty, so the run would write its files into the current "
                                  f"folder ({ROOT}): set hydra.run.dir to a folder"), proc.stderr
    assert not (ROOT / "summary.json").exists() and not (ROOT / "metrics.jsonl").exists()
    for name, what in (("summary.json", "a folder named summary.json"),
                       (".hydra", "a file named .hydra (Hydra's config folder, hydra.output_subdir)")):
        run = tmp_path / name.strip(".")
        (run / name).mkdir(parents=True) if name != ".hydra" else (run.mkdir(), (run / name).write_text("mine"))
        proc = _cli(f"hydra.run.dir={run}")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr == (f"error: hydra.run.dir={run} holds {what}, where the run writes its own; move it "
                               f"away, or set hydra.run.dir to another folder\n")
        assert sorted(p.name for p in run.iterdir()) == [name]


# ---- a sweep that ends before its first trial removes the sweep folder it made ------------------------------

def listing(root: Path) -> dict[str, str | None]:
    """Every path under ``root`` (relative), with a file's content (None for a folder)."""
    return {str(p.relative_to(root)): (p.read_text() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def sweep_started(sweep_dir: Path) -> None:
    """What ``OutputDirCheck`` does as a sweep into ``sweep_dir`` starts (it notes the folders it creates)."""
    outputs.OutputDirCheck().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}}))


def test_missing_names_the_folders_creating_a_path_makes(tmp_path):
    assert outputs.missing(tmp_path) == []
    assert outputs.missing(tmp_path / "a" / "b") == [tmp_path / "a", tmp_path / "a" / "b"]
    (tmp_path / "f").write_text("x")
    assert outputs.missing(tmp_path / "f" / "sweep") == [tmp_path / "f" / "sweep"]  # creating it fails: nothing made


def test_a_sweep_that_ended_before_its_first_trial_removes_only_the_folders_it_made_and_its_own_file(tmp_path):
    (tmp_path / "mine.txt").write_text("kept")
    before = listing(tmp_path)
    sweep_started(tmp_path / "multirun" / "day" / "time")
    (tmp_path / "multirun" / "day" / "time" / "multirun.yaml").write_text("hydra: {}\n")
    outputs.remove_unused_sweep_dir()
    assert listing(tmp_path) == before

    earlier = tmp_path / "earlier"  # an earlier sweep's folder: its trials and its multirun.yaml stay, whole
    (earlier / "0" / ".hydra").mkdir(parents=True)
    (earlier / "0" / ".hydra" / "overrides.yaml").write_text("- trainer.seed=0\n")
    (earlier / "multirun.yaml").write_text("earlier\n")
    (tmp_path / "empty").mkdir()  # a folder given empty stays
    before = listing(tmp_path)
    for d in (earlier, tmp_path / "empty"):
        sweep_started(d)
        outputs.remove_unused_sweep_dir()
    assert listing(tmp_path) == before


@pytest.mark.parametrize("earlier", ["earlier sweep's\n", None])
def test_a_sweep_stopped_before_its_first_trial_puts_back_the_multirun_yaml_it_wrote_over(tmp_path, earlier):
    path = tmp_path / "multirun.yaml"
    if earlier is not None:
        path.write_text(earlier)
    with pytest.raises(KeyboardInterrupt), outputs.kept_sweep_file(tmp_path):
        path.write_text("this sweep's\n")  # as Hydra's basic sweeper does before it launches the first trial
        raise KeyboardInterrupt
    assert (path.read_text() if path.exists() else None) == earlier
    with outputs.kept_sweep_file(tmp_path) as kept:
        path.write_text("this sweep's\n")
        kept.started = True  # a trial started: the file is this sweep's record
    assert path.read_text() == "this sweep's\n"


def test_a_made_sweep_folder_holding_anything_else_is_left_whole(tmp_path):
    new = tmp_path / "a" / "sweep"
    sweep_started(new)
    (new / "multirun.yaml").write_text("hydra: {}\n")
    (new / "0").mkdir()  # a trial started
    outputs.remove_unused_sweep_dir()
    assert sorted(listing(tmp_path)) == ["a", "a/sweep", "a/sweep/0", "a/sweep/multirun.yaml"]

    other = tmp_path / "b" / "sweep"
    sweep_started(other)
    (tmp_path / "b" / "theirs.txt").write_text("another program's")  # beside the folder: only the folder goes
    outputs.remove_unused_sweep_dir()
    assert listing(tmp_path / "b") == {"theirs.txt": "another program's"}
    outputs.remove_unused_sweep_dir()  # once: a second call has nothing noted
    assert (tmp_path / "b").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["optimizer=async_adam,async_sgd", "optimizer.b1=0.8"],  # a combination that does not compose: exit 2
    ["trainer.steps=abc,2"],  # a swept value the setting cannot take: exit 2
    ["hparams_search=optuna_emb_lr", "hydra.sweeper.direction=sideways"],  # an Optuna setting refused: exit 2
    ["trainer.seed=range(1,1)"],  # no trial to run: exit 1
])
def test_a_sweep_refused_before_its_first_trial_leaves_no_folder_and_an_earlier_sweeps_stays(tmp_path, args):
    """Each left an empty sweep folder (the no-trial sweep a multirun.yaml in it) that the next sweep into it took
    for an earlier sweep's."""
    proc = _cli("--multirun", *args, f"hydra.sweep.dir={tmp_path / 'new' / 'sweep'}")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    assert ("error: invalid sweep:" if proc.returncode == 2 else "sweep: no trial ran") in proc.stderr
    assert list(tmp_path.iterdir()) == []
    earlier = tmp_path / "earlier"
    (earlier / "0" / ".hydra").mkdir(parents=True)
    (earlier / "0" / ".hydra" / "overrides.yaml").write_text("- trainer.seed=0\n")
    (earlier / "multirun.yaml").write_text("earlier\n")
    before = listing(tmp_path)
    proc = _cli("--multirun", *args, f"hydra.sweep.dir={earlier}")
    assert proc.returncode in (1, 2) and len(proc.stderr.splitlines()) == 1 + (proc.returncode == 2), proc.stderr
    assert listing(tmp_path) == before  # the earlier multirun.yaml too: a sweep with no trial wrote over it (Hydra)


def test_a_database_the_refused_sweep_created_is_removed_and_one_that_existed_stays(tmp_path):
    from runner.sweep_storage import sqlite_file

    assert sqlite_file(f"sqlite:///{tmp_path}/s/study.db") == tmp_path / "s" / "study.db"
    assert sqlite_file(f"sqlite:///file:{tmp_path}/study.db?mode=ro&uri=true") == tmp_path / "study.db"
    assert [sqlite_file(u) for u in ("sqlite://", "sqlite:///:memory:", "mysql://u:p@h/db", None, 3)] == [None] * 5
    new, kept = tmp_path / "new" / "sweep", tmp_path / "kept.db"
    kept.write_text("an earlier study")
    sweep_started(new)
    (new / "study.db").write_text("this sweep's study")
    outputs.note_created(new / "study.db")
    outputs.remove_unused_sweep_dir()
    assert listing(tmp_path) == {"kept.db": "an earlier study"}
    sweep_started(new)
    (new / "study.db").write_text("this sweep's study")
    outputs.note_created(new / "study.db")
    outputs.keep_created()  # its first trial started: the study is the sweep's record
    outputs.remove_unused_sweep_dir()
    assert listing(tmp_path)["new/sweep/study.db"] == "this sweep's study"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # enqueue_trial: an earlier study's record
def test_a_search_refused_before_its_first_trial_leaves_no_study_database_it_created(tmp_path):
    """A storage in the new sweep folder kept that folder and its new study.db; a study.db there before stays,
    byte for byte."""
    import optuna

    search = ["hparams_search=optuna_emb_lr", "optimizer=choice(async_adam,nosuch)"]  # nosuch: refused
    new = tmp_path / "new" / "sweep"
    proc = _cli(*search, f"hydra.sweep.dir={new}", f"hydra.sweeper.storage=sqlite:///{new}/study.db")
    assert proc.returncode == 2 and proc.stderr.splitlines()[0] == "error: invalid sweep:", proc.stderr
    assert "optimizer=nosuch cannot be applied" in proc.stderr and len(proc.stderr.splitlines()) == 2
    assert list(tmp_path.iterdir()) == []
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    optuna.create_study(storage=f"sqlite:///{earlier}/study.db", study_name="other").enqueue_trial({"x": 1})
    before = (earlier / "study.db").read_bytes()
    proc = _cli(*search, f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.sweeper.storage=sqlite:///{earlier}/study.db")
    assert proc.returncode == 2 and "optimizer=nosuch cannot be applied" in proc.stderr, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["earlier"] and (earlier / "study.db").read_bytes() == before
