"""Helpers shared by the runner tests: compose a config (shrunk by the ``debug`` config group) and run a
built program for a few steps. The shrinking itself lives in ``conf/debug/`` so the command line has it too."""
from __future__ import annotations

import copy
from pathlib import Path

import jax
import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from omegaconf import DictConfig, OmegaConf

from runner.config import register
from runner.core.loop import to_device

ROOT = Path(__file__).resolve().parents[2]  # the repository
CONF = ROOT / "conf"
TINY = ["debug=tiny"]  # conf/debug/tiny.yaml: tiny ranking data and model, 6 steps, logger=none
TINY_SEQUENCES = ["debug=tiny_sequences"]  # conf/debug/tiny_sequences.yaml: 200 steps on a small world


_COMPOSED: dict[tuple[str, ...], DictConfig] = {}


def hydra_compose(key: tuple[str, ...]) -> DictConfig:
    """Hydra's own compose of the whole list (once per process; callers copy it before changing it)."""
    if key not in _COMPOSED:
        register()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
            _COMPOSED[key] = compose("config", overrides=list(key))
    return _COMPOSED[key]


def compose_config(overrides=(), tiny: bool = True) -> DictConfig:
    """The config ``python -m runner <overrides>`` composes (with ``debug=tiny`` first unless ``tiny=False``).

    Hydra's compose costs 0.15-0.3 s, and the suite composes a few hundred lists, most of them the same
    config choices with other values. So the choices (group overrides, ``+``/``~``, ``hydra.*``) are composed
    by Hydra once per process, and each plain ``key.path=value`` is then applied as Hydra applies it after
    composing (``OmegaConf.update(cfg, key, parsed value, merge=True)`` on the typed, struct config: the same
    parsing and type checks; tests/runner/test_config.py compares the two). A list whose values do not apply
    that way is composed whole by Hydra, so its error is Hydra's. Every caller gets its own deep copy."""
    key = tuple(TINY if tiny else []) + tuple(str(o) for o in overrides)
    parsed = OverridesParser.create().parse_overrides(list(key))
    values = [o for o in parsed if o.type == OverrideType.CHANGE and o.package is None and not o.is_sweep_override()
              and "." in o.key_or_group and not o.key_or_group.startswith("hydra.")]
    choices = tuple(o.input_line for o in parsed if o not in values)
    cfg = copy.deepcopy(hydra_compose(choices))
    try:
        for o in values:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    except Exception:  # noqa: BLE001 - Hydra composes it again and raises its own error
        return copy.deepcopy(hydra_compose(key))
    return cfg


# The same shrink as explicit overrides, for a data source or model the debug option cannot be composed with.
SEQ_MODEL = ["model=sequential", "model.emb_width=16", "model.num_blocks=1", "model.num_negatives=32"]
SEQ_TRAIN = ["logger=none", "trainer.batch_size=64", "trainer.steps=200", "trainer.log_interval=50",
             "trainer.eval_interval=100"]


def seq_config(*overrides, data=None, model=None):
    """The tiny synthetic-sequences run (``debug=tiny_sequences``) with ``overrides`` on top; with another
    ``data`` source or ``model`` (lists of overrides), that source or model with the same trainer shrink."""
    if data is None and model is None:
        return compose_config(TINY_SEQUENCES + list(overrides), tiny=False)
    data = ["data=synthetic_sequences"] if data is None else list(data)
    return compose_config(data + list(SEQ_MODEL if model is None else model) + SEQ_TRAIN + list(overrides),
                          tiny=False)


def numpy_tree(tree):
    return jax.tree.map(lambda a: np.array(a), tree)


def id_rows(spec, array) -> np.ndarray:
    """The first ``spec.vocab`` rows of a stored table or per-row state leaf in id order (row i holds id i): as
    stored, or under ``spec.permute_ids`` (``mesh.permute_ids``: the default on a row-sharded mesh) its rows
    picked with ``optimizers.permute_ids``, for comparison with a one-device unpermuted run."""
    from optimizers import permute_ids

    a = np.asarray(array)
    if not spec.permute_ids:
        return a[: spec.vocab]
    return a[np.asarray(permute_ids(np.arange(spec.vocab, dtype=np.int32), spec.vocab))]


def batch_size(program) -> int:
    name = next(iter(program.tables))  # any table: its update record holds batch x tokens per example ids
    return program.contexts[name].tokens_per_batch // program.tables[name].tokens_per_example


def jitted(program, data):
    """(step, flush, predict) of ``program``, jitted for its train batch (as the train loop compiles them)."""
    return program.compile(program.init_state(0), to_device(program, data.batch(0, batch_size(program))))


def run_steps(program, data, steps, flush=True):
    """Init, then ``steps`` jitted steps (and the flush); returns (initial state as numpy, final state,
    per-step losses, per-step metrics)."""
    B = batch_size(program)
    state = program.init_state(0)
    state0 = numpy_tree(state)
    step, flush_fn, _ = program.compile(state, to_device(program, data.batch(0, B)))
    losses, metrics = [], []
    for t in range(steps):
        state, m = step(state, to_device(program, data.batch(t, B)))
        losses.append(float(m["train/loss"]))
        metrics.append(jax.device_get(m))
    return state0, (flush_fn(state) if flush else state), losses, metrics
