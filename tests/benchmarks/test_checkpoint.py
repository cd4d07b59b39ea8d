"""The checkpoint benchmark's saves on the 2x4 mesh (``benchmarks/checkpoint.py``): the runner's type handlers
and Orbax's default take turns on the same state, each save timed with its own peak, and both become rows."""
import numpy as np
import pytest

from benchmarks import checkpoint, common
from tests.runner.checkpoint.test_handlers import _state


@pytest.mark.slow
def test_mesh_saves_take_turns_and_report_a_row_each(tmp_path):
    state = _state(64, 8)
    saves = checkpoint._mesh_saves(state, tmp_path / "mesh", rounds=2)
    assert set(saves) == {"runner", "orbax_default"}
    for v in saves.values():  # the warm-up round is left out
        assert len(v["seconds"]) == len(v["blocking"]) == len(v["peak_above"]) == 2
        assert all(0 < b <= t for b, t in zip(v["blocking"], v["seconds"]))
        assert all(p is None or p >= 0 for p in v["peak_above"])
    assert not any((tmp_path / "mesh").iterdir())  # each save removed after it was timed
    nbytes = common.tree_bytes(state)
    rows = checkpoint._mesh_rows(saves, nbytes, nbytes / 1e9)
    assert [r[0] for r in rows] == ["save on the 2x4 mesh, one replica of each shard (the runner's)",
                                   "save on the 2x4 mesh, replica-parallel (Orbax's default)"]
    assert rows[0][3] == "1.00x the runner's"
    ratio = np.median(saves["orbax_default"]["seconds"]) / np.median(saves["runner"]["seconds"])
    assert rows[1][3] == f"{ratio:.2f}x the runner's"
    assert checkpoint._mesh_rows(None, nbytes, 1.0) == []  # a result without them (an older run) has no rows
