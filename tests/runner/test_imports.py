"""What a launch imports: a run without checkpoints never imports Orbax (~0.6 s), a ranking run never imports
the sequential task's pyarrow readers (~0.3 s), yet an unknown data source is refused naming every known one;
each data source's task is registered by the package ``runner.tasks.PACKAGES`` names for it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.tasks import PACKAGES, TASKS, import_tasks
from tests.runner.support import CONF, ROOT, compose_config

LAUNCH = r"""
import sys
from runner import app  # noqa: F401 - what python -m runner imports to train
from runner.checkpoint import open_checkpoints
from runner.tasks import import_tasks, make_task
from tests.runner.support import compose_config
cfg = compose_config(["checkpoint.interval=0"])
assert open_checkpoints(cfg, None, None, sys.argv[1]) is None
make_task(cfg)
print("orbax without checkpoints:", "orbax.checkpoint" in sys.modules)
print("pyarrow for the ranking task:", "pyarrow" in sys.modules)
from runner.checkpoint import Checkpoints  # noqa: E402,F401 - what a run that checkpoints uses
print("orbax with the checkpoint manager:", "orbax.checkpoint" in sys.modules)
import_tasks("movielens")
print("pyarrow for the sequential task:", "pyarrow" in sys.modules)
"""
UNKNOWN = r"""
from runner.errors import PreflightError
from runner.tasks import make_task
from tests.runner.support import compose_config
try:
    make_task(compose_config(["data.name=bogus"]))
except PreflightError as e:
    print(e)
"""


@pytest.mark.slow
def test_a_ranking_run_without_checkpoints_imports_neither_orbax_nor_pyarrow_and_a_bad_name_lists_every_task(
        tmp_path):
    proc = subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["orbax without checkpoints: False", "pyarrow for the ranking task: False",
                                        "orbax with the checkpoint manager: True",
                                        "pyarrow for the sequential task: True"]
    # a fresh process that has imported no task yet still lists every known one for an unknown name
    proc = subprocess.run([sys.executable, "-c", UNKNOWN], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.stdout.strip() == "data.name='bogus' names no task; known: criteo, movielens, synthetic, synthetic_sequences"


def test_every_data_source_is_registered_by_the_package_named_for_it():
    import_tasks()  # all of them
    assert sorted(TASKS.names()) == sorted(PACKAGES)
    for name, package in PACKAGES.items():
        assert TASKS.get(name).__module__.startswith(f"runner.tasks.{package}."), name
    for option in sorted(f.stem for f in Path(CONF, "data").glob("*.yaml")):  # every data= choice
        assert compose_config([f"data={option}"], tiny=False).data.name in PACKAGES, option
