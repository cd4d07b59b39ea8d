"""Warnings a run prints when it starts and then goes on: a setting that works but costs the user something
they may not expect (each line starts with ``warning:``; ``runner.app`` prints them after the config and
budget lines). Refusals are ``runner.preflight``'s."""
from __future__ import annotations

from typing import Any, Mapping

from optimizers import OptaxEmbOptimizer, TableLayout

from .config import MeshConfig
from .core.embeddings import LANES as TPU_LANES


def rounding_warnings(emb_optimizers: Mapping[str, Any], tables: Mapping[str, Any]) -> list[str]:
    """Lines (each starting with ``warning:``) for each bfloat16 table a plain optax optimizer updates: it writes
    the rows back rounded to nearest, so every update below half a bfloat16 step is lost. ``tables``: each
    table's spec (its ``dtype``)."""
    out = []
    for name, opt in emb_optimizers.items():
        if isinstance(opt, OptaxEmbOptimizer) and str(tables[name].dtype) == "bfloat16":
            out.append(
                f"warning: table '{name}' is stored in bfloat16 (model.tables.{name}.dtype) and its optimizer "
                f"{type(opt).__name__} (plain optax over the whole table) writes every row back rounded to nearest: "
                f"an update smaller than half a bfloat16 step (2**-8 of the value's power of two, 0.2-0.4% of the "
                f"value) is lost and the row does not move. The fused optimizers (e.g. optimizer=async_adam) write "
                f"bfloat16 rows with stochastic rounding, so such updates still move them on average; or keep this "
                f"table in float32 (model.tables.{name}.dtype=float32)")
    return out


def hash_count_warnings(emb_optimizers: Mapping[str, Any], tables: Mapping[str, Any]) -> list[str]:
    """A line (starting with ``warning:``) per plain optax optimizer that updates hash tables and keeps state for
    the whole table, not per row (Adam's step count): a slot given to a new id resets the row and its per-row state
    (``hash_rows.reset_rows``) but not that, so the new id's row is updated as one trained since step 0 (Adam
    bias-corrects it by the table's count; docs/guide/hash_tables.md measures it). ``tables``: each table's spec
    (its ``kind``). Optimizers whose state is all per row (Adagrad's sums) start a new id's row afresh: no line."""
    import jax  # noqa: PLC0415 - only the shapes of the state, no array is made
    from optimizers import Adam  # noqa: PLC0415

    hashed: dict[tuple[str, str, bool], list[str]] = {}
    for name, opt in sorted(emb_optimizers.items()):
        if not isinstance(opt, OptaxEmbOptimizer) or tables[name].kind != "hash":
            continue
        two, three = (jax.tree_util.tree_flatten_with_path(jax.eval_shape(lambda r=r: opt.init(r, 1)))[0]
                      for r in (2, 3))
        whole = [_leaf_name(path) for (path, a), (_, b) in zip(two, three) if a.shape[:1] == b.shape[:1]]
        if whole:
            hashed.setdefault((type(opt).__name__, ", ".join(whole), isinstance(opt, Adam)), []).append(name)
    out = []
    for (cls, whole, adam), names in hashed.items():
        listed = ", ".join(f"'{n}'" for n in names)
        effect = ("so Adam bias-corrects the new id's row by the table's count, as a row trained since step 0: late "
                  "in a run its first updates are up to 6.6x a fresh row's with the default b1 and b2" if adam else
                  "so the new id's row is updated as one trained since step 0, not as a fresh row")
        out.append(
            f"warning: hash table{'s' * (len(names) > 1)} {listed} {'are' if len(names) > 1 else 'is'} updated by "
            f"{cls} (plain optax over the whole table), which keeps its state's {whole} for the whole table, not per "
            f"row: a slot given to a new id resets its row and its per-row state but not that, {effect} "
            f"(docs/guide/hash_tables.md). The fused optimizers keep it per row: optimizer=async_adam counts each "
            f"row's own updates (bias_correction=per_row, its default)")
    return out


def _leaf_name(path: tuple) -> str:
    """The last key of an optax state leaf's path (``count`` of ``ScaleByAdamState.count``)."""
    last = path[-1] if path else None
    return str(getattr(last, "name", getattr(last, "key", getattr(last, "idx", "state"))))


TPU_WARN_ROWS = 1_000_000  # below this a whole-table copy costs little next to the rest of a step


def layout_warnings(tables: Mapping[str, Any], backend: str) -> list[str]:
    """Lines (each starting with ``warning:``) for each large table whose width is not a multiple of 128 when the
    run's ``backend`` is a TPU: XLA may store it with its rows along the 128 lanes and copy it whole around every
    step's row gather and scatter, so the step's cost grows with the table (docs/results/tpu.md: width 64 at 10M
    rows 30.8 ms a step, width 128 4.7 ms). ``tables``: each table's spec (``rows``, ``width``)."""
    if backend != "tpu":
        return []
    out = []
    for name, spec in tables.items():
        if getattr(spec, "columns", spec.width) % TPU_LANES and spec.rows >= TPU_WARN_ROWS:
            wider = -(-spec.width // TPU_LANES) * TPU_LANES
            out.append(
                f"warning: table '{name}' is {spec.rows:,} rows x {spec.width} on a TPU: XLA stores a table whose "
                f"width is not a multiple of {TPU_LANES} with its rows along the lanes and may copy it whole around "
                f"every step's row gather and scatter, so a step's cost grows with the table (widths 64, 96 and 192 "
                f"did; docs/results/tpu.md). Storing its rows {wider} wide keeps the step's cost to the rows it touches: "
                f"set model.tables.{name}.stored_width={wider} (padding: the model still sees {spec.width} columns), or "
                f"the width itself (model.emb_width={wider}, or model.tables.{name}.width)")
    return out


def staleness_warnings(staleness: int, steps: int, source: str = "trainer.steps") -> list[str]:
    """A line (starting with ``warning:``) when an async run's staleness k is at least its steps: step t applies
    step t-k's embedding update, so none is applied while it trains and the final flush applies them all."""
    if staleness < 2 or staleness < steps:
        return []
    return [f"warning: async_emb.staleness={staleness} and the run has {steps:,} steps ({source}): step t applies "
            f"the embedding update of step t-{staleness}, so no update reaches the tables while the run trains (the "
            f"final flush applies them all, after the last step); lower async_emb.staleness (1, the default, "
            f"defers each by one step) or train for more than {staleness} steps"]


def passes_warnings(budget: Any, task: Any) -> list[str]:
    """A line (starting with ``warning:``) when a budget given in steps makes more passes over the training data
    than the task's model should see (``task.passes``: click logs' DLRM and DCN overfit a second pass); a budget
    given in passes (``trainer.epochs``) is the user's own choice."""
    limit = getattr(task, "passes", None)
    if limit is None or budget.epochs is None or budget.epochs <= limit or budget.source != "trainer.steps":
        return []
    return [f"warning: {budget.describe()}: more than {limit:g} passes over these logs, and a second pass overfits "
            f"(the test AUC falls); give the budget in passes for logs of this size: trainer.steps=null "
            f"trainer.epochs=1"]


def kernel_warnings(backend: str, devices: int) -> list[str]:
    """A line (starting with ``warning:``) when a one-device CPU run cannot use the fused update's native CPU
    kernels (``optimizers.kernels``: no C++ compiler, no FFI headers in jaxlib, a cache folder it cannot write),
    naming why and the fix; nothing when they were switched off on purpose (``OPTIMIZERS_CPU_KERNELS=0``) or the
    run would not use them (another backend, several devices). Builds them if they are not built yet (~5 s once
    per machine)."""
    import warnings  # noqa: PLC0415

    from optimizers.kernels import build  # noqa: PLC0415

    if backend != "cpu" or devices != 1:
        return []
    with warnings.catch_warnings():  # the library's own warning says the same: this line replaces it
        warnings.simplefilter("ignore", RuntimeWarning)
        why = build.status()
    if not why or why.startswith(build.ENV_SWITCH):  # off by choice (a bad value of it is refused at start)
        return []
    return [f"warning: the fused update's native CPU kernels are off ({why}): the XLA ops that compute the same "
            f"values run instead, a row-wise Adagrad update about 1.4-1.8x slower, Adam up to 1.3x. Install a C++ "
            f"compiler (g++) or name one in CXX; {build.ENV_SWITCH}=0 turns them off without this warning"]


def mesh_warnings(mesh: Any, plan: Any, devices: int) -> list[str]:
    """Lines (each starting with ``warning:``) for mesh settings the run was given and does not use: the routing
    settings when no table is split (one table shard), ``mesh.routing`` on the column layout (which exchanges ids
    its own way), and virtual CPU devices (``mesh.cpu_devices``) past the mesh's. ``mesh``: the ``mesh`` config;
    ``plan``: its resolved ``MeshPlan``; ``devices``: the devices of the run (every process's)."""
    out = []
    given = _given(mesh, MeshConfig, ("routing", "route_capacity", "route_overflow", "table_layout"))
    if plan.table_shards == 1 and given:
        settings = _listed(given, "mesh.")
        out.append(f"warning: {settings}: no table is split on this mesh ({plan.describe()}, one table shard), so "
                   f"{_they(given, 'it has', 'they have')} no effect; shard the tables over a table axis of 2 or "
                   f"more devices (mesh=data_table, mesh.axes.table) or leave {_they(given, 'it', 'them')} out")
    elif _plain(mesh.get("routing")) == "gather" and {"route_capacity", "route_overflow"} & set(given):
        idle = {k: v for k, v in given.items() if k.startswith("route_")}
        out.append(f"warning: {_listed(idle, 'mesh.')}: the all_to_all routing's, and mesh.routing=gather gathers every "
                   f"device's ids without a capacity: {_they(idle, 'it has', 'they have')} no effect")
    elif str(plan.table_layout) == str(TableLayout.column) and "routing" in given:
        out.append(f"warning: mesh.routing={given['routing'].value} applies to the row layout, and the tables use the "
                   f"column layout (mesh.table_layout=column), which exchanges each device's distinct ids its own way: "
                   f"it has no effect; use mesh.table_layout=row or leave mesh.routing out")
    n = mesh.get("cpu_devices")
    if n is not None and plan.num_devices < devices:
        fill = ("give one of mesh.axes -1 (it fills the devices)" if mesh.get("name") == "data_table" else
                "use mesh=data_table (its axes fill the devices)")
        out.append(f"warning: mesh.cpu_devices={n} gives {devices} devices and the mesh ({plan.describe()}) uses "
                   f"{plan.num_devices}: the others stay idle; {fill} or set mesh.axes to use them")
    return out


SCHEDULE_USES = {"constant": (), "warmup": ("warmup_steps",), "cosine": ("decay_steps", "end_ratio"),
                 "warmup_cosine": ("warmup_steps", "decay_steps", "end_ratio"), "step": ("step_every", "step_factor")}
HASH_ONLY = ("capacity", "admit_after", "admit_window", "evict", "ttl", "default", "probes", "sketch_width",
             "partitions")  # a table's settings that only kind=hash reads


def _plain(value: Any) -> str:
    """A setting's value as written on the command line (an enum's value, not its name)."""
    return str(getattr(value, "value", value))


def _given(node: Any, schema: type, keys: tuple[str, ...]) -> dict[str, Any]:
    """Those of ``keys`` set in ``node`` (not None) to another value than ``schema``'s default."""
    default = schema()
    return {k: node.get(k) for k in keys
            if node.get(k) is not None and _plain(node.get(k)) != _plain(getattr(default, k))}


def _they(given: Mapping[str, Any], one: str, many: str) -> str:
    """``one`` for a single setting, ``many`` for several (``it has`` / ``they have``)."""
    return one if len(given) == 1 else many


def _listed(given: Mapping[str, Any], prefix: str) -> str:
    return ", ".join(f"{prefix}{k}={_plain(v)}" for k, v in given.items())


def unused_settings(cfg: Any, steps: int, typed: set[str] | None = None) -> list[str]:
    """Lines (each starting with ``warning:``) for settings the run was given that nothing in it reads: a
    schedule's fields its kind does not use (or a step schedule that never steps in ``steps``), delay
    compensation's lambda without compensation, hash-table settings on a dense or modulo table, sampled-softmax
    settings under another loss, DCN's low rank without cross layers, ranking's evaluation batches on another task,
    W&B settings without W&B, several processes' settings for one, a run id without checkpoints, a dense warmup
    longer than the run. ``typed``: the keys the command line set (None: unknown), where a preset's own value (the
    generated logs' size beside ``data.path``) is not the user's to leave out."""
    from optimizers import Schedule

    from . import config as schemas

    out = []
    optimizers = [("optimizer.", cfg.optimizer)] + [(f"table_optimizers.{n}.", o)
                                                    for n, o in (cfg.get("table_optimizers") or {}).items()]
    for prefix, opt in optimizers:
        mode = opt.get("weight_decay_mode") if hasattr(opt, "get") else None
        if mode is not None and _plain(mode) != "decoupled" and not opt.get("weight_decay"):
            out.append(f"warning: {prefix}weight_decay_mode={_plain(mode)} says how {prefix}weight_decay decays rows, "
                       f"and it is 0: it has no effect; set {prefix}weight_decay above 0 or leave it out")
        schedule = opt.get("schedule") if hasattr(opt, "get") else None
        if not schedule:
            continue
        kind = _plain(schedule.kind)
        idle = _given(schedule, Schedule, tuple(k for uses in SCHEDULE_USES.values() for k in uses
                                                if k not in SCHEDULE_USES.get(kind, ())))
        if idle:
            out.append(f"warning: {_listed(idle, prefix + 'schedule.')}: {prefix}schedule.kind={kind} does not use "
                       f"{_they(idle, 'it', 'them')}; set the kind that does, or leave "
                       f"{_they(idle, 'it', 'them')} out")
        if kind == "step" and int(schedule.step_every) >= steps:
            out.append(f"warning: {prefix}schedule.kind=step steps every {schedule.step_every} updates "
                       f"({prefix}schedule.step_every) and the run has {steps}: the learning rate never steps")
        warm = int(schedule.warmup_steps) if kind == "warmup_cosine" else 0
        if kind in ("cosine", "warmup_cosine") and 0 < steps < warm + int(schedule.decay_steps):
            r = float(schedule.end_ratio)
            at = float(Schedule(**{k: v for k, v in schedule.items() if k != "_target_"})(steps))  # its last update's
            out.append(f"warning: {prefix}schedule.decay_steps={schedule.decay_steps}"
                       f"{f' after {warm} warmup updates' if warm else ''} outlasts the run's {steps} updates: its "
                       f"learning rate ends at {at:.3g} of {prefix}learning_rate, not at end_ratio={r:g}; "
                       f"{prefix}schedule.decay_steps=0 decays over the run")
    a = cfg.async_emb
    if _given(a, schemas.AsyncEmbConfig, ("dc_lambda",)) and not (a.enabled and _plain(a.compensation) == "dc"):
        out.append(f"warning: async_emb.dc_lambda={a.dc_lambda} is delay compensation's, and it is off (it needs "
                   f"async_emb=on async_emb.compensation=dc): it has no effect")
    for name, table in (cfg.model.get("tables") or {}).items():
        kind = _plain(table.get("kind") or "dense")
        if kind != "hash":
            idle = _given(table, schemas.TableConfig, HASH_ONLY)
            if idle:
                what = "dense" if kind == "dense" else "a modulo table (its rows are hash(id) mod vocab - 1)"
                out.append(f"warning: {_listed(idle, f'model.tables.{name}.')}: hash-table settings, and table "
                           f"'{name}' is {what}; set model.tables.{name}.kind=hash or leave them out")
            continue
        prefix = f"model.tables.{name}."
        if _plain(table.get("evict") or "lru") != "ttl" and _given(table, schemas.TableConfig, ("ttl",)):
            out.append(f"warning: {prefix}ttl={table.ttl} applies to {prefix}evict=ttl, and the table evicts by "
                       f"{_plain(table.get('evict') or 'lru')}: it has no effect; set {prefix}evict=ttl or leave it out")
        idle = _given(table, schemas.TableConfig, ("admit_window", "sketch_width"))
        if int(table.get("admit_after") or 1) == 1 and idle:
            out.append(f"warning: {_listed(idle, prefix)}: the admission sketch's, and {prefix}admit_after=1 admits "
                       f"every id on first sight without counting: {_they(idle, 'it has', 'they have')} no "
                       f"effect; set {prefix}admit_after above 1 or leave {_they(idle, 'it', 'them')} out")
    m, model = cfg.model, cfg.model.get("name")
    if model == "sequential":
        loss, negatives = (_plain(m.get(k)) for k in ("loss", "negatives"))
        keys = ("negatives", "num_negatives") if loss == "full_softmax" else (
            ("num_negatives",) if negatives == "in_batch" else ())
        idle = _given(m, schemas.SequentialModelConfig, keys)
        if idle:
            why = "model.loss=full_softmax scores every item" if loss == "full_softmax" else (
                "model.negatives=in_batch takes the batch's other targets")
            out.append(f"warning: {_listed(idle, 'model.')}: {why}, so it has no effect")
    if model == "dcn" and m.get("low_rank") is not None and int(m.get("cross_layers", 1)) == 0:
        out.append(f"warning: model.low_rank={m.low_rank} sets the cross layers' rank, and model.cross_layers=0: "
                   f"it has no effect")
    out += _data_settings(cfg, model, typed)
    if model != "ranking" and _given(cfg.trainer, schemas.TrainerConfig, ("eval_batches",)):
        out.append(f"warning: trainer.eval_batches={cfg.trainer.eval_batches} sizes the ranking task's evaluation; "
                   f"model={model} evaluates its whole held-out split, so it has no effect")
    idle = _given(cfg.logger, schemas.LoggerConfig, ("project", "entity", "mode", "group", "tags", "name"))
    if _plain(cfg.logger.kind) == "none" and idle:  # debug=tiny, for one, picks logger=none
        out.append(f"warning: {_listed(idle, 'logger.')}: W&B settings, and logger=none (no W&B run): "
                   f"{_they(idle, 'it has', 'they have')} no effect; add logger=wandb to log to W&B")
    idle = _given(cfg.distributed, schemas.DistributedConfig, ("coordinator_address", "num_processes", "process_id"))
    if _plain(cfg.distributed.kind) == "none" and idle:
        out.append(f"warning: {_listed(idle, 'distributed.')}: distributed=none runs one process, so "
                   f"{_they(idle, 'it has', 'they have')} no effect; pick distributed=local, manual or "
                   f"slurm (or python -m runner.launch) to run several")
    if cfg.trainer.get("run_id") is not None and not int(cfg.checkpoint.interval):
        out.append(f"warning: trainer.run_id={cfg.trainer.run_id} names the run's checkpoints and W&B id, and "
                   f"checkpoint.interval=0 saves none: it has no effect; set checkpoint.interval above 0 to save and "
                   f"resume the run under it, or leave it out")
    if _given(cfg.dense_optimizer, schemas.DenseOptimizerConfig, ("warmup_steps",)) and \
            int(cfg.dense_optimizer.warmup_steps) > steps:
        out.append(f"warning: dense_optimizer.warmup_steps={cfg.dense_optimizer.warmup_steps} is longer than the "
                   f"run ({steps} steps): the dense learning rate never reaches dense_optimizer.learning_rate")
    return out


def _data_settings(cfg: Any, model: Any, typed: set[str] | None = None) -> list[str]:
    """The data source's settings another of its settings leaves unread: the Criteo generator's with logs in
    ``data.path``, one id mode's with the other, mean pooling of one-hot logs; generated sequences' duplicates."""
    from . import config as schemas
    from .tasks.criteo.config import CriteoDataConfig

    d, out = cfg.data, []
    if model in ("dlrm", "dcn") and d.get("name") == "criteo":
        idle = _given(d, CriteoDataConfig, ("lines", "days")) if d.get("path") else {}
        idle = {k: v for k, v in idle.items() if typed is None or f"data.{k}" in typed}  # not a preset's own
        if idle:
            out.append(f"warning: {_listed(idle, 'data.')}: the generated logs' size, and data.path={d.path} names "
                       f"logs to read: {_they(idle, 'it has', 'they have')} no effect; leave "
                       f"{_they(idle, 'it', 'them')} out, or unset data.path to train on generated logs")
        ids = _plain(d.get("ids"))
        idle = _given(d, CriteoDataConfig, ("hash_rows",) if ids == "vocab" else ("min_count",))
        if idle:
            other = "hash" if ids == "vocab" else "vocab"
            out.append(f"warning: {_listed(idle, 'data.')}: data.ids={other}'s, and the run maps ids by "
                       f"data.ids={ids}: it has no effect; set data.ids={other} or leave it out")
        if _plain(cfg.model.get("pooling")) == "mean" and not d.get("path") and d.get("bags") is None:
            out.append("warning: model.pooling=mean pools a multi-hot feature's bag, and the generated logs are "
                       "one-hot (data.bags unset): it has no effect; set data.bags to write bags, or leave it out")
    if d.get("name") == "synthetic_sequences" and _given(d, schemas.SyntheticSequencesDataConfig, ("duplicates",)):
        out.append(f"warning: data.duplicates={_plain(d.duplicates)} applies to a file's exact duplicate rows, and "
                   f"data=synthetic_sequences generates its sequences without any: it has no effect")
    return out
