"""The `runner` console script: `--help` lists every config group with its options (read from conf/), and Hydra's
bash completion installs and completes group names, options and sweeper keys."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner.support import CONF

SCRIPT = Path(sys.executable).with_name("runner")
INSTALL_HINT = f"console script {SCRIPT} missing: run `{sys.executable} -m pip install -e .` (make install does)"


def runner(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert SCRIPT.is_file(), INSTALL_HINT
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def complete(line: str, tmp_path: Path) -> list[str]:
    proc = runner("--shell-completion", "query=bash", env={"COMP_LINE": line, "COMP_POINT": str(len(line))},
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.slow
def test_help_lists_every_group_and_option_from_any_directory(tmp_path):
    # the conf/ directory is found from the script, not the cwd; stderr lists every module imported
    proc = runner("--help", cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0, proc.stderr
    # --help (like completion and --cfg) only composes, every schema registered, the optimizers' included:
    # it imports no JAX or optax, which would cost more than the compose itself
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "runner.config" in imported and "optimizers.async_adam" in imported
    assert not {m for m in imported if m.split(".")[0] in ("jax", "jaxlib", "optax")}
    out = proc.stdout
    assert out.startswith("runner: Hydra-configured JAX training")
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")
    assert {"experiment", "hparams_search", "optimizer", "mesh", "logger"} <= set(groups)
    section = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    lines = {line.split(":")[0]: line for line in section.splitlines() if ":" in line}
    for group in groups:
        listed = [o.strip() for o in lines[group].split(":", 1)[1].split(",")]
        assert set(options(group)) <= set(listed), (group, listed)
    assert sorted(lines) == groups  # the schemas the options extend (schema/*) are not options to pick
    assert "runner hparams_search=optuna_emb_lr" in out and "python -m runner.report" in out
    assert "\noptimizer:\n  _target_: optimizers.AsyncRowwiseAdagrad" in out  # the composed default config


@pytest.mark.slow
def test_bash_completion_installs_and_completes_groups_options_and_sweeper_keys(tmp_path):
    proc = runner("--shell-completion", "install=bash", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "hydra_bash_completion()" in proc.stdout
    assert "complete -o nospace -o default -F hydra_bash_completion runner" in proc.stdout
    assert complete("runner hparams_", tmp_path) == ["hparams_search="]
    assert complete("runner experiment=", tmp_path) == [f"experiment={o}" for o in options("experiment")]
    got = complete("runner optimizer=async_", tmp_path)  # the YAML options (and their registered schemas)
    assert {f"optimizer={o}" for o in options("optimizer") if o.startswith("async_")} <= set(got)
    assert all(g.startswith("optimizer=async_") for g in got)
    assert "hydra.sweeper.n_trials=" in complete("runner hparams_search=optuna_emb_lr hydra.sweeper.n_tr", tmp_path)
