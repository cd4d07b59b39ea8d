"""``model.tables.<name>.stored_width``: tables stored wider than their rows (lane padding, for a TPU) train as
the narrow ones. The ranking model's tables (width 8) stored 13 wide against the same run unpadded: the same
initial rows (bit for bit) with zero padding columns, the same losses and trained rows (to float rounding: XLA
vectorizes the two widths differently), stacked or not, sync or async, dense or hash tables; bad values and a
resume with another stored width are refused by their messages."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.build import build
from runner.errors import PreflightError
from tests.runner.core.test_hash_step import HASHED
from tests.runner.support import batch_size, compose_config, run_steps, seq_config, to_device

RUN = ["trainer.steps=5", "trainer.log_interval=1"]
PAD = [f"model.tables.{n}.stored_width=13" for n in ("users", "items", "authors")]
WIDTH = 8


def train(overrides):
    program, task, _ = build(compose_config([*RUN, *overrides]))
    state0, state, losses, _ = run_steps(program, task, 5)
    return program, state0, state, losses, task


def scores(program, state, task):
    """The model's predictions for a batch (evaluation's path: lookups, and whole tables for a catalogue)."""
    return np.asarray(jax.jit(program.predict)(state, to_device(program, task.batch(7, batch_size(program)))))


@pytest.mark.parametrize("extra", [
    pytest.param(["async_emb=on"], id="async"),
    pytest.param(["async_emb=off", "model.stack_tables=true"], id="sync-stacked"),
    # hash tables beside a dense one, in 4 partitions each (as on a mesh of 4 row shards, whose program trains as
    # this one-device program does: test_hash_step.py)
    pytest.param(["async_emb=on", *HASHED, "model.tables.items.capacity=152", "model.tables.items.partitions=4",
                  "model.tables.users.partitions=4"], id="async-hash-4-partitions", marks=pytest.mark.slow),
])
@pytest.mark.slow
def test_a_padded_run_trains_as_the_narrow_one(extra):
    program, s00, s0, l0, task = train(extra)
    padded, s01, s1, l1, _ = train([*extra, *PAD])
    assert all(padded.tables[n].columns == 13 and padded.contexts[n].stored_width == 13 for n in padded.tables)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    close = dict(rtol=1e-6, atol=1e-7)
    for n in program.tables:
        first, trained = np.asarray(s01.tables[n]), np.asarray(s1.tables[n])
        assert first.shape[1] == trained.shape[1] == 13
        np.testing.assert_array_equal(first[:, :WIDTH], np.asarray(s00.tables[n]), err_msg=n)
        np.testing.assert_allclose(trained[:, :WIDTH], np.asarray(s0.tables[n]), **close, err_msg=n)
        assert not first[:, WIDTH:].any() and not trained[:, WIDTH:].any(), f"{n}: a padding column is not zero"
        for a, b in zip(jax.tree.leaves(s1.emb_states[n].rows), jax.tree.leaves(s0.emb_states[n].rows)):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_allclose(a[:, :WIDTH] if a.ndim == 2 else a, b, **close, err_msg=n)
    np.testing.assert_allclose(scores(padded, s1, task), scores(program, s0, task), rtol=1e-5, atol=1e-6)
    for n in program.stacking.members:  # a table read whole (export), out of its stack
        np.testing.assert_allclose(np.asarray(padded.table_of(s1, n)), np.asarray(program.table_of(s0, n)), **close)


@pytest.mark.slow
def test_the_sequential_model_scores_a_padded_catalogue_as_the_narrow_one():
    """Its evaluation scores every item against the whole table: the padding columns must not reach it."""
    runs = {}
    for extra in ([], ["model.tables.items.stored_width=40"]):
        program, task, _ = build(seq_config("trainer.steps=3", *extra))
        state0, state, _, _ = run_steps(program, task, 3)
        runs[bool(extra)] = (program, state0, state, task)
    (p0, s00, s0, task), (p1, s01, s1, _) = runs[False], runs[True]
    width = p0.tables["items"].width
    assert np.asarray(s01.tables["items"]).shape[1] == 40
    np.testing.assert_array_equal(np.asarray(s01.tables["items"])[:, :width], np.asarray(s00.tables["items"]))
    np.testing.assert_allclose(scores(p1, s1, task), scores(p0, s0, task), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides, needle", [
    (["model.tables.users.stored_width=4"],
     "model.tables.users.stored_width=4 is narrower than the table's width 8: set it to at least 8 (e.g. 128, "
     "the TPU's lanes), or null"),
    (["model.tables.users.stored_width=0"], "model.tables.users.stored_width=0 is outside [1, 65536]"),
    (["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=column",
      "model.tables.items.stored_width=16"],
     "table 'items': model.tables.items.stored_width=16 pads its 8-wide rows, which the column layout splits over "
     "its shards; drop the stored_width or use mesh.table_layout=row"),
])
def test_bad_stored_width_is_refused(overrides, needle):
    with pytest.raises(PreflightError) as e:
        build(compose_config(overrides))
    assert needle in str(e.value)


def test_a_stored_width_equal_to_the_width_is_no_padding():
    program, _, _ = build(compose_config(["model.tables.users.stored_width=8"]))
    assert program.tables["users"].columns == 8 and not program.contexts["users"].padded


@pytest.mark.slow
@pytest.mark.parametrize("first, then", [(16, None), (None, 16)], ids=["padded-then-not", "not-then-padded"])
def test_a_checkpoint_resumes_at_another_stored_width(tmp_path, first, then):
    """The padding is the layout, not the model: a checkpoint saved with one stored width resumes at another (the
    padding columns cut off or added as zeros; the digests cover the table's own columns) and the run goes on as
    one whose both halves ran at the new width (to float rounding)."""
    from runner.app import run

    def widths(s):
        return [f"model.tables.{n}.stored_width={s}" for n in ("users", "items")] if s else []

    import json

    def two_runs(ck, before, after, out):  # 5 steps and a checkpoint, then a resume to step 10
        base = [*RUN, "checkpoint.interval=5", f"checkpoint.dir={tmp_path / ck}"]
        run(compose_config([*base, *widths(before)]), tmp_path / f"{out}1")
        run(compose_config([*base, *widths(after), "trainer.steps=10"]), tmp_path / f"{out}2")
        return [json.loads(x) for x in (tmp_path / f"{out}2" / "metrics.jsonl").read_text().splitlines()]

    resumed = two_runs("ck", first, then, "a")
    whole = two_runs("ck_same", then, then, "b")  # the same two runs, both at the new stored width
    loss = lambda rows: {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}  # noqa: E731
    got, want = loss(resumed), loss(whole)
    assert set(range(6, 11)) <= set(got) and all(got[k] == pytest.approx(want[k], rel=1e-5) for k in range(6, 11))


@pytest.mark.slow
def test_a_slot_given_to_a_new_id_gets_a_fresh_row_and_zero_padding():
    """``reset_rows`` on a table stored wider than its rows: the new id's fresh row in its own columns, zeros
    past them (the update that follows writes zeros there too, but a row evicted before its update keeps them)."""
    from runner.core import hash_rows as hr, hash_tables as ht

    spec = ht.HashSpec(capacity=40)
    rng = np.random.default_rng(5)
    keys = ht.fingerprint(rng.integers(1, 2**62, 6, dtype=np.int64))
    fresh = np.array([3, spec.capacity, 17, 5, spec.capacity, 30], np.int32)
    got = ht.Assigned(jnp.zeros(6, jnp.int32), jnp.asarray(fresh), jnp.asarray(keys), 0, 0, 0)
    table = np.full((spec.rows, 13), 9.0, np.float32)
    seed = jnp.asarray([3, 9], jnp.uint32)
    t, _ = jax.jit(lambda t: hr.reset_rows(spec, t, {}, {}, got, seed, 0.1, width=WIDTH))(table)
    rows = np.asarray(hr.slot_rows(spec, jnp.asarray(fresh[fresh < spec.capacity])))
    want = np.asarray(hr.fresh_rows(spec, seed, jnp.asarray(keys[fresh < spec.capacity]), WIDTH, 0.1))
    np.testing.assert_allclose(np.asarray(t)[rows, :WIDTH], want, rtol=1e-6, atol=1e-7)
    assert not np.asarray(t)[rows, WIDTH:].any()
    assert (np.delete(np.asarray(t), rows, axis=0) == 9.0).all()


@pytest.mark.slow
def test_a_checkpoint_from_before_the_setting_resumes(tmp_path):
    """A checkpoint whose record has no stored_width (written before the setting) holds unpadded tables: a config
    without padding resumes it, and so does one with padding."""
    import json

    from runner.app import run

    base = [*RUN, "checkpoint.interval=5", f"checkpoint.dir={tmp_path / 'ck'}"]
    run(compose_config(base), tmp_path / "a")
    record = tmp_path / "ck" / "5" / "meta" / "metadata"
    meta = json.loads(record.read_text())
    for t in meta["tables"].values():
        del t["stored_width"]
    record.write_text(json.dumps(meta))
    run(compose_config([*base, "trainer.steps=10", "model.tables.users.stored_width=16"]), tmp_path / "b")
    assert (tmp_path / "ck" / "10").is_dir()


@pytest.mark.parametrize("width, backend, splits, want", [
    (64, "tpu", False, 128), (96, "tpu", False, 128), (192, "tpu", False, 256), (200, "tpu", False, 256),
    (128, "tpu", False, None), (256, "tpu", False, None), (48, "tpu", False, None), (16, "tpu", False, None),
    (64, "tpu", True, None), (64, "cpu", False, None), (64, "gpu", False, None),
])
def test_the_default_pads_on_a_tpu_only_widths_it_copies(width, backend, splits, want):
    from runner.core.embeddings import auto_stored_width

    assert auto_stored_width(width, backend, splits) == want


def test_a_run_on_a_tpu_pads_its_tables_unless_told_not_to(monkeypatch, caplog):
    """stored_width=null on a TPU backend (faked: the tables are built on the CPU) pads the 64-wide tables to 128
    and says so; a stored_width set to the width keeps a table narrow; on the CPU nothing is padded."""
    import logging

    cfg = ["model.emb_width=64", "model.tables.authors.stored_width=64"]
    program, _, _ = build(compose_config(cfg))
    assert {n: s.columns for n, s in program.tables.items()} == {"users": 64, "items": 64, "authors": 64}
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with caplog.at_level(logging.INFO, logger="runner"):
        program, _, _ = build(compose_config(cfg))
    assert {n: s.columns for n, s in program.tables.items()} == {"users": 128, "items": 128, "authors": 64}
    assert program.contexts["items"].stored_width == 128
    assert ("table items stored 128 columns wide for the TPU (its width 64; model.tables.items.stored_width=64 "
            "keeps it unpadded)") in caplog.text
