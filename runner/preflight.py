"""Checks that run before anything compiles: a config that cannot work is refused with a message that
names the value and the fix, never with a traceback from deep inside the trainer."""
from __future__ import annotations

from typing import Any, Mapping

from optimizers import supports_async_emb
from optimizers.context import COLUMN, ROW
from optimizers.protocol import no_fused_update_message

from .core.mesh import MeshPlan


class PreflightError(ValueError):
    """A config that cannot work; the message says why and how to fix it."""


ASYNC_WAYS_OUT = (
    "Ways out: (1) pick a fused optimizer for this table, e.g. optimizer=async_adam, async_rowwise_adagrad, "
    "async_adagrad or async_sgd; (2) implement gradient_update_start and gradient_update_done on {cls} "
    "(see optimizers/protocol.py); (3) turn async off with async_emb=off."
)


def check_async(emb_optimizers: Mapping[str, Any], async_emb: bool) -> None:
    """With async on, every table's optimizer must implement the fused AsyncEmbOptimizer protocol."""
    if not async_emb:
        return
    for table, opt in emb_optimizers.items():
        if not supports_async_emb(opt):
            cls = type(opt).__name__
            raise PreflightError(
                f"{no_fused_update_message(opt)} (configured for embedding table '{table}').\n"
                + ASYNC_WAYS_OUT.format(cls=cls))


def _positive(errors: list, name: str, value: Any) -> None:
    if value is None or not value > 0:
        errors.append(f"{name}={value!r} must be positive")


def check_values(cfg: Any, emb_optimizers: Mapping[str, Any], table_names: list[str]) -> None:
    """Plain value checks; all problems are reported together, one line each."""
    errors: list[str] = []
    t = cfg.trainer
    for key in ("steps", "batch_size", "log_interval", "eval_interval", "eval_batches"):
        _positive(errors, f"trainer.{key}", t[key])
    _positive(errors, "dense_optimizer.learning_rate", cfg.dense_optimizer.learning_rate)
    if cfg.dense_optimizer.warmup_steps < 0:
        errors.append(f"dense_optimizer.warmup_steps={cfg.dense_optimizer.warmup_steps} must be >= 0")
    for table, opt in emb_optimizers.items():
        lr = getattr(opt, "learning_rate", 1.0)
        if not (isinstance(lr, (int, float)) and lr > 0):
            errors.append(f"learning_rate={lr!r} of {type(opt).__name__} (table '{table}') must be positive")
    unknown = sorted(set(cfg.table_optimizers) - set(table_names))
    if unknown:
        errors.append(f"table_optimizers names unknown table(s) {unknown}; tables are {sorted(table_names)}")
    if cfg.logger.kind not in ("wandb", "none"):
        errors.append(f"logger.kind={cfg.logger.kind!r}: use wandb or none")
    if cfg.logger.mode not in ("offline", "online", "disabled"):
        errors.append(f"logger.mode={cfg.logger.mode!r}: use offline, online or disabled")
    if cfg.mesh.table_layout not in (ROW, COLUMN):
        errors.append(f"mesh.table_layout={cfg.mesh.table_layout!r}: use row or column")
    for name, table in cfg.model.get("tables", {}).items():
        if table.dtype not in ("float32", "bfloat16"):
            errors.append(f"model.tables.{name}.dtype={table.dtype!r}: use float32 or bfloat16")
    if errors:
        raise PreflightError("invalid config:\n  - " + "\n  - ".join(errors))


def check_mesh(plan: MeshPlan, available: int, batch_size: int, tables: Mapping[str, Any],
               async_emb: bool, pad_vocab: bool) -> None:
    """The mesh can hold the run: devices exist, axes exist, the batch and the tables divide."""
    names = plan.axis_names
    where = f"mesh {plan.describe()}"
    if plan.table_axis is not None and plan.table_axis not in names:
        label = "async_emb axis" if async_emb else "mesh.table_axis"
        raise PreflightError(
            f"{label} {plan.table_axis!r} is not a mesh axis of {dict(plan.axes)}; set mesh.table_axis to one "
            f"of {list(names)} (or null to replicate the tables)")
    if plan.num_devices > available:
        raise PreflightError(
            f"{where} needs {plan.num_devices} devices but only {available} exist; shrink mesh.axes "
            f"(or on CPU set mesh.cpu_devices={plan.num_devices})")
    if batch_size % plan.num_devices:
        raise PreflightError(
            f"trainer.batch_size={batch_size} does not divide over the {plan.num_devices} devices of {where}; "
            f"use a multiple of {plan.num_devices}")
    n = plan.table_shards
    if n <= 1:
        return
    for name, spec in tables.items():
        if plan.layout == COLUMN and spec.width % n:
            raise PreflightError(
                f"table '{name}': emb_width={spec.width} does not shard evenly over the {n} '{plan.table_axis}' "
                f"shards of the column layout; use a width that is a multiple of {n} or mesh.table_layout=row")
        if plan.layout == ROW and spec.vocab % n and not pad_vocab:
            raise PreflightError(
                f"table '{name}': vocab={spec.vocab} rows do not divide over the {n} '{plan.table_axis}' shards "
                f"of the row layout; set mesh.pad_vocab=true (pads to {-(-spec.vocab // n) * n} rows) or use a "
                f"vocab that is a multiple of {n}")
