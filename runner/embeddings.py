"""Embedding tables: their specs, initialisation and (sharded) lookup.

Lookups never materialise a full table on any device. With the table sharded over the mesh's table axis:
- ``row`` layout: ids are all-gathered over the table axis, each shard gathers the rows it owns (zeros
  elsewhere), and a reduce-scatter returns every device its own tokens' full rows;
- ``column`` layout: ids are all-gathered over the table axis, each shard gathers its width slice of every
  row, and an all-to-all rebuilds full rows for each device's own tokens.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from optimizers import COLUMN, AsyncEmbContext


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    vocab: int  # logical rows (ids are hashed into [1, vocab); 0 is the padding row)
    width: int
    tokens_per_example: int
    rows: int  # stored rows: vocab padded up so row shards divide evenly
    dtype: str = "float32"
    init_scale: float = 0.05


def hash_ids(raw: jax.Array, vocab: int) -> jax.Array:
    """Map raw ids (0 = padding) into table rows: 0 stays 0, others land in [1, vocab)."""
    raw = raw.astype(jnp.int32)
    return jnp.where(raw == 0, 0, 1 + (raw - 1) % (vocab - 1))


def init_table(spec: TableSpec, key: jax.Array, sharding: NamedSharding | None, chunk_rows: int = 1 << 18):
    """Normal(0, init_scale) rows, row 0 (padding) and padded rows zero.

    Filled chunk by chunk in place, so initialising needs the table plus one chunk of RNG work, not several
    times the table (a 10M x 64 table is 2.4 GB; drawing it in one go peaks near 10 GB on CPU).
    """
    dtype = jnp.dtype(spec.dtype)
    chunk = min(chunk_rows, spec.rows)
    n_chunks = -(-spec.rows // chunk)

    def fill():
        def body(i, table):
            off = jnp.minimum(i * chunk, spec.rows - chunk)  # the last chunk overlaps its predecessor
            rows = off + jnp.arange(chunk)
            vals = jax.random.normal(jax.random.fold_in(key, i), (chunk, spec.width), jnp.float32)
            vals = jnp.where(((rows > 0) & (rows < spec.vocab))[:, None], vals * spec.init_scale, 0)
            return lax.dynamic_update_slice_in_dim(table, vals.astype(dtype), off, 0)

        return lax.fori_loop(0, n_chunks, body, jnp.zeros((spec.rows, spec.width), dtype))

    return jax.jit(fill, out_shardings=sharding)()


def lookup(ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array) -> jax.Array:
    """Rows for ``ids`` ([B, n] int32, batch split over every mesh axis) -> [B, n, width] float32."""
    if not ctx.sharded:
        return table.at[ids].get(mode="fill", fill_value=0).astype(jnp.float32)
    mesh, axis = ctx.mesh, ctx.table_axis
    batch_axes = tuple(mesh.axis_names)

    def local(table_shard, ids_local):
        group_ids = lax.all_gather(ids_local, axis, axis=0, tiled=True)  # this data group's ids
        if ctx.layout == COLUMN:
            part = table_shard.at[group_ids].get(mode="fill", fill_value=0).astype(jnp.float32)
            return lax.all_to_all(part, axis, split_axis=0, concat_axis=2, tiled=True)
        local_ids = group_ids - lax.axis_index(axis) * ctx.shard_rows
        owned = (local_ids >= 0) & (local_ids < ctx.shard_rows)
        rows = table_shard.at[jnp.where(owned, local_ids, ctx.shard_rows)].get(mode="fill", fill_value=0)
        return lax.psum_scatter(rows.astype(jnp.float32), axis, scatter_dimension=0, tiled=True)

    return jax.shard_map(local, mesh=mesh, in_specs=(ctx.table_spec(), P(batch_axes, None)),
                         out_specs=P(batch_axes, None, None), check_vma=False)(table, ids)
