"""The Criteo task on the trainer's guarantees: a run stopped and resumed reads the same examples and ends
bit-identical to an uninterrupted one (the order is a function of the step); and the routed row layout on
8 virtual devices learns what one device does."""
import json
from pathlib import Path

import numpy as np
import pytest

from runner.app import run
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
    """The uninterrupted run on one device, which both tests hold others against (the stop and resume run on
    one device too: a resume on the mesh is the ranking task's test; here it is the Criteo data's order)."""
    tmp = tmp_path_factory.mktemp("straight")
    return tmp, launch(tmp, "first", cache, "mesh=single")


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
def test_the_routed_row_layout_learns_what_one_device_does(tmp_path, cache, straight):
    mesh = launch(tmp_path / "mesh", "first", cache, *MESH, "checkpoint.interval=0")
    a, b = rows(tmp_path / "mesh" / "first"), rows(straight[0] / "first")
    np.testing.assert_allclose([r["train/loss"] for r in a if "train/loss" in r],
                               [r["train/loss"] for r in b if "train/loss" in r], rtol=1e-4)
    assert mesh == pytest.approx(straight[1], abs=1e-4)  # the objective (valid AUC)
