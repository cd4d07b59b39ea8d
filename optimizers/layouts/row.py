"""What the row layouts share: each table shard owns a contiguous block of ``rows // shards`` rows."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import P
from .base import Layout
from .choices import TableLayout

if TYPE_CHECKING:
    from ..context import AsyncEmbContext


class RowLayout(Layout):
    """The table split by rows over the table axis (``P(table_axis, None)``), its per-row state alike, as
    TorchRec's row-wise sharding (``rw_sharding.py``). ``row_routed`` and ``row_gather`` differ in how ids
    reach the shard that owns their row."""

    table_layout = TableLayout.row
    splits_rows = True

    def table_spec(self, ctx: AsyncEmbContext) -> Any:
        """Rows split over the table axis."""
        return P(ctx.table_axis, None)

    def state_leaf_spec(self, ctx: AsyncEmbContext, leaf: Any) -> Any:
        """Per-row state follows its table: its leading (row) dim is split over the table axis."""
        ndim = len(getattr(leaf, "shape", ()))
        return P() if ndim == 0 else P(ctx.table_axis, *([None] * (ndim - 1)))

    def min_collective_bytes(self, ctx: AsyncEmbContext, unique_device: float, unique_global: float,
                             row_stats: bool = False) -> float:
        """Each device's distinct ids (int32) and their fp32 gradient rows go to their owners."""
        return unique_device * (4 * ctx.emb_width + 4)
