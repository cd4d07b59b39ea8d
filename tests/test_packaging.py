"""The distribution, not the checkout: a wheel built from the repository, installed (not editable) into a fresh
virtual environment and run from a folder outside the repository, composes configs from the config groups it
ships (runner/conf), trains, writes a report, and installs no top-level ``benchmarks`` package.

The temporary environment gets the dependencies without any download: it is created without pip from the base
interpreter, the wheel is installed into it with ``--no-deps`` by this environment's pip (``pip --python``), and
only then a ``.pth`` file appends this environment's site-packages to its path. Packages installed in the
temporary environment come first, so ``runner`` is imported from the wheel; the editable install of this
environment is not active there (a ``.pth`` line adds a folder but does not run the ``.pth`` files in it).
The wheel is built from a copy of the source tree so that no ``build/`` folder, from this build or an earlier
one, is left in (or read from) the checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
pytestmark = pytest.mark.slow

# What never belongs in a build: environments, run outputs, build leftovers.
IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "outputs", "multirun", "wandb",
                                "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", "*.pyc")


def _run(cmd: list[str], cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")} | (env or {})
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _local_setuptools_builds() -> bool:
    """This environment's setuptools satisfies the build requirement (pyproject.toml): build without isolation."""
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str]]:
    """The wheel, and the files ``pip wheel`` left in the source tree it was built from."""
    src = tmp_path_factory.mktemp("src") / "recsys-runner"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    before = _files(src)
    dist = tmp_path_factory.mktemp("dist")
    isolation = [] if not _local_setuptools_builds() else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "wheel", src, "-w", dist, "--no-deps", "-q", *isolation], cwd=dist)
    (whl,) = dist.glob("recsys_runner-*.whl")
    return whl, sorted(_files(src) - before)


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


def test_what_a_wheel_build_leaves_in_the_tree_is_ignored_by_git(built):
    left = built[1]
    assert any(f.startswith("build/") for f in left), left  # setuptools' build folder, the case this guards
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an installed copy of the tests)")
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(left),
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert sorted(set(left) - set(ignored)) == []


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv") / "env"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", env], cwd=env.parent)
    python = env / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=env.parent)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=env.parent).stdout.strip())
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])  # ours, in order
    (site / "_recsys_runner_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    return env


@pytest.fixture
def outside(tmp_path) -> Path:
    """A working directory outside the repository: nothing is found through the current directory."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert ROOT not in cwd.resolve().parents
    return cwd


def test_wheel_ships_every_config_group_and_no_benchmarks(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"runner", "optimizers", "hydra_plugins"} and len(dist_info) == 1, top
    # the runner's basic and Optuna sweepers, in Hydra's plugin namespace: no hydra_plugins/__init__.py, which would
    # hide the other plugins' (the Optuna and submitit ones they build on)
    assert sorted(n for n in names if n.startswith("hydra_plugins/")) == [
        "hydra_plugins/runner_basic/__init__.py", "hydra_plugins/runner_basic/sweeper.py",
        "hydra_plugins/runner_optuna/__init__.py", "hydra_plugins/runner_optuna/sweeper.py"]
    assert not [n for n in names if n.startswith("benchmarks/") or "/benchmarks/" in n]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    shipped = {n.removeprefix("runner/conf/") for n in names if n.startswith("runner/conf/")}
    expected = {p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml")}
    assert "config.yaml" in expected and shipped == expected
    assert "runner/__main__.py" in names and "optimizers/__init__.py" in names
    assert "optimizers/kernels/cpu.cc" in names  # the native kernels' source, built where they run


def test_installed_console_script_help_and_cfg(venv, outside):
    runner = venv / "bin" / "runner"
    where = _run([venv / "bin" / "python", "-c", "import runner, runner.__main__ as m; print(runner.__file__); "
                  "print(m.CONF_DIR)"], cwd=outside).stdout.split()
    assert Path(where[0]).is_relative_to(venv) and Path(where[1]) == Path(where[0]).parent / "conf", where
    proc = _run([venv / "bin" / "python", "-c", "import importlib.util as u; print(u.find_spec('benchmarks'))"],
                cwd=outside)
    assert proc.stdout.strip() == "None"  # not installed, and not found through the working directory
    proc = _run([venv / "bin" / "python", "-c", "from hydra.core.plugins import Plugins; from hydra.plugins.sweeper "
                 "import Sweeper; import sys; c = [c for c in Plugins.instance().discover(Sweeper) if c.__name__ == "
                 "'RunnerOptunaSweeper']; print(sys.modules[c[0].__module__].__file__)"], cwd=outside)
    assert Path(proc.stdout.strip()).is_relative_to(venv)  # Hydra finds the installed runner's Optuna sweeper

    out = _run([runner, "--help"], cwd=outside).stdout
    assert out.startswith("runner: Hydra-configured JAX training")
    groups = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    for group in ("optimizer", "mesh", "logger", "experiment", "debug"):
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        assert f"{group}: {', '.join(options)}" in groups, (group, groups)

    cfg = _run([runner, "--cfg", "job", "optimizer=async_sgd"], cwd=outside).stdout
    assert "_target_: optimizers.AsyncSGD" in cfg and "trainer:" in cfg


def test_installed_module_trains_and_reports(venv, outside):
    python = venv / "bin" / "python"
    run_dir = outside / "run"
    # debug=tiny as it is (6 steps): the programs the checkout's CLI tests compile, found in the persistent cache
    proc = _run([python, "-m", "runner", "debug=tiny", f"hydra.run.dir={run_dir}"], cwd=outside)
    assert "kernels are off" not in proc.stderr  # the shipped kernel source builds and loads
    assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "summary.json").is_file()
    assert '"status": "ok"' in (run_dir / "summary.json").read_text()
    out = _run([python, "-m", "runner.report", run_dir], cwd=outside).stdout
    assert out.strip() == str(run_dir / "report.md")
    assert (run_dir / "report.md").is_file() and (run_dir / "loss.png").is_file()
