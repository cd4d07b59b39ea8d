"""No run output is committed: Hydra runs and sweeps and W&B offline runs are ignored at any depth, and the
only tracked file under outputs/ is its .gitkeep (DEVELOPERS.md keeps the folder)."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_OUTPUTS = ["outputs/2026-12-01/10-00-00/metrics.jsonl", "outputs/2026-12-01/10-00-00/.hydra/config.yaml",
               "outputs/checkpoints/run/4/meta", "multirun/2026-12-01/10-00-00/0/summary.json",
               "wandb/offline-run-1/run-1.wandb", "runner/wandb/offline-run-2/files", "sub/outputs/x/runner.log",
               "conf/multirun/q"]


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def checkout():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an installed copy of the tests)")


def test_no_run_output_is_tracked():
    tracked = git("ls-files").stdout.splitlines()
    outputs = [f for f in tracked if {"outputs", "multirun", "wandb", ".hydra"} & set(f.split("/")[:-1])
               or "offline-run-" in f]
    assert outputs == ["outputs/.gitkeep"]
    assert git("ls-files", "-ci", "--exclude-standard").stdout == ""  # nothing tracked that .gitignore ignores


def test_run_outputs_are_ignored_and_the_gitkeep_is_not():
    ignored = git("check-ignore", "--no-index", *RUN_OUTPUTS).stdout.splitlines()
    assert ignored == RUN_OUTPUTS
    assert git("check-ignore", "--no-index", "outputs/.gitkeep").returncode == 1  # 1: not ignored
