"""Resumes of hash and modulo tables refused by name. Their rows are keyed by the ids the run started on: a
resume that turns ``data.raw_ids`` on or off is refused naming both values and the way out, and touches nothing
(``checkpoint.allow_data_change`` accepts it with a warning). A hash table's capacity is kept on a resume: a
``partitions`` set on the command line that does not divide it is refused naming the setting, not the mesh."""
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from runner.app import run
from runner.build import build
from runner.checkpoint import open_checkpoints, opening
from runner.checkpoint.lock import LOCK_FILE
from runner.errors import PreflightError
from tests.runner.checkpoint.test_data import tree
from tests.runner.support import compose_config

TABLES = ["model.tables.users.kind=hash", "model.tables.users.capacity=120", "model.tables.items.kind=modulo",
          "model.tables.items.vocab=101", "trainer.steps=2", "trainer.log_interval=1", "checkpoint.interval=2",
          "trainer.run_id=raw-ids", "trainer.eval_interval=2", "trainer.select_best=true"]


def config(ck: Path, raw: bool, *overrides):
    return compose_config([*TABLES, f"data.raw_ids={str(raw).lower()}", f"checkpoint.dir={ck}", *overrides])


def open_on(ck: Path, raw: bool, *overrides):
    cfg = config(ck, raw, *overrides)
    program, task, plan = build(cfg)
    return open_checkpoints(cfg, program, plan, ck.parent / "out", data_file=getattr(task, "data_file", None))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The checkpoint dir of a finished 2-step run on raw ids, its best state (selected at step 2) beside it."""
    d = tmp_path_factory.mktemp("raw")
    run(config(d / "ck", True), d / "first")
    return d / "ck"


@pytest.mark.slow
def test_a_resume_that_turns_raw_ids_off_is_refused_and_touches_nothing(trained, caplog):
    before = tree(trained)
    with pytest.raises(PreflightError) as e:
        open_on(trained, False)
    assert str(e.value) == (
        f"checkpoint {trained / '2'} was trained with data.raw_ids=true, and this run has data.raw_ids=false: its "
        f"hash and modulo tables ['items', 'users'] hold rows keyed by raw 64-bit ids, which the data's ids would "
        f"never find (the tables would start over while the run resumes). Resume with data.raw_ids=true, start a new "
        f"run (checkpoint.resume=never with another checkpoint.dir or trainer.run_id), or set "
        f"checkpoint.allow_data_change=true to resume on these ids on purpose.")
    assert tree(trained) == before and not (trained / LOCK_FILE).exists()

    with caplog.at_level(logging.WARNING, logger="runner"):
        accepted = open_on(trained, False, "checkpoint.allow_data_change=true")
    assert accepted.resume_point()[1] == 2
    accepted.close()
    assert "resuming on them anyway (checkpoint.allow_data_change=true): those tables start over" in caplog.text


@pytest.mark.slow
def test_the_same_ids_resume(trained, caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        ckpts = open_on(trained, True)
    assert ckpts.resume_point()[1] == 2
    ckpts.close()
    assert "data.raw_ids" not in caplog.text


@pytest.mark.slow
def test_partitions_that_do_not_divide_the_resumed_capacity_are_named_with_the_counts_that_do(trained):
    with pytest.raises(PreflightError) as e:
        build(config(trained, True, "model.tables.users.partitions=7"))
    assert str(e.value) == (
        f"model.tables.users.partitions=7 does not divide model.tables.users.capacity=120, which the checkpoint "
        f"{trained / '2'} holds and a resume keeps: set model.tables.users.partitions to a divisor of 120 that the "
        f"mesh's row shards divide (1, 2, 3, 4, ...), or leave it unset (the checkpoint's 1 where the mesh's row "
        f"shards divide it)")
    build(config(trained, True, "model.tables.users.partitions=4"))  # one that divides it: placed again


CHANGED = "resuming with settings that differ from the checkpoint's"


@pytest.mark.slow
def test_changed_settings_are_named_once_by_a_resume_and_not_by_one_then_refused(trained, caplog):
    """The warning names the settings a resume goes on with: a resume refused after its checkpoint was read (here a
    trainer.steps below the checkpoint's step, the very setting the warning would name) gives its error alone."""
    with caplog.at_level(logging.WARNING, logger="runner"), pytest.raises(PreflightError, match="is below step 2"):
        open_on(trained, True, "trainer.steps=1")
    assert caplog.text.count(CHANGED) == 0, caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="runner"):
        ckpts = open_on(trained, True, "trainer.steps=3")
    assert ckpts.resume_point()[1] == 2
    ckpts.close()
    assert caplog.text.count(CHANGED) == 1 and f"{CHANGED}: trainer.steps: 2 -> 3" in caplog.text, caplog.text


FOUND = ["resuming on them anyway (checkpoint.allow_data_change=true): those tables start over",
         "hash table 'users' was saved with 1 partitions and this run has 4: its ",
         "the best state saved beside it is not carried over: hash table(s) ['users'] were saved with other partitions"]


@pytest.mark.slow
def test_what_a_resume_finds_is_said_once_it_is_certain_by_process_0_alone(trained, caplog, monkeypatch):
    """What the restore finds (ids changed on purpose, a table placed again for other partitions, its best state
    left behind) is said with the resume, as its changed settings are: not by a resume refused after its checkpoint
    was read, and in a multi-process run (every process restores) by process 0 alone."""
    over = ["checkpoint.allow_data_change=true", "model.tables.users.partitions=4"]
    with caplog.at_level(logging.INFO, logger="runner"), pytest.raises(PreflightError, match="is below step 2"):
        open_on(trained, False, *over, "trainer.steps=1")
    assert not [f for f in FOUND if f in caplog.text], caplog.text

    caplog.clear()
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, logger="runner"):
        m.setattr(opening, "jax", SimpleNamespace(process_index=lambda: 1, process_count=lambda: 1))
        open_on(trained, False, *over).close()  # the resume as process 1 of a run sees it
    assert not [f for f in FOUND if f in caplog.text], caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="runner"):
        ckpts = open_on(trained, False, *over)
    assert ckpts.resume_point()[1] == 2
    ckpts.close()
    assert [caplog.text.count(f) for f in FOUND] == [1, 1, 1], caplog.text
