"""Host <-> device placement of batches and results on a mesh that may span several processes.

Each process generates only the rows of the global batch its devices hold (``batch_shard``) and puts them on
the mesh (``put_local``); arrays that are not fully addressable come back to the host gathered (``fetch``),
so every process sees the same numbers. On one process each is a plain ``device_put`` / ``device_get``.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from ..errors import DistributedError
from . import mesh as mesh_lib


def batch_shard(mesh, batch_size: int) -> tuple[int, int]:
    """(shard, num_shards) such that this process's devices hold exactly rows
    ``[shard * B / num_shards, (shard + 1) * B / num_shards)`` of the global batch; (0, 1) on one process.

    Raises if they do not hold one contiguous block (the mesh's device order does not follow the processes).
    """
    if jax.process_count() == 1:
        return 0, 1
    held = mesh_lib.batch_sharding(mesh, np.zeros((batch_size,))).addressable_devices_indices_map((batch_size,))
    rows = sorted({idx[0].indices(batch_size)[:2] for idx in held.values()})
    lo, hi = rows[0][0], rows[-1][1]
    contiguous = all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
    per = hi - lo
    if not contiguous or batch_size % per or lo % per:
        raise DistributedError(f"process {jax.process_index()}'s devices hold batch rows {rows}, not one block of "
                               f"the global batch of {batch_size}; build the mesh from jax.devices() in order")
    return lo // per, batch_size // per


def put_local(mesh, host: Mapping[str, np.ndarray], batch_size: int | None = None) -> dict[str, jax.Array]:
    """This process's rows (from ``batch_shard``) of a global batch of ``batch_size`` -> global arrays with the
    leading dim split over the mesh. ``batch_size=None``: ``host`` is the whole global batch, identical on
    every process, and each process slices out the rows its devices hold."""
    out = {}
    for k, v in host.items():
        sharding = mesh_lib.batch_sharding(mesh, v)
        if jax.process_count() == 1:
            out[k] = jax.device_put(v, sharding)
        else:
            rows = np.shape(v)[0] if batch_size is None else batch_size
            out[k] = jax.make_array_from_process_local_data(sharding, v, (rows, *np.shape(v)[1:]))
    return out


def put_global(mesh, host: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """The whole global batch, identical on every process -> global arrays (each process keeps its rows)."""
    return put_local(mesh, host)


def fetch(tree: Any) -> Any:
    """Device arrays -> numpy on every process, gathering the ones other processes hold parts of."""
    if jax.process_count() == 1:
        return jax.device_get(tree)

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            return multihost_utils.process_allgather(x, tiled=True)
        return np.asarray(x)

    return jax.tree.map(one, tree)


def gather_rows(mesh, host: Mapping[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Every process's rows of a host batch, in global order, on every process (for train metrics)."""
    if jax.process_count() == 1:
        return dict(host)
    return fetch(put_local(mesh, host, batch_size))
