"""``mesh.permute_ids``: id i is stored in row ``permute_ids(i, vocab)``. A run with it learns the same numbers as
one without (its table is the unpermuted run's with the rows relabelled), the same on a row-sharded mesh as on
one device, the sequential model's full ranking (catalogue logits, labels, seen-item masks) is unchanged, and
the row shards' load (``emb/shard_rows_max`` / ``_mean``) on Zipf ids is more even."""
import functools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from optimizers import permute_ids
from runner.build import build
from runner.checkpoint import meta as ckpt_meta
from runner.core.embeddings import in_id_order, stored_rows
from runner.core.loop import to_device
from runner.errors import PreflightError
from tests.runner.core.test_sharded import STEPS, single_device
from tests.runner.support import batch_size, compose_config, jitted, numpy_tree, seq_config

RUN = ["optimizer=async_rowwise_adagrad", "async_emb=on"]  # test_sharded's run, so its single-device run is shared
ROW = ["mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row"]
PERMUTED = ["mesh.permute_ids=true"]


@functools.lru_cache(maxsize=None)
def compiled(*overrides):
    """(program, data, jitted step, jitted flush) of test_sharded's run with ``overrides``, built once."""
    program, data, _ = build(compose_config([*RUN, *overrides]))
    step, flush, _ = jitted(program, data)
    return program, data, step, flush


@functools.lru_cache(maxsize=None)
def trained(*overrides):
    """(program, final state, losses) of ``STEPS`` steps and the flush, as ``support.run_steps`` runs them."""
    program, data, step, flush = compiled(*overrides)
    state, losses = program.init_state(0), []
    for t in range(STEPS):
        state, m = step(state, to_device(program, data.batch(t, batch_size(program))))
        losses.append(float(m["train/loss"]))
    return program, numpy_tree(flush(state)), losses


def relabelled(program, name: str) -> np.ndarray:
    vocab = program.tables[name].vocab
    return np.asarray(permute_ids(np.arange(vocab, dtype=np.int32), vocab))


@pytest.mark.slow  # compiles on the 2x4 mesh or trains; make test-fast keeps the unit checks
def test_relabelling_on_a_mesh_is_the_one_device_relabelling():
    """``stored_rows`` of a batch split over the 2x4 mesh and ``in_id_order`` of a row-sharded table (each device
    walks its own ids) against numpy indexing with the single-device permutation."""
    program = compiled(*ROW, *PERMUTED)[0]
    spec, ctx, mesh = program.tables["items"], program.contexts["items"], program.mesh
    ids = np.arange(-3, 8 * 70 - 3, dtype=np.int32).reshape(8 * 14, 5)  # 0, negatives and ids past vocab too
    table = np.random.default_rng(0).normal(size=(spec.rows, spec.width)).astype(np.float32)
    put = lambda x, where: jax.device_put(x, NamedSharding(mesh, where))  # noqa: E731
    rows, ordered = jax.jit(lambda i, t: (stored_rows(spec, i, mesh), in_id_order(spec, t, mesh)))(
        put(ids, P(mesh.axis_names)), put(table, ctx.table_spec()))
    perm = np.arange(spec.rows)
    perm[: spec.vocab] = relabelled(program, "items")
    np.testing.assert_array_equal(np.asarray(rows), np.where((ids >= 0) & (ids < spec.rows),
                                                           perm[np.clip(ids, 0, spec.rows - 1)], ids))
    np.testing.assert_array_equal(np.asarray(ordered), table[perm])


@pytest.mark.slow  # compiles on the 2x4 mesh or trains; make test-fast keeps the unit checks
def test_permuted_run_learns_the_unpermuted_runs_numbers_in_relabelled_rows():
    """One device: losses equal, and row permute_ids(i) of every table and per-row state is row i of the
    unpermuted run (initial values follow the id, not the row)."""
    program, state, losses = trained("mesh=single", *PERMUTED)
    _, ref, ref_losses, _ = single_device("async_rowwise_adagrad", "on")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    for name, table in state.tables.items():
        perm = relabelled(program, name)
        assert (perm != np.arange(perm.size)).mean() > 0.9  # the rows really moved
        np.testing.assert_allclose(np.asarray(table)[perm], np.asarray(ref.tables[name])[: perm.size], atol=1e-7)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a)[perm], np.asarray(b)[: perm.size],
                                                             rtol=1e-6, atol=1e-9) if np.ndim(a) else None,
                     state.emb_states[name], ref.emb_states[name])


@pytest.mark.slow  # compiles on the 2x4 mesh or trains; make test-fast keeps the unit checks
def test_permuted_row_sharded_run_matches_one_device():
    program, state, losses = trained(*ROW, *PERMUTED)
    _, ref, ref_losses = trained("mesh=single", *PERMUTED)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, table in state.tables.items():
        vocab = program.tables[name].vocab
        got = np.asarray(table)
        np.testing.assert_allclose(got[:vocab], np.asarray(ref.tables[name])[:vocab], rtol=1e-5, atol=1e-7)
        assert not got[vocab:].any()  # padded rows stay zero: permute_ids maps [1, vocab) onto itself


def zipf_batch(data, program, seed: int, a: float = 1.2):
    """A training batch whose item ids (history and candidate) are Zipf ranks: the small ids are the hot ones."""
    rng = np.random.default_rng(seed)
    b = dict(data.batch(0, batch_size(program)))
    n = program.tables["items"].vocab - 1
    for k in ("hist_items", "cand_item"):
        b[k] = ((rng.zipf(a, size=b[k].shape) - 1) % n + 1).astype(b[k].dtype)
    return b


@pytest.mark.slow
def test_permuted_ids_spread_zipf_rows_over_the_row_shards():
    """emb/shard_rows_max / _mean of the items table for one Zipf batch, with and without the relabelling (async:
    the second step applies the first one's update), against a numpy count of the distinct rows per shard."""
    loads = {}
    for key, overrides in {"block": (*ROW, "mesh.permute_ids=false"), "permuted": (*ROW, *PERMUTED)}.items():
        program, data, step, _ = compiled(*overrides)
        batch = to_device(program, zipf_batch(data, program, 0))
        state, _ = step(program.init_state(0), batch)
        _, m = step(state, batch)
        loads[key] = float(m["emb/shard_rows_max/items"]), float(m["emb/shard_rows_mean/items"])
    batch = zipf_batch(data, program, 0)
    rows = np.unique(np.concatenate([batch["hist_items"].ravel(), batch["cand_item"].ravel()]))
    rows = rows[rows > 0]
    shard_rows = program.contexts["items"].shard_rows
    for key, ids in {"block": rows, "permuted": relabelled(program, "items")[rows]}.items():
        per_shard = np.bincount(ids // shard_rows, minlength=4)
        assert loads[key] == (per_shard.max(), per_shard.mean()), key
    (bmax, bmean), (pmax, pmean) = loads["block"], loads["permuted"]
    assert bmax / bmean > 1.8 and pmax / pmean < 1.3, loads  # measured: 52 / 25 and 28 / 25


@pytest.mark.slow
def test_sequential_full_ranking_is_unchanged_by_the_relabelling():
    """Full softmax (the catalogue's logits), then valid/test ranking with seen items excluded: the same
    scores and metrics with and without mesh.permute_ids."""
    runs = {}
    for key, extra in {"plain": [], "permuted": PERMUTED}.items():
        cfg = seq_config("model.loss=full_softmax", "data.exclude_seen=true", "trainer.steps=3", *extra)
        program, task, _ = build(cfg)
        B = cfg.trainer.batch_size
        state = program.init_state(0)
        step, flush, predict = program.compile(state, to_device(program, task.batch(0, B)))
        losses = []
        for t in range(3):
            state, m = step(state, to_device(program, task.batch(t, B)))
            losses.append(float(m["train/loss"]))
        state = flush(state)
        put = lambda b, p=program: to_device(p, b)  # noqa: E731
        runs[key] = losses, task.evaluate(lambda s, b, f=predict: jax.device_get(f(s, b)), state, put, B)
    np.testing.assert_allclose(runs["permuted"][0], runs["plain"][0], rtol=1e-6)
    plain, permuted = runs["plain"][1], runs["permuted"][1]
    assert plain.keys() == permuted.keys() and any(k.startswith("test/ndcg") for k in plain)
    for k in plain:
        assert permuted[k] == pytest.approx(plain[k], abs=1e-6), k


def test_a_checkpoint_with_the_other_permute_ids_is_refused_by_name():
    """Both ways, and a checkpoint written before the setting existed (no key: unpermuted)."""
    plain, _, _ = build(compose_config([*RUN, "mesh=single", "mesh.permute_ids=false"]))
    permuted, _, _ = build(compose_config([*RUN, "mesh=single", *PERMUTED]))

    def meta_of(program, drop_key=False):
        tables = ckpt_meta.tables_of(program)
        if drop_key:
            tables = {n: {k: v for k, v in t.items() if k != "permute_ids"} for n, t in tables.items()}
        return {"format": ckpt_meta.FORMAT, "async_emb": True, "tables": tables}

    for written, resumed, was in [(permuted, plain, True), (plain, permuted, False)]:
        with pytest.raises(PreflightError) as e:
            ckpt_meta.check_compatible(meta_of(written), resumed, "ck/4")
        for name in ("authors", "items", "users"):
            assert (f"table '{name}' permute_ids (mesh.permute_ids): the checkpoint has {was}, this config has "
                    f"{not was}; its rows are stored in that order, so resume it with "
                    f"mesh.permute_ids={str(was).lower()} or mesh.permute_ids=auto (which follows the "
                    f"checkpoint)") in str(e.value)
        ckpt_meta.check_compatible(meta_of(written), written, "ck/4")  # the same value resumes
    ckpt_meta.check_compatible(meta_of(plain, drop_key=True), plain, "ck/4")
    with pytest.raises(PreflightError, match="the checkpoint has False, this config has True"):
        ckpt_meta.check_compatible(meta_of(plain, drop_key=True), permuted, "ck/4")

