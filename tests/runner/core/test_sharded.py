"""Sharded training on 8 CPU devices equals the single-device run: tables, optimizer state and losses,
for data parallel and data x table meshes (2x4, 4x2), row and column layouts, sync and async, every fused
optimizer."""
import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from optimizers import FUSED
from runner.build import build
from tests.runner.support import compose_config
from tests.runner.support import id_rows, run_steps

STEPS = 4
MESHES = {
    "data8": ["mesh=data"],
    "2x4-row": ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"],
    "4x2-row": ["mesh=data_table", "mesh.axes={data:4,table:2}", "mesh.table_layout=row"],
    "2x4-column": ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column"],
    "4x2-column": ["mesh=data_table", "mesh.axes={data:4,table:2}", "mesh.table_layout=column"],
}
EXPECTED_SPEC = {"data8": P(), "2x4-row": P("table", None), "4x2-row": P("table", None),
                 "2x4-column": P(None, "table"), "4x2-column": P(None, "table")}


def optimizer_overrides(optimizers) -> list[str]:
    """``(default, "table=name", ...)`` as overrides: the default optimizer and per-table ones."""
    default, *per_table = optimizers if isinstance(optimizers, tuple) else (optimizers,)
    return [f"optimizer={default}"] + [f"+optimizer@table_optimizers.{t}={o}" for t, o in
                                        (p.split("=") for p in per_table)]


@functools.lru_cache(maxsize=None)
def single_device(optimizer, mode: str):
    program, data, _ = build(compose_config([*optimizer_overrides(optimizer), f"async_emb={mode}", "mesh=single"]))
    return run_steps(program, data, STEPS)


def assert_same_run(optimizer, mode, mesh):
    program, data, plan = build(compose_config([*optimizer_overrides(optimizer), f"async_emb={mode}", *MESHES[mesh]]))
    assert plan.num_devices == 8
    _, state, losses, metrics = run_steps(program, data, STEPS)
    _, ref, ref_losses, _ = single_device(optimizer, mode)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, table in state.tables.items():
        assert table.sharding.spec == EXPECTED_SPEC[mesh], (name, table.sharding.spec)
        spec = program.tables[name]  # row layout: ids permuted (mesh.permute_ids=auto), compared in id order
        assert spec.permute_ids == mesh.endswith("-row"), name
        got, want = np.asarray(table), np.asarray(ref.tables[name])
        np.testing.assert_allclose(id_rows(spec, got), want[:spec.vocab], rtol=1e-5, atol=1e-7)
        assert not got[spec.vocab:].any()  # padded rows stay zero
        jax.tree.map(lambda a, b: np.testing.assert_allclose(id_rows(spec, a) if np.ndim(a) else a,
                                                             np.asarray(b)[:spec.vocab] if np.ndim(b) else b,
                                                             rtol=1e-5, atol=1e-7),
                     state.emb_states[name], ref.emb_states[name])
    return metrics


# Every mesh runs once and every layout in both modes, with the fused optimizers spread over them (a run's default
# optimizer, and per-table ones: the ranking model's tables are users, items and authors), so that every optimizer
# trains a table-sharded run through the whole train step (routed by default on the row layout) and every layout
# runs sync and async (the kernels are the same in both modes). Every optimizer on every layout, in both modes, is
# the optimizers' own contract (tests/optimizers/test_sharded.py, in make test-fast too).
OPTIMIZER = {("data8", "on"): "async_adam",
             ("2x4-row", "on"): ("async_adam", "users=async_ftrl", "authors=async_partial_rowwise_adam"),
             ("4x2-row", "off"): ("async_rowwise_adagrad", "users=async_rowwise_adagrad_momentum"),
             ("4x2-column", "on"): ("async_adagrad", "authors=async_ftrl"),
             ("2x4-column", "off"): ("async_sgd", "users=async_partial_rowwise_adam")}


def used(optimizers) -> set[str]:
    default, *per_table = optimizers if isinstance(optimizers, tuple) else (optimizers,)
    return {default} | {p.split("=")[1] for p in per_table}


def test_every_fused_optimizer_trains_on_a_table_sharded_layout_and_every_layout_in_both_modes():
    sharded = set().union(*(used(o) for (m, _), o in OPTIMIZER.items() if "-" in m))
    assert sharded == set(FUSED), set(FUSED) - sharded
    assert {(m.split("-")[1], a) for m, a in OPTIMIZER if "-" in m} == {(layout, a) for layout in ("row", "column")
                                                                        for a in ("on", "off")}
    assert {m for m, _ in OPTIMIZER} == set(MESHES)


# make test-fast runs none of these whole-run comparisons: its sharded == one device checks are the optimizers'
# contract on every layout (tests/optimizers/test_sharded.py); its sharded runs are the exact and the resharded
# resume (tests/runner/checkpoint/test_resume.py). These run in make test.
@pytest.mark.slow
@pytest.mark.parametrize("mesh, mode", list(OPTIMIZER))
def test_mesh_matches_single_device(mesh, mode):
    metrics = assert_same_run(OPTIMIZER[mesh, mode], mode, mesh)
    if mesh != "data8":  # load balance is visible per shard
        m = metrics[-1]
        assert m["emb/shard_rows_max/items"] >= m["emb/shard_rows_mean/items"] > 0


# The plain optax baseline (sync only) through the whole train step on the routed row layout, whose step hands the
# optimizer per-device update records (the column layout's are the same kind; every layout, the gather row layout
# included, is tests/optimizers/test_sharded.py's dense case). Tolerances as above: rtol 1e-5.
@pytest.mark.slow
def test_dense_baseline_on_a_routed_row_table_matches_single_device():
    assert_same_run("adam", "off", "2x4-row")
