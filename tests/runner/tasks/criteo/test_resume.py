"""The Criteo task on the trainer's guarantees: a run stopped and resumed, or SIGKILLed and relaunched, reads the
same examples and ends bit-identical to an uninterrupted one (the order is a function of the step), on one
device and on the 2x4 mesh; and the routed row layout on 8 virtual devices learns what one device does."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runner.app import run
from runner.checkpoint.drills import KILL_ENV
from tests.runner.support import compose_config

BASE = ["data=criteo", "model=dlrm", "logger=none", "data.lines=20000", "model.emb_width=8", "model.bottom=[16]",
        "model.top=[16]", "trainer.batch_size=256", "trainer.steps=6", "trainer.log_interval=1",
        "trainer.eval_interval=100", "data.eval_examples=512", "checkpoint.interval=2"]
MESH = ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"]


def rows(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("criteo_data") / "generated"


def launch(tmp: Path, name: str, cache: Path, *overrides) -> float:
    cfg = compose_config([*BASE, f"data.cache={cache}", f"checkpoint.dir={tmp / 'ck'}", *overrides], tiny=False)
    return run(cfg, tmp / name)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache):
    """The uninterrupted run on one device, which the one-device resumes and the mesh are held against."""
    tmp = tmp_path_factory.mktemp("straight")
    return tmp, launch(tmp, "first", cache, "mesh=single")


@pytest.fixture(scope="module")
def mesh_straight(tmp_path_factory, cache):
    """The uninterrupted run on the 2x4 mesh (the 26 tables stacked and row-sharded, ids routed)."""
    tmp = tmp_path_factory.mktemp("mesh_straight")
    return tmp, launch(tmp, "first", cache, *MESH)


@pytest.mark.slow
def test_a_stopped_run_resumes_bit_identical(tmp_path, cache, straight):
    stopped = tmp_path / "stopped"
    launch(stopped, "first", cache, "mesh=single", "trainer.stop_after=3")
    assert [r["step"] for r in rows(stopped / "first")] == [1, 2, 3]
    launch(stopped, "second", cache, "mesh=single")
    resumed = rows(stopped / "second")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6, 6]  # every step once, then the final evaluation
    assert resumed == rows(straight[0] / "first")  # losses, norms, AUCs: the same floats


@pytest.mark.slow
def test_a_stopped_run_on_the_mesh_resumes_bit_identical(tmp_path, cache, mesh_straight):
    stopped = tmp_path / "stopped"
    launch(stopped, "first", cache, *MESH, "trainer.stop_after=3")
    launch(stopped, "second", cache, *MESH)
    assert rows(stopped / "second") == rows(mesh_straight[0] / "first")


@pytest.mark.slow
def test_a_killed_run_relaunched_trains_on_the_same_examples_and_ends_bit_identical(tmp_path, cache, straight):
    """SIGKILL in the middle of saving step 4 (``KILL_ENV``: every array written, not committed): the same
    command again resumes from step 2 and re-reads steps 3-6's examples, as the uninterrupted run read them."""
    # mesh.cpu_devices=8: the 8 virtual devices of this test process, so XLA:CPU splits the step's loops as here
    command = [sys.executable, "-m", "runner", *BASE, f"data.cache={cache}", "mesh=single", "mesh.cpu_devices=8",
               f"checkpoint.dir={tmp_path / 'ck'}", f"hydra.run.dir={tmp_path / 'run'}"]
    killed = subprocess.run(command, cwd=tmp_path, env={**os.environ, KILL_ENV: "4"}, capture_output=True, text=True,
                            timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [r["step"] for r in rows(tmp_path / "run")][:4] == [1, 2, 3, 4]  # then killed saving step 4
    launch(tmp_path, "run", cache, "mesh=single", "mesh.cpu_devices=8")  # the same command again (in this process)
    assert rows(tmp_path / "run") == rows(straight[0] / "first")


@pytest.mark.slow
def test_the_routed_row_layout_learns_what_one_device_does(cache, straight, mesh_straight):
    a, b = rows(mesh_straight[0] / "first"), rows(straight[0] / "first")
    np.testing.assert_allclose([r["train/loss"] for r in a if "train/loss" in r],
                               [r["train/loss"] for r in b if "train/loss" in r], rtol=1e-4)
    assert mesh_straight[1] == pytest.approx(straight[1], abs=1e-4)  # the objective (valid AUC)
