"""The 1B-row plan's code (``benchmarks/plan.py``) compiles the real train step for abstract inputs: here a
scaled-down table on the 8 test devices, nothing allocated, with figures that add up."""
import pytest

from benchmarks.plan import plan


@pytest.mark.slow
def test_scaled_down_plan_compiles_and_reports_memory_and_collectives():
    rows, width = 10**6, 8
    r = plan(rows, width, batch=64)
    assert (r["devices"], r["table_shards"], r["rows"]) == (8, 8, rows)
    assert r["table_bytes"] == rows * width * 4
    # Adam: m and v per element, a per-row step count (int32) and the update count
    assert r["optimizer_state_bytes"] == 2 * rows * width * 4 + rows * 4 + 4
    pd = r["per_device"]
    # Every device holds its eighth of the table and of the Adam state (donated: aliased, not copied).
    assert pd["argument"] >= (r["table_bytes"] + r["optimizer_state_bytes"]) / 8
    assert pd["alias"] >= (r["table_bytes"] + r["optimizer_state_bytes"]) / 8 * 0.99
    assert pd["peak"] < 1.5 * pd["argument"]
    assert r["collective_bytes"]["all-to-all"] > 0 and r["collective_bytes"]["total"] < pd["argument"]
