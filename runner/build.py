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
from .config import TableConfig
from .core.embeddings import TableSpec
from .core.mesh import MeshPlan, build_mesh, resolve_axes
from .core.step import TrainProgram
from .tasks import make_task


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


def table_specs(cfg: DictConfig, task: Any, plan: MeshPlan | None) -> dict[str, TableSpec]:
    """Each table's rows, width and tokens per example; rows padded so row shards divide evenly."""
    needs = task.tables()
    unknown = sorted(set(cfg.model.tables) - set(needs))
    if unknown:
        raise preflight.PreflightError(f"model.tables names {unknown}, which this data source does not use; "
                                       f"its tables are {sorted(needs)}")
    shards = plan.table_shards if plan is not None and plan.layout == "row" and cfg.mesh.pad_vocab else 1
    specs = {}
    for name, (id_range, tokens) in needs.items():
        t = cfg.model.tables.get(name) or OmegaConf.structured(TableConfig)
        vocab = t.vocab or id_range + 1
        specs[name] = TableSpec(name, vocab, t.width or cfg.model.emb_width, tokens,
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


def build(cfg: DictConfig) -> tuple[TrainProgram, Any, MeshPlan]:
    """Validate, then assemble (program, task, mesh plan). Raises PreflightError before anything compiles."""
    task = make_task(cfg)
    names = list(task.tables())
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
    specs = table_specs(cfg, task, plan)
    preflight.check_mesh(plan, available, cfg.trainer.batch_size, specs, cfg.async_emb.enabled,
                         cfg.mesh.pad_vocab)

    mesh = build_mesh(plan)
    B = cfg.trainer.batch_size
    contexts = {n: AsyncEmbContext(s.rows, s.width, B * s.tokens_per_example, mesh=mesh,
                                   table_axis=plan.table_axis, layout=plan.layout) for n, s in specs.items()}
    model = task.make_model(specs, cfg.model)
    tx, schedule = dense_optimizer(cfg)
    program = TrainProgram(model, specs, contexts, opts, tx, schedule, cfg.async_emb.enabled, mesh,
                           tuple(task.model_keys), detail_interval=int(cfg.trainer.log_interval),
                           detail_last=int(cfg.trainer.steps))
    return program, task, plan
