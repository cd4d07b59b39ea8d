"""The async embedding-optimizer protocol.

An embedding optimizer that implements both methods of :class:`AsyncEmbOptimizer` can apply a deferred
(or same-step) :class:`AsyncEmbGradientUpdate` to its table in place: it dedupes nothing itself (the update
already carries the batch's unique ids and each token's segment), segment-sums the per-token gradients in
fp32, updates only the touched rows and their state, and reports the global norm of the deduped gradient
and whether the update was applied (it is refused whole when its gradient or its result is not finite).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    import jax

NO_FUSED_UPDATE = (
    "use_async_emb requires an embedding optimizer implementing AsyncEmbOptimizer, "
    "and {name} has no fused table update"
)


def no_fused_update_message(opt_or_cls: Any) -> str:
    """The error for an optimizer (or class) used with ``use_async_emb`` that has no fused table update."""
    cls = opt_or_cls if isinstance(opt_or_cls, type) else type(opt_or_cls)
    return NO_FUSED_UPDATE.format(name=cls.__name__)


class AsyncEmbGradientUpdate(NamedTuple):
    """A batch's embedding gradient, deduplicated but not yet segment-summed.

    unique_tokens: int32 [num_unique], sorted, padded with the out-of-range id ``vocab`` (scatters drop it).
    grads: [tokens_per_batch, width], one row per token.
    segment_ids: int32 [tokens_per_batch], each token's index into ``unique_tokens``; -1 for padding tokens.
    pending: bool scalar, false when there is nothing to apply (first step, or after a flush).
    rows: [tokens_per_batch, width] float32 or None: each token's row as the gradient was computed on it
        (``w_then``), carried only for delay compensation (``AsyncEmbContext.dc_lambda``); None otherwise.

    On the routed row layout (``AsyncEmbContext.routed``) ``make_update`` builds the record per device:
    ``unique_tokens`` is ``mesh.size`` blocks of ``local_unique`` (each device's own sorted distinct ids) and
    a token's segment id indexes its own device's block (``AsyncEmbContext.record_unique``/``local_record``).
    """

    unique_tokens: jax.Array
    grads: jax.Array
    segment_ids: jax.Array
    pending: jax.Array
    rows: Any = None


@runtime_checkable
class AsyncEmbOptimizer(Protocol):
    """Two-phase fused table update: ``start`` applies the update, ``done`` reports on it."""

    def gradient_update_start(
        self, context: Any, update: AsyncEmbGradientUpdate, table: jax.Array, state: Any, gate: jax.Array
    ) -> tuple[tuple[jax.Array, ...], jax.Array, Any]:
        """Apply ``update`` to ``table`` and ``state``; returns ``(keepalive, table, state)``."""
        raise NotImplementedError(no_fused_update_message(self))

    def gradient_update_done(self, context: Any, gate: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Returns ``(norm, valid, done_pin)`` for the update started on ``context``: the global L2 norm of
        the deduped gradient, and whether the update was applied. ``valid`` is false, and table and state
        were left bit-for-bit unchanged, when nothing was pending, the gradient was not finite, or the rows
        or state the update computed were not finite (then ``norm`` may well be finite)."""
        raise NotImplementedError(no_fused_update_message(self))


def _overrides(cls: type, name: str) -> bool:
    impl = getattr(cls, name, None)
    return impl is not None and impl is not getattr(AsyncEmbOptimizer, name)


def supports_async_emb(opt: Any) -> bool:
    """True only when both protocol methods are really implemented (not the raising defaults)."""
    cls = opt if isinstance(opt, type) else type(opt)
    return _overrides(cls, "gradient_update_start") and _overrides(cls, "gradient_update_done")
