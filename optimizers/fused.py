"""The fused optimizer base: a subclass writes its per-row rule, this does the rest, on every layout.

A fused optimizer gives ``init_rows`` (its per-row state) and ``update_rows`` (the rule over gathered rows, in
float32). ``apply_fused`` applies an update record through that rule: the table's layout (``ctx.layout``,
``optimizers/layouts/``) brings each shard its unique rows and their fp32 summed gradients, and the shared
gather -> rule -> gate -> in-place scatter (``optimizers.row_update``) writes them, on one device or inside
``jax.shard_map`` over a table-sharded mesh. The cost of an update grows with the rows a batch touches, never
with the vocabulary, and an update whose gradient or result is not finite writes nothing. This follows the
fused backward-plus-optimizer kernels of FBGEMM's table-batched embeddings, as TorchRec uses them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ._lazy import jnp, lax
from .checks import check_update
from .fields import as_bias_correction, as_weight_decay_mode
from .protocol import AsyncEmbGradientUpdate, AsyncEmbOptimizer
from .row_update import EmbOptState, GlobalDecay, RowContext, WeightDecayMode, decay_mode
from .schedules import ScheduleKind

if TYPE_CHECKING:
    import jax

    from .context import AsyncEmbContext

__all__ = ["FusedEmbOptimizer", "EmbOptState", "RowContext", "apply_fused"]


class FusedEmbOptimizer(AsyncEmbOptimizer):
    """Base of the fused optimizers: subclasses give ``init_rows`` and ``update_rows`` only."""

    def init_rows(self, num_rows: int, width: int) -> Any:  # pragma: no cover - abstract
        """The per-row state of a ``num_rows`` x ``width`` table (leaves with a leading row dim)."""
        raise NotImplementedError

    def update_rows(self, rows: jax.Array, state: Any, grad: jax.Array, rc: RowContext) -> tuple[jax.Array, Any]:
        """The rule: new float32 rows and state of the gathered touched rows, from their summed gradient."""
        raise NotImplementedError  # pragma: no cover - abstract

    # The optimizers.kernels rule that computes this class's own update_rows natively on a CPU (a subclass that
    # overrides update_rows does not inherit it), and the rule's attributes from this instance's settings.
    native_rule: ClassVar[str | None] = None

    def native_attrs(self) -> dict[str, Any]:
        """The native rule's attributes (``native_rule``): its hyperparameters besides the learning rate."""
        return {}

    def learning_rate_at(self, count: jax.Array):
        """The learning rate of update ``count`` (1-based): ``learning_rate`` times ``schedule(count)``
        (``optimizers.schedules``); ``learning_rate`` itself, a Python float, when the schedule is constant or
        there is none. The rules read it as ``RowContext.learning_rate``."""
        lr = getattr(self, "learning_rate", None)
        schedule = getattr(self, "schedule", None)
        if lr is None or schedule is None or schedule.kind is ScheduleKind.constant:
            return lr
        return lr * schedule(count)

    def __post_init__(self):
        """A word given for ``weight_decay_mode`` or ``bias_correction`` (``optimizers.fields``) as the Enum."""
        if hasattr(self, "weight_decay_mode"):
            object.__setattr__(self, "weight_decay_mode", as_weight_decay_mode(self.weight_decay_mode))
        if hasattr(self, "bias_correction"):
            object.__setattr__(self, "bias_correction", as_bias_correction(self.bias_correction))

    def problems(self) -> list[str]:
        """Checks across hyperparameters (``optimizers.problems`` adds them to the range checks): with
        ``weight_decay_mode=decoupled_global`` the per-update decay ``1 - learning_rate * weight_decay`` must be
        positive."""
        if decay_mode(self) is WeightDecayMode.decoupled_global and self.learning_rate * self.weight_decay >= 1:
            return [f"weight_decay={self.weight_decay} with learning_rate={self.learning_rate} decays a row by "
                    f"1 - {self.learning_rate * self.weight_decay:g} per update under weight_decay_mode="
                    "decoupled_global: their product must be below 1"]
        return []

    def init(self, num_rows: int, width: int) -> EmbOptState:
        """The optimizer state of a ``num_rows`` x ``width`` table: ``init_rows`` and an update count of 0."""
        decay = None
        if decay_mode(self) is WeightDecayMode.decoupled_global:
            decay = GlobalDecay(jnp.zeros((num_rows,), jnp.float32), jnp.zeros((), jnp.float32))
        return EmbOptState(self.init_rows(num_rows, width), jnp.zeros((), jnp.int32), decay)

    # The protocol -------------------------------------------------------------------------------------
    def gradient_update_start(self, context: AsyncEmbContext, update: AsyncEmbGradientUpdate,
                              table: jax.Array, state: EmbOptState, gate: jax.Array):
        """Apply ``update`` (``apply_fused``); returns ``((norm, valid), table, state)``. Hyperparameters outside
        their ranges (``optimizers.problems``), a table that is not a float ``[context.stored_rows,
        context.stored_width]`` array, a state that is not ``self.init`` of those, or a record built on another
        context is a ValueError naming it (``optimizers.checks``), at trace time."""
        table, state, norm, valid, rows = apply_fused(self, context, update, table, state, gate)
        context.results.update(norm=norm, valid=valid, rows_per_shard=rows)
        return (norm, valid), table, state

    def gradient_update_done(self, context: AsyncEmbContext, gate: jax.Array):
        """``(norm, valid, done_pin)``: ``norm`` is the global L2 norm of the deduped gradient; ``valid`` is
        true only when the update was pending, its gradient finite and the rows and state it computed
        finite, i.e. when it was written. A refused update (``valid`` false with a finite ``norm``: the
        rule's result overflowed or was NaN, e.g. a huge learning rate, or eps=0 on a zero gradient in a class
        that declares no ranges: the built-in ones refuse eps=0 or b1=1 when the update is traced) left table
        and state bit-for-bit unchanged, exactly like a non-finite gradient."""
        if "norm" not in context.results:
            raise RuntimeError("gradient_update_done called before gradient_update_start on this context")
        norm, valid = context.results["norm"], context.results["valid"]
        done_pin = lax.optimization_barrier((jnp.asarray(gate), norm, valid))[0]
        return norm, valid, done_pin


def apply_fused(opt: FusedEmbOptimizer, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate,
                table: jax.Array, state: EmbOptState, gate: jax.Array):
    """Apply ``update`` to the touched rows; returns (table, state, norm, valid, rows_updated_per_shard).

    The table's layout runs the update (``Layout.update``). A layout that counts routes (routed row, sharded
    column) also records ``ctx.results["route_refused"]``: what it could not deliver, so the update was
    refused whole (``valid`` false). Routed row, ``route_overflow="stop"``: the ids without a slot at their
    owner (summed over the sending devices); ``"reroute"``: such ids are routed in further rounds, and only
    rows past an owner's buffer (``ctx.owner_slots_for``) count (summed over the table shards). Column,
    ``"stop"``: the distinct ids past a device's exchange (``ctx.slots_for``, summed over devices);
    ``"reroute"``: such a step exchanges every device's whole buffer and nothing is refused (0)."""
    check_update(opt, ctx, update, table, state)
    if ctx.compensates != (update.rows is not None):
        raise ValueError(f"an update record {'without' if ctx.compensates else 'with'} rows (w_then) on a context "
                         f"{'with' if ctx.compensates else 'without'} delay compensation (dc_lambda): build "
                         "records with make_update/empty_update on the table's own context")
    # The gate orders the table writes after the gate's producer (e.g. the lookup that reads the table).
    table, state, gate = lax.optimization_barrier((table, state, jnp.asarray(gate)))
    return ctx.layout.update(opt, ctx, update, table, state, gate)
