"""Table stacking (``model.stack_tables``): the plan (which tables share a physical table, and where each
member's ids live), and a stacked run against the same run with every table on its own: the same initial
rows bit for bit, the same losses and trained rows up to float rounding (a sum or a fused rule compiled for
other shapes may round its last bit otherwise); an out-of-range id of one member reads zeros,
counts under its own name and touches no neighbour; a resume across a change of stacking is refused."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optimizers
from runner.build import build
from runner.core import stacking
from runner.core.embeddings import TableSpec
from runner.errors import PreflightError
from tests.runner.support import compose_config, run_steps


def spec(name, vocab, width=8, tokens=1, **kw):
    return TableSpec(name, vocab, width, tokens, rows=vocab, **kw)


def test_the_plan_stacks_tables_that_share_width_dtype_and_optimizer_only():
    adam, sgd = optimizers.create("async_adam"), optimizers.create("async_sgd")
    specs = {"a": spec("a", 10), "b": spec("b", 5, tokens=3), "c": spec("c", 7, width=4), "d": spec("d", 4),
             "e": spec("e", 6), "h": spec("h", 9, kind="hash")}
    opts = {"a": adam, "b": optimizers.create("async_adam"), "c": adam, "d": sgd, "e": adam, "h": adam}
    plan, physical, popts = stacking.plan(specs, opts, shards=4)
    # a, b and e: width 8 and an equal Adam (b's is another object with the same settings); c is narrower, d has
    # SGD, h is a hash table: each alone, under its own name
    assert plan.stacks == {"stack0": ("a", "b", "e")}
    assert sorted(physical) == ["c", "d", "h", "stack0"] and physical["c"] is specs["c"]
    s = physical["stack0"]
    assert (s.vocab, s.rows, s.tokens_per_example, s.bases) == (1 + 9 + 4 + 5, 20, 5, (1, 10, 14))
    assert popts["stack0"] == adam and popts["d"] is sgd
    assert [plan.stack_of(n) for n in "abcdeh"] == ["stack0", "stack0", "c", "d", "stack0", "h"]


def test_member_ids_land_in_their_own_rows_and_bad_ids_nowhere():
    specs = {"a": spec("a", 10), "b": spec("b", 5, tokens=3)}
    plan, _, _ = stacking.plan(specs, dict.fromkeys(specs, optimizers.create("async_sgd")))
    a = np.array([[0], [1], [9], [12]])
    b = np.array([[1, 4, 0], [0, 0, 0], [2, 3, 5], [4, -1, 1]])
    bad = {"a": (a < 0) | (a >= 10), "b": (b < 0) | (b >= 5)}
    got = plan.physical_ids({"a": a, "b": b}, bad)["stack0"]
    want = [[0, 10, 13, 0], [1, 0, 0, 0], [9, 11, 12, -1], [-1, 13, -1, 10]]  # a's i -> i; b's i -> 9 + i; 0 -> 0
    np.testing.assert_array_equal(got, want)
    rows = jnp.arange(4 * 4 * 2, dtype=jnp.float32).reshape(4, 4, 2)
    out = plan.logical_rows({"stack0": rows}, {"a": a.shape, "b": b.shape})
    np.testing.assert_array_equal(out["a"], rows[:, :1])
    np.testing.assert_array_equal(out["b"], rows[:, 1:])


def test_a_table_named_like_a_stack_is_refused():
    specs = {"stack0": spec("stack0", 4), "x": spec("x", 4), "y": spec("y", 4)}
    with pytest.raises(ValueError, match="a table is named 'stack0', the name a stack of tables gets"):
        stacking.plan(specs, dict.fromkeys(specs, optimizers.create("async_sgd")))


RUN = ["trainer.steps=5", "trainer.log_interval=1"]


@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.slow
def test_a_stacked_run_trains_exactly_as_its_tables_apart(mode):
    """The ranking model's three tables (users, items, authors: vocabs 301, 501, 51, width 8) stacked into one
    and kept apart: the same initial rows (bit for bit), losses and final rows and optimizer state of every
    table (to float rounding: 1e-6 relative, or of the largest value where a sum cancels)."""
    runs = {}
    for stack in (True, False):
        cfg = compose_config([*RUN, f"async_emb={mode}", f"model.stack_tables={str(stack).lower()}"])
        program, task, _ = build(cfg)
        assert bool(program.stacking.stacks) == stack
        state0, state, losses, metrics = run_steps(program, task, 5)
        runs[stack] = (program, state0, state, losses, metrics)
    (p1, s01, s1, l1, m1), (_, s00, s0, l0, m0) = runs[True], runs[False]
    assert p1.stacking.stacks == {"stack0": ("authors", "items", "users")} and sorted(p1.tables) == ["stack0"]
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for n in ("users", "items", "authors"):
        first = np.asarray(p1.table_of(jax.tree.map(jnp.asarray, s01), n))
        np.testing.assert_array_equal(first, np.asarray(s00.tables[n]), err_msg=n)
        np.testing.assert_allclose(np.asarray(p1.table_of(s1, n)), np.asarray(s0.tables[n]), rtol=1e-6, atol=1e-9,
                                   err_msg=n)
        m = p1.stacking.members[n]  # the per-row optimizer state (Adam's moments) of its rows, too
        for stacked, apart in zip(jax.tree.leaves(s1.emb_states["stack0"].rows), jax.tree.leaves(s0.emb_states[n].rows)):
            rows = np.asarray(stacked)[m.base:m.base + m.vocab - 1]
            want = np.asarray(apart)[1:m.vocab]  # a sum with cancellation may lose more bits: its scale, then
            np.testing.assert_allclose(rows, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(), err_msg=n)
    # the stack's norm is its members' together
    for a, b in zip(m1, m0):
        want = np.sqrt(sum(float(b[f"emb/grad_norm/{n}"]) ** 2 for n in ("users", "items", "authors")))
        assert float(a["emb/grad_norm/stack0"]) == pytest.approx(want, rel=1e-5)


def test_an_out_of_range_id_of_a_member_counts_under_its_name_and_reads_zeros():
    program, task, _ = build(compose_config(["model.stack_tables=true"]))
    batch = task.batch(0, 32)
    raw = {n: np.asarray(x) for n, x in program.model.table_ids(batch).items()}
    raw["authors"] = raw["authors"].copy()
    raw["authors"][0, 0] = 51  # authors has ids [0, 51): 51 would be the first row of the next member (items)
    ids, bad = program.table_ids(batch, raw_ids={n: jnp.asarray(x) for n, x in raw.items()})
    assert int(bad["authors"].sum()) == 1 and int(bad["items"].sum()) == int(bad["users"].sum()) == 0
    flat = np.asarray(ids["stack0"]).reshape(32, -1)
    assert flat[0, 0] == program.contexts["stack0"].stored_rows  # out of range: reads zeros, updates nothing


@pytest.mark.slow
def test_a_resume_with_other_stacking_is_refused(tmp_path):
    from runner.app import run

    base = [*RUN, "checkpoint.interval=5", f"checkpoint.dir={tmp_path / 'ck'}"]
    run(compose_config([*base, "model.stack_tables=true"]), tmp_path / "a")
    with pytest.raises(PreflightError, match=r"tables: the checkpoint has \['stack0'\], this config has \['authors', "
                                             r"'items', 'users'\] \(the checkpoint's tables were stacked: "
                                             r"model.stack_tables=true builds them as it has them\)"):
        run(compose_config([*base, "model.stack_tables=false", "trainer.steps=10"]), tmp_path / "b")
    # other tables altogether (another model's checkpoint): stacking would not make them match, so no hint
    from runner.checkpoint.meta import check_compatible

    meta = json.loads((tmp_path / "ck" / "5" / "meta" / "metadata").read_text())
    meta["tables"]["stack0"]["members"] = ["cat_0", "cat_1", "cat_2"]
    program, _, _ = build(compose_config([*RUN, "model.stack_tables=false"]))
    with pytest.raises(PreflightError) as e:
        check_compatible(meta, program, "ck/5")
    assert "tables: the checkpoint has ['stack0'], this config has ['authors', 'items', 'users']\n" in str(e.value)
    assert "stack_tables" not in str(e.value)


def test_stacked_bfloat16_rows_keep_their_dtype():
    program, _, _ = build(compose_config(["model.stack_tables=true", "model.tables.items.dtype=bfloat16"]))
    # items alone (its dtype differs); users and authors stacked
    assert program.stacking.stacks == {"stack0": ("authors", "users")}
    assert program.tables["items"].dtype == "bfloat16" and program.tables["stack0"].dtype == "float32"
    assert dataclasses.replace(program.tables["stack0"], bases=()).vocab == 51 + 301 - 1
