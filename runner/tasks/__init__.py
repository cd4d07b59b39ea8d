"""Tasks: a data source, the model trained on it, and how it is evaluated.

The trainer core (``runner.core``) knows nothing of features or metrics; a :class:`Task` gives it what it
needs. A task is registered under the data source it reads (``data.name``) in :data:`TASKS`; adding one is
a package here with a ``task.py`` whose factory is decorated ``@TASKS.register("<data name>")``.

- ``ranking/``: multi-action ranking on the synthetic generator, per-action AUC against the Bayes limit.
- ``sequential/``: next-item prediction on MovieLens-style files or synthetic sequences, full ranking.
- ``criteo/``: click-through prediction on Criteo-format logs (real or generated), DLRM or DCNv2.

Each package's ``report.py`` declares what ``python -m runner.report`` shows of the task's runs
(:class:`ReportMetrics`); it imports nothing heavy, so a report never imports JAX or a task's data readers.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np
from omegaconf import DictConfig

from ..errors import PreflightError
from ..registry import Registry, UnknownName


@dataclasses.dataclass(frozen=True)
class ReportMetrics:
    """What ``python -m runner.report`` shows of a task's runs.

    Attributes:
        objective: the metric trials are ranked by unless ``--metric`` names another (the task's default
            objective, e.g. ``valid/auc_mean``).
        charted: a regular expression (case-insensitive) that the last part of a logged key matches when the
            key gets a panel of its own in the metrics chart, e.g. ``auc`` for ``valid/auc_click``.
        chart: what the chart shows, in its title and the report's text (``AUC``).
        chart_file: the chart's file in the report folder (``auc.png``).
        reference: the prefix of a reference metric: ``<reference><metric>`` is drawn as a dotted line on the
            ``<metric>`` panel, not as a panel of its own (``bayes/`` for ``bayes/valid/auc_mean``).
        reference_name: what the reference is called in the chart and the text (``Bayes-optimal``).
        not_charted: prefixes of keys that get no panel, e.g. another scorer's (``popularity/``) or the
            selected state's copy of each metric (``best/``).
    """

    objective: str
    charted: str
    chart: str
    chart_file: str
    reference: str
    reference_name: str
    not_charted: tuple[str, ...] = ()

    def is_charted(self, key: str) -> bool:
        """Whether ``key`` gets a panel: its last part matches ``charted`` and no ``not_charted`` prefix its start."""
        return (re.search(self.charted, key.rsplit("/", 1)[-1], re.IGNORECASE) is not None
                and not key.startswith(self.not_charted))


@runtime_checkable
class Task(Protocol):
    """What the train loop and step need from a task."""

    model_keys: tuple[str, ...]  # the batch keys the device needs
    objective: str  # the metric a sweep maximises, e.g. "eval/auc_mean"
    report: ReportMetrics  # what python -m runner.report shows of its runs (the package's report.py)

    def tables(self) -> dict[str, tuple[int, int]]:
        """The embedding tables: ``{name: (id_range, tokens_per_example)}``."""

    def make_model(self, specs: Mapping[str, Any], model_cfg: DictConfig) -> Any:
        """A model with ``table_ids(batch)`` (each table's raw ids, unmapped: the trainer counts, or under
        ``trainer.strict_ids`` refuses, every id outside ``[0, vocab)`` before any row is read), ``init(key)``,
        ``loss(params, embs, batch) -> (loss, outputs)`` and ``predict(params, embs, batch, tables)``;
        ``tables`` hold row i = id i (also under ``mesh.permute_ids``, whose stored rows are relabelled)."""

    def batch(self, step: int, batch_size: int, shard: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        """Rows ``[shard*B/n, (shard+1)*B/n)`` of step's global batch: host arrays, a pure function of
        (seed, step)."""

    def train_metrics(self, host_batch: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> dict[str, float]:
        """Metrics of a logged training batch, from the step's outputs."""

    def evaluate(self, predict: Callable, state: Any, put: Callable, batch_size: int) -> dict[str, float]:
        """Score the state on the task's evaluation data."""

    def summary_lines(self, summary: Mapping[str, Any]) -> list[str]:
        """What the run prints at the end."""


TASKS: Registry[Callable[[DictConfig], Task]] = Registry("task", "data.name")


# The package whose task module registers each data source. A run imports only its own (the sequential
# task's file readers import pyarrow, ~0.3 s a launch that a ranking run does not need); an unknown name
# imports them all, so its error lists every registered source. tests/runner/test_imports.py checks the map.
PACKAGES = {"synthetic": "ranking", "movielens": "sequential", "synthetic_sequences": "sequential",
            "criteo": "criteo"}
DEFAULT_DATA = "synthetic"  # conf/config.yaml's data default: what a run folder without its config ran


def import_tasks(name: str | None = None) -> None:
    """Register the task of data source ``name`` (every task when it is None or not in ``PACKAGES``)."""
    wanted = [PACKAGES[name]] if name in PACKAGES else sorted(set(PACKAGES.values()))
    for package in wanted:
        importlib.import_module(f"{__name__}.{package}.task")


def report_metrics(data_name: str | None) -> ReportMetrics:
    """What the report shows of a run of data source ``data_name`` (``DEFAULT_DATA``'s when it is None or
    unknown); imports only the task package's ``report.py``."""
    package = PACKAGES.get(data_name or DEFAULT_DATA, PACKAGES[DEFAULT_DATA])
    return importlib.import_module(f"{__name__}.{package}.report").REPORT


def refuse_own_widths(cfg: DictConfig, why: str) -> None:
    """For a model whose tables all share ``model.emb_width`` (``why``: what makes them), refuse a
    ``model.tables.<name>.width`` other than it, before any data is built."""
    widths = {n: int(t.width) for n, t in (cfg.model.get("tables") or {}).items()
              if t.get("width") is not None and int(t.width) != int(cfg.model.emb_width)}
    if widths:
        raise PreflightError(f"model.tables.<name>.width={widths}: model={cfg.model.name}'s tables all have "
                             f"model.emb_width={cfg.model.emb_width} ({why}); unset them, or set model.emb_width")


def make_task(cfg: DictConfig) -> Task:
    """The task registered for ``cfg.data.name``, built from the whole config."""
    import_tasks(cfg.data.name)
    try:
        factory = TASKS.get(cfg.data.name)
    except UnknownName as e:
        raise PreflightError(str(e)) from None
    return factory(cfg)
