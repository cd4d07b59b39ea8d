"""The device mesh: axis names, PartitionSpecs and shardings, all in one place.

A mesh config names its axes and their sizes (``-1`` fills the remaining devices) and which axis, if any,
the embedding tables are sharded over. The batch is always split over every mesh axis (data parallel over
``data`` and ``table`` alike), so each device feeds ``global_batch / num_devices`` examples.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from optimizers import Layout, Routing, TableLayout, select

DATA = "data"
TABLE = "table"


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """The resolved mesh: axis names and sizes (no -1 left), the table axis and the words of its layout
    (``mesh.table_layout``, ``mesh.routing``); ``layout`` is the layout they select."""

    axes: tuple[tuple[str, int], ...]
    table_axis: str | None
    table_layout: TableLayout | str = TableLayout.row
    routing: Routing | str = Routing.alltoall

    @property
    def layout(self) -> Layout:
        """The tables' layout on this mesh (``optimizers.select``: the one-device layout for one shard)."""
        return select(self.table_layout, self.routing, self.table_shards)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axis names, in order."""
        return tuple(name for name, _ in self.axes)

    @property
    def num_devices(self) -> int:
        """Devices the mesh uses: the product of the axis sizes."""
        return math.prod(size for _, size in self.axes)

    @property
    def table_shards(self) -> int:
        """Shards of each embedding table: the table axis' size (1 without a table axis)."""
        return dict(self.axes).get(self.table_axis, 1) if self.table_axis else 1

    def describe(self) -> str:
        """The axes as the run's log shows them, e.g. ``data=4xtable=2``."""
        return "x".join(f"{n}={s}" for n, s in self.axes)


def resolve_axes(axes: Mapping[str, int], num_devices: int) -> tuple[tuple[str, int], ...]:
    """Replace a single ``-1`` with whatever devices remain. Raises ValueError with the fix."""
    axes = dict(axes)
    fills = [n for n, s in axes.items() if s == -1]
    if len(fills) > 1:
        raise ValueError(f"mesh.axes {axes}: only one axis may be -1 (fill); set the others to sizes")
    bad = {n: s for n, s in axes.items() if s != -1 and s < 1}
    if bad:
        raise ValueError(f"mesh.axes {bad}: axis sizes must be positive or -1 (fill with the remaining devices)")
    fixed = math.prod(s for s in axes.values() if s != -1)
    if fills:
        if num_devices % fixed:
            raise ValueError(
                f"mesh.axes {axes}: {num_devices} devices do not divide by the fixed axes' product {fixed}; "
                f"choose sizes whose product divides {num_devices}"
                + (f", or on a CPU give it virtual devices (mesh.cpu_devices={fixed} or "
                   f"a multiple of {fixed})" if num_devices < fixed else ""))
        axes[fills[0]] = num_devices // fixed
    return tuple(axes.items())


def build_mesh(plan: MeshPlan, devices: list | None = None) -> Mesh:
    """The ``jax.sharding.Mesh`` of ``plan`` over the first ``plan.num_devices`` of ``devices`` (default
    ``jax.devices()``: global, ordered by process), reshaped to the axis sizes in order."""
    devices = jax.devices() if devices is None else devices
    shape = tuple(size for _, size in plan.axes)
    return Mesh(np.asarray(devices[: plan.num_devices]).reshape(shape), plan.axis_names)


def batch_spec(mesh: Mesh, ndim: int = 1) -> P:
    """The batch's leading dim split over every mesh axis; the rest replicated."""
    return P(tuple(mesh.axis_names), *([None] * (ndim - 1)))


def batch_sharding(mesh: Mesh, x: Any) -> NamedSharding:
    """The sharding of a batch array like ``x``: its leading dim split over every mesh axis (``batch_spec``)."""
    return NamedSharding(mesh, batch_spec(mesh, np.ndim(x)))


def replicated(mesh: Mesh) -> NamedSharding:
    """A sharding that keeps a whole copy on every device of ``mesh``."""
    return NamedSharding(mesh, P())


def named(mesh: Mesh, specs: Any) -> Any:
    """A pytree of ``PartitionSpec`` -> the same pytree of ``NamedSharding`` on ``mesh``."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


