"""Config schemas of the Criteo task: the data (``data=criteo``) and its two models (``model=dlrm``,
``model=dcn``). Registered with the other schemas by ``runner.config.register`` (which imports this module
when it runs, after ``runner.config`` itself has loaded)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional

from optimizers import hparam

from ...config import TableConfig

TABLES = tuple(f"cat_{j:02d}" for j in range(1, 27))  # one table per categorical feature (tsv.CAT's order)

MAX_ROWS = 10**8
MAX_WIDTH = 65536


class CriteoIds(str, Enum):
    """How categorical values become rows (``runner.tasks.criteo.ids``)."""

    hash = "hash"  # 2 + mix(value) mod (rows - 2); rows = min(distinct values + 2, data.hash_rows) per feature
    vocab = "vocab"  # values seen >= data.min_count times in training each get a row; the rest share row 1


class DCNStructure(str, Enum):
    """How DCNv2's cross layers and MLP are combined (Wang et al., 2021, section 3)."""

    stacked = "stacked"  # the MLP over the cross layers' output
    parallel = "parallel"  # the MLP over x0 beside the cross layers, one linear layer over both outputs


class Pooling(str, Enum):
    """How a multi-hot feature's bag of rows becomes one vector (EmbeddingBag's modes)."""

    sum = "sum"
    mean = "mean"


class CriteoLogs(str, Enum):
    """Which logs a run expects: generated ones, or a preset's real ones (then data.path is required)."""

    any = "any"  # data.path if set, else generated logs
    kaggle = "kaggle"  # Kaggle Display Advertising's train.txt (experiment=criteo_kaggle)
    terabyte = "terabyte"  # Criteo Terabyte's day_0 ... day_23, split by day (experiment=criteo_terabyte)


@dataclass
class CriteoDataConfig:
    """Click logs in the Criteo format: a folder converted by ``python -m runner.prepare criteo``, the raw logs
    (converted on first use into ``cache``), or, when ``path`` is None, logs generated with a planted click
    model (``runner/tasks/criteo/logs.py`` says what ``path`` may name)."""

    name: str = "criteo"
    # a folder converted by python -m runner.prepare criteo (holds manifest.json), or raw logs: a file (train.txt,
    # day_<d>, .gz too), a folder of day_<d>[.gz] files (or its train.txt), a glob ('/data/day_?.gz'); None = generated
    path: Optional[str] = None
    logs: CriteoLogs = CriteoLogs.any  # kaggle / terabyte: a preset for real logs, which refuses to run without data.path
    ids: CriteoIds = CriteoIds.vocab
    hash_rows: int = hparam(100_000, "data.ids=hash: most rows a feature's table gets (DLRM's max-ind-range); "
                            "model.tables.<cat_NN>.vocab sets one table's", low=3, high=MAX_ROWS)
    min_count: int = hparam(1, "data.ids=vocab: a value needs this many training occurrences for a row of its own",
                            low=1, high=2**31 - 1)
    eval_examples: Optional[int] = hparam(None, "examples of each evaluation split scored (None: all)", low=1,
                                          high=2**31 - 1)
    lines: int = hparam(1_000_000, "generated logs (path=None): examples in all", low=1000, high=10**9)
    days: int = hparam(1, "generated logs: 1 writes train.txt (seeded 90/5/5 split); more write day files "
                       "(the last one evaluates)", low=1, high=1000)
    seed: int = hparam(0, "generated logs: the click model's seed; also the training order's", low=0,
                       high=2**32 - 1)
    # raw or generated logs: converted once into <cache>/logs-<files and settings hash> or generated-<spec hash>
    # (None: outputs/criteo_data), reused by later runs
    cache: Optional[str] = None
    max_bad_lines: int = hparam(0, "raw logs in data.path: bad lines skipped and counted per file (data/bad_lines); "
                                "0 refuses the first", low=0, high=2**31 - 1)
    # generated or raw logs: the most values each of the 26 features holds per line (multi-hot; None: one each). A
    # converted folder's bags are fixed at conversion (python -m runner.prepare criteo --bag-sizes)
    bags: Optional[List[int]] = None


@dataclass
class DLRMModelConfig:
    """DLRM (Naumov et al., 2019): bottom MLP over the 13 dense features, one table per categorical feature,
    pairwise dot-product interactions, top MLP, BCE."""

    name: str = "dlrm"
    emb_width: int = hparam(16, "width of every table (and the bottom MLP's output)", low=1, high=MAX_WIDTH)
    bottom: List[int] = field(default_factory=lambda: [64])  # hidden widths below the emb_width output
    top: List[int] = field(default_factory=lambda: [128, 64])  # hidden widths above the interactions
    pooling: Pooling = Pooling.sum  # a multi-hot feature's bag: the sum or the mean of its rows
    tables: Dict[str, TableConfig] = field(default_factory=lambda: {n: TableConfig() for n in TABLES})
    # the 26 tables kept as one (those of one width, dtype and optimizer; runner/core/stacking.py): one dedupe,
    # update and routing exchange a step instead of 26, as FBGEMM's table-batched embeddings do
    stack_tables: bool = True


@dataclass
class DCNModelConfig:
    """DCNv2 (Wang et al., 2021): the dense features and every embedding concatenated, ``cross_layers`` cross
    layers (full-rank, or low-rank of ``low_rank``) and an MLP, stacked or parallel, BCE."""

    name: str = "dcn"
    emb_width: int = hparam(16, "width of every table", low=1, high=MAX_WIDTH)
    cross_layers: int = hparam(3, "cross layers", low=0, high=64)
    low_rank: Optional[int] = hparam(None, "rank of each cross layer's matrix (None: full rank)", low=1,
                                     high=MAX_WIDTH)
    deep: List[int] = field(default_factory=lambda: [128, 64])  # the MLP above (or beside) the cross layers
    structure: DCNStructure = DCNStructure.stacked
    # None: the 13 dense features enter x0 as they are; a list of hidden widths: a bottom MLP maps them to one
    # emb_width vector first (MLPerf DLRMv2's DCN, e.g. [64])
    bottom: Optional[List[int]] = None
    pooling: Pooling = Pooling.sum  # a multi-hot feature's bag: the sum or the mean of its rows
    tables: Dict[str, TableConfig] = field(default_factory=lambda: {n: TableConfig() for n in TABLES})
    # the 26 tables kept as one (those of one width, dtype and optimizer; runner/core/stacking.py): one dedupe,
    # update and routing exchange a step instead of 26, as FBGEMM's table-batched embeddings do
    stack_tables: bool = True
