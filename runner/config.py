"""Config schemas: one dataclass per config group and section, registered with Hydra's ConfigStore.

Every YAML under ``conf/`` extends one of these (its defaults list names the ``*_schema`` node), so a wrong type or
an unknown key fails when Hydra composes the config (one added with ``+key=`` fails the preflight). The embedding-
optimizer schemas are derived from the optimizer dataclasses, so a hyperparameter is declared once, in ``optimizers/``."""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

import optimizers
from optimizers import ROUTE_CAPACITY, ROUTE_CAPACITY_MAX, Choice, RouteOverflow, Routing, TableLayout, hparam

# Sane caps, declared once: the preflight refuses a value outside its field's range before anything runs.
MAX_IDS = 10**8  # ids / rows of a generated data source or a table
MAX_WIDTH = 65536  # an embedding or hidden width
MAX_SEED = 2**32 - 1
MAX_CPU_DEVICES = 4096  # virtual CPU devices: creating many more takes minutes
DC_LAMBDA = 100.0  # async_emb.dc_lambda's default, chosen on validation (docs/results/ranking.md)
ROUTE_SAMPLE_BATCHES = 8  # train batches whose ids size the routed row layout's slots and the column layout's
# exchange (runner.build.route_peaks)


class TableDType(Choice):
    float32 = "float32"
    bfloat16 = "bfloat16"  # fp32 optimizer state; fused optimizers round stochastically, optax ones to nearest (warned)


class TableKind(Choice):
    dense = "dense"  # [vocab, width] rows indexed by ids in [0, vocab)
    hash = "hash"  # raw (64-bit) ids mapped to `capacity` slots in the step: admission, eviction, no collisions
    modulo = "modulo"  # raw ids hashed modulo vocab - 1 rows (the hashing trick: distinct ids may share a row)


class Evict(Choice):
    lru = "lru"  # the least recently seen slot of the id's window
    lfu = "lfu"  # the least often seen (then least recently)
    ttl = "ttl"  # the least recently seen of those unseen for more than `ttl` steps; none: no slot


class HashDefault(Choice):
    zeros = "zeros"  # an id without a slot reads zeros and trains nothing
    shared = "shared"  # it reads (and trains) one shared row


class DistributedKind(Choice):
    none = "none"
    local = "local"
    slurm = "slurm"
    manual = "manual"


class LoggerKind(Choice):
    wandb = "wandb"
    none = "none"  # metrics.jsonl only


class LoggerMode(Choice):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class ProgressMode(Choice):
    auto = "auto"  # bar when stderr is a terminal, lines otherwise (SLURM logs, CI, pipes)
    bar = "bar"  # a live progress bar (step, loss, examples/s, ETA, the objective)
    lines = "lines"  # a plain line every trainer.log_interval steps
    off = "off"  # nothing between the start-up lines and the summary (metrics.jsonl has every row)


class TrainWindows(Choice):
    last = "last"  # one example per user: the window ending at its prefix's end (SASRec)
    all = "all"  # every training target: each prefix cut into consecutive windows of max_len targets


class Duplicates(Choice):
    drop = "drop"  # rows equal in user, item and timestamp to an earlier row are dropped and counted
    refuse = "refuse"  # such rows stop the run, naming the file, the count and the first one


class Loss(Choice):
    sampled_softmax = "sampled_softmax"
    full_softmax = "full_softmax"


class Negatives(Choice):
    """sampled_softmax's negatives (runner/tasks/sequential/model.py)."""

    uniform = "uniform"  # num_negatives ids per sequence, uniform over the items; no correction
    popularity = "popularity"  # num_negatives ids per sequence ~ training-prefix counts; logits - log q
    in_batch = "in_batch"  # the other sequences' targets at the same position; logits - log q


class Compensation(Choice):
    """What async mode does about a deferred gradient being late (``async_emb.compensation``)."""

    none = "none"  # apply it as it is
    dc = "dc"  # delay compensation (DC-ASGD): g + dc_lambda * g * g * (w_now - w_then), per touched row


MAX_STALENESS = 64


@dataclass
class AsyncEmbConfig:
    enabled: bool = True
    staleness: int = hparam(1, "steps a deferred embedding update waits: step t applies step t-k's (async only)",
                            low=1, high=MAX_STALENESS)
    compensation: Compensation = Compensation.none
    dc_lambda: float = hparam(DC_LAMBDA, "delay compensation's lambda (compensation=dc)", low=0.0, low_open=True)


@dataclass
class MeshConfig:
    name: str = "single"
    axes: Dict[str, int] = field(default_factory=lambda: {"data": 1})
    table_axis: Optional[str] = None  # mesh axis the embedding tables are sharded over; None = replicated
    table_layout: TableLayout = TableLayout.row  # row: each shard owns a block of rows; column: a slice of the width
    pad_vocab: bool = True  # row layout: pad table rows up to a multiple of the table shards
    routing: Routing = Routing.alltoall  # row layout: how ids reach the shard that owns their row
    # auto | true | false: true stores id i in row optimizers.routing.permute_ids(i, vocab) (a bijection of
    # [1, vocab)), so Zipf-hot small ids spread over the row shards; the same numbers are learned either way.
    # auto: a new run permutes where rows are split over several shards; a resume keeps its checkpoint's order.
    permute_ids: Union[bool, str] = "auto"
    route_capacity: float = hparam(
        ROUTE_CAPACITY, "row layout, alltoall routing: slots for the ids one device sends each table shard per step, as a "
        f"multiple of the most it sent one shard in the first {ROUTE_SAMPLE_BATCHES} train batches (sampled before "
        "compiling; never below 64 slots); column layout: distinct ids one device exchanges per step, as a multiple "
        "of the most one device held in those batches; raise it if emb/route_overflow is often above 0", low=0.0,
        high=ROUTE_CAPACITY_MAX, low_open=True)
    route_overflow: RouteOverflow = RouteOverflow.reroute  # a step with more ids for one shard (column: one
    # device) than its slots
    cpu_devices: Optional[int] = hparam(None, "virtual CPU devices to create before JAX starts; CPU only",
                                        low=1, high=MAX_CPU_DEVICES)


PERMUTE_IDS = ("auto", "true", "false")  # the words of mesh.permute_ids


def permute_ids_setting(value: Any) -> str | None:
    """``mesh.permute_ids`` as one of ``PERMUTE_IDS`` (a bool, from ``mesh.permute_ids=true``, as its word), or
    None for any other value."""
    word = str(value).lower() if isinstance(value, bool) else value
    return word if isinstance(word, str) and word in PERMUTE_IDS else None


@dataclass
class DistributedConfig:
    """Multi-process training (``runner/distributed.py``): none | local | slurm | manual."""

    kind: DistributedKind = DistributedKind.none
    coordinator_address: Optional[str] = None  # host:port of process 0 (local/manual; slurm detects it)
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    initialization_timeout_s: int = 120  # give up if the peers/coordinator are not all up by then
    heartbeat_timeout_s: int = 30  # a peer silent this long is dead: every process stops with an error
    shutdown_timeout_s: int = 30  # how long an exiting process waits for the others at shutdown
    dump_state: bool = False  # test/debug: process 0 writes the final state to final_state.npz


@dataclass
class TableConfig:
    vocab: Optional[int] = hparam(None, "rows incl. the padding row 0; None = the data's id range + 1",
                                  low=2, high=MAX_IDS + 1)
    width: Optional[int] = hparam(None, "this table's width; None = model.emb_width", low=1, high=MAX_WIDTH)
    stored_width: Optional[int] = hparam(None, "stored columns >= width; None: auto", low=1, high=MAX_WIDTH)
    dtype: TableDType = TableDType.float32
    init_scale: float = hparam(0.05, "scale of the initial rows", low=0.0)
    kind: TableKind = TableKind.dense  # dense | hash | modulo (runner/core/hash_tables.py)
    capacity: Optional[int] = hparam(None, "kind=hash: slots (ids the table holds at once)", low=1, high=MAX_IDS)
    admit_after: int = hparam(1, "kind=hash: sightings (count-min estimate) before an id gets a slot; 1 = at "
                              "first sight", low=1, high=2**30)
    admit_window: int = hparam(100, "kind=hash, admit_after > 1: the admission sketch's counts are halved every "
                               "admit_window steps (0: never), so sightings older than a few windows fade",
                               low=0, high=2**30)
    evict: Evict = Evict.lru
    ttl: int = hparam(1000, "kind=hash, evict=ttl: a slot unseen for more than ttl steps may be given to "
                      "another id", low=0, high=2**30)
    default: HashDefault = HashDefault.zeros
    probes: int = hparam(16, "kind=hash: slots after its home slot an id may live in", low=1, high=1024)
    sketch_width: int = hparam(1 << 16, "kind=hash: counters per row of the admission sketch", low=1, high=1 << 26)
    partitions: Optional[int] = hparam(None, "kind=hash: the slots split by the id's hash into this many parts, "
                                       "each row shard holding whole ones; None = the table shards (row layout), "
                                       "or the checkpoint's on a resume", low=1, high=4096)


@dataclass
class RankingModelConfig:
    name: str = "ranking"
    emb_width: int = hparam(32, "width of every table without its own", low=1, high=MAX_WIDTH)
    hidden: List[int] = field(default_factory=lambda: [128, 64])
    tables: Dict[str, TableConfig] = field(default_factory=lambda: {
        "users": TableConfig(), "items": TableConfig(), "authors": TableConfig()})
    stack_tables: bool = False  # keep the tables of one width, dtype and optimizer as one (runner/core/stacking.py)


@dataclass
class SyntheticDataConfig:
    name: str = "synthetic"
    num_users: int = hparam(20_000, "user ids 1..num_users", low=1, high=MAX_IDS)
    num_items: int = hparam(50_000, "item ids 1..num_items", low=1, high=MAX_IDS)
    num_authors: int = hparam(5_000, "author ids 1..num_authors", low=1, high=MAX_IDS)
    history_len: int = hparam(16, "items in a user's history", low=1, high=4096)
    actions: List[str] = field(default_factory=lambda: ["click", "like", "share"])
    zipf_a: float = hparam(1.1, "Zipf exponent of user/item popularity (rare ids underflow past 20)", low=0.0, high=20.0)
    latent_dim: int = hparam(8, "size of the hidden ground-truth model", low=1, high=4096)
    seed: int = hparam(0, "seed of the generated world", low=0, high=MAX_SEED)
    drift: float = hparam(0.0, "Zipf ranks of users and items slide this many per step (new ids rise, old ones "
                          "stop); the held-out splits are drawn at the last step", low=0.0, high=MAX_IDS)
    raw_ids: bool = False  # user and item ids as 64-bit ids: their tables need kind=hash or kind=modulo


@dataclass
class MovieLensDataConfig:
    """Leave-one-out next-item sequences from an interaction file (``runner/tasks/sequential/task.py``)."""

    name: str = "movielens"
    path: Optional[str] = None  # u.data, ratings.dat, ratings.csv, *.inter, csv/parquet, or a folder holding one
    max_len: int = hparam(200, "the model's window: the last max_len items of a sequence", low=1, high=MAX_WIDTH)
    min_interactions: int = hparam(3, "users with fewer are dropped; each needs a test target, a validation "
                                   "target and a training item", low=3)
    random_crop: bool = False  # train on a random prefix end instead of the whole training prefix
    train_windows: TrainWindows = TrainWindows.last  # last: one window per user; all: every training target
    exclude_seen: bool = False  # rank only items not already in the user's history (the protocol: false)
    ks: List[int] = field(default_factory=lambda: [10])  # HR@k and NDCG@k cutoffs (MRR has none)
    duplicates: Duplicates = Duplicates.drop  # exact duplicate rows of data.path (user, item, timestamp): drop | refuse


@dataclass
class SyntheticSequencesDataConfig(MovieLensDataConfig):
    """Cluster-Markov item sequences with a planted next-item pattern (``runner/tasks/sequential/synthetic.py``)."""

    name: str = "synthetic_sequences"
    max_len: int = hparam(50, "the model's window: the last max_len items of a sequence", low=1, high=MAX_WIDTH)
    num_users: int = hparam(2000, "users, one sequence each", low=1, high=MAX_IDS)
    num_items: int = hparam(1000, "item ids 1..num_items", low=1, high=MAX_IDS)
    num_clusters: int = hparam(50, "item clusters of the planted pattern, at most num_items", low=1,
                               high=MAX_IDS)
    min_length: int = hparam(8, "shortest sequence; leave-one-out takes two items from each", low=3,
                             high=MAX_WIDTH)
    max_length: int = hparam(40, "longest sequence, >= min_length; training needs sequences of >= 4 items", low=4,
                             high=MAX_WIDTH)
    noise: float = hparam(0.1, "probability that the next cluster is uniform", low=0.0, high=1.0)
    zipf_a: float = hparam(1.0, "within-cluster popularity exponent (rare items underflow past 20)", low=0.0, high=20.0)
    seed: int = hparam(0, "seed of the generated world", low=0, high=MAX_SEED)


@dataclass
class SequentialModelConfig:
    """SASRec-like causal self-attention next-item model, output tied to the item table."""

    name: str = "sequential"
    emb_width: int = hparam(64, "item embedding and hidden width", low=1, high=MAX_WIDTH)
    num_blocks: int = hparam(2, "self-attention blocks", low=0, high=1024)
    num_heads: int = hparam(1, "attention heads, a divisor of emb_width", low=1, high=MAX_WIDTH)
    ffn_mult: int = hparam(4, "FFN hidden width = ffn_mult * emb_width", low=1, high=1024)
    dropout: float = hparam(0.0, "dropout rate", low=0.0, high=1.0, high_open=True)
    loss: Loss = Loss.sampled_softmax
    negatives: Negatives = Negatives.uniform  # sampled_softmax: uniform | popularity | in_batch (both logQ-corrected)
    num_negatives: int = hparam(128, "sampled_softmax with uniform or popularity negatives: negatives per "
                                "sequence, shared by its positions", low=1, high=MAX_IDS)
    l2_norm: bool = False  # cosine logits: L2-normalise the hidden state and the item rows
    temperature: float = hparam(1.0, "logits are divided by this", low=0.0, low_open=True)
    seen_bias: bool = False  # learn one logit offset for items already in the input sequence (repeat-aware)
    tables: Dict[str, TableConfig] = field(default_factory=lambda: {"items": TableConfig()})


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.wandb  # metrics.jsonl is always written
    project: str = "recsys-runner"
    entity: Optional[str] = None
    mode: LoggerMode = LoggerMode.offline
    init_timeout: float = hparam(30.0, "seconds an online W&B run may take to start before the run stops",
                                 low=0.0, low_open=True, high=600.0)
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    name: Optional[str] = None


@dataclass
class DenseOptimizerConfig:
    """optax AdamW with linear warmup then cosine decay, after global-norm clipping."""

    learning_rate: float = hparam(2e-3, "peak step size, reached after warmup", low=0.0, low_open=True)
    warmup_steps: int = hparam(20, "steps of linear warmup from 0", low=0)
    end_learning_rate_ratio: float = hparam(0.1, "final learning rate / peak learning rate", low=0.0, high=1.0)
    b1: float = hparam(0.9, "decay of the first-moment estimate", low=0.0, high=1.0, high_open=True)
    b2: float = hparam(0.999, "decay of the second-moment estimate", low=0.0, high=1.0, high_open=True)
    weight_decay: float = hparam(1e-4, "decoupled AdamW weight decay", low=0.0)
    clip_norm: float = hparam(1.0, "global gradient norm clipped to this", low=0.0, low_open=True)


@dataclass
class TrainerConfig:
    # The run's length: steps, or epochs over the task's examples (runner/budget.py). The model YAML gives the
    # task's budget; trainer.steps or trainer.epochs on the command line wins, and giving both is refused.
    steps: Optional[int] = hparam(None, "training steps; null = trainer.epochs (else default_epochs)", low=1)
    epochs: Optional[float] = hparam(None, "training budget in passes over the training examples (sequence "
                                           "tasks); exclusive with trainer.steps", low=0.0, low_open=True)
    default_epochs: Optional[float] = hparam(None, "the model's budget in epochs when trainer.steps and "
                                                   "trainer.epochs are both null", low=0.0, low_open=True)
    batch_size: int = hparam(1024, "global batch: examples per step over every device", low=1, high=2**24)
    seed: int = hparam(0, "seed of the initial weights and the batches", low=0, high=MAX_SEED)
    log_interval: int = hparam(100, "steps between logged rows", low=1)
    eval_interval: Optional[int] = hparam(None, "steps between evaluations; null = at most 10 evaluations a "
                                                "run, on logged steps", low=1)
    eval_batches: int = hparam(4, "batches per ranking evaluation", low=1, high=10**6)
    objective: Optional[str] = None  # the metric a run returns to a sweep (any it reports); None = the task's own
    # Model selection (runner/core/selection.py): keep the best evaluated state by a validation metric (the
    # objective if it is one, else the task's own) and report its metrics as best/*; a sweep gets the objective
    # of that state. null = on for the sequential task, off for the ranking task (fresh training examples every
    # step: it reports its last state).
    select_best: Optional[bool] = None
    early_stop_patience: Optional[int] = hparam(None, "stop after this many evaluations in a row without an "
                                                      "improvement of the objective; null = never", low=1)
    run_id: Optional[str] = None  # names the run's checkpoint dir and W&B id; None = a hash of the config
    stop_after: Optional[int] = None  # pre-emption drill: save a checkpoint at this step and exit
    max_skipped_updates: int = hparam(10, "stop the run after this many consecutive skipped (non-finite) "
                                          "embedding updates of one table; 0 = never stop", low=0)
    strict_ids: bool = False  # stop on an id outside [0, vocab); false: it reads zeros and counts in emb/dropped_ids
    progress: ProgressMode = ProgressMode.auto  # auto: a live bar if stderr is a terminal, else plain lines
    data_workers: int = hparam(0, "processes that build batches ahead of the step (Grain's mp_prefetch); 0 = one "
                                  "background thread of the run's process (runner/core/feed.py)", low=0, high=64)


@dataclass
class CheckpointConfig:
    """Checkpoints and exact resume (``runner/checkpoint/manager.py``); off while ``interval`` is 0."""

    interval: int = 0  # save every this many steps and at the end; 0 = no checkpoints
    dir: Optional[str] = None  # None = outputs/checkpoints/<run id>, found again by a re-launch
    keep: int = 3  # the newest checkpoints kept; older ones are deleted once a newer one is committed
    resume: str = "auto"  # auto: newest complete checkpoint of this run | never | a checkpoint path
    async_save: bool = True  # write in the background while training goes on
    compress: bool = False  # zstd per chunk: ~10% smaller for float tables, saves 2x and restores 4x slower
    allow_data_change: bool = False  # resume although the data file differs from the checkpoint's (a warning)


@dataclass
class Config:
    optimizer: Any = MISSING
    table_optimizers: Dict[str, Any] = field(default_factory=dict)
    async_emb: AsyncEmbConfig = field(default_factory=AsyncEmbConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    model: Any = MISSING
    data: Any = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    dense_optimizer: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def optimizer_schema(cls: type) -> type:
    """A Hydra schema for an optimizer dataclass: its fields plus ``_target_`` naming the class. A field that is
    itself a dataclass (``schedule``) gets a schema of its own, with its ``_target_``, so Hydra builds it too."""
    hints = typing.get_type_hints(cls)
    fields = [("_target_", str, field(default=f"{cls.__module__.split('.')[0]}.{cls.__name__}"))]
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(hints[f.name]):
            inner = optimizer_schema(hints[f.name])
            fields.append((f.name, inner, field(default_factory=inner)))
        else:
            fields.append((f.name, hints[f.name], field(default=f.default, metadata=f.metadata)))  # its range
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields)


@functools.cache
def register() -> None:
    """Schemas live in ``schema/<group>``, out of the option lists (an option extends one: ``- /schema/<group>@_here_:
    <name>``). Once per process: the store is process-wide, and storing its 80-odd schemas costs a third of a compose."""
    from .config_store import share_config_store  # noqa: PLC0415 (a Hydra fix, with the store it fixes)
    share_config_store()
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, cls in optimizers.REGISTRY.items():
        cs.store(group="schema/optimizer", name=name, node=optimizer_schema(cls))
    for group, name, node in [
        ("async_emb", "async_emb", AsyncEmbConfig), ("mesh", "mesh", MeshConfig),
        ("distributed", "distributed", DistributedConfig), ("logger", "logger", LoggerConfig),
        ("model", "ranking", RankingModelConfig), ("model", "sequential", SequentialModelConfig),
        ("data", "synthetic", SyntheticDataConfig), ("data", "movielens", MovieLensDataConfig),
        ("data", "synthetic_sequences", SyntheticSequencesDataConfig), *task_schemas(),
    ]:
        cs.store(group=f"schema/{group}", name=name, node=node)


def task_schemas() -> list[tuple[str, str, type]]:
    """(group, name, schema) of the schemas a task package keeps beside its code (the Criteo task's)."""
    from .tasks.criteo import config as criteo  # noqa: PLC0415 (it imports TableConfig from here)

    return [("data", "criteo", criteo.CriteoDataConfig), ("model", "dlrm", criteo.DLRMModelConfig),
            ("model", "dcn", criteo.DCNModelConfig)]
