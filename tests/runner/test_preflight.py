import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from optimizers import FUSED
from runner.app import run
from runner.build import build
from runner.errors import PreflightError
from runner.notices import rounding_warnings
from tests.runner.support import compose_config, seq_config

ROOT = Path(__file__).resolve().parents[2]
MESSAGE = ("use_async_emb requires an embedding optimizer implementing AsyncEmbOptimizer, and {} has no fused "
           "table update")


def test_dense_adam_refused_in_async_mode(cfg_of):
    with pytest.raises(PreflightError) as e:
        build(cfg_of(["optimizer=adam", "async_emb=on"]))
    text = str(e.value)
    assert text.startswith(MESSAGE.format("Adam") + " (configured for embedding table 'users').\nWays out: (1) pick "
                           "a fused optimizer for this table, e.g. optimizer=async_adam, async_rowwise_adagrad")
    assert "async_rowwise_adagrad" in text and "gradient_update_start" in text and "async_emb=off" in text


def test_dense_adam_allowed_in_sync_mode(cfg_of):
    program, _, _ = build(cfg_of(["optimizer=adam", "async_emb=off"]))
    assert type(program.emb_optimizers["items"]).__name__ == "Adam"


def test_user_class_overriding_only_done_is_refused_by_its_name(cfg_of):
    cfg = cfg_of(["optimizer=adam", "async_emb=on",
                  "optimizer._target_=tests.runner.custom_optimizers.HalfFusedAdam"])
    with pytest.raises(PreflightError, match=MESSAGE.format("HalfFusedAdam")):
        build(cfg)


def test_per_table_override_refused_naming_the_table(cfg_of):
    cfg = cfg_of(["optimizer=async_adam", "async_emb=on", "+optimizer@table_optimizers.authors=adam"])
    with pytest.raises(PreflightError) as e:
        build(cfg)
    assert str(e.value).startswith(MESSAGE.format("Adam") + " (configured for embedding table 'authors' by "
                                   "table_optimizers.authors).\nWays out: (1) pick a fused optimizer for this table, "
                                   "e.g. +optimizer@table_optimizers.authors=async_adam, async_rowwise_adagrad")


def test_per_table_override_to_another_fused_optimizer(cfg_of):
    cfg = cfg_of(["optimizer=async_adam", "+optimizer@table_optimizers.users=async_rowwise_adagrad"])
    program, _, _ = build(cfg)
    names = {n: type(o).__name__ for n, o in program.emb_optimizers.items()}
    assert names == {"users": "AsyncRowwiseAdagrad", "items": "AsyncAdam", "authors": "AsyncAdam"}


BF16_WARNING = (
    "warning: table 'users' is stored in bfloat16 (model.tables.users.dtype) and its optimizer Adam (plain optax "
    "over the whole table) writes every row back rounded to nearest: an update smaller than half a bfloat16 step "
    "(2**-8 of the value's power of two, 0.2-0.4% of the value) is lost and the row does not move. The fused "
    "optimizers (e.g. optimizer=async_adam) write bfloat16 rows with stochastic rounding, so such updates still "
    "move them on average; or keep this table in float32 (model.tables.users.dtype=float32)")


def bf16_tables(cfg_of):
    """users: bfloat16 under optax Adam (warned); items: bfloat16 under fused Adam (stochastic rounding: no
    warning); authors: optax Adam on float32 (no warning)."""
    return cfg_of(["optimizer=adam", "async_emb=off", "model.tables.users.dtype=bfloat16",
                   "+optimizer@table_optimizers.items=async_adam", "model.tables.items.dtype=bfloat16",
                   "trainer.steps=1", "trainer.eval_interval=1"])


def test_a_bfloat16_table_under_a_plain_optax_optimizer_is_warned_naming_it(cfg_of):
    program, _, _ = build(bf16_tables(cfg_of))
    assert rounding_warnings(program.emb_optimizers, program.tables) == [BF16_WARNING]


@pytest.mark.slow
def test_the_run_logs_the_bfloat16_rounding_warning_once(cfg_of, tmp_path, caplog):
    cfg = bf16_tables(cfg_of)
    caplog.set_level(logging.INFO, logger="runner")
    run(cfg, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "runner"]
    assert [ln for ln in lines if ln.startswith("warning:")] == [BF16_WARNING], lines


@pytest.mark.slow
def test_a_staleness_past_the_last_step_is_warned_and_the_flush_applies_every_update(cfg_of, tmp_path, caplog):
    """staleness 8 in a 3-step run: no update is applied while it trains, which the run says once; the flush
    then applies the 3 queued (the summary's table moved)."""
    from runner.notices import staleness_warnings

    assert staleness_warnings(1, 1) == staleness_warnings(2, 3) == [] and len(staleness_warnings(3, 3)) == 1
    caplog.set_level(logging.INFO, logger="runner")
    run(cfg_of(["async_emb=on", "async_emb.staleness=8", "trainer.steps=3"]), tmp_path)
    warned = [r.getMessage() for r in caplog.records if r.name == "runner" and r.getMessage().startswith("warning:")]
    assert warned == ["warning: async_emb.staleness=8 and the run has 3 steps (trainer.steps): step t applies the "
                      "embedding update of step t-8, so no update reaches the tables while the run trains (the final "
                      "flush applies them all, after the last step); lower async_emb.staleness (1, the default, "
                      "defers each by one step) or train for more than 8 steps"], warned
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["emb/flush_grad_norm"] > 0 and summary["emb/flush_valid"] is True


def test_mesh_settings_the_mesh_does_not_use_are_warned_once_by_name(cfg_of):
    from runner.build import build_run
    from runner.notices import mesh_warnings

    def warned(*overrides):
        cfg = cfg_of(list(overrides))
        plan = build_run(cfg)[2]
        return mesh_warnings(cfg.mesh, plan, jax.device_count())

    assert warned() == warned("mesh=data_table", "mesh.routing=gather") == warned("mesh=data") == []
    assert warned("mesh.routing=gather", "mesh.route_capacity=5") == [
        "warning: mesh.routing=gather, mesh.route_capacity=5.0: no table is split on this mesh (data=1, one table "
        "shard), so they have no effect; shard the tables over a table axis of 2 or more devices (mesh=data_table, "
        "mesh.axes.table) or leave them out"]
    assert warned("mesh=data_table", "mesh.table_layout=column", "mesh.routing=gather") == [
        "warning: mesh.routing=gather applies to the row layout, and the tables use the column layout "
        "(mesh.table_layout=column), which exchanges each device's distinct ids its own way: it has no effect; use "
        "mesh.table_layout=row or leave mesh.routing out"]
    assert warned("mesh=data_table", "mesh.routing=gather", "mesh.route_capacity=0.5", "mesh.route_overflow=stop") == [
        "warning: mesh.route_capacity=0.5, mesh.route_overflow=stop: the all_to_all routing's, and mesh.routing=gather "
        "gathers every device's ids without a capacity: they have no effect"]
    assert warned("mesh=data_table", "mesh.axes={data:2,table:2}", "mesh.cpu_devices=8") == [
        "warning: mesh.cpu_devices=8 gives 8 devices and the mesh (data=2xtable=2) uses 4: the others stay idle; give "
        "one of mesh.axes -1 (it fills the devices) or set mesh.axes to use them"]
    assert warned("mesh.cpu_devices=8") == [
        "warning: mesh.cpu_devices=8 gives 8 devices and the mesh (data=1) uses 1: the others stay idle; use "
        "mesh=data_table (its axes fill the devices) or set mesh.axes to use them"]


@pytest.mark.parametrize("name", FUSED)
def test_every_fused_optimizer_passes(cfg_of, name):
    program, _, _ = build(cfg_of([f"optimizer={name}", "async_emb=on"]))
    assert program.async_emb


@pytest.mark.parametrize("override, needle", [
    ("optimizer.learning_rate=-0.1", "optimizer.learning_rate=-0.1 is outside (0, inf) (step size)"),
    ("dense_optimizer.learning_rate=0", "dense_optimizer.learning_rate=0.0 is outside (0, inf) (peak step size, "
                                        "reached after warmup)"),
    ("trainer.batch_size=0", "trainer.batch_size=0 is outside [1, 16777216] (global batch: examples per step "
                             "over every device)"),
    ("data.zipf_a=1000", "data.zipf_a=1000.0 is outside [0, 20] (Zipf exponent of user/item popularity (rare ids "
                         "underflow past 20))"),
    ("+optimizer@table_optimizers.items=async_adam table_optimizers.items.eps=0",
     "table_optimizers.items.eps=0.0 is outside (0, inf)"),
    ("+table_optimizers.movies={_target_:optimizers.AsyncSGD}", "unknown table(s) ['movies']"),
    # mesh.table_layout and a table's dtype are Enum fields: tests/runner/test_config.py (composition)
])
def test_bad_values_get_one_line_each(cfg_of, override, needle):
    with pytest.raises(PreflightError) as e:
        build(cfg_of(override.split(" ")))
    assert needle in str(e.value)


@pytest.mark.slow
def test_cli_refusal_is_fast_clean_and_nonzero(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline"}
    proc = subprocess.run(
        [sys.executable, "-m", "runner", "optimizer=adam", "async_emb=on", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert MESSAGE.format("Adam") in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before any training started


def test_a_large_table_of_a_width_a_tpu_copies_is_warned_on_a_tpu_only():
    from runner.core.embeddings import TableSpec
    from runner.notices import layout_warnings

    def spec(name, rows, width, stored=None):
        return TableSpec(name, rows, width, 1, rows, stored_width=stored)

    tables = {"items": spec("items", 10_000_000, 64), "users": spec("users", 999_999, 64),
              "ads": spec("ads", 2_000_000, 256), "pages": spec("pages", 1_000_000, 200),
              "clicks": spec("clicks", 5_000_000, 64, stored=128)}
    warned = layout_warnings(tables, "tpu")
    assert len(warned) == 2, warned  # not users (small), not ads (a multiple of 128), not clicks (stored 128 wide)
    assert warned[0].startswith("warning: table 'items' is 10,000,000 rows x 64 on a TPU: ")
    assert ("set model.tables.items.stored_width=128 (padding: the model still sees 64 columns), or the width itself "
            "(model.emb_width=128, or model.tables.items.width)") in warned[0]
    assert "docs/results/tpu.md" in warned[0]
    assert warned[1].startswith("warning: table 'pages' is 1,000,000 rows x 200") and "model.emb_width=256" in warned[1]
    assert layout_warnings(tables, "cpu") == [] and layout_warnings(tables, "gpu") == []


@pytest.mark.parametrize("overrides, steps, warned", [
    (["async_emb.dc_lambda=5"], 6, ["warning: async_emb.dc_lambda=5.0 is delay compensation's, and it is off (it needs "
                                    "async_emb=on async_emb.compensation=dc): it has no effect"]),
    (["async_emb.compensation=dc", "async_emb.dc_lambda=5"], 6, []),
    (["optimizer.schedule.warmup_steps=3", "optimizer.schedule.end_ratio=0.5"], 6, [
        "warning: optimizer.schedule.warmup_steps=3, optimizer.schedule.end_ratio=0.5: optimizer.schedule.kind=constant "
        "does not use them; set the kind that does, or leave them out"]),
    (["optimizer.schedule.kind=warmup", "optimizer.schedule.warmup_steps=3"], 6, []),
    (["optimizer.schedule.kind=step"], 6, ["warning: optimizer.schedule.kind=step steps every 1000 updates "
                                           "(optimizer.schedule.step_every) and the run has 6: the learning rate never "
                                           "steps"]),
    (["optimizer.schedule.kind=step", "optimizer.schedule.step_every=2"], 6, []),
    (["optimizer.schedule.kind=cosine", "optimizer.schedule.decay_steps=12", "optimizer.schedule.end_ratio=0.1"], 6, [
        "warning: optimizer.schedule.decay_steps=12 outlasts the run's 6 updates: its learning rate ends at 0.55 of "
        "optimizer.learning_rate, not at end_ratio=0.1; optimizer.schedule.decay_steps=0 decays over the run"]),
    (["+optimizer@table_optimizers.users=async_sgd", "table_optimizers.users.schedule.kind=warmup_cosine",
      "table_optimizers.users.schedule.warmup_steps=2", "table_optimizers.users.schedule.decay_steps=8"], 6, [
        "warning: table_optimizers.users.schedule.decay_steps=8 after 2 warmup updates outlasts the run's 6 updates: "
        "its learning rate ends at 0.5 of table_optimizers.users.learning_rate, not at end_ratio=0; "
        "table_optimizers.users.schedule.decay_steps=0 decays over the run"]),
    (["optimizer.schedule.kind=cosine", "optimizer.schedule.decay_steps=6"], 6, []),
    (["optimizer.weight_decay_mode=l2"], 6, [
        "warning: optimizer.weight_decay_mode=l2 says how optimizer.weight_decay decays rows, and it is 0: it has no "
        "effect; set optimizer.weight_decay above 0 or leave it out"]),
    (["optimizer.weight_decay_mode=l2", "optimizer.weight_decay=0.01"], 6, []),
    (["model.tables.users.capacity=100", "model.tables.users.evict=lfu"], 6, [
        "warning: model.tables.users.capacity=100, model.tables.users.evict=lfu: hash-table settings, and table "
        "'users' is dense; set model.tables.users.kind=hash or leave them out"]),
    (["model.tables.users.kind=modulo", "model.tables.users.vocab=101", "model.tables.users.capacity=100"], 6, [
        "warning: model.tables.users.capacity=100: hash-table settings, and table 'users' is a modulo table (its rows "
        "are hash(id) mod vocab - 1); set model.tables.users.kind=hash or leave them out"]),
    (["dense_optimizer.warmup_steps=1000"], 6, ["warning: dense_optimizer.warmup_steps=1000 is longer than the run "
                                                "(6 steps): the dense learning rate never reaches "
                                                "dense_optimizer.learning_rate"]),
    ([], 6, []),  # the default warmup (20) outlasting a 6-step smoke run is not news
    (["logger.mode=online", "logger.project=zzz"], 6, [  # the tiny runs' logger=none (debug=tiny)
        "warning: logger.project=zzz, logger.mode=online: W&B settings, and logger=none (no W&B run): they have no "
        "effect; add logger=wandb to log to W&B"]),
    (["logger=wandb", "logger.project=zzz"], 6, []),
    (["distributed.num_processes=4", "distributed.process_id=3"], 6, [
        "warning: distributed.num_processes=4, distributed.process_id=3: distributed=none runs one process, so they "
        "have no effect; pick distributed=local, manual or slurm (or python -m runner.launch) to run several"]),
    (["model.tables.items.kind=hash", "model.tables.items.capacity=100", "model.tables.items.ttl=5",
      "model.tables.items.sketch_width=1024"], 6, [
        "warning: model.tables.items.ttl=5 applies to model.tables.items.evict=ttl, and the table evicts by lru: it has "
        "no effect; set model.tables.items.evict=ttl or leave it out",
        "warning: model.tables.items.sketch_width=1024: the admission sketch's, and model.tables.items.admit_after=1 "
        "admits every id on first sight without counting: it has no effect; set model.tables.items.admit_after above "
        "1 or leave it out"]),
    (["model.tables.items.kind=hash", "model.tables.items.capacity=100", "model.tables.items.evict=ttl",
      "model.tables.items.ttl=5", "model.tables.items.admit_after=2", "model.tables.items.sketch_width=1024"], 6, []),
    (["trainer.run_id=drill"], 6, [
        "warning: trainer.run_id=drill names the run's checkpoints and W&B id, and checkpoint.interval=0 saves none: it "
        "has no effect; set checkpoint.interval above 0 to save and resume the run under it, or leave it out"]),
    (["trainer.run_id=drill", "checkpoint.interval=3"], 6, []),
], ids=["dc_lambda", "dc_lambda-used", "schedule", "schedule-used", "step", "step-used", "cosine-longer",
        "warmup-cosine-longer", "cosine-used", "decay-mode-without-decay", "decay-mode-used", "hash-on-dense", "hash-on-modulo",
        "dense-warmup", "defaults", "wandb-without-wandb", "wandb-used", "processes-for-one", "hash-idle",
        "hash-used", "run-id-without-checkpoints", "run-id-used"])
def test_settings_nothing_in_the_run_reads_are_named_in_a_warning(overrides, steps, warned):
    from runner.notices import unused_settings

    assert unused_settings(compose_config(overrides), steps) == warned


def test_settings_of_another_loss_or_task_are_named_in_a_warning():
    from runner.notices import unused_settings

    seq = seq_config("model.loss=full_softmax", "model.num_negatives=7", "trainer.eval_batches=3")
    assert unused_settings(seq, 6) == [
        "warning: model.num_negatives=7: model.loss=full_softmax scores every item, so it has no effect",
        "warning: trainer.eval_batches=3 sizes the ranking task's evaluation; model=sequential evaluates its whole "
        "held-out split, so it has no effect"]
    assert unused_settings(seq_config("model.negatives=in_batch", "model.num_negatives=7"), 6) == [
        "warning: model.num_negatives=7: model.negatives=in_batch takes the batch's other targets, so it has no effect"]
    assert unused_settings(seq_config("model.negatives=popularity", "model.num_negatives=7"), 6) == []
    dcn = compose_config(["data=criteo", "model=dcn", "model.cross_layers=0", "model.low_rank=4"], tiny=False)
    assert unused_settings(dcn, 6) == ["warning: model.low_rank=4 sets the cross layers' rank, and model.cross_layers=0: "
                                       "it has no effect"]


@pytest.mark.parametrize("overrides, warned", [
    (["data.path=/logs", "data.lines=50000", "data.days=3"],
     "warning: data.lines=50000, data.days=3: the generated logs' size, and data.path=/logs names logs to read: they "
     "have no effect; leave them out, or unset data.path to train on generated logs"),
    (["data.hash_rows=1000"], "warning: data.hash_rows=1000: data.ids=hash's, and the run maps ids by data.ids=vocab: "
                              "it has no effect; set data.ids=hash or leave it out"),
    (["data.ids=hash", "data.min_count=5"], "warning: data.min_count=5: data.ids=vocab's, and the run maps ids by "
                                            "data.ids=hash: it has no effect; set data.ids=vocab or leave it out"),
    (["model.pooling=mean"], "warning: model.pooling=mean pools a multi-hot feature's bag, and the generated logs are "
                             "one-hot (data.bags unset): it has no effect; set data.bags to write bags, or leave it out"),
    (["data.ids=hash", "data.hash_rows=1000", "model.pooling=mean", "data.bags=[2]"], None),  # each one read
], ids=["generator-with-path", "hash-rows-with-vocab", "min-count-with-hash", "mean-of-one-hot", "used"])
@pytest.mark.slow
def test_criteo_data_settings_another_one_leaves_unread_are_named(overrides, warned):
    from runner.notices import unused_settings

    got = unused_settings(compose_config(["debug=tiny_criteo", *overrides], tiny=False), 6)
    assert got == ([warned] if warned else [])
    assert unused_settings(seq_config("data.duplicates=refuse"), 6) == [
        "warning: data.duplicates=refuse applies to a file's exact duplicate rows, and data=synthetic_sequences "
        "generates its sequences without any: it has no effect"]


def test_a_presets_own_generator_settings_beside_data_path_are_not_warned_about():
    """debug=tiny_criteo (and experiment=criteo_synthetic) set data.lines themselves: with data.path given on the
    command line, the warning told the user to leave out a value they never gave. Only the command line's own
    (``typed``: Hydra's task overrides) are named; a run started from Python (None) is checked as before."""
    from runner.app import _typed
    from runner.notices import unused_settings

    cfg = compose_config(["debug=tiny_criteo", "data.path=/logs"], tiny=False)
    assert unused_settings(cfg, 6, typed={"debug", "data.path"}) == []
    assert unused_settings(cfg, 6) == [
        "warning: data.lines=20000: the generated logs' size, and data.path=/logs names logs to read: it has no "
        "effect; leave it out, or unset data.path to train on generated logs"]
    cfg = compose_config(["debug=tiny_criteo", "data.path=/logs", "data.lines=50000"], tiny=False)
    assert unused_settings(cfg, 6, typed={"debug", "data.path", "data.lines"}) == [
        "warning: data.lines=50000: the generated logs' size, and data.path=/logs names logs to read: it has no "
        "effect; leave it out, or unset data.path to train on generated logs"]
    assert _typed() is None  # no Hydra run here


def test_a_budget_in_steps_of_several_passes_over_click_logs_is_warned_about():
    """model=dlrm's 880 steps of 1,024 are one pass over the generated default's 900,000 lines, five over 180,000."""
    from types import SimpleNamespace

    from runner.budget import Budget
    from runner.notices import passes_warnings
    from runner.tasks.criteo.task import CriteoTask

    logs = SimpleNamespace(passes=CriteoTask.passes)
    assert passes_warnings(Budget(880, 1024, 180_000), logs) == [
        "warning: 880 steps of 1,024 = 5.0 epochs of 180,000 training examples (trainer.steps): more than 1.5 passes "
        "over these logs, and a second pass overfits (the test AUC falls); give the budget in passes for logs of "
        "this size: trainer.steps=null trainer.epochs=1"]
    assert passes_warnings(Budget(880, 1024, 900_000), logs) == []  # one pass
    assert passes_warnings(Budget(880, 1024, 180_000, "trainer.epochs=5"), logs) == []  # passes the user chose
    assert passes_warnings(Budget(880, 1024, 180_000), SimpleNamespace()) == []  # a task without the limit


@pytest.mark.parametrize("value", ["maybe", "2", ""])
def test_a_bad_native_kernel_switch_is_refused_at_start(monkeypatch, value):
    """``OPTIMIZERS_CPU_KERNELS`` takes 0/1 (false/true, no/yes, off/on): another value stops the run before
    anything compiles, naming the value and both ways out."""
    from runner.preflight import check_config

    monkeypatch.setenv("OPTIMIZERS_CPU_KERNELS", value)
    with pytest.raises(PreflightError) as e:
        check_config(compose_config([]))
    assert (f"OPTIMIZERS_CPU_KERNELS={value!r} is not 0 or 1 (false/true, no/yes, off/on also do): set it to 0 to "
            f"run the XLA ops instead of the native CPU kernels, or to 1 (or unset it) to use them") in str(e.value)
    for good in ("0", "1", "Off", " true "):
        monkeypatch.setenv("OPTIMIZERS_CPU_KERNELS", good)
        check_config(compose_config([]))
