"""Turn a composed config into the run's parts: mesh plan, tables, embedding optimizers, model, program.

Everything here is checked by ``runner.preflight`` before any JAX computation is compiled.
"""
from __future__ import annotations

from typing import Any

import hydra
import jax
import optax
from omegaconf import DictConfig, OmegaConf

from optimizers import AsyncEmbContext

from . import preflight
from .data import SyntheticRanking, SyntheticSpec
from .embeddings import TableSpec
from .mesh import MeshPlan, build_mesh, resolve_axes
from .model import RankingModel
from .step import TrainProgram


def apply_cpu_devices(cfg: DictConfig) -> None:
    """``mesh.cpu_devices``: ask for that many virtual CPU devices, which only works before JAX starts."""
    n = cfg.mesh.cpu_devices
    if not n:
        return
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:
        pass  # the backend is already up (e.g. inside a test process that set it itself); checked below


def emb_optimizers(cfg: DictConfig, table_names: list[str]) -> dict[str, Any]:
    """The default optimizer for every table, with per-table overrides from ``table_optimizers``."""
    default = hydra.utils.instantiate(cfg.optimizer)
    overrides = {name: hydra.utils.instantiate(c) for name, c in cfg.table_optimizers.items()}
    return {name: overrides.get(name, default) for name in table_names}


def data_source(cfg: DictConfig) -> SyntheticRanking:
    d = OmegaConf.to_container(cfg.data, resolve=True)
    d.pop("name")
    d["actions"] = tuple(d["actions"])
    return SyntheticRanking(SyntheticSpec(**d))


def table_specs(cfg: DictConfig, data: SyntheticRanking, plan: MeshPlan | None) -> dict[str, TableSpec]:
    id_range = {"users": data.spec.num_users, "items": data.spec.num_items, "authors": data.spec.num_authors}
    tokens = {"users": 1, "items": data.spec.history_len + 1, "authors": data.spec.history_len + 1}
    shards = plan.table_shards if plan is not None and plan.layout == "row" and cfg.mesh.pad_vocab else 1
    specs = {}
    for name, t in cfg.model.tables.items():
        vocab = t.vocab or id_range[name] + 1
        specs[name] = TableSpec(name, vocab, t.width or cfg.model.emb_width, tokens[name],
                                rows=-(-vocab // shards) * shards, dtype=t.dtype, init_scale=t.init_scale)
    return specs


def dense_optimizer(cfg: DictConfig):
    d, steps = cfg.dense_optimizer, cfg.trainer.steps
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, d.learning_rate, max(d.warmup_steps, 1), max(steps, d.warmup_steps + 1),
        end_value=d.learning_rate * d.end_learning_rate_ratio)
    tx = optax.chain(optax.clip_by_global_norm(d.clip_norm),
                     optax.adamw(schedule, d.b1, d.b2, weight_decay=d.weight_decay))
    return tx, schedule


def build(cfg: DictConfig) -> tuple[TrainProgram, SyntheticRanking, MeshPlan]:
    """Validate, then assemble. Raises PreflightError before anything compiles."""
    data = data_source(cfg)
    names = list(cfg.model.tables)
    opts = emb_optimizers(cfg, names)
    preflight.check_values(cfg, opts, names)
    preflight.check_async(opts, cfg.async_emb.enabled)

    apply_cpu_devices(cfg)
    available = jax.device_count()
    try:
        axes = resolve_axes(cfg.mesh.axes, available)
    except ValueError as e:
        raise preflight.PreflightError(str(e)) from None
    plan = MeshPlan(axes, cfg.mesh.table_axis, cfg.mesh.table_layout)
    specs = table_specs(cfg, data, plan)
    preflight.check_mesh(plan, available, cfg.trainer.batch_size, specs, cfg.async_emb.enabled,
                         cfg.mesh.pad_vocab)

    mesh = build_mesh(plan)
    B = cfg.trainer.batch_size
    contexts = {n: AsyncEmbContext(s.rows, s.width, B * s.tokens_per_example, mesh=mesh,
                                   table_axis=plan.table_axis, layout=plan.layout) for n, s in specs.items()}
    model = RankingModel(specs, tuple(cfg.data.actions), tuple(cfg.model.hidden))
    tx, schedule = dense_optimizer(cfg)
    program = TrainProgram(model, specs, contexts, opts, tx, schedule, cfg.async_emb.enabled, mesh)
    return program, data, plan
