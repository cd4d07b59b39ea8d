"""The row layout's id routing as the runner uses it: its settings are checked before anything compiles, and
a batch with more ids for one shard than ``mesh.route_capacity`` allows routes the rest in further rounds of
its slots (the default, noted once) or, with ``mesh.route_overflow=stop``, stops the run with a message naming
the table and the setting; ids are never silently dropped. The column layout's exchange (each device's distinct
ids, up to ``mesh.route_capacity`` x the most one device held in the first batches) follows the same policy."""
from __future__ import annotations

import math

import numpy as np
import pytest

import optimizers
from optimizers import ranges
from runner.build import build
from runner.config import MeshConfig
from runner.core import loop
from runner.errors import PreflightError, TrainingError
from tests.runner.core.test_health import Recorder
from tests.runner.support import compose_config

ROW = ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"]


@pytest.mark.parametrize("value, needle", [("0", "mesh.route_capacity=0.0 is outside (0, 1024]"),
                                           ("-1", "mesh.route_capacity=-1.0 is outside (0, 1024]"),
                                           ("nan", "mesh.route_capacity=nan is outside (0, 1024]"),
                                           ("1025", "mesh.route_capacity=1025.0 is outside (0, 1024]")])
def test_route_capacity_outside_its_range_is_refused(value, needle):
    with pytest.raises(PreflightError) as e:
        build(compose_config([*ROW, f"mesh.route_capacity={value}"]))
    assert needle in str(e.value)


def test_the_runner_and_the_library_bound_route_capacity_alike():
    """``mesh.route_capacity``'s range is ``AsyncEmbContext``'s (``optimizers.context.ROUTE_CAPACITY_RANGE``): the
    preflight refuses, in the config's words, every value the context would, and lets through none it refuses."""
    assert ranges(MeshConfig)["route_capacity"] == optimizers.context.ROUTE_CAPACITY_RANGE


def test_unknown_routing_is_refused_when_composed():
    with pytest.raises(Exception) as e:
        compose_config([*ROW, "mesh.routing=ring"])
    text = f"{e.value} {e.value.__cause__}"
    assert "mesh.routing=ring" in text and "Invalid value 'ring', expected one of [alltoall, gather]" in text


def test_unknown_overflow_policy_is_refused_when_composed():
    with pytest.raises(Exception) as e:
        compose_config([*ROW, "mesh.route_overflow=drop"])
    text = f"{e.value} {e.value.__cause__}"
    assert "mesh.route_overflow=drop" in text and "Invalid value 'drop', expected one of [reroute, stop]" in text


def test_routing_is_the_row_layout_default():
    program, _, _ = build(compose_config(ROW))
    assert all(c.routed for c in program.contexts.values())
    program, _, _ = build(compose_config([*ROW, "mesh.routing=gather"]))
    assert not any(c.routed for c in program.contexts.values())


def overflowing(*extra):
    # 4,096 examples x 5 item tokens over 8 devices: 2,560 tokens each; Zipf ids crowd the first of 4 row shards,
    # far past the 64 slots a capacity of 0.1 gives.
    return compose_config([*ROW, "trainer.batch_size=4096", "mesh.route_capacity=0.1", "trainer.steps=3",
                           "trainer.log_interval=1", *extra])


def stopped_run(cfg) -> tuple[str, Recorder]:
    """Train ``cfg``, which must stop with a TrainingError: (its message, the metrics logged before it)."""
    program, task, _ = build(cfg)
    tracker = Recorder()
    with pytest.raises(TrainingError) as info:
        loop.train(program, task, cfg.trainer, tracker, log=lambda *a: None)
    return str(info.value), tracker


@pytest.mark.slow
def test_capacity_overflow_stops_the_run_naming_the_table_and_the_setting():
    text, tracker = stopped_run(overflowing("mesh.route_overflow=stop"))
    assert text.startswith("training stopped at step 1: table '")
    assert "had no slot at their owning table shard: mesh.route_capacity=0.1 gives 64 slots per device and shard" \
        in text
    assert "None was dropped silently" in text and "Raise mesh.route_capacity" in text
    assert "mesh.route_overflow=reroute" in text and "mesh.routing=gather" in text
    row = tracker.rows[0]
    name = text.split("'")[1]
    assert row[f"emb/route_overflow/{name}"] > 0 and row[f"emb/route_peak/{name}"] > 64


def assert_same_tables_without_overflow(got: dict, overrides: list[str]) -> None:
    """A rerouted run (``got``) learned the same tables as the run of ``overrides`` at the default capacity, in
    which no step overflows (summed in another order across slots and rounds: equal within 1e-6)."""
    cfg = compose_config(overrides)
    program, task, _ = build(cfg)
    assert program.contexts["items"].route_slots > 64
    tracker = Recorder()
    want = loop.train(program, task, cfg.trainer, tracker, log=lambda *a: None)
    assert all(r["emb/route_overflow/items"] == 0 for r in tracker.rows[:3])
    for n in program.tables:
        np.testing.assert_allclose(np.asarray(got["state"].tables[n]), np.asarray(want["state"].tables[n]),
                                   rtol=0, atol=1e-6)


@pytest.mark.slow
def test_overflowing_steps_are_rerouted_by_default_noted_once_and_learn_the_same_numbers():
    cfg = overflowing()
    program, task, _ = build(cfg)
    slots = {n: c.route_slots for n, c in program.contexts.items()}
    assert slots["items"] == 64 and all(c.reroutes for c in program.contexts.values())
    tracker, lines = Recorder(), []
    got = loop.train(program, task, cfg.trainer, tracker, log=lines.append)
    notes = [line for line in lines if line.startswith("note: table")]
    assert all(r["emb/route_overflow/items"] > 0 and r["emb/route_refused/items"] == 0 for r in tracker.rows[:3])
    assert len([n for n in notes if "'items'" in n]) == 1  # once a run, not once a step
    assert "the step routed them in further rounds of its slots, so nothing was lost" in notes[0]
    assert "raise mesh.route_capacity" in notes[0]
    # The same run with room to spare (the default capacity, sized from the first 8 batches: no step overflows).
    assert_same_tables_without_overflow(got, [*ROW, "trainer.batch_size=4096", "trainer.steps=3",
                                              "trainer.log_interval=1"])


def test_a_refused_update_after_rerouting_names_the_table_the_owner_buffer_and_the_setting():
    """The message ``check_health`` raises when an owner had more rows than its buffer even after rerouting
    (``emb/route_refused/<table>`` > 0; the update itself is tested in tests/optimizers/test_routing.py)."""
    program, _, _ = build(compose_config(ROW))
    ctx = program.contexts["items"]
    text = loop.route_overflow_message(program, "items", overflow=40, refused=7, peak=10**6, where="step 3")
    assert text.startswith("training stopped at step 3: table 'items': 7 rows had no room at their owning table "
                           "shard even after the step routed every id in further rounds of its slots")
    assert f"an owner keeps at most {ctx.owner_unique - 1} distinct rows" in text
    assert f"mesh.route_capacity={ctx.route_capacity:g} gives {ctx.route_slots} slots per device and shard" in text
    assert "The update was refused whole: nothing of it was written." in text
    assert "Raise mesh.route_capacity" in text and "mesh.routing=gather" in text


COLUMN = ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column", "trainer.batch_size=512",
          "trainer.steps=3", "trainer.log_interval=1"]


@pytest.mark.slow
def test_a_column_table_with_a_tiny_capacity_reroutes_notes_it_once_and_learns_the_same_numbers():
    """Column layout: each device exchanges at most C of its distinct ids (C = route_capacity x the most one
    device held in the first batches, never below 64). 512 examples x 5 item tokens over 8 devices hold ~107
    distinct items each, past the 64 a capacity of 0.1 gives: every step exchanges every whole buffer instead."""
    cfg = compose_config([*COLUMN, "mesh.route_capacity=0.1"])
    program, task, _ = build(cfg)
    ctx = program.contexts["items"]
    assert ctx.table_layout == "column" and ctx.route_peak > 64 and ctx.route_slots == 64 and ctx.column_capped
    tracker, lines = Recorder(), []
    got = loop.train(program, task, cfg.trainer, tracker, log=lines.append)
    assert all(r["emb/route_overflow/items"] > 0 and r["emb/route_refused/items"] == 0 for r in tracker.rows[:3])
    assert all(r["emb/route_peak/items"] > 64 for r in tracker.rows[:3])
    notes = [line for line in lines if line.startswith("note: table 'items'")]
    assert len(notes) == 1  # once a run, not once a step
    assert "were past what their device exchanges with the other column shards" in notes[0]
    assert "mesh.route_capacity=0.1 lets each device exchange 64 distinct ids" in notes[0]
    assert "exchanged every device's whole buffer of ids instead, so nothing was lost" in notes[0]
    # The same run at the default capacity (1.2 x the sampled peak): no step overflows.
    assert_same_tables_without_overflow(got, COLUMN)


@pytest.mark.slow
def test_a_column_table_past_its_exchange_stops_the_run_when_the_policy_is_stop():
    text, tracker = stopped_run(compose_config([*COLUMN, "mesh.route_capacity=0.1", "mesh.route_overflow=stop"]))
    assert text.startswith("training stopped at step 1: table 'items': ")
    assert ("distinct ids of the batch (summed over devices) were past what their device exchanges with the other "
            "column shards: mesh.route_capacity=0.1 lets each device exchange 64 distinct ids") in text
    assert "None was dropped silently" in text and "Raise mesh.route_capacity" in text
    assert "mesh.route_overflow=reroute" in text and "mesh.routing=gather" not in text
    assert tracker.rows[0]["emb/route_overflow/items"] > 0 and tracker.rows[0]["emb/route_peak/items"] > 64


@pytest.mark.slow
def test_route_peaks_of_a_column_table_is_the_most_distinct_ids_one_device_held_in_the_first_batches():
    from runner.config import ROUTE_SAMPLE_BATCHES

    cfg = compose_config(COLUMN)
    program, task, _ = build(cfg)
    B = cfg.trainer.batch_size
    for name, ctx in program.contexts.items():
        want = 0
        for step in range(ROUTE_SAMPLE_BATCHES):
            ids = np.asarray(program.model.table_ids({k: np.asarray(v) for k, v in task.batch(step, B).items()})[name])
            for block in np.split(ids.reshape(B, -1), 8):  # the batch split over the 8 devices
                want = max(want, len(set(block.ravel().tolist()) & set(range(ctx.stored_rows))))
        assert ctx.route_peak == want, name
        # 1.2 x it, at least 64, at most a device's tokens or the table's rows (authors: 51)
        assert ctx.route_slots == min(max(math.ceil(1.2 * want), 64), ctx.local_tokens, ctx.stored_rows), name
