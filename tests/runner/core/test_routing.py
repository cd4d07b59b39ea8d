"""The row layout's id routing as the runner uses it: its settings are checked before anything compiles, and
a batch with more ids for one shard than ``mesh.route_capacity`` allows stops the run with a message naming
the table and the setting (never silently dropped ids)."""
from __future__ import annotations

import pytest

from runner.build import build
from runner.core import loop
from runner.preflight import PreflightError, TrainingError
from tests.runner.core.test_health import Recorder
from tests.runner.support import compose_config

ROW = ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"]


@pytest.mark.parametrize("value, needle", [("0", "mesh.route_capacity=0.0 is outside (0, 1024]"),
                                           ("-1", "mesh.route_capacity=-1.0 is outside (0, 1024]"),
                                           ("nan", "mesh.route_capacity=nan is outside (0, 1024]")])
def test_route_capacity_outside_its_range_is_refused(value, needle):
    with pytest.raises(PreflightError) as e:
        build(compose_config([*ROW, f"mesh.route_capacity={value}"]))
    assert needle in str(e.value)


def test_unknown_routing_is_refused_when_composed():
    with pytest.raises(Exception) as e:
        compose_config([*ROW, "mesh.routing=ring"])
    text = f"{e.value} {e.value.__cause__}"
    assert "mesh.routing=ring" in text and "Invalid value 'ring', expected one of [alltoall, gather]" in text


def test_routing_is_the_row_layout_default():
    program, _, _ = build(compose_config(ROW))
    assert all(c.routed for c in program.contexts.values())
    program, _, _ = build(compose_config([*ROW, "mesh.routing=gather"]))
    assert not any(c.routed for c in program.contexts.values())


@pytest.mark.slow
def test_capacity_overflow_stops_the_run_naming_the_table_and_the_setting():
    # 4,096 examples x 5 item tokens over 8 devices: 2,560 tokens each; Zipf ids crowd the first of 4 row shards,
    # far past the 64 slots a capacity of 0.1 gives.
    cfg = compose_config([*ROW, "trainer.batch_size=4096", "mesh.route_capacity=0.1", "trainer.steps=3",
                          "trainer.log_interval=1"])
    program, task, _ = build(cfg)
    tracker = Recorder()
    with pytest.raises(TrainingError) as info:
        loop.train(program, task, cfg.trainer, tracker, log=lambda *a: None)
    text = str(info.value)
    assert text.startswith("training stopped at step 1: table '")
    assert "had no slot at their owning table shard: mesh.route_capacity=0.1 gives 64 slots per device and shard" \
        in text
    assert "None was dropped silently" in text and "Raise mesh.route_capacity" in text
    assert "mesh.routing=gather" in text
    row = tracker.rows[0]
    name = text.split("'")[1]
    assert row[f"emb/route_overflow/{name}"] > 0 and row[f"emb/route_peak/{name}"] > 64
