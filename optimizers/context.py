"""The per-table handle an embedding optimizer works through: sizes, and how the table is laid out.

``AsyncEmbContext`` carries the static facts of one table (rows, width, tokens per batch, the static number
of unique ids) and, when the table is sharded, the mesh, the table axis and the layout:

- ``row``: each table shard owns a contiguous block of ``rows // shards`` rows (``P(table_axis, None)``);
- ``column``: each shard owns ``width // shards`` columns of every row (``P(None, table_axis)``), as the
  seed design does. Each device dedupes its own tokens; the ids go to every shard of its table group
  (all-gather) and each shard returns (lookup) or receives (update) only its width slice of those rows
  (all-to-all), so nothing per token crosses devices. Only the first ``slots_for(tokens)`` of a device's
  sorted distinct ids are exchanged: ``route_capacity`` times ``route_peak``, the most distinct ids one
  device held in sampled train batches (``runner.build.route_peaks``); the update record keeps its size.
  Without a ``route_peak`` the whole buffer is exchanged. A device with more distinct ids follows
  ``route_overflow``: ``REROUTE`` exchanges every device's whole buffer that step, ``STOP`` reads zeros for
  the ids past it and refuses the update.

In the row layout ids are routed (``routing="alltoall"``, the default; ``optimizers/routing.py``): each
device dedupes its own tokens' ids, an all-to-all over the table axis sends each shard only the ids it owns
(at most ``route_slots`` per destination), the owner gathers or updates only those rows. ``"gather"`` is the
older path: every shard sees every id of its data group.

``gradient_update_start`` records its results on the context so ``gradient_update_done`` can return them;
make a fresh context (``ctx.fresh()``) for every traced step.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from ._lazy import P, jax

if TYPE_CHECKING:
    from jax.sharding import Mesh

ROW = "row"
COLUMN = "column"
ALLTOALL = "alltoall"
GATHER = "gather"
REROUTE = "reroute"  # a step whose ids overflow their slots routes the rest in further rounds (column: all at once)
STOP = "stop"  # ids without a slot read zeros and the update is refused: the runner stops the run
ROUTE_MIN_SLOTS = 64  # per-destination slots never fall below this (small batches route exactly)


def num_unique_for(tokens_per_batch: int, vocab: int) -> int:
    """Static size of the unique-id buffer: every distinct id fits, plus one padding slot."""
    return min(tokens_per_batch, vocab) + 1


@dataclasses.dataclass(eq=False)
class AsyncEmbContext:
    vocab: int  # rows of the table as stored (padded rows included); also the out-of-range padding id
    emb_width: int
    tokens_per_batch: int
    mesh: Mesh | None = None
    table_axis: str | None = None  # mesh axis the table is sharded over; None = replicated
    layout: str = ROW
    routing: str = ALLTOALL  # row layout: "alltoall" (ids routed to their owners) or "gather"
    route_capacity: float = 2.0  # per-destination slots: a multiple of route_peak, or else of the even share
    route_min_slots: int = ROUTE_MIN_SLOTS
    # The most distinct ids one device sent one shard in sampled train batches (``routing.route_peak``); when
    # given, slots are ``route_capacity`` times it instead of times the even share of the device's tokens.
    # Column layout: the most distinct ids one device held; its exchange is ``route_capacity`` times it.
    route_peak: int | None = None
    route_overflow: str = REROUTE  # what a step with more ids for one shard (column: one device) than its slots does
    results: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_unique(self) -> int:
        return num_unique_for(self.tokens_per_batch, self.vocab)

    @property
    def table_shards(self) -> int:
        if self.mesh is None or self.table_axis is None:
            return 1
        return int(self.mesh.shape[self.table_axis])

    @property
    def sharded(self) -> bool:
        return self.table_shards > 1

    @property
    def shard_width(self) -> int:
        return self.emb_width // self.table_shards if self.layout == COLUMN else self.emb_width

    @property
    def shard_rows(self) -> int:
        return self.vocab // self.table_shards if self.layout == ROW else self.vocab

    @property
    def routed(self) -> bool:
        """Row layout with ids routed to their owning shard by all-to-all."""
        return self.sharded and self.layout == ROW and self.routing == ALLTOALL

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
        return num_unique_for(self.local_tokens, self.vocab)

    @property
    def route_slots(self) -> int:
        """Per-destination capacity C of the id routing for a train batch (``slots_for(local_tokens)``)."""
        return self.slots_for(self.local_tokens)

    def slots_for(self, tokens: int, exact: bool = False) -> int:
        """C for a device holding ``tokens`` ids: ``route_capacity`` times the measured ``route_peak`` (scaled to
        ``tokens``), or without one, times the even share of its ids (tokens / shards); at least
        ``route_min_slots``, at most what can ever be needed (its distinct ids, or the rows one shard owns);
        ``exact``: that most, so nothing can overflow.

        Column layout: C is how many of the device's distinct ids (the first C of its sorted unique buffer) it
        exchanges, ``route_capacity`` times ``route_peak`` (the most distinct ids one device held in the sampled
        batches, scaled to ``tokens``), at least ``route_min_slots``, at most its distinct ids (``min(tokens,
        vocab)``, the unique buffer less its padding slot). Without a ``route_peak`` there is no even share to
        guess from: C is that most (the whole buffer is exchanged, nothing can overflow)."""
        if self.layout == COLUMN:
            most = max(1, min(tokens, self.vocab))
            if exact or self.route_peak is None:
                return most
        else:
            most = max(1, min(tokens, self.vocab, self.shard_rows))
            if exact:
                return most
        return max(1, min(most, max(math.ceil(self.route_capacity * self.slot_base(tokens)), self.route_min_slots)))

    def slot_base(self, tokens: int) -> float:
        """What ``route_capacity`` multiplies: ``route_peak`` scaled to ``tokens``, or the even share (row
        layout; the column layout without a peak: every distinct id ``tokens`` can hold)."""
        if self.route_peak is not None:
            return self.route_peak * tokens / max(1, self.local_tokens)
        return min(tokens, self.vocab) / (1 if self.layout == COLUMN else self.table_shards)

    def column_capped_for(self, tokens: int) -> bool:
        """A sharded column table whose exchange for a device holding ``tokens`` ids (``slots_for``) is smaller
        than its distinct ids can be: a step with more may overflow it (``route_overflow`` says what then happens)."""
        return self.sharded and self.layout == COLUMN and self.slots_for(tokens) < self.slots_for(tokens, exact=True)

    @property
    def column_capped(self) -> bool:
        """``column_capped_for`` a train batch."""
        return self.column_capped_for(self.local_tokens)

    @property
    def per_device_record(self) -> bool:
        """Each device dedupes only its own tokens, for its lookup and its update record (``make_update``):
        the routed row layout and the column layout. Their ids then travel between devices deduplicated."""
        return self.routed or (self.sharded and self.layout == COLUMN)

    @property
    def reroutes(self) -> bool:
        """A routed step whose ids overflow their slots routes the rest in further rounds of the same slots
        (``REROUTE``); a column step whose ids overflow its exchange exchanges every device's whole unique buffer."""
        return self.route_overflow == REROUTE

    @property
    def counts_routes(self) -> bool:
        """Its lookup and update report ``(overflow, peak)`` and refused ids (``emb/route_*/<table>``): the routed
        row layout and the sharded column layout."""
        return self.per_device_record

    def owner_slots_for(self, tokens: int) -> int:
        """Static size of the unique-row buffer an owning shard dedupes received ids into when each device
        holds ``tokens`` ids: every sender's slots, or every row it owns, plus one padding slot."""
        senders = self.mesh.size if self.mesh is not None else 1  # every device of every data group
        return min(senders * self.slots_for(tokens), self.shard_rows) + 1

    @property
    def record_unique(self) -> int:
        """Static size of an update record's ``unique_tokens`` for this context (``make_update``): the batch's
        distinct ids (``num_unique``), or, routed, every device's own (``mesh.size`` blocks of
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
        return dataclasses.replace(self, results={})

    # --- partition specs of the table, its state and the update (used by the runner and shard_map) ---
    def table_spec(self) -> P:
        if not self.sharded:
            return P()
        return P(self.table_axis, None) if self.layout == ROW else P(None, self.table_axis)

    def state_leaf_spec(self, leaf: Any) -> P:
        """Per-row state follows its table: rows split (row layout) or width split (column layout).

        Per-row scalars (an accumulator, a step count) are replicated over the table axis in the column
        layout, where every shard holds every row.
        """
        ndim = len(getattr(leaf, "shape", ()))
        if not self.sharded or ndim == 0:
            return P()
        if self.layout == ROW:
            return P(self.table_axis, *([None] * (ndim - 1)))
        if ndim >= 2:
            return P(None, self.table_axis, *([None] * (ndim - 2)))
        return P()

    def state_specs(self, state: Any) -> Any:
        return jax.tree.map(self.state_leaf_spec, state)

    def grads_spec(self) -> P:
        """The deferred update's per-token gradients: full rows split over the batch (routed row layout and
        column layout: each device's own tokens) or full rows (gather row layout)."""
        if self.per_device_record:
            return P(self.batch_axes, None)
        return P()

    def update_specs(self, local: bool | None = None) -> tuple[P, P, P, P]:
        """Specs of the update record's fields (unique_tokens, grads, segment_ids, pending). On a
        ``per_device_record`` context the record ``make_update`` builds is per device (``local``, the default
        there): every field but ``pending`` is split over the batch axes; a record of the whole batch
        (``local=False``) has its ids replicated."""
        split = self.per_device_record
        local = split if local is None else local
        seg = P(self.batch_axes) if split else P()
        return (P(self.batch_axes) if local and split else P()), self.grads_spec(), seg, P()
