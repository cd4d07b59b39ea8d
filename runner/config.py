"""Config schemas: one dataclass per config group and section, registered with Hydra's ConfigStore.

Every YAML under ``conf/`` extends one of these (its defaults list names the ``*_schema`` node), so a wrong
type or an unknown key fails when Hydra composes the config. The embedding-optimizer schemas are derived
from the optimizer dataclasses themselves, so a hyperparameter is declared once, in ``optimizers/``.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

import optimizers


@dataclass
class AsyncEmbConfig:
    enabled: bool = True


@dataclass
class MeshConfig:
    name: str = "single"
    axes: Dict[str, int] = field(default_factory=lambda: {"data": 1})
    table_axis: Optional[str] = None  # mesh axis the embedding tables are sharded over; None = replicated
    table_layout: str = "row"  # row: each shard owns a block of rows; column: a slice of the width
    pad_vocab: bool = True  # row layout: pad table rows up to a multiple of the table shards
    cpu_devices: Optional[int] = None  # on CPU, how many virtual devices to create (before JAX starts)


@dataclass
class DistributedConfig:
    """Multi-process training (``runner/distributed.py``): none | local | slurm | manual."""

    kind: str = "none"
    coordinator_address: Optional[str] = None  # host:port of process 0 (local/manual; slurm detects it)
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    initialization_timeout_s: int = 120  # give up if the peers/coordinator are not all up by then
    heartbeat_timeout_s: int = 30  # a peer silent this long is dead: every process stops with an error
    shutdown_timeout_s: int = 30  # how long an exiting process waits for the others at shutdown
    dump_state: bool = False  # test/debug: process 0 writes the final state to final_state.npz


@dataclass
class TableConfig:
    vocab: Optional[int] = None  # rows incl. the padding row 0; None = the data's id range + 1
    width: Optional[int] = None  # None = model.emb_width
    dtype: str = "float32"
    init_scale: float = 0.05


@dataclass
class RankingModelConfig:
    name: str = "ranking"
    emb_width: int = 32
    hidden: List[int] = field(default_factory=lambda: [128, 64])
    tables: Dict[str, TableConfig] = field(default_factory=lambda: {
        "users": TableConfig(), "items": TableConfig(), "authors": TableConfig()})


@dataclass
class SyntheticDataConfig:
    name: str = "synthetic"
    num_users: int = 20_000
    num_items: int = 50_000
    num_authors: int = 5_000
    history_len: int = 16
    actions: List[str] = field(default_factory=lambda: ["click", "like", "share"])
    zipf_a: float = 1.1
    latent_dim: int = 8
    seed: int = 0


@dataclass
class MovieLensDataConfig:
    """Leave-one-out next-item sequences from an interaction file (``runner/tasks/sequential/task.py``)."""

    name: str = "movielens"
    path: Optional[str] = None  # u.data, ratings.dat, ratings.csv, *.inter, csv/parquet, or a folder holding one
    max_len: int = 200  # the model's window: the last max_len items of a sequence
    min_interactions: int = 3  # users with fewer are dropped (two go to the validation and test targets)
    random_crop: bool = False  # train on a random prefix end instead of the whole training prefix
    exclude_seen: bool = False  # rank only items not already in the user's history (the protocol: false)
    ks: List[int] = field(default_factory=lambda: [10])  # HR@k and NDCG@k cutoffs (MRR has none)


@dataclass
class SyntheticSequencesDataConfig(MovieLensDataConfig):
    """Cluster-Markov item sequences with a planted next-item pattern (``runner/tasks/sequential/synthetic.py``)."""

    name: str = "synthetic_sequences"
    max_len: int = 50
    num_users: int = 2000
    num_items: int = 1000
    num_clusters: int = 50
    min_length: int = 8
    max_length: int = 40
    noise: float = 0.1
    zipf_a: float = 1.0
    seed: int = 0


@dataclass
class SequentialModelConfig:
    """SASRec-like causal self-attention next-item model, output tied to the item table."""

    name: str = "sequential"
    emb_width: int = 64
    num_blocks: int = 2
    num_heads: int = 1
    ffn_mult: int = 4  # FFN hidden width = ffn_mult * emb_width
    dropout: float = 0.0
    loss: str = "sampled_softmax"  # sampled_softmax | full_softmax
    num_negatives: int = 128  # sampled_softmax: uniform negatives per sequence, shared by its positions
    l2_norm: bool = False  # cosine logits: L2-normalise the hidden state and the item rows
    temperature: float = 1.0  # logits are divided by this
    tables: Dict[str, TableConfig] = field(default_factory=lambda: {"items": TableConfig()})


@dataclass
class LoggerConfig:
    kind: str = "wandb"  # wandb | none (metrics.jsonl is always written)
    project: str = "recsys-runner"
    entity: Optional[str] = None
    mode: str = "offline"  # offline | online | disabled
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    name: Optional[str] = None


@dataclass
class DenseOptimizerConfig:
    """optax AdamW with linear warmup then cosine decay, after global-norm clipping."""

    learning_rate: float = 2e-3
    warmup_steps: int = 20
    end_learning_rate_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.999
    weight_decay: float = 1e-4
    clip_norm: float = 1.0


@dataclass
class TrainerConfig:
    steps: int = 2000
    batch_size: int = 1024
    seed: int = 0
    log_interval: int = 100
    eval_interval: int = 500
    eval_batches: int = 4
    objective: Optional[str] = None  # the metric a run returns to a sweep; None = the task's own
    run_id: Optional[str] = None  # names the run's checkpoint dir and W&B id; None = a hash of the config
    stop_after: Optional[int] = None  # pre-emption drill: save a checkpoint at this step and exit


@dataclass
class CheckpointConfig:
    """Checkpoints and exact resume (``runner/checkpoint/manager.py``); off while ``interval`` is 0."""

    interval: int = 0  # save every this many steps and at the end; 0 = no checkpoints
    dir: Optional[str] = None  # None = outputs/checkpoints/<run id>, found again by a re-launch
    keep: int = 3  # the newest checkpoints kept; older ones are deleted once a newer one is committed
    resume: str = "auto"  # auto: newest complete checkpoint of this run | never | a checkpoint path
    async_save: bool = True  # write in the background while training goes on
    compress: bool = False  # zstd per chunk: ~10% smaller for float tables, saves 2x and restores 4x slower


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
    """A Hydra schema for an optimizer dataclass: its fields plus ``_target_`` naming the class."""
    hints = typing.get_type_hints(cls)
    fields = [("_target_", str, field(default=f"optimizers.{cls.__name__}"))]
    fields += [(f.name, hints[f.name], field(default=f.default)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields)


def register() -> None:
    """Schemas live in ``schema/<group>``, out of the option lists; each option YAML extends one with
    ``- /schema/<group>@_here_: <name>`` in its defaults."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, cls in optimizers.REGISTRY.items():
        cs.store(group="schema/optimizer", name=name, node=optimizer_schema(cls))
    for group, name, node in [
        ("async_emb", "async_emb", AsyncEmbConfig), ("mesh", "mesh", MeshConfig),
        ("distributed", "distributed", DistributedConfig), ("logger", "logger", LoggerConfig),
        ("model", "ranking", RankingModelConfig), ("model", "sequential", SequentialModelConfig),
        ("data", "synthetic", SyntheticDataConfig), ("data", "movielens", MovieLensDataConfig),
        ("data", "synthetic_sequences", SyntheticSequencesDataConfig),
    ]:
        cs.store(group=f"schema/{group}", name=name, node=node)
