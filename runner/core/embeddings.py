"""Embedding tables: their specs, initialisation and (sharded) lookup.

Lookups never materialise a full table on any device. How ids reach their rows is the table's layout's
business (``ctx.layout.lookup``; one module per layout under ``optimizers/layouts/``): one gather on one
device, ids routed to their owning row shard, ids gathered over the table axis, or width slices exchanged.

With ``TableSpec.permute_ids`` (``mesh.permute_ids``) id ``i`` is stored in row ``optimizers.permute_ids(i, vocab)``
instead of row ``i``, so the hot (small) ids of a Zipf distribution spread over the row shards. The relabelling
happens once, in ``TrainProgram.table_ids`` (``stored_rows``): everything after it (lookup, update records,
row statistics) works on stored rows. Initial values are drawn per id, not per row, so a permuted table starts
as the unpermuted one with its rows relabelled and trains to the same numbers.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from optimizers import AsyncEmbContext, compiler_options, hash2d, permute_ids, unpermute_ids


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One embedding table as the trainer builds it: its name, its logical rows and its width."""

    name: str
    vocab: int  # logical rows: ids in [1, vocab) (row i holds id i); 0 is the padding row
    width: int
    tokens_per_example: int
    rows: int  # stored rows: vocab padded up so row shards divide evenly
    dtype: str = "float32"
    init_scale: float = 0.05
    permute_ids: bool = False  # id i lives in row optimizers.permute_ids(i, vocab) (mesh.permute_ids)
    kind: str = "dense"  # dense | hash (ids mapped to slots: ``hash``) | modulo (raw ids hashed mod vocab - 1)
    hash: Any = None  # kind=hash: its ``hash_tables.HashSpec``
    # a stack of tables (``runner.core.stacking``): the row of each member's id 1, ascending; () otherwise
    bases: tuple[int, ...] = ()
    stored_width: int | None = None  # columns a row is stored with (model.tables.<name>.stored_width); None = width

    @property
    def columns(self) -> int:
        """The columns the table (and its per-element optimizer state) is stored with: ``stored_width`` or the
        width. Past the width they are padding: zero in the table, never read (``AsyncEmbContext.stored_width``)."""
        return self.stored_width or self.width


LANES = 128  # a TPU tile's minor dimension: a float32 row of a multiple of it is stored row-major as it is
AUTO_PAD_FROM = 64  # narrower tables are not padded by default: 2.7x-16x the memory, and no copy at 10M rows


def auto_stored_width(width: int, backend: str, splits_width: bool = False) -> int | None:
    """The stored width ``model.tables.<name>.stored_width=null`` resolves to: on a TPU, a width of at least 64
    that is not a multiple of 128 is padded up to one (XLA would store the table column-major and copy it whole
    around every row gather and scatter: docs/results/tpu.md); None (the width itself) on other backends, for
    narrower widths, and on a layout that splits the width over its shards."""
    if backend != "tpu" or splits_width or width < AUTO_PAD_FROM or width % LANES == 0:
        return None
    return -(-width // LANES) * LANES


def stored_rows(spec: TableSpec, ids: jax.Array, mesh: Mesh | None = None, split: bool = True) -> jax.Array:
    """The rows that hold ``ids`` (int32): the ids themselves, or their relabelling under ``spec.permute_ids``
    (0, the padding id, and ids outside ``[1, vocab)`` stay as they are).

    On a mesh of several devices each device relabels its own ids (``split``: the leading dim is split over
    every mesh axis, as a batch is; else every device holds all of them): the relabelling loops until each of
    its ids has been placed, and a loop over ids split by the SPMD partitioner stops on a condition the
    devices agree on through a collective, which deadlocked XLA:CPU's 2x4 mesh. Per device it needs none."""
    ids = jnp.asarray(ids).astype(jnp.int32)
    if not spec.permute_ids:
        return ids
    if mesh is None or mesh.size == 1:
        return permute_ids(ids, spec.vocab)
    return _relabel_per_device(spec.vocab, mesh, split)(ids)


@functools.lru_cache(maxsize=None)
def _relabel_per_device(vocab: int, mesh: Mesh, split: bool):
    """``permute_ids`` run by each device on its block (``split``) or its copy of the ids, jitted once."""
    where = P(tuple(mesh.axis_names)) if split else P()
    return jax.jit(jax.shard_map(functools.partial(permute_ids, vocab=vocab), mesh=mesh, in_specs=where,
                                 out_specs=where, check_vma=False))


def in_id_order(spec: TableSpec, table: jax.Array, mesh: Mesh | None = None) -> jax.Array:
    """The table with row ``i`` holding id ``i`` (the table itself unless ``spec.permute_ids``): for a model
    that scores whole catalogues by row (the sequential model's ``predict``)."""
    if not spec.permute_ids:
        return table
    return table[stored_rows(spec, jnp.arange(table.shape[0], dtype=jnp.int32), mesh, split=False)]


def normal_block(seed: jax.Array, rows: jax.Array, cols: jax.Array) -> jax.Array:
    """Standard normals [len(rows), len(cols)] that depend only on (seed, global row, global column); ``seed``
    is ``[2]``, or ``[len(rows), 2]``: each row's own.

    A counter-based hash gives 23 uniform bits per entry and ``sqrt(2) * erfinv`` maps them to a normal, so
    any block of the table can be drawn on its own (per shard, per chunk) and every layout gets the same
    values; about 8x cheaper on CPU than ``jax.random.normal``'s threefry.
    """
    h = hash2d(rows, cols, seed[..., 0], seed[..., 1])
    u = ((h >> 9).astype(jnp.float32) + 0.5) * (2.0 / (1 << 23)) - 1.0  # uniform in (-1, 1), never +-1
    return jnp.float32(math.sqrt(2.0)) * lax.erf_inv(u)


def _fill_block(spec: TableSpec, seed: jax.Array, shape: tuple[int, int], row0, col0, chunk_rows: int):
    """This block of the table ([shape] at global (row0, col0)), filled chunk by chunk in place. A stack of
    tables (``seed`` ``[members, 2]``, ``spec.bases``): each member's rows hold what its own table would, its id
    i drawn under its own seed."""
    dtype = jnp.dtype(spec.dtype)
    n_rows, n_cols = shape
    chunk = max(1, min(chunk_rows, n_rows))
    width = min(n_cols, spec.width)  # the columns drawn: a padded table's (stored_width) are zeros past the width
    cols = col0 + jnp.arange(width)

    def body(i, block):
        off = jnp.minimum(i * chunk, n_rows - chunk)  # the last chunk overlaps its predecessor (same values)
        rows = row0 + off + jnp.arange(chunk)
        ids = unpermute_ids(rows, spec.vocab) if spec.permute_ids else rows  # values follow the id
        if spec.bases:  # a stack: the member whose rows these are, and its own id of each
            bases = jnp.asarray(spec.bases, jnp.int32)
            m = jnp.clip(jnp.searchsorted(bases, ids, side="right") - 1, 0, len(spec.bases) - 1)
            vals = normal_block(seed[m], ids - bases[m] + 1, cols) * spec.init_scale
        else:
            vals = normal_block(seed, ids, cols) * spec.init_scale
        vals = jnp.where(((rows > 0) & (rows < spec.vocab))[:, None], vals, 0)  # padding row 0, padded rows
        if n_cols > width:  # stored padded (stored_width): zero columns past the width
            vals = jnp.pad(vals, ((0, 0), (0, n_cols - width)))
        return lax.dynamic_update_slice_in_dim(block, vals.astype(dtype), off, 0)

    return lax.fori_loop(0, -(-n_rows // chunk), body, jnp.zeros(shape, dtype))


def init_table(spec: TableSpec, key: jax.Array, sharding: NamedSharding | None, chunk_rows: int = 1 << 14):
    """Normal(0, init_scale) rows, row 0 (padding) and padded rows zero; the same values on every layout.
    Each value depends on (key, id, column), so under ``spec.permute_ids`` id i's values land in its row.

    Each device fills only its own shard, chunk by chunk and in place, so initialising needs the table plus
    one chunk of work, never a table-sized temporary (drawing a 10M x 64 table with ``jax.random.normal``
    in one go peaks near 10 GB on CPU; a sharded fill through the SPMD partitioner gathers whole tables).
    """
    return table_initializer(spec, sharding, chunk_rows)(key)


def table_initializer(spec: TableSpec, sharding: NamedSharding | None, chunk_rows: int = 1 << 14):
    """``init_table``'s jitted ``key -> table``, to compile ahead (e.g. before a memory baseline is taken)."""
    options = compiler_options([spec.dtype])  # bfloat16: keep XLA:CPU from filling an f32 copy
    fill = lambda k: table_values(spec, k, sharding, chunk_rows)  # noqa: E731
    return jax.jit(fill, out_shardings=sharding, compiler_options=options)


def table_values(spec: TableSpec, key: Any, sharding: NamedSharding | None, chunk_rows: int = 1 << 14):
    """``init_table``'s values as a traceable function, for a jitted program that builds several things
    (``TrainProgram.init_state``); jit it with ``out_shardings=sharding``. A stack of tables (``spec.bases``)
    takes one key per member (a list), each member's rows drawn as its own table's would be."""
    if spec.bases:
        seed = jnp.stack([jax.random.bits(k, (2,), jnp.uint32) for k in key])
    else:
        seed = jax.random.bits(key, (2,), jnp.uint32)
    if sharding is None or len(sharding.device_set) == 1:
        return _fill_block(spec, seed, (spec.rows, spec.columns), 0, 0, chunk_rows)
    mesh, pspec = sharding.mesh, sharding.spec
    local = sharding.shard_shape((spec.rows, spec.columns))

    def fill_shard(s):
        # The spec names the mesh axes each dim is split over; this shard's block starts at its index there.
        starts = [lax.axis_index(axes) * size if axes is not None else 0
                  for axes, size in zip(tuple(pspec) + (None,) * (2 - len(pspec)), local)]
        return _fill_block(spec, s, local, starts[0], starts[1], chunk_rows)

    return jax.shard_map(fill_shard, mesh=mesh, in_specs=P(), out_specs=pspec, check_vma=False)(seed)


def lookup(ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array) -> jax.Array:
    """Rows for ``ids`` ([B, n] int32, batch split over every mesh axis) -> [B, n, width] float32.

    An id outside ``[0, rows)`` reads a row of zeros on every layout (a negative id never wraps around to
    the end of the table). ``TrainProgram.table_ids`` maps ids outside the logical vocab here first. Routed
    ids get room for every id (no capacity: nothing here reports an overflow); the train step uses
    ``lookup_counted``."""
    return lookup_counted(ctx, table, ids, exact=True)[0]


def lookup_counted(ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, exact: bool = False,
                   with_dedupe: bool = False):
    """``lookup`` and, on the routed path, ``(overflow, peak)``: the distinct ids (summed over devices) the
    id routing had no slot for (they read zeros, so a step with any must not be trusted:
    ``emb/route_overflow/<table>``) and the most ids one device sent one shard (the slots this batch
    needed: ``emb/route_peak/<table>``). On the sharded column layout: the distinct ids past a device's
    exchange (``ctx.slots_for``; summed over devices) and the most distinct ids one device held. With
    ``route_overflow="reroute"`` overflowing ids are exchanged again with room for all (they read their
    rows); with ``"stop"`` they read zeros. Both 0 on other layouts. ``with_dedupe`` (per-device records only): also
    each device's dedupe of its own ids, padding id 0 left out, as ``make_update`` builds it (unique ids
    ``[mesh.size * local_unique]`` and segment ids, both split over the batch), to reuse for the update."""
    ids = jnp.where((ids >= 0) & (ids < ctx.stored_rows), ids, ctx.stored_rows)  # stored rows: out of range
    if with_dedupe and not ctx.per_device_record:
        raise ValueError("lookup_counted(with_dedupe=True) needs a per-device record (routed row layout or column "
                         "layout)")
    return ctx.layout.lookup(ctx, table, ids, exact, with_dedupe)
