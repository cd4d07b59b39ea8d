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
