"""The train loop's feed (``runner/core/feed.py``): the batches of steps [start, stop) in order, exactly
``task.batch(step)``'s, read ahead by a thread or by worker processes; a run with workers trains exactly as one
without; the setting's range is checked by name."""
import json

import numpy as np
import pytest

from runner.build import build
from runner.core.feed import Feed
from runner.errors import PreflightError
from runner.preflight import check_config
from tests.runner.support import compose_config


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_feed_gives_each_steps_batch_in_order(workers):
    _, task, _ = build(compose_config())
    rows = {"shard": 1, "num_shards": 2}  # this process's half of every global batch
    with Feed(task, 3, 9, 32, rows, workers=workers) as feed:
        got = list(feed)
    assert len(got) == 6
    for step, b in zip(range(3, 9), got):
        same(b, task.batch(step, 32, **rows))


def test_a_feed_closed_early_stops_reading_and_an_empty_range_yields_nothing():
    _, task, _ = build(compose_config())
    feed = Feed(task, 0, 1000, 32)
    same(next(feed), task.batch(0, 32))
    feed.close()
    feed.close()  # twice is fine
    assert list(Feed(task, 5, 5, 32)) == []


def rows(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_fed_by_worker_processes_trains_exactly_as_one_fed_by_a_thread(tmp_path):
    from runner.app import run

    for w in (0, 2):
        run(compose_config(["trainer.log_interval=1", f"trainer.data_workers={w}"]), tmp_path / f"w{w}")
    assert rows(tmp_path / "w2") == rows(tmp_path / "w0")


@pytest.mark.parametrize("bad", [-1, 65])
def test_data_workers_out_of_range_is_refused_by_name(bad):
    with pytest.raises(PreflightError, match=rf"trainer.data_workers={bad} is outside \[0, 64\]"):
        check_config(compose_config([f"trainer.data_workers={bad}"]))
