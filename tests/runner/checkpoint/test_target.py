"""What a restore reads into (``runner/checkpoint/target.py``), on small abstract states: a table's
``weight_decay_mode=decoupled_global`` bookkeeping is found by the key entries of its path, so tables whose names
contain one another (``item`` and ``items``) or hold ``.decay.`` or a quote are each judged on their own arrays."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import pytest

from optimizers.row_update import EmbOptState, GlobalDecay
from runner.checkpoint.target import restore_target
from runner.errors import PreflightError

ROWS = 4


class State(NamedTuple):
    """The part of a ``TrainState`` the bookkeeping lives in."""

    emb_states: dict[str, Any]


def _state(names: list[str], decaying: set[str]) -> State:
    """Abstract optimizer state of ``names``, with ``decoupled_global`` bookkeeping for those in ``decaying``."""
    def leaf(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)
    return State({t: EmbOptState(rows=(leaf(ROWS, 2),), count=jax.ShapeDtypeStruct((), jnp.int32),
                                 decay=GlobalDecay(leaf(ROWS), leaf()) if t in decaying else None) for t in names})


def _meta(state: State) -> dict:
    """The ``arrays`` and ``tables`` records a checkpoint of ``state`` keeps (keys are ``keystr`` text)."""
    arrays = {jax.tree_util.keystr(p): {"shape": list(x.shape), "dtype": str(x.dtype), "rows": None}
              for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    return {"arrays": arrays, "tables": {t: {"vocab": ROWS, "rows": ROWS, "width": 2} for t in state.emb_states}}


def _restore(saved: State, now: State) -> State:
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree_util.tree_map(lambda _: one, now)
    return restore_target(_meta(saved), now, shardings, one, "ck/4")


def _refused(saved: State, now: State) -> list[str]:
    with pytest.raises(PreflightError) as e:
        _restore(saved, now)
    return [line for line in str(e.value).splitlines() if line.startswith("  - ")]


def _line(t: str, saved_with: bool) -> str:
    return (f"  - table '{t}' weight decay (optimizer.weight_decay_mode / table_optimizers.{t}.weight_decay_mode): "
            f"the checkpoint was saved {'with' if saved_with else 'without'} the decay bookkeeping of "
            f"weight_decay_mode=decoupled_global (with a weight_decay above 0), and this config "
            f"{'does not keep it' if saved_with else 'keeps it'}; resume with the mode it was saved with")


@pytest.mark.parametrize("names", [["item", "items"], ["user", "users_hist"], ["users_hist", "user"]])
def test_nested_names_are_judged_each_on_its_own_bookkeeping(names):
    short, long = sorted(names, key=len)
    assert _refused(_state(names, {long}), _state(names, {short})) == [_line(short, False), _line(long, True)]
    assert _refused(_state(names, {short}), _state(names, {long})) == [_line(short, True), _line(long, False)]
    assert _refused(_state(names, {short, long}), _state(names, {long})) == [_line(short, True)]
    for decaying in (set(), {short}, {long}, {short, long}):  # the same mode on both sides: restored as it is
        now = _state(names, decaying)
        assert jax.tree_util.tree_structure(_restore(_state(names, decaying), now)) == jax.tree_util.tree_structure(now)


@pytest.mark.parametrize("name", ["o'neil", 'say "hi"', "a.decay.b"])
def test_names_that_look_like_paths_are_only_names(name):
    """A quote changes how ``keystr`` quotes the name and ``.decay.`` looks like the bookkeeping's own path text;
    neither hides a change of mode or a missing array."""
    names = [name, "items"]
    assert _refused(_state(names, set()), _state(names, {name})) == [_line(name, False)]
    assert _refused(_state(names, {name}), _state(names, set())) == [_line(name, True)]
    missing = _refused(_state(["items"], set()), _state(names, set()))  # a table the checkpoint lacks
    assert any(line.startswith(f"  - array .emb_states[{name!r}].rows[0]: missing") for line in missing), missing
