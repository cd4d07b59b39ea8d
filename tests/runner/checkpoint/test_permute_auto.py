"""``mesh.permute_ids=auto`` (the default): a new run permutes the ids of the tables whose rows are split over
several shards (the row layout on a table axis of more than one) and no other; a resume follows the order its
checkpoint records (no key: an older checkpoint, unpermuted), continuing bit-identically, with a one-line note
when that order is not a new run's; explicit true/false against the other order and a word that is none of
the three are refused by name."""
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from optimizers import permute_ids
from runner.build import build
from runner.errors import PreflightError
from tests.runner.checkpoint.test_resume import (MESHES, N, assert_same_arrays, copy_of, launch, metric_rows,
                                                  saved_arrays, steps_in)
from tests.runner.support import ROOT, compose_config

ROW = MESHES["2x4-row"]
UNPERMUTED = ["mesh.permute_ids=false"]
LAYOUTS = {"single": (["mesh=single"], False), "data8": (["mesh=data"], False), "2x4-row": (ROW, True),
           "1x8-row": (["mesh=table"], True), "2x4-column": (["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column"], False)}


def initial_tables(overrides) -> tuple[dict, dict[str, np.ndarray]]:
    program, _, _ = build(compose_config(list(overrides)))
    state = program.init_state(0)
    return program.tables, {n: np.asarray(t) for n, t in state.tables.items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.slow
def test_auto_permutes_exactly_the_row_sharded_tables(layout):
    """Row ``permute_ids(i)`` of each stored table holds the initial values of id ``i`` (row ``i`` of the one-device
    unpermuted table: initial values follow the id) on a row-sharded mesh; elsewhere row ``i`` does."""
    overrides, permuted = LAYOUTS[layout]
    specs, tables = initial_tables(overrides)
    _, ref = initial_tables(["mesh=single"])
    for name, table in tables.items():
        vocab = specs[name].vocab
        assert specs[name].permute_ids is permuted, name
        rows = np.asarray(permute_ids(np.arange(vocab, dtype=np.int32), vocab)) if permuted else np.arange(vocab)
        assert not permuted or (rows != np.arange(vocab)).mean() > 0.9  # the rows really moved
        np.testing.assert_array_equal(table[rows], ref[name][:vocab], err_msg=name)
        assert not table[vocab:].any()  # padding rows stay zero


def test_auto_never_counts_a_keyed_table_as_permuted(tmp_path, monkeypatch, caplog):
    """A hash table places its ids by their hash: a new run on a row-sharded mesh does not permute it, so the
    resume of its checkpoint (which records it unpermuted) is no change of order and gets no note."""
    import runner.build as build_lib
    from runner.core.mesh import MeshPlan

    cfg = compose_config([*ROW, "data.raw_ids=true", "model.tables.items.kind=hash", "model.tables.items.capacity=64",
                          "model.tables.users.kind=hash", "model.tables.users.capacity=64"])
    plan = MeshPlan((("data", 2), ("table", 4)), "table", "row")
    assert build_lib.permuted_tables(cfg, plan, ["items", "users", "authors"]) == {
        "items": False, "users": False, "authors": True}
    recorded = {n: {"permute_ids": n == "authors"} for n in ("items", "users", "authors")}
    monkeypatch.setattr(build_lib.checkpoint_meta, "resumed_tables", lambda cfg: ("ck/4", recorded))
    caplog.set_level(logging.INFO, logger="runner")
    assert build_lib.permuted_tables(cfg, plan, ["items", "users", "authors"])["authors"] is True
    assert "mesh.permute_ids=auto" not in caplog.text


@pytest.fixture(scope="module")
def unpermuted_runs(tmp_path_factory):
    """On the 2x4 row mesh with mesh.permute_ids=false: (the straight 2N-step run, the run stopped at step N)."""
    straight, stopped = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("stopped")
    launch(straight, "first", [*ROW, *UNPERMUTED])
    launch(stopped, "first", [*ROW, *UNPERMUTED, f"trainer.stop_after={N}"])
    return straight, stopped


def forget_permute_ids(ck: Path) -> None:
    """Make each checkpoint look written before the setting existed: no ``permute_ids`` in its record."""
    for step in steps_in(ck):
        path = ck / str(step) / "meta" / "metadata"
        meta = json.loads(path.read_text())
        for table in meta["tables"].values():
            del table["permute_ids"]
        del meta["config"]["mesh"]["permute_ids"]
        path.write_text(json.dumps(meta))


@pytest.mark.slow
@pytest.mark.parametrize("recorded", ["false", "absent"])
def test_auto_resumes_an_unpermuted_checkpoint_in_its_order(tmp_path, unpermuted_runs, caplog, recorded):
    """Under auto (which would permute on this mesh) the checkpoint's unpermuted rows continue as they are: the
    end state and every logged row equal the uninterrupted permute_ids=false run's."""
    straight, stopped = unpermuted_runs
    tmp = copy_of(stopped, tmp_path)
    resume = []
    if recorded == "absent":
        forget_permute_ids(tmp / "ck")
        resume = [f"checkpoint.resume={tmp / 'ck' / str(N)}"]  # a path, not the run's own newest
    caplog.set_level(logging.INFO, logger="runner")
    launch(tmp, "second", [*ROW, *resume])
    notes = [r.getMessage() for r in caplog.records if r.name == "runner" and "mesh.permute_ids=auto" in r.getMessage()]
    assert notes == [f"mesh.permute_ids=auto: resuming {tmp / 'ck' / str(N)} in the row order it was written in: "
                     f"the ids of users, items, authors are unpermuted; a new run on this mesh would permute them "
                     f"to spread hot ids over the row shards"], notes
    meta = json.loads((tmp / "ck" / "6" / "meta" / "metadata").read_text())
    assert {n: t["permute_ids"] for n, t in meta["tables"].items()} == dict.fromkeys(meta["tables"], False)
    assert_same_arrays(saved_arrays(straight / "ck", 6), saved_arrays(tmp / "ck", 6))
    assert metric_rows(tmp / "second") == metric_rows(straight / "first")


@pytest.mark.slow
def test_explicit_true_on_an_unpermuted_checkpoint_is_refused_with_the_way_out(tmp_path, unpermuted_runs):
    tmp = copy_of(unpermuted_runs[1], tmp_path)
    with pytest.raises(PreflightError) as e:
        launch(tmp, "second", [*ROW, "mesh.permute_ids=true"])
    assert ("table 'items' permute_ids (mesh.permute_ids): the checkpoint has False, this config has True; its rows "
            "are stored in that order, so resume it with mesh.permute_ids=false or mesh.permute_ids=auto (which "
            "follows the checkpoint)") in str(e.value)
    assert steps_in(tmp / "ck") == [2, N]  # nothing was written


BAD = ("mesh.permute_ids='maybe' is not one of auto, true, false (auto: permute the ids of row-sharded tables, "
       "resume a checkpoint in its own order)")


def test_a_word_that_is_not_a_choice_is_refused_by_name():
    for word in ("maybe", "yes", "AUTO"):
        with pytest.raises(PreflightError) as e:
            build(compose_config([*ROW, f"mesh.permute_ids={word}"]))
        assert BAD.replace("maybe", word) in str(e.value), str(e.value)


@pytest.mark.slow
def test_the_command_line_refuses_it_in_one_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "runner", "debug=tiny", "mesh.permute_ids=maybe",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=dict(os.environ), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert BAD in proc.stderr and proc.stderr.count("error: ") == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
