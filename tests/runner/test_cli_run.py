"""`python -m runner` end to end in a subprocess: a W&B offline run, a metrics.jsonl whose loss goes down,
the summary; and the sharded mesh from the command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner.support import TINY

ROOT = Path(__file__).resolve().parents[2]


def run_cli(tmp_path, *overrides, env=None):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", **(env or {})}
    args = [*TINY, "logger=wandb"]  # the tiny run, with the default logger
    proc = subprocess.run([sys.executable, "-m", "runner", *args, f"hydra.run.dir={tmp_path}", *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def metrics(path: Path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_default_run_writes_wandb_and_metrics(tmp_path):
    proc = run_cli(tmp_path, "trainer.steps=60", "trainer.log_interval=10", "trainer.eval_interval=30",
                   "optimizer=async_adam", "logger=wandb")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    rows = [r for r in metrics(tmp_path) if "train/loss" in r]
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50, 60]
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    for key in ("emb/grad_norm", "emb/valid_step", "emb/unique_rows", "emb/stale_rows", "dense/grad_norm",
                "dense/learning_rate", "emb/learning_rate/items", "train/auc_click", "perf/examples_per_s",
                "perf/step_time_ms"):
        assert key in rows[-1], key
    assert any("valid/auc_mean" in r and "test/auc_mean" in r for r in metrics(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 60 and 0.5 < summary["bayes/test/auc_mean"] <= 1
    log = (tmp_path / "runner.log").read_text()  # hydra.job.name is `runner`
    assert "[jax." not in proc.stderr + log  # JAX's INFO lines stay out of the run's log (conf/config.yaml)
    assert "done: 60 steps" in log and "Bayes-optimal" in log
    assert f"outputs: {tmp_path} (metrics.jsonl, summary.json, wandb/)" in log


@pytest.mark.slow
def test_a_run_whose_cpu_kernels_cannot_be_built_says_why_once_and_trains(tmp_path):
    """No C++ compiler: one ``warning:`` line naming why and the fix (not Python's RuntimeWarning with its source
    line), and the run trains on the XLA ops; switched off on purpose, no line."""
    env = {"CXX": str(tmp_path / "no-such-compiler"), "OPTIMIZERS_KERNEL_CACHE": str(tmp_path / "kernels")}
    proc = run_cli(tmp_path / "run", "logger=none", env=env)
    log = (tmp_path / "run" / "runner.log").read_text()
    lines = [line for line in log.splitlines() if "native CPU kernels are off" in line]
    assert len(lines) == 1 and "warning: the fused update's native CPU kernels are off (building cpu.cc into" in lines[0]
    assert "no-such-compiler" in lines[0] and "OPTIMIZERS_CPU_KERNELS=0 turns them off" in lines[0]
    assert "RuntimeWarning" not in proc.stderr + log and '"status": "ok"' in (tmp_path / "run" / "summary.json").read_text()
    off = run_cli(tmp_path / "off", "logger=none", env={**env, "OPTIMIZERS_CPU_KERNELS": "0"})
    assert "kernels are off" not in off.stderr + (tmp_path / "off" / "runner.log").read_text()


def test_the_outputs_line_names_what_the_run_wrote():
    from omegaconf import OmegaConf

    from runner.app import outputs_line

    def line(**lg):
        return outputs_line(Path("out"), OmegaConf.create(lg))

    assert line(kind="wandb", mode="offline") == line(kind="wandb", mode="online") == (
        "outputs: out (metrics.jsonl, summary.json, wandb/)")
    assert line(kind="wandb", mode="disabled") == line(kind="none") == "outputs: out (metrics.jsonl, summary.json)"


@pytest.mark.slow
def test_sharded_mesh_from_the_command_line(tmp_path):
    run_cli(tmp_path, "mesh=data_table", "mesh.cpu_devices=8", "trainer.steps=6", "trainer.log_interval=3",
            "mesh.table_layout=column", "logger=none")
    rows = [r for r in metrics(tmp_path) if "train/loss" in r]
    assert rows and "emb/shard_rows_max/items" in rows[-1]
    assert rows[-1]["emb/shard_rows_max/items"] >= rows[-1]["emb/shard_rows_mean/items"] > 0


@pytest.mark.slow
def test_a_second_run_in_the_same_directory_sets_the_first_ones_record_aside(cfg_of, tmp_path, caplog):
    """Without checkpoints, a run started in a directory an earlier run wrote (hydra.run.dir given again) moves
    that run's metrics.jsonl and summary.json aside whole, and writes its own: no mixed series, nothing lost."""
    import json
    import logging

    from runner.app import run

    run(cfg_of(["trainer.steps=2", "trainer.log_interval=1"]), tmp_path)
    first = (tmp_path / "metrics.jsonl").read_text()
    (tmp_path / "wandb_run.json").write_text('{"id": "first"}')  # as a run with W&B (logger=wandb) leaves
    with caplog.at_level(logging.WARNING, logger="runner"):
        run(cfg_of(["trainer.steps=3", "trainer.log_interval=1", "trainer.seed=5"]), tmp_path)
    assert (tmp_path / "metrics.jsonl.before-restart").read_text() == first
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps[:3] == [1, 2, 3] and set(steps) == {1, 2, 3}  # this run's rows alone (step 3: train, final)
    assert json.loads((tmp_path / "summary.json.before-restart").read_text())["steps"] == 2
    # the record naming the earlier run's W&B run goes with them (this run, logger=none, writes none)
    assert (tmp_path / "wandb_run.json.before-restart").read_text() == '{"id": "first"}'
    assert not (tmp_path / "wandb_run.json").exists()
    assert any("already held an earlier run's metrics.jsonl, summary.json and wandb_run.json: moved to "
               "metrics.jsonl.before-restart, summary.json.before-restart, wandb_run.json.before-restart"
               in r.getMessage() for r in caplog.records)


def test_an_allocation_xla_cannot_make_mid_run_is_one_message_and_other_errors_are_not_dressed_as_one():
    import jax

    from runner.errors import out_of_memory

    oom = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2560000128 bytes.\n"
                                     "BufferAssignment OOM Debugging.")
    assert out_of_memory(oom) == (
        "out of memory: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2560000128 bytes. Lower "
        "trainer.batch_size, make the tables smaller (their vocab or capacity, model.emb_width, "
        "model.tables.<name>.dtype=bfloat16), pick an embedding optimizer with less state a row "
        "(optimizer=async_rowwise_adagrad keeps one number a row), or shard the tables over more devices "
        "(mesh=data_table)")
    assert out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: Error dispatching computation: Out of memory "
                                                    "allocating 2560000128 bytes.")) is not None
    assert out_of_memory(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes differ")) is None
    assert out_of_memory(MemoryError("Out of memory")) is None  # Python's own: not XLA's


@pytest.mark.slow
def test_an_out_of_memory_mid_run_ends_with_one_line_and_exit_code_1(tmp_path):
    """The memory checks before the run estimate; when XLA still cannot allocate mid-run (here: the run made to
    raise XLA's error), the command ends with one line naming the ways out, not Hydra's traceback."""
    script = ("import sys, jax, runner.app as app\n"
              "def run(*a, **k):\n"
              "    raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 5 "
              "bytes.')\n"
              "app.run = run\n"
              f"sys.argv = ['runner', 'debug=tiny', 'hydra.run.dir={tmp_path}']\n"
              "from runner.__main__ import entry\n"
              "entry()\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # as summary.json records a run that failed mid-way
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: out of memory: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 5 bytes. Lower "
        "trainer.batch_size, make the tables smaller (their vocab or capacity, model.emb_width, "
        "model.tables.<name>.dtype=bfloat16), pick an embedding optimizer with less state a row "
        "(optimizer=async_rowwise_adagrad keeps one number a row), or shard the tables over more devices "
        "(mesh=data_table)"]
