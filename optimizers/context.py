"""The per-table handle an embedding optimizer works through: sizes, the mesh, and the table's layout.

``AsyncEmbContext`` carries the static facts of one table (its stored rows, width, tokens per batch, the
static number of unique ids) and, when the table is sharded, the mesh, the table axis and the config words
that pick its layout (``table_layout``, ``routing``). ``ctx.layout`` is the layout they select from
``optimizers.layouts.REGISTRY`` (``optimizers.layouts.select``): every layout question (specs, capacity,
lookup, update, metrics) goes to it; see ``optimizers/layouts/`` for what each one does.

``gradient_update_start`` records its results on the context so ``gradient_update_done`` can return them;
make a fresh context (``ctx.fresh()``) for every traced step.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import TYPE_CHECKING, Any

from ._lazy import P, jax
from .hparams import INF, Range, float32_problem, is_number
from .layouts import (ROUTE_CAPACITY, ROUTE_CAPACITY_MAX, ROUTE_MIN_SLOTS, Layout, RouteOverflow, Routing, TableLayout,
                      coerce, select)
from .record import num_unique_for

if TYPE_CHECKING:
    from jax.sharding import Mesh

__all__ = ["AsyncEmbContext", "num_unique_for"]


DC_LAMBDA_RANGE = Range(0.0, INF, high_open=True)
ROUTE_CAPACITY_RANGE = Range(0.0, ROUTE_CAPACITY_MAX, low_open=True)


def dc_lambda_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a context's ``dc_lambda`` (not a number, outside ``[0, inf)``, or a number float32
    does not hold), or None."""
    doc = "delay compensation's strength: a finite number >= 0, or None for no compensation"
    if not is_number(value):
        return f"dc_lambda={value!r} is not a number ({doc})"
    if not DC_LAMBDA_RANGE.contains(value):
        return f"dc_lambda={value!r} is outside {DC_LAMBDA_RANGE} ({doc})"
    return float32_problem("dc_lambda", value)


def size_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be a context's size ``name`` (rows, a width, tokens: a whole number >= 1), or None."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        return f"{name}={value!r} must be an int >= 1"
    return None


def routing_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be a context's routing setting ``name``, or None: ``route_capacity`` a number in
    ``ROUTE_CAPACITY_RANGE``, ``route_min_slots`` an int >= 0, ``route_peak`` None or an int >= 0 (0: the sampled
    batches held no id of the table; the slots are then ``route_min_slots``). Slots are at least 1 whatever these
    are, so 0 and 1 are alike as a floor. A bool is no number here."""
    if name == "route_capacity":
        doc = "routing slots per destination, as a multiple of route_peak or of the even share"
        if not is_number(value):
            return f"route_capacity={value!r} is not a number ({doc})"
        return None if ROUTE_CAPACITY_RANGE.contains(value) else (
            f"route_capacity={value!r} is outside {ROUTE_CAPACITY_RANGE} ({doc})")
    if value is None and name == "route_peak":
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        doc = ("None or an int >= 0 (the most distinct ids one device sent one shard in sampled batches)"
               if name == "route_peak" else "an int >= 0 (the fewest routing slots per destination)")
        return f"{name}={value!r} must be {doc}"
    return None


@dataclasses.dataclass(eq=False)
class AsyncEmbContext:
    """One table's static facts and layout, as the fused update and the lookups see them.

    Attributes:
        stored_rows: rows of the table as stored (padded rows included); also the out-of-range padding id.
        emb_width: the width of a row.
        tokens_per_batch: ids of one table per train batch (its update record's per-token rows): the most
            ``make_update`` takes. The three sizes are ints >= 1, else a ValueError.
        mesh: the device mesh, or None (one device).
        table_axis: the mesh axis the table is sharded over (one of the mesh's, else a ValueError); None =
            replicated. A layout that splits the table's rows (its width) over the axis needs ``stored_rows``
            (``emb_width``) to divide over its shards, else a ValueError (``split_problem``).
        table_layout: how a sharded table is split (``TableLayout``, or its word).
        routing: how the row layout's ids reach their owners (``Routing``, or its word).
        route_capacity: per-destination slots, a multiple of ``route_peak`` or else of the even share: a number
            in ``(0, ROUTE_CAPACITY_MAX]`` (1024, as ``mesh.route_capacity``).
        route_min_slots: per-destination slots never fall below this (an int >= 0; slots are at least 1 anyway).
        route_peak: the most distinct ids one device sent one shard in sampled train batches (column layout:
            the most one device held); when given, slots are ``route_capacity`` times it. None or an int >= 0.
            A routing setting out of its range is a ValueError (``routing_problem``), whatever the layout.
        route_overflow: what a step with more ids for one shard (column: one device) than its slots does.
        stored_width: the columns a row is stored with, at least ``emb_width``; None = ``emb_width``. Wider
            (e.g. a 64-wide table padded to 128 lanes on a TPU, where XLA otherwise stores a narrow table
            column-major and copies it whole around every row gather and scatter): the table and its
            per-element state are ``[rows, stored_width]``; lookups return ``emb_width`` columns, the rules see
            only those, and an update writes zeros past them (a table's padding columns, zero when created,
            stay zero; the state's are never read). Not with a layout that splits the width.
        dc_lambda: delay compensation (DC-ASGD, Zheng et al. 2017): None = off; else every update record
            carries the rows its gradient was computed on (``AsyncEmbGradientUpdate.rows``, ``w_then``) and
            each touched row's summed gradient becomes ``g + dc_lambda * g * g * (w_now - w_then)`` before the
            optimizer's rule, ``w_now`` the row as the update finds it. A finite number >= 0 (0: the records
            carry the rows and nothing is corrected); a negative, NaN or infinite one is a ValueError.
        layout: the ``Layout`` the words select (not an argument).
    """

    stored_rows: int
    emb_width: int
    tokens_per_batch: int
    mesh: Mesh | None = None
    table_axis: str | None = None
    table_layout: TableLayout = TableLayout.row
    routing: Routing = Routing.alltoall
    route_capacity: float = ROUTE_CAPACITY
    route_min_slots: int = ROUTE_MIN_SLOTS
    route_peak: int | None = None
    route_overflow: RouteOverflow = RouteOverflow.reroute
    dc_lambda: float | None = None
    stored_width: int | None = None
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    layout: Layout = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        for name in ("stored_rows", "emb_width", "tokens_per_batch") + (("stored_width",) if self.stored_width else ()):
            if bad := size_problem(name, getattr(self, name)):
                raise ValueError(bad)
        if self.dc_lambda is not None and (bad := dc_lambda_problem(self.dc_lambda)):
            raise ValueError(bad)
        for name in ("route_capacity", "route_min_slots", "route_peak"):
            if bad := routing_problem(name, getattr(self, name)):
                raise ValueError(bad)
        self.table_layout = coerce(TableLayout, self.table_layout)
        self.routing = coerce(Routing, self.routing)
        self.route_overflow = coerce(RouteOverflow, self.route_overflow)
        if self.mesh is not None and self.table_axis is not None and self.table_axis not in self.mesh.axis_names:
            raise ValueError(f"table_axis={self.table_axis!r} is not an axis of the mesh (its axes: "
                             f"{', '.join(map(repr, self.mesh.axis_names))}): name one of them, or give None to "
                             "replicate the table")
        self.layout = select(self.table_layout, self.routing, self.table_shards)
        if bad := self.split_problem():
            raise ValueError(bad)
        if self.stored_width is None:
            self.stored_width = self.emb_width
        if not self.emb_width <= self.stored_width:
            raise ValueError(f"stored_width={self.stored_width} is narrower than the table's width {self.emb_width}: "
                             "give at least the width (or None)")
        if self.padded and self.layout.splits_width:
            raise ValueError(f"stored_width={self.stored_width} pads rows of width {self.emb_width}, which the "
                             f"{self.layout.name} layout splits over its shards: pad only a table it does not split")

    def split_problem(self) -> str | None:
        """Why the table cannot be split over its shards as its layout splits it, or None: a layout that gives each
        shard a block of rows needs ``stored_rows`` to divide over them, one that gives each a slice of every row
        ``emb_width`` (else a ``shard_map`` deep in the update fails to split it)."""
        n, axis = self.table_shards, self.table_axis
        if self.layout.splits_rows and self.stored_rows % n:
            return (f"stored_rows={self.stored_rows} does not divide over the {n} shards of mesh axis {axis!r}, "
                    f"which the {self.layout.name} layout gives a block of rows each: store the table with a multiple "
                    f"of {n} rows (e.g. {-(-self.stored_rows // n) * n}; rows no id names are never touched), or use "
                    "table_layout='column'")
        if self.layout.splits_width and self.emb_width % n:
            return (f"emb_width={self.emb_width} does not divide over the {n} shards of mesh axis {axis!r}, which "
                    f"the {self.layout.name} layout gives a slice of every row each: use a width that is a multiple "
                    f"of {n}, or table_layout='row'")
        return None

    @property
    def padded(self) -> bool:
        """Rows are stored wider than ``emb_width`` (``stored_width``): lookups and rules use the first columns."""
        return self.stored_width != self.emb_width

    def narrow(self, rows: jax.Array) -> jax.Array:
        """``rows [..., stored_width]`` -> their first ``emb_width`` columns (as they are when not padded)."""
        return rows[..., :self.emb_width] if self.padded else rows

    @property
    def num_unique(self) -> int:
        """Static size of the whole batch's unique-id buffer."""
        return num_unique_for(self.tokens_per_batch, self.stored_rows)

    @property
    def table_shards(self) -> int:
        """Shards of the table axis (1 when the table is replicated)."""
        if self.mesh is None or self.table_axis is None:
            return 1
        return int(self.mesh.shape[self.table_axis])

    @property
    def sharded(self) -> bool:
        """Whether the table is split over more than one shard."""
        return self.table_shards > 1

    @property
    def one_device(self) -> bool:
        """Whether programs on this context run on one device (no mesh, or a mesh of one). Only such programs
        take the native CPU kernels (``optimizers.kernels``): XLA:CPU runs a multi-device program's devices on
        one thread pool, where a collective beside a custom call was seen to wait forever for its peers."""
        return self.mesh is None or self.mesh.size == 1

    @property
    def shard_width(self) -> int:
        """Columns one shard holds."""
        return self.layout.shard_width(self)

    @property
    def shard_rows(self) -> int:
        """Rows one shard holds."""
        return self.layout.shard_rows(self)

    @property
    def routed(self) -> bool:
        """Ids are routed to their owning shard by all-to-all (the routed row layout)."""
        return self.layout.routes_to_owners

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """Every mesh axis: the batch (and a routed update's per-token rows) is split over all of them."""
        return tuple(self.mesh.axis_names) if self.mesh is not None else ()

    @property
    def local_tokens(self) -> int:
        """Tokens each device holds (the batch split over every mesh axis)."""
        return self.tokens_per_batch // (self.mesh.size if self.mesh is not None else 1)

    @property
    def local_unique(self) -> int:
        """Static size of a device's own unique-id buffer (its tokens' distinct ids plus one padding slot)."""
        return num_unique_for(self.local_tokens, self.stored_rows)

    @property
    def route_slots(self) -> int:
        """Per-destination capacity C of the id routing for a train batch (``slots_for(local_tokens)``)."""
        return self.slots_for(self.local_tokens)

    def slots_for(self, tokens: int, exact: bool = False) -> int:
        """C for a device holding ``tokens`` ids (``Layout.slots_for``); ``exact``: room for every id."""
        return self.layout.slots_for(self, tokens, exact)

    def slot_base(self, tokens: int) -> float:
        """What ``route_capacity`` multiplies for a device holding ``tokens`` ids (``Layout.slot_base``)."""
        return self.layout.slot_base(self, tokens)

    def column_capped_for(self, tokens: int) -> bool:
        """A sharded column table whose exchange for a device holding ``tokens`` ids (``slots_for``) is smaller
        than its distinct ids can be: a step with more may overflow it (``route_overflow`` says what then happens)."""
        return self.sharded and self.layout.capped_for(self, tokens)

    @property
    def column_capped(self) -> bool:
        """``column_capped_for`` a train batch."""
        return self.column_capped_for(self.local_tokens)

    @property
    def per_device_record(self) -> bool:
        """Each device dedupes only its own tokens, for its lookup and its update record (``make_update``):
        the routed row layout and the column layout. Their ids then travel between devices deduplicated."""
        return self.layout.per_device_record

    @property
    def reroutes(self) -> bool:
        """A routed step whose ids overflow their slots routes the rest in further rounds of the same slots
        (``REROUTE``); a column step whose ids overflow its exchange exchanges every device's whole unique buffer."""
        return self.route_overflow == RouteOverflow.reroute

    @property
    def counts_routes(self) -> bool:
        """Its lookup and update report ``(overflow, peak)`` and refused ids (``emb/route_*/<table>``): the routed
        row layout and the sharded column layout (``Layout.metrics``)."""
        return bool(self.layout.metrics)

    def owner_slots_for(self, tokens: int) -> int:
        """Static size of the unique-row buffer an owning shard dedupes received ids into when each device
        holds ``tokens`` ids: every sender's slots, or every row it owns, plus one padding slot."""
        senders = self.mesh.size if self.mesh is not None else 1  # every device of every data group
        return min(senders * self.slots_for(tokens), self.shard_rows) + 1

    @property
    def record_unique(self) -> int:
        """Static size of an update record's ``unique_tokens`` for this context (``make_update``): the batch's
        distinct ids (``num_unique``), or, per device, every device's own (``mesh.size`` blocks of
        ``local_unique``, one per device, split like the batch). The two sizes differ whenever the mesh has
        more than one device, so a record says which kind it is (``local_record``)."""
        return self.mesh.size * self.local_unique if self.per_device_record else self.num_unique

    def local_record(self, update: Any) -> bool:
        """Whether ``update`` holds per-device ids (``make_update`` on a ``per_device_record`` context), not the
        batch's (one device's)."""
        return self.per_device_record and update.unique_tokens.shape[0] == self.record_unique

    @property
    def owner_unique(self) -> int:
        """``owner_slots_for`` a train batch."""
        return self.owner_slots_for(self.local_tokens)

    def fresh(self) -> "AsyncEmbContext":
        """A copy with no recorded results, for one traced step."""
        return dataclasses.replace(self, results={})

    # --- partition specs of the table, its state and the update (used by the runner and shard_map) ---
    def table_spec(self) -> P:
        """The table's ``PartitionSpec`` (``Layout.table_spec``)."""
        return self.layout.table_spec(self)

    def state_leaf_spec(self, leaf: Any) -> P:
        """One optimizer-state leaf's ``PartitionSpec``: per-row state follows its table (``Layout.state_leaf_spec``)."""
        return self.layout.state_leaf_spec(self, leaf)

    def state_specs(self, state: Any) -> Any:
        """``state_leaf_spec`` of every leaf of ``state``."""
        return jax.tree.map(self.state_leaf_spec, state)

    def grads_spec(self) -> P:
        """The deferred update's per-token gradients: full rows split over the batch (per-device records) or
        full rows (a record of the whole batch)."""
        if self.per_device_record:
            return P(self.batch_axes, None)
        return P()

    @property
    def compensates(self) -> bool:
        """Whether updates are delay-compensated (``dc_lambda`` given): their records carry ``rows``."""
        return self.dc_lambda is not None

    def update_specs(self, local: bool | None = None) -> tuple:
        """Specs of the update record's fields (unique_tokens, grads, segment_ids, pending, rows: like the
        gradients under delay compensation, else None). On a
        ``per_device_record`` context the record ``make_update`` builds is per device (``local``, the default
        there): every field but ``pending`` is split over the batch axes; a record of the whole batch
        (``local=False``) has its ids replicated."""
        split = self.per_device_record
        local = split if local is None else local
        seg = P(self.batch_axes) if split else P()
        rows = self.grads_spec() if self.compensates else None
        return (P(self.batch_axes) if local and split else P()), self.grads_spec(), seg, P(), rows
