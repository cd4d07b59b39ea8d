"""The ranking task's evaluation: a validation split (selected and tuned on) and a test split (reported),
each scored on its own fixed batches beside the Bayes-optimal AUC of its own labels."""
import numpy as np
import pytest

from runner.build import build
from runner.tasks.ranking.auc import auc
from tests.runner.support import compose_config


def test_valid_and_test_are_scored_on_their_own_labels_each_beside_its_bayes_auc():
    _, task, _ = build(compose_config(["trainer.eval_batches=2"]))
    assert task.objective == "valid/auc_mean"
    B = 64
    got = task.evaluate(lambda state, b: b["probs"], None, lambda b: b, B)  # the true probabilities
    assert sorted(got) == sorted(task.metric_names())
    for split in ("valid", "test"):
        # reference: the same batches drawn straight from the generator
        bs = [task.data.batch(i, B, split=split) for i in range(2)]
        labels, probs = (np.concatenate([b[k] for b in bs]) for k in ("labels", "probs"))
        for k, a in enumerate(task.actions):
            assert got[f"{split}/auc_{a}"] == pytest.approx(auc(labels[:, k], probs[:, k]))
            assert got[f"bayes/{split}/auc_{a}"] == got[f"{split}/auc_{a}"]
    assert got["valid/auc_mean"] != got["test/auc_mean"]  # other labels
    # a constant score: AUC 0.5 on both splits, the Bayes-optimal AUC unchanged
    flat = task.evaluate(lambda state, b: np.full(b["probs"].shape, 0.5), None, lambda b: b, B)
    for split in ("valid", "test"):
        assert flat[f"{split}/auc_mean"] == 0.5
        assert flat[f"bayes/{split}/auc_mean"] == got[f"bayes/{split}/auc_mean"]


def test_summary_names_the_test_split_and_its_fraction_of_the_bayes_auc():
    _, task, _ = build(compose_config())
    s = {f"{p}{split}/auc_{a}": v for p, v in (("", 0.8), ("bayes/", 0.85)) for split in ("valid", "test")
         for a in (*task.actions, "mean")}
    s["test/auc_mean"] = 0.81
    (line,) = task.summary_lines(s)
    assert line.startswith("test  AUC 0.8100 (Bayes-optimal 0.8500: 0.9529 of it)   (valid AUC 0.8000 "
                           "(Bayes-optimal 0.8500: 0.9412 of it)); per action model/Bayes on test: click=0.800/0.850")
    best = {**s, **{f"best/{k}": v for k, v in s.items()}, "best/step": 3, "selected_on": "valid/auc_mean"}
    lines = task.summary_lines(best)
    assert lines[0].startswith("best  test  AUC 0.8100") and lines[0].endswith("step 3, selected on valid/auc_mean)")
    assert lines[1].startswith("final test  AUC 0.8100")
