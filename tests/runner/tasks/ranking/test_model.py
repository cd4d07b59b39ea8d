"""The ranking model hands the trainer raw ids: an id outside a table's ``[0, vocab)`` is counted in
``emb/dropped_ids/<table>`` and refused under ``trainer.strict_ids``, never mapped onto a real row."""
import jax.numpy as jnp
import numpy as np
import pytest

from runner.build import build
from runner.core import loop
from runner.errors import TrainingError
from tests.runner.core.test_health import BadIds, Recorder
from tests.runner.support import compose_config

BAD_USERS = (-1, 301, 1_000_000)  # debug=tiny: 300 users, so the users table has vocab 301


class BadUsers(BadIds):
    """The ranking task with the first users of every batch replaced by ``BAD_USERS``."""

    key = "user"

    def put(self, ids):
        ids[:len(BAD_USERS)] = BAD_USERS


def test_table_ids_are_the_raw_ids_and_out_of_range_ones_are_masked():
    program, task, _ = build(compose_config())
    vocab = program.tables["users"].vocab
    assert vocab == 301
    b = BadUsers(task).batch(0, 32)
    raw = np.asarray(program.model.table_ids({k: jnp.asarray(v) for k, v in b.items()})["users"])[:, 0]
    np.testing.assert_array_equal(raw, b["user"])  # no hash, no modulo: the ids as the data has them
    rows, bad = program.table_ids({k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_array_equal(np.asarray(bad["users"])[:, 0], [True] * 3 + [False] * 29)
    # they read the out-of-range row (zeros), never a real row such as 299, 1 or 100
    assert (np.asarray(rows["users"])[:3, 0] == program.contexts["users"].stored_rows).all()
    for name in ("items", "authors"):
        assert not np.asarray(bad[name]).any()


@pytest.mark.slow
def test_out_of_range_user_ids_are_counted_and_refused_under_strict_ids():
    cfg = compose_config(["trainer.steps=2", "trainer.log_interval=1", "trainer.strict_ids=true"])
    program, task, _ = build(cfg)
    tracker = Recorder()
    with pytest.raises(TrainingError) as info:
        loop.train(program, BadUsers(task), cfg.trainer, tracker, log=lambda *a: None)
    assert str(info.value).startswith(
        "table 'users' got id -1 in the batch of step 1, outside its vocab [0, 301) (3 such ids in that batch; "
        "trainer.strict_ids=true stops on them). Fix the data's ids, raise model.tables.users.vocab")
    row = tracker.rows[0]
    assert (row["step"], row["emb/dropped_ids/users"], row["emb/dropped_ids/items"]) == (1, 3, 0)
