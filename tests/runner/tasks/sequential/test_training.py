"""Training the sequential model: the item table's per-token update equals the dense gradient of the loss
w.r.t. the whole table (both losses), sharded meshes equal one device, and a short run on the planted
pattern beats the popularity baseline by a wide margin and comes close to the Bayes-optimal oracle."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.app import run
from runner.build import build
from runner.core.loop import to_device
from tests.runner.support import id_rows, numpy_tree, run_steps
from tests.runner.support import seq_config

LR = 0.5


@pytest.mark.parametrize("loss, negatives", [pytest.param("sampled_softmax", "uniform", marks=pytest.mark.slow),
                                             ("full_softmax", "uniform"),
                                             pytest.param("sampled_softmax", "popularity", marks=pytest.mark.slow),
                                             pytest.param("sampled_softmax", "in_batch", marks=pytest.mark.slow)])
def test_one_fused_sgd_step_equals_the_dense_table_gradient(loss, negatives):
    program, task, _ = build(seq_config(f"model.loss={loss}", f"model.negatives={negatives}", "optimizer=async_sgd",
                                        f"optimizer.learning_rate={LR}", "async_emb=off", "data.num_users=200"))
    state = program.init_state(0)
    state0 = numpy_tree(state)
    host = task.batch(0, 64)
    step, _, _ = program.compile(state, to_device(program, host))
    new, _ = step(state, to_device(program, host))

    batch = {k: jnp.asarray(host[k]) for k in program.model_keys}
    ids = program.model.table_ids(batch)["items"]

    def dense_loss(table):  # the loss as a function of the whole table: an ordinary gather
        return program.model.loss(state0.params, {"items": table[ids]}, batch)[0]

    grad = np.asarray(jax.jit(jax.grad(dense_loss))(jnp.asarray(state0.tables["items"])))
    want = state0.tables["items"] - LR * grad
    got = np.asarray(new.tables["items"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    moved = np.flatnonzero(np.abs(got - state0.tables["items"]).max(1) > 0)
    if loss == "full_softmax":
        assert moved.size == task.data.num_items  # every item row is a token
    else:
        used = ["inputs", "targets"] + (["negatives"] if negatives != "in_batch" else [])
        touched = set(np.unique(np.concatenate([host[k].ravel() for k in used]))) - {0}
        assert set(moved) == touched
    assert not got[0].any()  # the padding row never moves


@functools.lru_cache(maxsize=None)  # the one-device run is the reference of both layouts: run once
def three_steps_and_eval(dropout: float, *mesh: str):
    """3 async Adam steps of the tiny sequence run at ``model.dropout=dropout`` on ``mesh``, then a full
    evaluation: (devices, losses, the items table in id order, the metrics)."""
    program, task, plan = build(seq_config("async_emb=on", "optimizer=async_adam", "data.num_users=120",
                                           f"model.dropout={dropout}", *mesh))
    _, state, losses, _ = run_steps(program, task, 3)
    put = lambda b: to_device(program, b)  # noqa: E731
    _, _, predict = program.compile(state, put(task.batch(0, 64)))
    return (plan.num_devices, losses, id_rows(program.tables["items"], state.tables["items"]),
            task.evaluate(predict, state, put, 64))


@pytest.mark.slow  # two programs compiled and evaluated, one of them on 8 devices: ~20 s each
@pytest.mark.parametrize("layout", ["row", "column"])
def test_sharded_mesh_equals_one_device(layout):
    """Without dropout, the tables agree to rounding. Adam moves an element by m / sqrt(v) of its summed gradient,
    about a whole step whatever the sum's size, so an element whose sum is within rounding of zero moves by up to
    a step either way as the mesh adds its terms in another order. With dropout this run has such elements (one
    seen 1.1e-4 apart, a tenth of a step, after 3 steps), so there the losses (every example drew the same mask)
    and the metrics are compared."""
    mesh = ("mesh=data_table", "mesh.axes={data:2,table:4}", f"mesh.table_layout={layout}")
    _, l1, t1, m1 = three_steps_and_eval(0.0)
    devices, l2, t2, m2 = three_steps_and_eval(0.0, *mesh)
    assert devices == 8
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    np.testing.assert_allclose(t2, t1, rtol=1e-4, atol=1e-6)  # in id order (the row layout permutes the ids)
    for k in ("valid/ndcg@10", "test/hr@10", "test/mrr"):
        assert m2[k] == pytest.approx(m1[k], abs=2e-3), k
    if layout == "row":  # the default dropout: the same masks on the mesh (one layout suffices: masks are per example)
        _, l1, _, m1 = three_steps_and_eval(0.3)
        _, l2, _, m2 = three_steps_and_eval(0.3, *mesh)
        np.testing.assert_allclose(l2, l1, rtol=1e-5)
        assert l1[0] != pytest.approx(three_steps_and_eval(0.0)[1][0], rel=1e-4)  # dropout changed the loss
        for k in ("valid/ndcg@10", "test/hr@10", "test/mrr"):
            assert m2[k] == pytest.approx(m1[k], abs=2e-3), k


@pytest.mark.slow  # 200 steps and two evaluations of the tiny sequence run
@pytest.mark.parametrize("optimizer", ["async_adam", "async_rowwise_adagrad"])
def test_short_run_beats_popularity_and_nears_the_oracle(tmp_path, optimizer):
    objective = run(seq_config(f"optimizer={optimizer}", "async_emb=on"), tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert objective == s["best/valid/ndcg@10"] >= s["valid/ndcg@10"]  # selected on validation: the best value
    assert s["data/cold_valid_targets"] >= 0 and s["data/cold_test_targets"] >= 0 and s["best/step"] in (100, 200)
    for split in ("valid", "test"):
        model, pop, oracle = (s[f"{p}{split}/ndcg@10"] for p in ("", "popularity/", "oracle/"))
        assert model > 3 * pop, (split, model, pop)
        assert model > 0.8 * oracle, (split, model, oracle)
        assert s[f"{split}/hr@10"] > 3 * s[f"popularity/{split}/hr@10"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "test/ndcg@10" in r]
    assert [r["step"] for r in evals] == [100, 200]  # every eval_interval and at the end
    assert evals[0]["popularity/test/ndcg@10"] == s["popularity/test/ndcg@10"]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert losses[-1] < losses[0] and 0 < rows[-2]["train/top1_sampled"] <= 1
