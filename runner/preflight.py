"""Checks that run before anything compiles: a config that cannot work is refused with a message that
names the value and the fix, never with a traceback from deep inside the trainer."""
from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import math
import netrc
import os
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from optimizers import Range, no_fused_update_message, problems, ranges, supports_async_emb
from optimizers.kernels.build import switch_problem
from optimizers.hparams import float32_problem

from . import config as schemas
from .core.mesh import MeshPlan
from .errors import PreflightError
from .hash_checks import check_hash_tables  # noqa: F401 (the hash tables' refusals)


ASYNC_WAYS_OUT = (
    "Ways out: (1) pick a fused optimizer for this table, e.g. {pick}=async_adam, async_rowwise_adagrad, "
    "async_adagrad or async_sgd; (2) implement gradient_update_start and gradient_update_done on {cls} "
    "(see optimizers/protocol.py); (3) turn async off with async_emb=off."
)


def check_async(emb_optimizers: Mapping[str, Any], async_emb: bool, keys: Mapping[str, str] | None = None) -> None:
    """With async on, every table's optimizer must implement the fused AsyncEmbOptimizer protocol. ``keys``: each
    table's optimizer setting (``optimizer``, or ``table_optimizers.<name>`` for one set per table)."""
    for table, opt in emb_optimizers.items() if async_emb else ():
        if not supports_async_emb(opt):
            key = (keys or {}).get(table, "optimizer")
            by, pick = ("", key) if key == "optimizer" else (f" by {key}", f"+optimizer@{key}")
            raise PreflightError(f"{no_fused_update_message(opt)} (configured for embedding table '{table}'{by}).\n"
                                 + ASYNC_WAYS_OUT.format(cls=type(opt).__name__, pick=pick))


def _raise(errors: list[str]) -> None:
    if errors:
        raise PreflightError("invalid config:\n  - " + "\n  - ".join(errors))


# ---- ranges declared beside the fields (runner/config.py, optimizers/*.py) ----------------------------

DATA_SCHEMAS = {"synthetic": schemas.SyntheticDataConfig, "movielens": schemas.MovieLensDataConfig,
                "synthetic_sequences": schemas.SyntheticSequencesDataConfig,
                **{n: c for g, n, c in schemas.task_schemas() if g == "data"}}
MODEL_SCHEMAS = {"ranking": schemas.RankingModelConfig, "sequential": schemas.SequentialModelConfig,
                 **{n: c for g, n, c in schemas.task_schemas() if g == "model"}}


def _bound(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(rng: Range) -> str:
    return f"{'(' if rng.low_open else '['}{_bound(rng.low)}, {_bound(rng.high)}{')' if rng.high_open else ']'}"


def section_problems(node: Any, schema: type, prefix: str) -> list[str]:
    """``<prefix><name>=<value> is outside <range> (<meaning>)`` for every field of ``schema`` declared with
    ``optimizers.hparams.hparam`` whose value in ``node`` is out of range (``None`` is fine for a field whose
    default is ``None``)."""
    out = []
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for name, rng in ranges(schema).items():
        if name not in node:
            continue
        value = node[name]
        if value is None and fields[name].default is None:
            continue
        if not rng.contains(value):
            out.append(f"{prefix}{name}={value!r} is outside {_range(rng)} ({fields[name].metadata['doc']})")
        elif fields[name].type in (float, "float") and (too_big := float32_problem(f"{prefix}{name}", value)):
            out.append(too_big)
    return out


def _positive_list(errors: list, key: str, values: Any, example: str, allow_empty: bool = False) -> None:
    values = list(values or [])
    bad = [v for v in values if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= schemas.MAX_WIDTH)]
    if bad or (not values and not allow_empty):
        errors.append(f"{key}={values} must list {'' if allow_empty else 'one or more '}integers in "
                      f"[1, {schemas.MAX_WIDTH}], e.g. {key}={example}")


WANDB_BAD_CHARS = set("/\\#?%:")


def wandb_key_source() -> str | None:
    """Where W&B would find an API key without asking (``WANDB_API_KEY``, or the netrc entry ``wandb login``
    writes for its host), or None. Read without importing wandb or reaching the network."""
    if os.environ.get("WANDB_API_KEY", "").strip():
        return "WANDB_API_KEY"
    base = os.environ.get("WANDB_BASE_URL")
    if not base:
        import wandb  # its default server (only asked in online mode: the import costs ~0.5 s)

        base = wandb.Settings().base_url
    host = urllib.parse.urlparse(base).hostname or ""
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if entry and entry[2] else None


def _wandb_online_problems(lg: Any) -> list[str]:
    if str(lg.kind) != "wandb" or str(lg.mode) != "online" or wandb_key_source() is not None:
        return []
    return ["logger.mode=online needs a W&B API key and none is configured (WANDB_API_KEY is unset and no netrc "
            "entry has one): set WANDB_API_KEY (or run `wandb login`), or use logger.mode=offline (the default; "
            "`wandb sync` uploads the run later) or logger=none"]


def _logger_problems(lg: Any) -> list[str]:
    errors = _wandb_online_problems(lg)
    if not isinstance(lg.project, str) or not lg.project.strip() or len(lg.project) > 128 \
            or WANDB_BAD_CHARS & set(lg.project):
        errors.append(f"logger.project={lg.project!r} must be a non-empty name of at most 128 characters "
                      f"without any of / \\ # ? % :")
    for key in ("entity", "group", "name"):
        v = lg.get(key)
        chars = " without any of / \\ # ? % :" if key == "entity" else ""  # a W&B entity is a path component
        if v is not None and (not str(v).strip() or len(str(v)) > 128 or chars and WANDB_BAD_CHARS & set(v)):
            errors.append(f"logger.{key}={v!r} must be null or a non-empty name of at most 128 characters{chars}")
    for tag in lg.tags or []:
        if not str(tag).strip() or len(str(tag)) > 64:
            errors.append(f"logger.tags has {tag!r}: each tag must be non-empty and at most 64 characters")
    return errors


def _async_problems(a: Any) -> list[str]:
    """Staleness and delay compensation are async mode's: with async off they would do nothing."""
    if a.enabled:
        return []
    out = []
    if int(a.staleness) != 1:
        out.append(f"async_emb.staleness={a.staleness} needs async mode (async_emb.enabled=false applies each "
                   f"step's update in its own step): use async_emb=on, or leave staleness at 1")
    if str(a.compensation) != str(schemas.Compensation.none):
        out.append(f"async_emb.compensation={a.compensation} corrects a deferred update for its delay, and with "
                   f"async_emb.enabled=false no update is deferred: use async_emb=on, or async_emb.compensation=none")
    return out


KWARGS_SECTIONS = ("optimizer", "table_optimizers")  # keyword arguments of their _target_, which checks them itself


def unknown_keys(node: Any, path: str = "") -> list[str]:
    """Keys of ``node`` (the composed config, or a section of it) that its schema does not declare: a ``+key=value``
    override adds one, and nothing would read it. Each named with the closest declared key. The optimizers'
    sections are left to their classes (a user's class takes keys the built-in schema does not have)."""
    kind = OmegaConf.get_type(node)
    out = []
    if dataclasses.is_dataclass(kind):
        known = [f.name for f in dataclasses.fields(kind)]
        for key in sorted(set(node.keys()) - set(known)):
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (or set {path}{near[0]}, the closest setting)" if near else ""
            out.append(f"{path}{key} is not a setting of {path.rstrip('.') or 'the config'} (added with +{path}{key}="
                       f"...), so nothing would read it: remove it{hint}; `runner --cfg job` lists the settings")
    for key in (k for k in node.keys() if path or k not in KWARGS_SECTIONS):
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            out += unknown_keys(child, f"{path}{key}.")
    return out


def check_config(cfg: DictConfig) -> None:
    """Every numeric setting against the range declared beside its field, lists and names, all problems at
    once; runs before any data is generated or read and before any device is created."""
    errors: list[str] = unknown_keys(cfg)
    errors += section_problems(cfg.trainer, schemas.TrainerConfig, "trainer.")
    errors += section_problems(cfg.dense_optimizer, schemas.DenseOptimizerConfig, "dense_optimizer.")
    errors += section_problems(cfg.mesh, schemas.MeshConfig, "mesh.")
    errors += section_problems(cfg.async_emb, schemas.AsyncEmbConfig, "async_emb.")
    errors += _async_problems(cfg.async_emb)
    if schemas.permute_ids_setting(cfg.mesh.get("permute_ids")) is None:
        errors.append(f"mesh.permute_ids={cfg.mesh.get('permute_ids')!r} is not one of {', '.join(schemas.PERMUTE_IDS)} "
                      f"(auto: permute the ids of row-sharded tables, resume a checkpoint in its own order)")
    model_schema = MODEL_SCHEMAS.get(cfg.model.get("name"))
    if model_schema is not None:
        errors += section_problems(cfg.model, model_schema, "model.")
    for name, table in (cfg.model.get("tables") or {}).items():
        errors += section_problems(table, schemas.TableConfig, f"model.tables.{name}.")
    if cfg.model.get("name") == "ranking":
        _positive_list(errors, "model.hidden", cfg.model.hidden, "[128,64]", allow_empty=True)
    for key, example in (("bottom", "[64]"), ("top", "[128,64]"), ("deep", "[128,64]")):
        if cfg.model.get("name") in ("dlrm", "dcn") and key in cfg.model:
            _positive_list(errors, f"model.{key}", cfg.model[key], example, allow_empty=True)
    data_schema = DATA_SCHEMAS.get(cfg.data.get("name"))
    if data_schema is not None:
        errors += section_problems(cfg.data, data_schema, "data.")
    if "ks" in cfg.data:
        _positive_list(errors, "data.ks", cfg.data.ks, "[10]")
    if cfg.data.get("name") == "synthetic":
        actions = [str(a) for a in cfg.data.actions or []]
        if not actions or len(set(actions)) != len(actions) or not all(a.strip() for a in actions):
            errors.append(f"data.actions={actions} must list one or more distinct non-empty action names, "
                          f"e.g. data.actions=[click,like,share]")
    errors += section_problems(cfg.logger, schemas.LoggerConfig, "logger.")
    errors += _logger_problems(cfg.logger)
    errors += [p for p in [switch_problem()] if p]  # the native CPU kernels' switch, in the environment
    _raise(errors)


def check_optimizers(default: Any, overrides: Mapping[str, Any]) -> None:
    """Each embedding optimizer's hyperparameters against the ranges its class declares
    (``optimizers.hparams``); a class that declares none still needs a finite positive learning_rate."""
    errors: list[str] = []
    for prefix, opt in [("optimizer.", default)] + [(f"table_optimizers.{n}.", o) for n, o in overrides.items()]:
        errors += problems(opt, prefix)
        if "learning_rate" not in ranges(opt) and hasattr(opt, "learning_rate"):
            lr = opt.learning_rate
            if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0):
                errors.append(f"{prefix}learning_rate={lr!r} is outside (0, inf) (step size of "
                              f"{type(opt).__name__}: a finite number > 0)")
    _raise(errors)


def check_warmups(configured: tuple[Any, Mapping[str, Any]], steps: int) -> None:
    """A learning-rate schedule whose warmup outlasts the run (``trainer.steps``, resolved) never reaches its
    learning rate: refused, naming the key. ``configured``: the default optimizer and the per-table ones."""
    default, overrides = configured
    errors = []
    for key, opt in [("optimizer", default)] + [(f"table_optimizers.{n}", o) for n, o in overrides.items()]:
        schedule = getattr(opt, "schedule", None)
        if getattr(schedule, "warms", False) and schedule.warmup_steps > steps:
            errors.append(f"{key}.schedule.warmup_steps={schedule.warmup_steps} is longer than the run "
                          f"(trainer.steps={steps}): the learning rate would never reach {key}.learning_rate; "
                          f"shorten the warmup or lengthen the run")
    _raise(errors)


REFERENCES = ("bayes", "popularity", "oracle")  # metrics of the data or a fixed scorer, not of the model
SUMMARY_KEYS = ("final/train_loss", "perf/examples_per_s")  # in a run's summary beside the task's metrics


def check_objective(objective: str | None, task: Any) -> None:
    """``trainer.objective`` must be a metric the task's evaluation reports (refused before compiling, not
    discovered as a NaN objective at the end)."""
    if objective is None:
        return
    names = list(task.metric_names())
    if objective not in names and objective not in SUMMARY_KEYS:
        raise PreflightError(
            f"trainer.objective={objective!r} is not a metric this run reports; use one of {', '.join(names)} "
            f"(or trainer.objective=null for the task's own, {task.objective})")
    if objective.split("/")[0] in REFERENCES:
        model = [n for n in names if n.split("/")[0] not in REFERENCES]
        raise PreflightError(
            f"trainer.objective={objective!r} is a reference the model is compared with (the same whatever it "
            f"learns), so a sweep would compare constants; use one of the model's: {', '.join(model)} (or "
            f"trainer.objective=null for the task's own, {task.objective})")


def check_selection(trainer: Any, task: Any) -> None:
    """Best-state selection and early stopping need a validation metric that every evaluation reports."""
    from .core.selection import selection_metric  # what they go by, whatever trainer.objective names

    objective = selection_metric(trainer.get("objective"), task)
    wanted = [f"trainer.{k}={trainer.get(k)}" for k in ("select_best", "early_stop_patience")
              if trainer.get(k) is not None and trainer.get(k) is not False]
    if wanted and objective not in list(task.metric_names()):
        raise PreflightError(
            f"{' and '.join(wanted)} select on a validation metric each evaluation reports (trainer.objective "
            f"when it is one, else the task's own), but {objective!r} is not an evaluation metric; set "
            f"trainer.objective to one of {', '.join(n for n in task.metric_names() if n.startswith('valid/'))}, "
            f"or drop {' and '.join(w.split('=')[0] for w in wanted)}")


def _accelerator_installed() -> bool:
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith(("jax-cuda", "jax-rocm", "libtpu", "jaxlib-cuda")):
            return True
    return False


def _cpu_only() -> bool:
    import jax

    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or ""
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not _accelerator_installed()


def check_devices(cfg: DictConfig, resolve: Any) -> None:
    """With ``mesh.cpu_devices`` on a CPU-only single-process run, before those devices are created (which
    takes long for many): the axes fit that many devices and the batch divides over them (``resolve``:
    ``runner.core.mesh.resolve_axes``). Without it the devices exist already and ``check_mesh`` checks."""
    B = cfg.trainer.batch_size
    axes = dict(cfg.mesh.axes)
    n = cfg.mesh.cpu_devices
    if not n or cfg.distributed.kind != "none" or not _cpu_only():
        return
    try:
        plan = resolve(axes, int(n))
    except ValueError as e:
        raise PreflightError(f"{e} (mesh.cpu_devices={n})") from None
    need = math.prod(s for _, s in plan)
    if need > n:
        raise PreflightError(f"mesh.axes={axes} needs {need} devices but mesh.cpu_devices={n}; set "
                             f"mesh.cpu_devices={need} or shrink mesh.axes")
    if B % need:
        raise PreflightError(
            f"trainer.batch_size={B} does not divide over the {need} devices of mesh.axes={axes} with "
            f"mesh.cpu_devices={n}; use a multiple of {need}")


def check_values(cfg: Any, emb_optimizers: Mapping[str, Any], table_names: list[str]) -> None:
    """Plain value checks; all problems are reported together, one line each. Settings that take one of a few
    words (logger.kind/mode, mesh.table_layout, a table's dtype) are Enum fields of the schemas
    (runner/config.py): a wrong word already fails when the config is composed, listing the valid ones."""
    errors: list[str] = []
    unknown = sorted(set(cfg.table_optimizers) - set(table_names))
    if unknown:
        errors.append(f"table_optimizers names unknown table(s) {unknown}; tables are {sorted(table_names)}")
    _raise(errors)


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
        cpu = (f" (or on CPU set mesh.cpu_devices={plan.num_devices})"
               if plan.num_devices <= schemas.MAX_CPU_DEVICES else "")
        raise PreflightError(f"{where} needs {plan.num_devices} devices but only {available} exist; shrink "
                             f"mesh.axes{cpu}")
    if batch_size % plan.num_devices:
        raise PreflightError(
            f"trainer.batch_size={batch_size} does not divide over the {plan.num_devices} devices of {where}; "
            f"use a multiple of {plan.num_devices}")
    n = plan.table_shards
    if n <= 1:
        return
    for name, spec in tables.items():
        if plan.layout.splits_width and spec.columns != spec.width:
            raise PreflightError(
                f"table '{name}': model.tables.{name}.stored_width={spec.columns} pads its {spec.width}-wide rows, "
                f"which the column layout splits over its shards; drop the stored_width or use mesh.table_layout=row")
        if plan.layout.splits_width and spec.width % n:
            raise PreflightError(
                f"table '{name}': emb_width={spec.width} does not shard evenly over the {n} '{plan.table_axis}' "
                f"shards of the column layout; use a width that is a multiple of {n} or mesh.table_layout=row")
        if plan.layout.splits_rows and spec.vocab % n and not pad_vocab:
            raise PreflightError(
                f"table '{name}': vocab={spec.vocab} rows do not divide over the {n} '{plan.table_axis}' shards "
                f"of the row layout; set mesh.pad_vocab=true (pads to {-(-spec.vocab // n) * n} rows) or use a "
                f"vocab that is a multiple of {n}")
