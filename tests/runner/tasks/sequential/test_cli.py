"""`python -m runner` with the sequence sources: a run on the shipped synthetic sequences and one on a
MovieLens-format ratings.dat complete with the full-ranking summary; a bad data.path is a clean refusal."""
import json
import os
import subprocess
import sys

import pytest

from runner.tasks.sequential.synthetic import SequenceSpec, SequenceWorld, write_ratings_dat
from tests.runner.support import ROOT

SMALL = ["model=sequential", "model.emb_width=16", "model.num_blocks=1", "model.num_negatives=16",
         "trainer.batch_size=32", "trainer.steps=30", "trainer.log_interval=10", "trainer.eval_interval=20",
         "logger=none"]


def cli(tmp_path, *overrides, timeout=600):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return subprocess.run([sys.executable, "-m", "runner", *overrides, f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_synthetic_sequences_run_completes(tmp_path):
    proc = cli(tmp_path, "data=synthetic_sequences", "data.num_users=300", "data.num_items=100",
               "data.num_clusters=10", "data.max_len=16", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("valid/ndcg@10", "test/hr@10", "test/ndcg@10", "test/mrr", "popularity/test/ndcg@10",
                "oracle/test/ndcg@10"):
        assert 0 <= summary[key] <= 1, key
    log = (tmp_path / "runner.log").read_text()
    assert "popularity test  HR@10" in log and "oracle (Bayes-optimal) test" in log and "300 users" in log
    assert f"best valid/ndcg@10 {summary['best/valid/ndcg@10']:.4f} at step {summary['best/step']}" in log
    assert "best  test  HR@10" in log and "final test  HR@10" in log and "cold targets" in log


@pytest.mark.slow
def test_movielens_ratings_dat_run_completes(tmp_path):
    data = tmp_path / "ml"
    write_ratings_dat(SequenceWorld(SequenceSpec(num_users=200, num_items=80, num_clusters=8)).interactions(),
                      data / "ratings.dat")
    proc = cli(tmp_path / "run", "data=movielens", f"data.path={data}", "data.max_len=16", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test/hr@10"] >= 0 and "oracle/test/ndcg@10" not in summary  # no oracle for real data
    assert "200 users, 80 items" in (tmp_path / "run" / "runner.log").read_text()


@pytest.mark.slow
def test_bad_data_path_is_a_clean_refusal(tmp_path):
    proc = cli(tmp_path, "data=movielens", "model=sequential", "data.path=/nonexistent/ml-1m", timeout=120)
    assert proc.returncode == 2
    assert ("error: data.path='/nonexistent/ml-1m' cannot be used: interaction data not found: "
            "/nonexistent/ml-1m. Fix data.path") in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "metrics.jsonl").exists()
