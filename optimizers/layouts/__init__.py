"""Table layouts: one module per layout, one registry, and the config words that select them.

| layout | selected by | what crosses devices |
|---|---|---|
| `single` | a table axis of one shard (or none) | nothing |
| `row_routed` | `table_layout=row`, `routing=alltoall` | each device's distinct ids and their rows or gradients, to or from their owner |
| `row_gather` | `table_layout=row`, `routing=gather` | every id of the data group, and full rows back |
| `column` | `table_layout=column` | each device's distinct ids and their rows' width slices |

Adding a layout is one module here (a :class:`Layout` subclass: its specs, lookup, update, metrics and cost
model) plus one line in ``REGISTRY`` (and, if no existing word selects it, a member of ``TableLayout`` or
``Routing``); the contract test then runs every optimizer on it.
"""
from __future__ import annotations

from .base import ROUTE_METRICS, Layout
from .choices import ROUTE_CAPACITY, ROUTE_CAPACITY_MAX, ROUTE_MIN_SLOTS, Choice, RouteOverflow, Routing, TableLayout
from .column import Column
from .row_gather import RowGather
from .row_routed import RowRouted
from .single import Single

REGISTRY: dict[str, Layout] = {layout.name: layout for layout in (Single(), RowRouted(), RowGather(), Column())}
SINGLE = REGISTRY["single"]


def select(table_layout: TableLayout | str, routing: Routing | str, shards: int) -> Layout:
    """The registered layout the config words pick for a table split over ``shards`` shards.

    Args:
        table_layout: a ``TableLayout`` member or its word (``"row"``, ``"column"``).
        routing: a ``Routing`` member or its word; only layouts that declare one are told apart by it.
        shards: the size of the table axis (1, or no table axis: the one-device layout, whatever the words).

    Raises:
        ValueError: a word that names no member, naming the words there are.
    """
    table_layout, routing = coerce(TableLayout, table_layout), coerce(Routing, routing)
    if shards <= 1:
        return SINGLE
    for layout in REGISTRY.values():
        if layout.table_layout == table_layout and layout.routing in (None, routing):
            return layout
    raise ValueError(f"no registered layout for table_layout={table_layout}, routing={routing}")  # pragma: no cover


def coerce(kind: type[Choice], value: Choice | str) -> Choice:
    """``value`` as a member of ``kind`` (a member, or its word); a ValueError naming the words otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{kind.__name__} {value!r} is not one of {', '.join(m.value for m in kind)}") from None


__all__ = ["Layout", "REGISTRY", "SINGLE", "select", "coerce", "Choice", "TableLayout", "Routing", "RouteOverflow",
           "ROUTE_CAPACITY", "ROUTE_CAPACITY_MAX", "ROUTE_MIN_SLOTS", "ROUTE_METRICS", "Single", "RowRouted", "RowGather", "Column"]
