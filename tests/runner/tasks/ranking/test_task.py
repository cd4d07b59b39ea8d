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


def _one_label_batches(task, split: str, batches: int, batch_size: int) -> list[str]:
    """Reference: the actions whose labels over the split's first ``batches`` batches are all 0 or all 1."""
    labels = np.concatenate([task.data.batch(i, batch_size, split=split)["labels"] for i in range(batches)])
    return [a for k, a in enumerate(task.actions) if labels[:, k].min() == labels[:, k].max()]


def test_an_evaluation_too_small_for_an_auc_is_refused_naming_the_fewest_batches_that_hold_both_labels():
    from runner.errors import PreflightError

    with pytest.raises(PreflightError) as e:
        build(compose_config(["trainer.batch_size=8", "trainer.eval_batches=1"]))
    message = str(e.value)
    _, task, _ = build(compose_config(["trainer.batch_size=8", "trainer.eval_batches=40"]))
    split = next(s for s in ("valid", "test") if _one_label_batches(task, s, 1, 8))
    fewest = next(k for k in range(1, 41) if not any(_one_label_batches(task, s, k, 8) for s in ("valid", "test")))
    assert message == (f"trainer.eval_batches=1 x trainer.batch_size=8: the {split} split's 8 examples hold one label "
                       f"only of {', '.join(_one_label_batches(task, split, 1, 8))}, so its AUC is undefined: raise "
                       f"trainer.eval_batches to {fewest} or more (or trainer.batch_size)")
    assert fewest > 1
    _, task, _ = build(compose_config(["trainer.batch_size=8", f"trainer.eval_batches={fewest}"]))  # accepted
    got = task.evaluate(lambda state, b: b["probs"], None, lambda b: b, 8)
    assert all(np.isfinite(got[f"{s}/auc_{a}"]) for s in ("valid", "test") for a in task.actions)


@pytest.mark.slow
def test_an_action_too_rare_to_evaluate_is_named():
    _, task, _ = build(compose_config(["trainer.eval_batches=2"]))
    real = task.data.batch

    class NoShares:  # the generator with the last action never positive
        spec = task.data.spec

        def batch(self, *args, **kwargs):
            b = dict(real(*args, **kwargs))
            b["labels"] = b["labels"].copy()
            b["labels"][:, -1] = 0
            return b

    task.data = NoShares()
    assert task.undefined_auc(512) == (
        f"trainer.eval_batches=2 x trainer.batch_size=512: the valid split's 1,024 examples hold one label only of "
        f"{task.actions[-1]}, so its AUC is undefined, and it still is over 1,048,576 examples: the action is too rare "
        f"to evaluate; leave it out of data.actions")
