"""The Criteo task: DLRM and DCNv2 against a numpy reference of their math, the training order, the
evaluation against the true click probabilities, a short run that beats a constant predictor, and the
settings refused before anything compiles."""
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.core.embeddings import TableSpec
from runner.tasks.criteo.model import DCN, DLRM, TABLES
from runner.tasks.criteo.order import examples, shuffled

ROOT = Path(__file__).resolve().parents[4]
B, D = 5, 4


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    specs = {n: TableSpec(n, 10, D, 1, rows=10) for n in TABLES}
    embs = {n: jnp.asarray(rng.normal(size=(B, 1, D)), jnp.float32) for n in TABLES}
    batch = {"dense": jnp.asarray(rng.random((B, 13)), jnp.float32), "cat": jnp.zeros((B, 26), jnp.int32),
             "label": jnp.asarray(rng.integers(0, 2, B), jnp.float32)}
    return specs, embs, batch


def np_mlp(layers, x, last_relu):
    for i, layer in enumerate(layers):
        x = x @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"], np.float64)
        if i < len(layers) - 1 or last_relu:
            x = np.maximum(x, 0)
    return x


@pytest.mark.slow
def test_dlrm_matches_a_numpy_reference_of_its_interactions():
    specs, embs, batch = inputs()
    model = DLRM(specs, bottom=(8,), top=(6,))
    params = model.init(jax.random.key(0))
    got = np.asarray(model.logit(params, embs, batch))
    x = np_mlp(params["bottom"], np.asarray(batch["dense"], np.float64), True)
    vecs = [x] + [np.asarray(embs[n][:, 0], np.float64) for n in TABLES]
    dots = [np.sum(vecs[i] * vecs[j], 1) for i in range(27) for j in range(i)]  # each pair once
    want = np_mlp(params["top"], np.concatenate([x, np.stack(dots, 1)], 1), False)[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    loss, out = model.loss(params, embs, batch)
    p = 1 / (1 + np.exp(-want))
    y = np.asarray(batch["label"])
    assert float(loss) == pytest.approx(float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()), rel=1e-4)
    assert out["probs"].shape == (B,)
    ids = model.table_ids({"cat": jnp.arange(B * 26).reshape(B, 26)})
    assert ids["cat_03"].shape == (B, 1) and int(ids["cat_03"][1, 0]) == 26 + 2


@pytest.mark.parametrize("low_rank, bottom, structure", [(None, None, "stacked"), (3, None, "stacked"),
                                                       (None, (5,), "stacked"), (3, (), "parallel"),
                                                       (None, (5,), "parallel")])
@pytest.mark.slow
def test_dcn_matches_a_numpy_reference_of_its_cross_layers(low_rank, bottom, structure):
    specs, embs, batch = inputs(1)
    model = DCN(specs, cross_layers=2, low_rank=low_rank, deep=(7,), bottom=bottom, structure=structure)
    params = model.init(jax.random.key(1))
    for layer in params["cross"]:  # each cross layer starts as the identity: W (or V of U V) and b are zero
        assert not np.asarray(layer["w" if low_rank is None else "v"]).any() and not np.asarray(layer["b"]).any()
    leaves, tree = jax.tree.flatten(params)  # then every weight random, so that the products are checked
    keys = jax.random.split(jax.random.key(2), len(leaves))
    params = jax.tree.unflatten(tree, [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    dense = np.asarray(batch["dense"], np.float64)
    if bottom is not None:  # the bottom MLP's D-wide output replaces the 13 raw dense features
        assert [w["w"].shape for w in params["bottom"]] == [(13, *bottom, D)[i:i + 2] for i in range(len(bottom) + 1)]
        dense = np_mlp(params["bottom"], dense, True)
    d = dense.shape[1] + 26 * D
    for layer in params["cross"]:
        assert ("w" in layer) == (low_rank is None)
        assert (layer["w"].shape == (d, d)) if low_rank is None else (layer["u"].shape == (d, 3))
    x0 = np.concatenate([dense] + [np.asarray(embs[n][:, 0], np.float64) for n in TABLES], 1)
    x = x0
    for layer in params["cross"]:
        w = np.asarray(layer["w"], np.float64) if low_rank is None else \
            np.asarray(layer["u"], np.float64) @ np.asarray(layer["v"], np.float64)
        x = x0 * (x @ w + np.asarray(layer["b"], np.float64)) + x
    if structure == "stacked":
        want = np_mlp(params["deep"], x, False)[:, 0]
    else:  # the MLP over x0 beside the cross layers, one linear layer over both
        want = np_mlp(params["out"], np.concatenate([x, np_mlp(params["deep"], x0, True)], 1), False)[:, 0]
    np.testing.assert_allclose(np.asarray(model.logit(params, embs, batch)), want, rtol=1e-4, atol=1e-5)


def test_training_order_is_a_permutation_per_epoch_and_the_same_split_over_processes():
    for n in (1, 3, 1000, 4099):
        assert sorted(shuffled(np.arange(n), n, 7, 0).tolist()) == list(range(n))
    first = np.concatenate([examples(s, 100, 1000, 7) for s in range(10)])  # epoch 0 exactly
    second = np.concatenate([examples(s, 100, 1000, 7) for s in range(10, 20)])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(1000))
    assert not np.array_equal(first, second)  # each epoch its own order
    for step in (0, 9, 10, 33):  # 4 processes' rows, side by side, are the global batch
        np.testing.assert_array_equal(np.concatenate([examples(step, 100, 1000, 7, i, 4) for i in range(4)]),
                                      examples(step, 100, 1000, 7))
    assert not np.array_equal(examples(0, 100, 1000, 7), examples(0, 100, 1000, 8))


def run(tmp_path, *overrides, criteo=True):
    data = ["data=criteo", f"data.cache={tmp_path.parent / 'criteo_data'}", "data.lines=20000"] if criteo else []
    return subprocess.run([sys.executable, "-m", "runner", *data, "logger=none", f"hydra.run.dir={tmp_path}",
                           *overrides], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["dlrm", "dcn"])
def test_a_short_run_beats_a_constant_predictor(tmp_path, model, caplog):
    """DCN on generated logs (data.path unset); DLRM on the same logs written as a raw train.txt with two bad
    lines at its end (data.path=train.txt, data.max_bad_lines=2): converted by the run, the lines skipped,
    counted in the summary's data/bad_lines and named in the note the run prints."""
    from runner.app import run as run_in_process
    from runner.tasks.criteo.synthetic import CriteoSpec, write_logs
    from tests.runner.support import compose_config

    data = ["data.lines=20000"]
    if model == "dlrm":
        (log,) = write_logs(CriteoSpec(lines=20000), tmp_path / "logs")
        with open(log, "a") as f:  # at the end: the lines before keep their click probabilities (train.txt.p.npy)
            f.write("2" + "\t" * 39 + "\n" + "1\tx" + "\t" * 38 + "\n")
        data = [f"data.path={log}", "data.max_bad_lines=2"]
    cfg = compose_config(["data=criteo", f"model={model}", "logger=none", *data,
                          f"data.cache={tmp_path.parent / 'criteo_data'}", "trainer.steps=80", "trainer.batch_size=256",
                          "trainer.eval_interval=80", "model.emb_width=8", "data.eval_examples=1000"], tiny=False)
    caplog.set_level("INFO", logger="runner")
    run_in_process(cfg, tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["valid/auc"] > 0.6 and s["test/auc"] > 0.6  # a constant scores 0.5
    assert 0.75 < s["bayes/valid/auc"] < 0.95 and s["valid/auc"] < s["bayes/valid/auc"]
    assert s["valid/logloss"] < np.log(2)  # below a coin's
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note: ")]
    if model == "dlrm":
        assert s["data/bad_lines"] == 2
        assert len(notes) == 1 and "skipping 2 bad input lines (data.max_bad_lines=2 per file" in notes[0]
    else:
        assert s["data/bad_lines"] == 0 and notes == []


BAD = [
    (["model=ranking"], "data=criteo is a click-log source, but model=ranking; use model=dlrm or model=dcn"),
    (["model=dlrm", "data=synthetic"], "use model=ranking, or data=criteo for model=dlrm"),
    (["model=dlrm", "data.path=/nonexistent"], "data.path=/nonexistent: no such file or folder; give data.path "
                                               "a folder converted by python -m runner.prepare criteo, a Criteo"),
    (["model=dlrm", "data.hash_rows=1"], "data.hash_rows=1"),
    (["model=dcn", "model.cross_layers=-1"], "model.cross_layers=-1"),
    (["model=dcn", "model.low_rank=0"], "model.low_rank=0"),
    (["model=dcn", "model.emb_width=8", "model.low_rank=221"],
     "model.low_rank=221 is not below the cross layers' input width 221 (13 dense + 26 x model.emb_width=8): such a "
     "rank is full rank, in two matrices larger than the full-rank one; use a rank below 221"),
    (["model=dcn", "model.emb_width=8", "model.bottom=[16]", "model.low_rank=216"], "input width 216 (8 dense + 26"),
    (["model=dcn", "model.bottom=[0]"], "model.bottom=[0] must list integers in [1, 65536], e.g. model.bottom=[64]"),
    (["model=dlrm", "model.top=[0]"], "model.top"),
    (["model=dlrm", "data.lines=10"], "data.lines=10"),
    (["model=dlrm", "data.days=30000"], "data.days=30000 is outside [1, 1000]"),
    (["model=dlrm", "data.max_bad_lines=-1"], "data.max_bad_lines=-1 is outside [0, 2147483647] (raw logs in "
                                              "data.path: bad lines skipped and counted per file"),
    (["model=dlrm", "data.lines=1000", "data.days=500"], "too few examples to train and evaluate on ({'valid': 1, 'test': 1}"),
    (["model=dlrm", "data.bags=[0]"], "data.bags: bag sizes [0]: 26 integers in 1..255"),
    (["model=dlrm", "model.pooling=max"], "model.pooling"),
    (["model=dlrm", "data.logs=kagle"], "data.logs"),
    (["model=dlrm", "data.ids=hash", "model.tables.cat_01.vocab=2"], "a hashed table needs >= 3 rows"),
    (["model=dcn", "model.tables.cat_07.width=3"], "model.tables.<name>.width={'cat_07': 3}: model=dcn's tables all"),
]


# composed in process and refused by build's preflight; CLI marks the values the schema itself refuses (at composition),
# which, with one preflight refusal, run as the command line a user types: exit != 0, one message, no traceback
CLI = [(["model=dlrm", "model.pooling=max"], "model.pooling"), (["model=dlrm", "data.logs=kagle"], "data.logs"),
       (["model=dcn", "model.structure=mixed"], "model.structure"), BAD[0]]


@pytest.mark.parametrize("overrides, message", [b if "data.days=500" not in b[0] else pytest.param(*b, marks=pytest.mark.slow)
                                                for b in BAD if b not in CLI], ids=lambda v: str(v)[:60])
@pytest.mark.slow
def test_bad_settings_are_refused_by_one_message(tmp_path, overrides, message):
    from runner.build import build
    from runner.errors import PreflightError
    from tests.runner.support import compose_config

    data = [] if "data=synthetic" in overrides else ["data=criteo", f"data.cache={tmp_path / 'criteo_data'}",
                                                     "data.lines=20000"]
    with pytest.raises(PreflightError) as e:
        build(compose_config([*data, "logger=none", *overrides], tiny=False))
    assert message in str(e.value) and "Traceback" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("overrides, message", CLI, ids=lambda v: str(v)[:60])
def test_bad_settings_on_the_command_line_exit_with_one_message(tmp_path, overrides, message):
    proc = run(tmp_path, *overrides)
    assert proc.returncode != 0 and message in proc.stderr, (overrides, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]


def test_evaluation_scores_the_splits_against_their_true_click_probabilities(tmp_path):
    from runner.tasks.criteo.ids import HashIds
    from runner.tasks.criteo.prepare import convert
    from runner.tasks.criteo.synthetic import CriteoSpec, write_logs
    from runner.tasks.criteo.task import CriteoTask
    from runner.tasks.ranking.auc import auc

    logs = write_logs(CriteoSpec(lines=6000, days=2), tmp_path / "logs")
    convert(logs, tmp_path / "s")
    task = CriteoTask(tmp_path / "s", HashIds([50] * 26), seed=0, eval_examples=1500)
    # score with the true probabilities, looked up by the batch's own rows: a Bayes-optimal model
    got = {}
    for split in ("valid", "test"):
        data = task.splits[split]
        b = data.take(np.arange(1500), task.ids)
        got[split] = (auc(b["label"], b["p"]), b)
    calls = []

    def predict(state, batch):  # the evaluation hands batches in file order, the last one padded
        calls.append(batch["cat"].shape[0])
        key = batch["cat"].tobytes()
        return lookup[key]

    lookup = {}
    for split in ("valid", "test"):
        data = task.splits[split]
        for start in range(0, 1500, 512):
            index = np.minimum(np.arange(start, start + 512), 1499)
            b = data.take(index, task.ids)
            lookup[b["cat"].tobytes()] = b["p"]
    out = task.evaluate(predict, None, lambda b: b, 512)
    assert sorted(out) == sorted(task.metric_names())
    for split in ("valid", "test"):
        assert out[f"{split}/auc"] == pytest.approx(got[split][0]) and out[f"bayes/{split}/auc"] == out[f"{split}/auc"]
        y, p = got[split][1]["label"], got[split][1]["p"].astype(np.float64)
        assert out[f"{split}/logloss"] == pytest.approx(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(), rel=1e-6)
        assert out[f"{split}/accuracy"] == pytest.approx(np.mean((p > 0.5) == (y == 1)))
    assert set(calls) == {512}  # 3 batches per split, the last padded to the compiled size
    flat = task.evaluate(lambda state, b: np.full(b["cat"].shape[0], 0.3), None, lambda b: b, 512)
    assert flat["valid/auc"] == 0.5 and flat["bayes/valid/auc"] == out["bayes/valid/auc"]


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_a_pooled_bag_updates_each_of_its_rows_as_a_dense_reference_does(tmp_path, pooling):
    """Multi-hot features through the runner's fused step (sync SGD, one step): every row of a bag gets the
    pooled gradient (divided by the bag's length under the mean), as the gradient of a dense reference
    that pools with a count matrix; padding row 0 stays zero; the update record holds B x L ids, no more."""
    from runner.build import build
    from runner.core.loop import to_device
    from runner.tasks.criteo.ids import PADDING
    from tests.runner.support import compose_config

    bags = [3] + [1] * 24 + [4]
    B, lr = 64, 0.5
    cfg = compose_config(["data=criteo", "model=dlrm", "logger=none", "data.lines=3000", f"data.bags={bags}",
                          f"data.cache={tmp_path / 'data'}", "optimizer=async_sgd", f"optimizer.learning_rate={lr}",
                          "async_emb=off", "mesh=single", f"trainer.batch_size={B}", "model.emb_width=4",
                          "model.bottom=[8]", "model.top=[8]", f"model.pooling={pooling}"], tiny=False)
    program, task, _ = build(cfg)
    stack = program.stacking.stack_of("cat_01")  # the 26 tables are stacked (model.stack_tables, the default)
    assert program.stacking.stacks[stack] == TABLES
    assert program.contexts[stack].tokens_per_batch == B * sum(bags)  # B x L ids of every bag, no more
    state = program.init_state(0)
    tables0 = {n: np.asarray(program.table_of(state, n), np.float64) for n in TABLES}
    params0 = jax.device_get(state.params)
    batch = task.batch(0, B)
    step, _, _ = program.compile(state, to_device(program, batch))
    new, _ = step(state, to_device(program, batch))

    ids = program.model.table_ids({"cat": jnp.asarray(batch["cat"])})
    counts = {}  # [B, rows]: how often each row is in an example's bag (padding left out)
    for n, t in tables0.items():
        c = np.zeros((B, t.shape[0]))
        np.add.at(c, (np.repeat(np.arange(B), ids[n].shape[1]), np.asarray(ids[n]).ravel()), 1.0)
        c[:, PADDING] = 0
        counts[n] = c / c.sum(1, keepdims=True) if pooling == "mean" else c
    assert (counts["cat_01"] > 0).sum(1).max() > 1  # some bag holds several rows
    one_hot = DLRM({n: TableSpec(n, 10, 4, 1, rows=10) for n in TABLES}, "sum", (8,), (8,))

    def loss(tables):
        embs = {n: (jnp.asarray(counts[n], jnp.float32) @ tables[n])[:, None] for n in TABLES}
        return one_hot.loss(params0, embs, jax.tree.map(jnp.asarray, batch))[0]

    grads = jax.jit(jax.grad(loss))({n: jnp.asarray(t, jnp.float32) for n, t in tables0.items()})
    for n in ("cat_01", "cat_05", "cat_26"):
        want = tables0[n] - lr * np.asarray(grads[n], np.float64)
        got = np.asarray(program.table_of(new, n))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=n)
        assert not got[PADDING].any()


def test_the_id_map_is_the_one_data_ids_names(tmp_path):
    """data.ids chooses the map (a string compared to the Enum member never matched, so every run hashed):
    the default is the vocabulary, whose rows are the training values seen plus padding and missing."""
    from runner.tasks import make_task
    from runner.tasks.criteo.ids import HashIds, VocabIds
    from tests.runner.support import compose_config

    base = ["data=criteo", "model=dlrm", "logger=none", "data.lines=3000", f"data.cache={tmp_path}"]
    vocab = make_task(compose_config(base, tiny=False))
    assert isinstance(vocab.ids, VocabIds)
    assert [r - 2 for r in vocab.ids.table_rows()] == [len(v) for v in vocab.ids.values]
    hashed = make_task(compose_config(base + ["data.ids=hash", "data.hash_rows=7"], tiny=False))
    assert isinstance(hashed.ids, HashIds) and max(hashed.ids.table_rows()) == 7


def test_lines_skipped_at_conversion_are_reported_by_the_run(tmp_path):
    from runner.tasks.criteo.ids import HashIds
    from runner.tasks.criteo.prepare import convert
    from runner.tasks.criteo.synthetic import CriteoSpec, write_logs
    from runner.tasks.criteo.task import CriteoTask

    (log,) = write_logs(CriteoSpec(lines=3000), tmp_path / "logs")
    with open(log, "a") as f:
        f.write("2" + "\t" * 39 + "\n" + "1\tx" + "\t" * 38 + "\n")  # a label of 2, then an integer feature 'x'
    convert([log], tmp_path / "s", max_bad_lines=2)
    task = CriteoTask(tmp_path / "s", HashIds([50] * 26), seed=0, eval_examples=100)
    assert task.data_metrics() == {"data/bad_lines": 2}
    (note,) = task.warnings()
    assert "skipping 2 bad input lines (--max-bad-lines 2 per file" in note and ":3001: " in note


@pytest.mark.slow
def test_the_real_log_presets_need_their_logs(tmp_path):
    """experiment=criteo_kaggle / criteo_terabyte compose the reference models and stop, naming data.path,
    rather than train on generated logs; the Terabyte preset refuses a folder not split by day."""
    from runner.errors import PreflightError
    from runner.tasks import make_task
    from runner.tasks.criteo.task import generated
    from tests.runner.support import compose_config

    folder = generated(compose_config(["data=criteo", "model=dlrm", "data.lines=3000", f"data.cache={tmp_path}"],
                                      tiny=False))
    kaggle = compose_config(["experiment=criteo_kaggle"], tiny=False)
    assert (kaggle.model.emb_width, list(kaggle.model.bottom), list(kaggle.model.top)) == (16, [512, 256, 64], [512, 256])
    with pytest.raises(PreflightError, match=r"data.logs=kaggle trains on the real Criteo kaggle logs, and data.path "
                                             r"is unset: set data.path to them \(train.txt; converted on first use "
                                             r"into data.cache\), or to a folder converted ahead of time \(python -m "
                                             r"runner.prepare criteo train.txt --out DIR\). The logs: the Display "
                                             r"Advertising Challenge's train.txt, from https://www.kaggle.com/c/"
                                             r"criteo-display-ad-challenge$"):
        make_task(kaggle)
    task = make_task(compose_config(["experiment=criteo_kaggle", f"data.path={folder}"], tiny=False))
    assert task.num_train_examples == json.loads((folder / "manifest.json").read_text())["splits"]["train"]["examples"]
    tb = compose_config(["experiment=criteo_terabyte", f"data.path={folder}"], tiny=False)
    assert (tb.model.emb_width, tb.data.hash_rows, tb.trainer.batch_size) == (128, 40_000_000, 2048)
    with pytest.raises(PreflightError, match="data.logs=terabyte evaluates on the last day, but data.path=.* was split seeded"):
        make_task(tb)


def test_the_tiny_criteo_preset_composes_with_both_models():
    from tests.runner.support import compose_config

    for model in ("dlrm", "dcn"):
        cfg = compose_config(["debug=tiny_criteo", f"model={model}"], tiny=False)
        assert (cfg.data.name, cfg.model.name, cfg.logger.kind) == ("criteo", model, "none")
        assert (cfg.data.lines, cfg.model.emb_width, cfg.trainer.steps, cfg.trainer.batch_size) == (20000, 8, 60, 256)


@pytest.mark.slow
def test_the_tiny_criteo_preset_trains_dcn_from_the_command_line(tmp_path):
    proc = run(tmp_path, "debug=tiny_criteo", "model=dcn", f"data.cache={tmp_path.parent / 'criteo_data'}",
               criteo=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 60 steps" in proc.stdout + proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["test/auc"] > 0.6 and s["test/auc"] < s["bayes/test/auc"]
