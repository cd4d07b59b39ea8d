"""Turn a composed config into the run's parts: mesh plan, tables, embedding optimizers, model, program.

Everything here is checked by ``runner.preflight`` before any JAX computation is compiled.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
from typing import Any, NamedTuple

import hydra
import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from optimizers import AsyncEmbContext, Schedule, ScheduleKind

from . import budget, padding, preflight
from . import config as schemas
from .checkpoint import meta as checkpoint_meta
from .checkpoint import rebucket as rebucket_lib
from .config import ROUTE_SAMPLE_BATCHES, TableConfig
from .core.dense_optimizer import DenseOptimizer
from .core.embeddings import TableSpec, stored_rows
from .core.hash_tables import HashSpec
from .core.mesh import MeshPlan, build_mesh, resolve_axes
from .core import stacking
from .core.step import TrainProgram
from .errors import PreflightError
from .tasks import make_task

log = logging.getLogger("runner")


def apply_cpu_devices(cfg: DictConfig) -> None:
    """``mesh.cpu_devices``: ask for that many virtual CPU devices, which only works before JAX starts."""
    n = cfg.mesh.cpu_devices
    if not n:
        return
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:
        pass  # the backend is already up (e.g. inside a test process that set it itself); checked below


def _instantiate(node: DictConfig, key: str) -> Any:
    """One optimizer from its config; a class that cannot be found or built is a PreflightError naming it."""
    if not isinstance(node, DictConfig) or not node.get("_target_"):
        group = "optimizer" if key == "optimizer" else f"optimizer@{key}"
        raise PreflightError(
            f"{key}={OmegaConf.to_container(node) if isinstance(node, DictConfig) else node!r} names no optimizer "
            f"class (_target_); pick one with +{group}=async_adam (or async_rowwise_adagrad, async_adagrad, "
            f"async_sgd, async_ftrl, adam, adagrad) or give {key}._target_=optimizers.AsyncAdam")
    schedule = node.get("schedule") if "schedule" in node else None
    node = _without_group_defaults(node, drop=("schedule",) if schedule is not None else ())
    try:
        return _with_schedule(hydra.utils.instantiate(node), schedule, key)
    except PreflightError:
        raise
    except Exception as e:  # noqa: BLE001 - InstantiationException, or whatever a user's __init__ raises
        cause = e.__cause__ or e
        reason = str(e).split(", set env var HYDRA_FULL_ERROR")[0].split("\nfull_key:")[0]
        if e.__cause__ is not None and str(cause) not in reason:
            reason += f" ({type(cause).__name__}: {cause})"
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        raise PreflightError(
            f"{key}._target_={target!r} cannot be built: {' '.join(reason.split())}. Fix {key}: a class path "
            f"such as optimizers.AsyncAdam (or optimizer=async_adam) and arguments its class accepts") from None


def _without_group_defaults(node: DictConfig, drop: tuple[str, ...] = ()) -> DictConfig:
    """``node`` without the fields its optimizer group brings at that group's defaults (e.g. ``eps``) that its
    ``_target_`` class does not take: ``optimizer=async_sgd optimizer._target_=mypkg.MySGD`` builds ``MySGD``
    with the values it has fields for. A field set to another value stays, and building the class names it.
    The fields ``drop`` (the schedule, built apart) are left out in any case."""
    group = OmegaConf.get_type(node)  # the schema of the option chosen: its defaults, not another optimizer's
    quiet = logging.getLogger("hydra.utils")  # get_class logs an ERROR of its own before it raises
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        params = inspect.signature(hydra.utils.get_class(node._target_)).parameters.values()
    except Exception:  # noqa: BLE001 - not a class, or not found: instantiate names the problem
        params = None
    finally:
        quiet.setLevel(level)
    takes_all = params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    taken = set(node) if takes_all else {"_target_", *(p.name for p in params)}
    defaults = {f.name: f.default for f in (dataclasses.fields(group) if dataclasses.is_dataclass(group) else ())
                if f.default is not dataclasses.MISSING}
    drop = (*drop, *(k for k in node if k not in taken and k in defaults and node[k] == defaults[k]))
    return OmegaConf.masked_copy(node, [k for k in node if k not in drop]) if drop else node


def _with_schedule(opt: Any, node: DictConfig | None, key: str) -> Any:
    """``opt`` with the learning-rate schedule ``node`` (an ``optimizers.Schedule``), if its class has a
    ``schedule`` field; a class without one runs at its constant rate, and asking it for another is refused."""
    if node is None:
        return opt
    schedule = Schedule(**{k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"})
    if dataclasses.is_dataclass(opt) and "schedule" in {f.name for f in dataclasses.fields(opt)}:
        return dataclasses.replace(opt, schedule=schedule)
    if schedule.kind is not ScheduleKind.constant:
        raise PreflightError(
            f"{key}.schedule.kind={schedule.kind.value}: {type(opt).__name__} has no learning-rate schedule (no "
            f"'schedule' field); use a fused optimizer (e.g. {key}=async_adam), give the class a schedule field "
            f"(optimizers.Schedule) and read RowContext.learning_rate in its rule, or set {key}.schedule.kind=constant")
    return opt


def configured_optimizers(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The default embedding optimizer and the per-table overrides, instantiated."""
    return (_instantiate(cfg.optimizer, "optimizer"),
            {name: _instantiate(c, f"table_optimizers.{name}") for name, c in cfg.table_optimizers.items()})


def emb_optimizers(cfg: DictConfig, table_names: list[str], configured: tuple | None = None) -> dict[str, Any]:
    """The default optimizer for every table, with per-table overrides from ``table_optimizers``."""
    default, overrides = configured or configured_optimizers(cfg)
    return {name: overrides.get(name, default) for name in table_names}


def over_the_run(opt: Any, steps: int) -> Any:
    """``opt`` with a schedule's ``decay_steps = 0`` read as the run's ``steps`` updates (``Schedule.over``)."""
    schedule = getattr(opt, "schedule", None)
    if dataclasses.is_dataclass(opt) and isinstance(schedule, Schedule):
        return dataclasses.replace(opt, schedule=schedule.over(steps))
    return opt


def permuted_tables(cfg: DictConfig, plan: MeshPlan | None, names: list[str]) -> dict[str, bool]:
    """Per table, whether its ids are permuted (``TableSpec.permute_ids``), from ``mesh.permute_ids``: true or
    false for every table; auto: as the checkpoint this run resumes records it (``meta.resumed_tables``; no key:
    an older checkpoint, unpermuted), else where its rows are split over several shards (the row layout on a
    table axis of more than one: hot Zipf ids would all land in the first shard), never on one device or the
    column layout (every shard holds every row, so it would only cost time). A resume whose order differs
    from a new run's is noted in one line."""
    setting = schemas.permute_ids_setting(cfg.mesh.permute_ids)
    if setting != "auto":
        return dict.fromkeys(names, setting == "true")
    split = plan is not None and plan.layout.splits_rows
    tables = cfg.model.get("tables") or {}
    fresh = {n: split and str((tables.get(n) or {}).get("kind", "dense")) == "dense"  # keyed kinds place ids by
             for n in names}  # their hash: never permuted
    resumed = checkpoint_meta.resumed_tables(cfg)
    if resumed is None:
        return fresh
    where, recorded = resumed
    out = {n: bool(recorded[n].get("permute_ids", False)) if isinstance(recorded.get(n), dict) else fresh[n]
           for n in names}
    kept = [n for n in names if out[n] != fresh[n]]
    if kept and jax.process_index() == 0:
        log.info("mesh.permute_ids=auto: resuming %s in the row order it was written in: the ids of %s are %s; a "
                 "new run on this mesh would %s", where, ", ".join(kept), "unpermuted" if split else "permuted",
                 "permute them to spread hot ids over the row shards" if split else "not permute them")
    return out


def table_specs(cfg: DictConfig, task: Any, plan: MeshPlan | None) -> dict[str, TableSpec]:
    """Each table's rows, width and tokens per example; rows padded so row shards divide evenly; ids permuted
    per ``permuted_tables``."""
    needs = task.tables()
    unknown = sorted(set(cfg.model.tables) - set(needs))
    if unknown:
        raise PreflightError(f"model.tables names {unknown}, which this data source does not use; "
                                       f"its tables are {sorted(needs)}")
    shards = plan.table_shards if plan is not None and plan.layout.splits_rows and cfg.mesh.pad_vocab else 1
    permuted = permuted_tables(cfg, plan, list(needs))
    resumed = checkpoint_meta.resumed_tables(cfg) if any(  # read once: hash tables follow the checkpoint's
        str((cfg.model.tables.get(n) or {}).get("kind", "dense")) == "hash" for n in needs) else None
    specs = {}
    for name, (id_range, tokens) in needs.items():
        t = cfg.model.tables.get(name) or OmegaConf.structured(TableConfig)
        kind = str(t.kind)
        if kind != "dense":
            parts = hash_partitions(plan, name, t, resumed)
            if kind == "hash" and t.capacity is not None and int(t.capacity) % parts:
                rebucket_lib.refuse_resumed_capacity(resumed, name, int(t.capacity), parts, t.get("partitions"))
            specs[name] = keyed_table(name, t, tokens, cfg.model.emb_width, shards, parts)
            continue
        if id_range is None:
            raise PreflightError(
                f"table '{name}' gets raw 64-bit ids from the data (data.raw_ids), which a dense table cannot index; "
                f"set model.tables.{name}.kind=hash with a capacity (slots, no collisions), or kind=modulo with a "
                f"vocab (hash(id) mod vocab - 1 rows: distinct ids may share a row)")
        vocab = t.vocab or id_range + 1
        if vocab < id_range + 1:
            raise PreflightError(
                f"model.tables.{name}.vocab={vocab} is too small: the data's {name} ids go up to {id_range}, so "
                f"the table needs >= {id_range + 1} rows (row 0 is padding); raise it or set it to null")
        specs[name] = TableSpec(name, vocab, t.width or cfg.model.emb_width, tokens,
                                rows=-(-vocab // shards) * shards, dtype=t.dtype, init_scale=t.init_scale,
                                permute_ids=permuted[name])
    return padding.stored_widths(cfg, plan, specs)


def hash_partitions(plan: MeshPlan | None, name: str, t: DictConfig,
                    resumed: tuple[str, dict[str, Any]] | None) -> int:
    """A hash table's partitions (``model.tables.<name>.partitions``): as set; else as the checkpoint this run
    resumes records them (``resumed``: ``meta.resumed_tables``; none recorded: 1) when this mesh's row shards can
    each hold whole ones; else the table shards of a row-sharded mesh (each shard holds one), 1 otherwise. A resume
    with another count than the checkpoint's places the ids again (``runner/checkpoint/rebucket.py``)."""
    if t.get("partitions") is not None:
        return int(t.partitions)
    shards = plan.table_shards if plan is not None and plan.layout.splits_rows else 1
    if resumed is not None and isinstance(resumed[1].get(name), dict):
        parts = int(resumed[1][name].get("partitions", 1))
        if parts % shards == 0:
            return parts
    return shards


def keyed_table(name: str, t: DictConfig, tokens: int, emb_width: int, shards: int, partitions: int = 1) -> TableSpec:
    """A table of kind hash or modulo: ids of any size (raw 64-bit ids, or the data's ids), no vocabulary."""
    width = t.width or emb_width
    if str(t.kind) == "modulo":
        if t.vocab is None:
            raise PreflightError(f"model.tables.{name}.kind=modulo needs model.tables.{name}.vocab (the rows ids "
                                 f"are hashed onto, incl. the padding row 0), e.g. model.tables.{name}.vocab=100001")
        return TableSpec(name, t.vocab, width, tokens, rows=-(-t.vocab // shards) * shards, dtype=t.dtype,
                         init_scale=t.init_scale, kind="modulo")
    if t.capacity is None:
        raise PreflightError(f"model.tables.{name}.kind=hash needs model.tables.{name}.capacity (the ids it holds "
                             f"at once), e.g. model.tables.{name}.capacity=100000")
    if t.vocab is not None:
        raise PreflightError(f"model.tables.{name}.vocab={t.vocab} is for dense and modulo tables; a hash table's "
                             f"size is model.tables.{name}.capacity: remove the vocab")
    if int(t.capacity) % partitions:
        raise PreflightError(f"model.tables.{name}.capacity={t.capacity} does not split into {partitions} equal "
                             f"partitions (model.tables.{name}.partitions, one or more a row shard): make the capacity "
                             f"a multiple of {partitions}, e.g. {-(-int(t.capacity) // partitions) * partitions}")
    spec = HashSpec(int(t.capacity), int(t.admit_after), str(t.evict), int(t.ttl), str(t.default), int(t.probes),
                    sketch_width=int(t.sketch_width), admit_window=int(t.admit_window), partitions=partitions)
    return TableSpec(name, spec.rows, width, tokens, rows=spec.rows, dtype=t.dtype, init_scale=t.init_scale,
                     kind="hash", hash=spec)


def optimizer_key(cfg: DictConfig, name: str) -> str:
    """The config key of table ``name``'s embedding optimizer (a stack's: its first member's)."""
    return f"table_optimizers.{name}" if name in cfg.table_optimizers else "optimizer"


def stack_tables(cfg: DictConfig, plan: MeshPlan, logical: dict[str, TableSpec],
                 opts: dict[str, Any]) -> tuple[stacking.Stacking, dict[str, TableSpec], dict[str, Any]]:
    """``model.stack_tables``: the physical tables (``runner.core.stacking.plan``: dense tables of one width,
    dtype, initial scale and optimizer share one), their optimizers, and the stacking; else the tables as they
    are. (The sequential model, which scores whole tables by row, has no such setting.)"""
    if not bool(cfg.model.get("stack_tables", False)):  # a model whose schema has no such field: never
        return stacking.identity(logical), logical, opts
    shards = plan.table_shards if plan.layout.splits_rows and cfg.mesh.pad_vocab else 1
    stacked, specs, physical_opts = stacking.plan(logical, opts, shards)
    if stacked.stacks:  # a stack's ids are permuted as the checkpoint resumed records it, or as a new run's
        permuted = permuted_tables(cfg, plan, list(stacked.stacks))
        specs = {n: dataclasses.replace(s, permute_ids=permuted[n]) if n in stacked.stacks else s
                 for n, s in specs.items()}
        if jax.process_index() == 0:
            for n, members in stacked.stacks.items():
                log.info("tables stacked: %s holds %s (%d tables, %s rows, width %d)", n, ", ".join(members),
                         len(members), f"{specs[n].vocab:,}", specs[n].width)
    return stacked, specs, physical_opts


def route_peaks(task: Any, model: Any, specs: dict[str, TableSpec], contexts: dict[str, AsyncEmbContext],
                batch_size: int, stacked: stacking.Stacking | None = None,
                logical: dict[str, TableSpec] | None = None) -> dict[str, int]:
    """Per routed table: the most distinct ids one device sends one row shard over the first
    ``ROUTE_SAMPLE_BATCHES`` train batches (their stored rows, split over the mesh as the step splits them);
    per sharded column table: the most distinct ids one device holds (what its exchange is sized from,
    ``AsyncEmbContext.slots_for``). Every process samples the same global batches, so all of them size their
    slots alike."""
    routed = {n for n, c in contexts.items() if c.per_device_record}
    if not routed:
        return {}
    peaks = dict.fromkeys(routed, 0)
    for step in range(ROUTE_SAMPLE_BATCHES):
        ids = model.table_ids({k: np.asarray(v) for k, v in task.batch(step, batch_size).items()})
        if stacked is not None and stacked.stacks:  # stacked tables: their ids side by side in the stack's rows
            dense = {n: np.asarray(x).astype(np.int32) for n, x in ids.items() if n in stacked.members}
            bad = {n: (x < 0) | (x >= logical[n].vocab) for n, x in dense.items()}
            ids = {**ids, **stacked.physical_ids(dense, bad)}
        for n in routed:
            spec, ctx = specs[n], contexts[n]
            raw = np.asarray(ids[n]).astype(np.int32)
            rows = np.asarray(stored_rows(spec, raw))
            rows = np.where((raw < 0) | (raw >= spec.vocab), ctx.stored_rows, rows)
            peaks[n] = max(peaks[n], ctx.layout.sample_peak(ctx, rows))
    return peaks


# Settings that no part of the train program reads (``build`` hands none of them to ``TrainProgram``; they
# steer the loop, the checkpoints and the logging), and those that reach it only as the step's arguments
# (``TrainProgram.run_args``: the dense schedule and which steps are logged). Runs in one process that differ
# only in them share one set of jitted functions (``TrainProgram.reuse_key``), each run with its own arguments:
# a resume, a relaunch or a sweep's trial over the dense learning rate traces and compiles nothing again.
OUTSIDE_THE_PROGRAM = ("checkpoint", "logger", "trainer.stop_after", "trainer.run_id", "trainer.progress",
                       "trainer.eval_interval", "trainer.data_workers", "distributed.dump_state")
STEP_ARGUMENTS = ("trainer.steps", "trainer.log_interval", "dense_optimizer.learning_rate",
                  "dense_optimizer.warmup_steps", "dense_optimizer.end_learning_rate_ratio")


def program_key(cfg: DictConfig, specs: dict[str, TableSpec], peaks: dict[str, int],
                opts: dict[str, Any] | None = None) -> str:
    """A digest of everything the train program is built from: the resolved config without
    ``OUTSIDE_THE_PROGRAM`` and ``STEP_ARGUMENTS``, the tables (sized from the data), the route peaks and the
    embedding optimizers as built (a schedule over the whole run depends on ``trainer.steps``)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    for path in OUTSIDE_THE_PROGRAM + STEP_ARGUMENTS:
        *parents, last = path.split(".")
        d = c
        for part in parents:
            d = d.get(part) or {}
        d.pop(last, None)
    material = (json.dumps(c, sort_keys=True, default=str) + repr(sorted(specs.items())) + repr(sorted(peaks.items()))
                + repr(sorted((opts or {}).items())))
    return hashlib.sha256(material.encode()).hexdigest()


def dc_lambda(cfg: DictConfig) -> float | None:
    """The tables' delay-compensation lambda (``async_emb.compensation=dc``, async only), else None."""
    a = cfg.async_emb
    if not a.enabled or str(a.compensation) != "dc":
        return None
    return float(a.dc_lambda)


def dense_optimizer(cfg: DictConfig) -> DenseOptimizer:
    d = cfg.dense_optimizer
    return DenseOptimizer(d.learning_rate, d.warmup_steps, int(cfg.trainer.steps),
                          d.learning_rate * d.end_learning_rate_ratio, d.b1, d.b2, d.weight_decay, d.clip_norm)


class RunParts(NamedTuple):
    """What ``build_run`` assembles: the program, the task, the mesh plan and the budget resolved for them."""

    program: TrainProgram
    task: Any
    plan: MeshPlan
    budget: budget.Budget


def build(cfg: DictConfig) -> tuple[TrainProgram, Any, MeshPlan]:
    """Validate, then assemble (program, task, mesh plan): ``build_run`` without the budget."""
    parts = build_run(cfg)
    return parts.program, parts.task, parts.plan


def build_run(cfg: DictConfig) -> RunParts:
    """Validate, then assemble the run's parts. Raises PreflightError before anything compiles.

    The budget is resolved once, here: ``trainer.steps`` (and a derived ``trainer.eval_interval``) are written
    into ``cfg`` for everything that reads the config, and the :class:`~runner.budget.Budget` (its epochs, the
    setting it came from) is passed on in the result."""
    preflight.check_config(cfg)  # every setting's range: before any data is generated or read
    budget.check(cfg.trainer)  # steps or epochs, not both
    configured = configured_optimizers(cfg)
    default, overrides = configured  # a schedule's decay_steps=0 is the run's length, filled in below
    preflight.check_optimizers(over_the_run(default, 1), {n: over_the_run(o, 1) for n, o in overrides.items()})
    preflight.check_devices(cfg, resolve_axes)  # before any device is created
    task = make_task(cfg)
    run_budget = budget.resolve(cfg, task)  # trainer.steps from trainer.epochs and the data size (and eval_interval)
    preflight.check_objective(cfg.trainer.objective, task)
    preflight.check_selection(cfg.trainer, task)
    names = list(task.tables())
    opts = {n: over_the_run(o, int(cfg.trainer.steps)) for n, o in emb_optimizers(cfg, names, configured).items()}
    preflight.check_warmups(configured, int(cfg.trainer.steps))
    preflight.check_values(cfg, opts, names)
    preflight.check_async(opts, cfg.async_emb.enabled, {n: optimizer_key(cfg, n) for n in opts})

    apply_cpu_devices(cfg)
    available = jax.device_count()
    try:
        axes = resolve_axes(cfg.mesh.axes, available)
    except ValueError as e:
        raise PreflightError(str(e)) from None
    plan = MeshPlan(axes, cfg.mesh.table_axis, cfg.mesh.table_layout, cfg.mesh.routing)
    logical = table_specs(cfg, task, plan)
    preflight.check_hash_tables(cfg, plan, logical)
    stacked, specs, opts = stack_tables(cfg, plan, logical, opts)
    preflight.check_mesh(plan, available, cfg.trainer.batch_size, specs, cfg.async_emb.enabled,
                         cfg.mesh.pad_vocab)

    mesh = build_mesh(plan)
    B = cfg.trainer.batch_size
    contexts = {n: AsyncEmbContext(s.rows, s.width, B * s.tokens_per_example, mesh=mesh, stored_width=s.columns,
                                   table_axis=plan.table_axis, table_layout=plan.table_layout, routing=plan.routing,
                                   route_capacity=float(cfg.mesh.route_capacity),
                                   route_overflow=cfg.mesh.route_overflow, dc_lambda=dc_lambda(cfg))
                for n, s in specs.items()}
    model = task.make_model(logical, cfg.model)
    peaks = route_peaks(task, model, specs, contexts, B, stacked, logical)
    contexts = {n: dataclasses.replace(c, route_peak=peaks.get(n)) for n, c in contexts.items()}
    program = TrainProgram(model, specs, contexts, opts, dense_optimizer(cfg), cfg.async_emb.enabled, mesh,
                           tuple(task.model_keys), detail_interval=int(cfg.trainer.log_interval),
                           detail_last=int(cfg.trainer.steps), reuse_key=program_key(cfg, specs, peaks, opts),
                           optimizer_keys={n: optimizer_key(cfg, stacked.stacks.get(n, (n,))[0]) for n in specs},
                           staleness=int(cfg.async_emb.staleness) if cfg.async_emb.enabled else 1,
                           logical=logical, stacking=stacked)
    return RunParts(program, task, plan, run_budget)
