"""The hash tables' refusals (``model.tables.<name>.kind=hash``), run by ``runner.build`` once the tables and the
mesh are known and before anything compiles: a setting or a combination they cannot run stops the run with one
line naming the setting and the way out (``runner.preflight`` re-exports ``check_hash_tables``)."""
from __future__ import annotations

from typing import Any, Mapping

from omegaconf import DictConfig

from . import config as schemas
from .core.hash_tables import top_estimate
from .core.mesh import MeshPlan
from .errors import PreflightError


def check_hash_tables(cfg: DictConfig, plan: MeshPlan, tables: Mapping[str, Any]) -> None:
    """What a hash table (``model.tables.<name>.kind=hash``) cannot do, or cannot do yet, refused by name with the
    way out."""
    hashed = sorted(n for n, s in tables.items() if s.kind == "hash")
    if not hashed:
        return
    name = hashed[0]
    if plan.table_shards > 1 and not plan.layout.splits_rows:
        raise PreflightError(
            f"table '{name}' is a hash table, and hash tables are sharded by rows (each row shard holds whole "
            f"partitions of the slots): mesh {plan.describe()} splits the tables by {plan.layout.name}. Use "
            f"mesh.table_layout=row, or mesh=data (tables replicated, the batch split over every device)")
    for n in hashed:
        parts = tables[n].hash.partitions
        if plan.table_shards > 1 and parts % plan.table_shards:
            raise PreflightError(
                f"model.tables.{n}.partitions={parts}: table '{n}' is a hash table whose slots are split into "
                f"{parts} partitions, and mesh {plan.describe()} has {plan.table_shards} row shards, which must each "
                f"hold whole partitions: use a mesh whose table axis divides {parts}, or "
                f"model.tables.{n}.partitions={plan.table_shards} (a resume with another count than its "
                f"checkpoint's places the ids again), or leave it unset (the default fits the mesh)")
        check_admission(n, tables[n], int(cfg.trainer.batch_size))
    if cfg.async_emb.enabled and int(cfg.async_emb.staleness) > 1:
        raise PreflightError(
            f"table '{name}' is a hash table, and async_emb.staleness={cfg.async_emb.staleness} is not supported "
            f"with hash tables (a deferred update is checked against the slots given away in the one step it "
            f"waits); use async_emb.staleness=1 or async_emb=off")
    if schemas.permute_ids_setting(cfg.mesh.get("permute_ids")) == "true":
        raise PreflightError(f"mesh.permute_ids=true relabels a dense table's ids; table '{name}' is a hash table "
                             f"(its slots are already spread by the id's hash): use mesh.permute_ids=auto or false")


def check_admission(name: str, spec: Any, batch_size: int) -> None:
    """An ``admit_after`` no id can reach is refused: the admission sketch counts every lookup of an id without a
    slot (at most the global batch times the ids an example has in the table, a step) and halves its counts every
    ``admit_window`` steps, so no estimate exceeds ``hash_tables.top_estimate``; above it no id would ever get a
    slot and the table would train nothing. ``spec``: the table's ``TableSpec``."""
    h, per = spec.hash, spec.tokens_per_example
    top = top_estimate(h, batch_size * per)
    if top is None or h.admit_after <= top:
        return
    raise PreflightError(
        f"model.tables.{name}.admit_after={h.admit_after} can never be reached: table '{name}' is looked up at most "
        f"{batch_size * per:,} times a step (trainer.batch_size={batch_size} x {per} id{'s' * (per > 1)} an example) "
        f"and model.tables.{name}.admit_window={h.admit_window} halves its admission counts every {h.admit_window} "
        f"steps, so no id's estimate exceeds {top:,} and no id would ever get a slot (the table would train "
        f"nothing): set model.tables.{name}.admit_after to at most {top:,}, or raise model.tables.{name}.admit_window "
        f"(0: counts never fade)")
