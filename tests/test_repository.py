"""No run output is committed: Hydra runs and sweeps and W&B offline runs are ignored at any depth, and
nothing under outputs/ is tracked (the first run creates the folder)."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_OUTPUTS = ["outputs/.gitkeep", "outputs/2026-12-01/10-00-00/metrics.jsonl", "outputs/2026-12-01/10-00-00/.hydra/config.yaml",
               "outputs/checkpoints/run/4/meta", "multirun/2026-12-01/10-00-00/0/summary.json",
               "wandb/offline-run-1/run-1.wandb", "runner/wandb/offline-run-2/files", "sub/outputs/x/runner.log",
               "conf/multirun/q", ".hydra/config.yaml", "optuna.db"]


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
    assert outputs == []
    assert git("ls-files", "-ci", "--exclude-standard").stdout == ""  # nothing tracked that .gitignore ignores


def test_run_outputs_are_ignored_and_the_source_is_not():
    ignored = git("check-ignore", "--no-index", *RUN_OUTPUTS).stdout.splitlines()
    assert ignored == RUN_OUTPUTS
    sources = ["runner/outputs.py", "runner/tracking/wandb.py", "conf/logger/wandb.yaml", "tests/runner/test_output_dir.py"]
    assert git("check-ignore", "--no-index", *sources).returncode == 1  # 1: none of them ignored


HEADED = sorted(p for group in ("experiment", "hparams_search", "debug", "model")
                for p in (ROOT / "conf" / group).glob("*.yaml") if group != "model" or p.stem in ("ranking", "sequential"))


@pytest.mark.parametrize("path", HEADED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_runnable_config_opens_with_run_takes_expect_and_at_most_three_lines_of_why(path):
    """The config header form of the docs: the command, how long it takes, what it should reach, then at most
    three lines of why (search histories live in docs/results/)."""
    lines = path.read_text().splitlines()
    if lines and lines[0].startswith("# @package"):
        lines = lines[1:]
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    assert [h.split(":")[0] for h in header[:3]] == ["# Run", "# Takes", "# Expect"], header[:3]
    assert header[0].startswith("# Run:    python -m runner "), header[0]
    assert all(len(h.split(":", 1)[1].strip()) > 0 for h in header[:3]), header[:3]
    assert len(header) <= 6, f"{len(header) - 3} lines of why after Run/Takes/Expect; at most 3"


@pytest.mark.parametrize("package", ["runner", "optimizers", "benchmarks", "hydra_plugins"])
def test_no_module_is_longer_than_400_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / package).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, f"split these modules (at most 400 lines each): {long}"
