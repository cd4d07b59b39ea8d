"""The words that pick a table's layout, declared once for the library and the runner's config schema.

Each is a ``str`` Enum (:class:`Choice`): a member equals its word, so a word read from YAML or given as an
argument (``"column"``) selects the same member, and OmegaConf, given one of these as the type of a schema
field, refuses any other word when the config is composed (``Invalid value 'x', expected one of [a, b]``).
"""
from __future__ import annotations

from enum import Enum

ROUTE_CAPACITY = 1.2  # per-destination slots, as a multiple of the sampled peak (or of the even share)
ROUTE_MIN_SLOTS = 64  # per-destination slots never fall below this (small batches route exactly)
# route_capacity's largest value: well past every exact routing (capacity >= the table shards, or >= 1 over a peak),
# and small enough that capacity times any batch's ids stays a float (mesh.route_capacity's bound as well)
ROUTE_CAPACITY_MAX = 1024.0


class Choice(str, Enum):
    """A setting that takes one of a few words; ``str()`` and f-strings give the word."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class TableLayout(Choice):
    """How a sharded table is split over the mesh's table axis (``mesh.table_layout``)."""

    row = "row"  # each table shard owns a block of rows
    column = "column"  # each table shard owns a slice of every row


class Routing(Choice):
    """How ids reach the shard that owns their row in the row layout (``mesh.routing``)."""

    alltoall = "alltoall"  # each device's distinct ids go to their owning shard by all-to-all
    gather = "gather"  # every shard sees every id of its data group (the older path)


class RouteOverflow(Choice):
    """What a step does with ids past their slots (``mesh.route_overflow``)."""

    reroute = "reroute"  # the rest is routed in further rounds (column layout: every device's whole buffer)
    stop = "stop"  # such ids read zeros, the step's embedding update is refused and the runner stops the run
