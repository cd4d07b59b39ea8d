"""Hash and modulo tables' settings: every bad value, and every combination they cannot run, stops before
anything compiles with one message naming the setting and the way out; a combination that runs but not as a user
may expect (a dense optax Adam's table-wide step count) is named in one warning line."""
import logging

import pytest

from runner import notices
from runner.app import run
from runner.build import build
from runner.errors import PreflightError
from tests.runner.support import compose_config

RAW = ["data.raw_ids=true", "model.tables.items.kind=modulo", "model.tables.items.vocab=401"]
HASH = [*RAW, "model.tables.users.kind=hash", "model.tables.users.capacity=100"]

CASES = [
    (["model.tables.users.capacity=0"], ["model.tables.users.capacity=0 is outside [1, 100000000]"]),
    (["model.tables.users.admit_after=0"], ["model.tables.users.admit_after=0 is outside [1,"]),
    (["model.tables.users.probes=0"], ["model.tables.users.probes=0 is outside [1, 1024]"]),
    (["model.tables.users.ttl=-1"], ["model.tables.users.ttl=-1 is outside [0,"]),
    (["model.tables.users.admit_window=-1"], ["model.tables.users.admit_window=-1 is outside [0,"]),
    (["model.tables.users.sketch_width=0"], ["model.tables.users.sketch_width=0 is outside [1, 67108864]"]),
    (["data.drift=-1"], ["data.drift=-1.0 is outside [0, 100000000]"]),
    (["data.drift=nan"], ["data.drift=nan is outside [0,"]),
    (["model.tables.users.capacity=null"], ["model.tables.users.kind=hash needs model.tables.users.capacity",
                                            "capacity=100000"]),
    (["model.tables.users.vocab=300"], ["model.tables.users.vocab=300 is for dense and modulo tables",
                                        "remove the vocab"]),
    (["model.tables.items.vocab=null"], ["model.tables.items.kind=modulo needs model.tables.items.vocab"]),
    (["model.tables.users.kind=dense"], ["table 'users' gets raw 64-bit ids from the data (data.raw_ids)",
                                         "kind=hash with a capacity", "kind=modulo with a vocab"]),
    (["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column", "trainer.batch_size=64"],
     ["table 'users' is a hash table, and hash tables are sharded by rows", "splits the tables by column",
      "mesh.table_layout=row"]),
    (["mesh=data_table", "mesh.axes={data:2,table:4}", "model.tables.users.partitions=2", "trainer.batch_size=64"],
     ["model.tables.users.partitions=2", "has 4 row shards, which must each hold whole partitions",
      "model.tables.users.partitions=4"]),
    (["model.tables.users.partitions=3"], ["model.tables.users.capacity=100 does not split into 3 equal partitions",
                                           "e.g. 102"]),
    (["model.tables.users.partitions=0"], ["model.tables.users.partitions=0 is outside [1, 4096]"]),
    (["async_emb.staleness=2"], ["async_emb.staleness=2 is not supported with hash tables",
                                 "async_emb.staleness=1 or async_emb=off"]),
    (["mesh.permute_ids=true"], ["mesh.permute_ids=true relabels a dense table's ids", "mesh.permute_ids=auto"]),
]


@pytest.mark.parametrize("over, words", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_hash_table_settings_are_refused_by_name(over, words):
    with pytest.raises(PreflightError) as e:
        build(compose_config([*HASH, *over]))
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("table", [["kind=hash", "capacity=100"], ["kind=hash"], ["kind=modulo"], ["kind=modulo",
                                                                                                 "vocab=101"]])
def test_the_sequential_model_refuses_hash_tables(table):
    """First, whatever else the table lacks: asking for its capacity or vocab first led to this refusal after the
    user gave it."""
    with pytest.raises(PreflightError) as e:
        build(compose_config(["debug=tiny_sequences", *(f"model.tables.items.{t}" for t in table)], tiny=False))
    assert str(e.value) == ("invalid config:\n  - model=sequential scores whole item catalogues by row, which tables of "
                            "kind hash or modulo (items) do not have; use kind=dense for its tables")


def test_hash_tables_on_the_data_ids_and_a_sharded_modulo_table_run():
    """kind=hash also takes the data's own integer ids, and a modulo table shards like a dense one."""
    program, _, _ = build(compose_config(["model.tables.users.kind=hash", "model.tables.users.capacity=50",
                                          "model.tables.items.kind=modulo", "model.tables.items.vocab=101"]))
    assert program.tables["users"].rows == 52 and program.tables["items"].rows == 101
    program, _, plan = build(compose_config(["model.tables.items.kind=modulo", "model.tables.items.vocab=101",
                                             "mesh=data_table", "mesh.axes={data:2,table:4}"]))
    assert plan.table_shards == 4 and program.tables["items"].rows == 104


@pytest.mark.parametrize("table, over, lookups, top", [
    ("users", ["model.tables.users.admit_window=1"], "32 times a step (trainer.batch_size=32 x 1 id an example)", 63),
    ("items", ["model.tables.items.kind=hash", "model.tables.items.capacity=400", "model.tables.items.vocab=null"],
     "160 times a step (trainer.batch_size=32 x 5 ids an example)", 31_999)])
def test_an_admit_after_no_id_can_reach_is_refused_with_the_bound(table, over, lookups, top):
    """The sketch counts at most the table's lookups a step and halves every admit_window steps, so no estimate
    exceeds 2 x admit_window x lookups - 1 (tests/runner/core/test_hash_tables.py checks the bound against the
    step): one more would never admit an id, and the table would train nothing."""
    build(compose_config([*HASH, *over, f"model.tables.{table}.admit_after={top}"]))  # the bound itself: reachable
    with pytest.raises(PreflightError) as e:
        build(compose_config([*HASH, *over, f"model.tables.{table}.admit_after={top + 1}"]))
    window = 1 if table == "users" else 100
    assert str(e.value) == (
        f"model.tables.{table}.admit_after={top + 1} can never be reached: table '{table}' is looked up at most "
        f"{lookups} and model.tables.{table}.admit_window={window} halves its admission counts every {window} steps, "
        f"so no id's estimate exceeds {top:,} and no id would ever get a slot (the table would train nothing): set "
        f"model.tables.{table}.admit_after to at most {top:,}, or raise model.tables.{table}.admit_window (0: counts "
        f"never fade)")


ADAM_COUNT = (
    "warning: hash table{s} {tables} {be} updated by Adam (plain optax over the whole table), which keeps its state's "
    "count for the whole table, not per row: a slot given to a new id resets its row and its per-row state but not "
    "that, so Adam bias-corrects the new id's row by the table's count, as a row trained since step 0: late in a run "
    "its first updates are up to 6.6x a fresh row's with the default b1 and b2 (docs/guide/hash_tables.md). The "
    "fused optimizers keep it per row: optimizer=async_adam counts each row's own updates (bias_correction=per_row, "
    "its default)")


@pytest.mark.parametrize("over, expected", [
    (["optimizer=adam"], [ADAM_COUNT.format(s="", tables="'users'", be="is")]),
    (["optimizer=adam", "model.tables.items.kind=hash", "model.tables.items.capacity=400",
      "model.tables.items.vocab=null"], [ADAM_COUNT.format(s="s", tables="'items', 'users'", be="are")]),
    (["optimizer=adagrad"], []),  # its state is all per row: a new id's row starts afresh
    (["optimizer=async_adam"], []),  # fused: per-row counts
    (["optimizer=adam", "model.tables.users.kind=modulo", "model.tables.users.vocab=101",
      "model.tables.users.capacity=null"], []),  # no slot is ever given to another id
], ids=["adam", "adam-two-tables", "adagrad", "async_adam", "adam-modulo"])
def test_a_dense_optax_adam_on_a_hash_table_is_warned_of_its_table_wide_count(over, expected):
    """Adam's step count is the table's in optax: a hash table's slot given to a new id resets the row and its
    moments, not the count (tests/runner/core/test_hash_step.py measures the first update it gives)."""
    program, _, _ = build(compose_config([*HASH, "async_emb=off", *over]))
    assert notices.hash_count_warnings(program.emb_optimizers, program.tables) == expected


@pytest.mark.slow
def test_the_run_prints_the_table_wide_count_warning_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="runner")
    run(compose_config([*HASH, "async_emb=off", "optimizer=adam", "trainer.steps=2"]), tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "runner"]
    assert [ln for ln in lines if "updated by Adam" in ln] == [ADAM_COUNT.format(s="", tables="'users'", be="is")]
