"""Learning-rate schedules of the fused optimizers: a multiplier of ``learning_rate`` per update.

A schedule is a function of the table's own update count (``EmbOptState.count + 1``, the 1-based number of
the update being applied; refused updates do not count), evaluated inside the compiled step from that traced
count: the learning rate changes every update and the step is compiled once. Every fused optimizer's rule
reads the scheduled value as ``RowContext.learning_rate``.

Kinds (``t`` = the update's count, ``W`` = ``warmup_steps``, ``T`` = ``decay_steps``, ``r`` = ``end_ratio``):

- ``constant``: 1.
- ``warmup``: ``min(1, t / W)``, then 1 (linear warmup from ``1/W``).
- ``cosine``: ``r + (1 - r) * (1 + cos(pi * min(t, T) / T)) / 2``: from 1 down to ``r`` over ``T`` updates.
- ``step``: ``step_factor ** floor(t / step_every)``.
- ``warmup_cosine``: ``warmup`` for ``W`` updates, then ``cosine`` over the next ``T``.

``decay_steps = 0`` means "the whole run": the runner sets it to ``trainer.steps``; a library user passes it.
"""
from __future__ import annotations

import dataclasses
import enum
import math

from ._lazy import jax, jnp
from .hparams import hparam, problems


class ScheduleKind(str, enum.Enum):
    """The shape of a schedule (module docstring)."""

    constant = "constant"
    warmup = "warmup"
    cosine = "cosine"
    step = "step"
    warmup_cosine = "warmup_cosine"


# The longest warmup, cosine or step, in updates: the largest int32. The multiplier is computed in the compiled
# step from the traced update count, where a Python int beyond int32 cannot enter (an OverflowError as it compiles).
MAX_STEPS = 2**31 - 1
DECAYING = (ScheduleKind.cosine, ScheduleKind.warmup_cosine)
WARMING = (ScheduleKind.warmup, ScheduleKind.warmup_cosine)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A multiplier of an optimizer's ``learning_rate`` per update count (module docstring)."""

    kind: ScheduleKind = dataclasses.field(default=ScheduleKind.constant, metadata={
        "doc": "constant, warmup, cosine, step or warmup_cosine"})
    warmup_steps: int = hparam(0, "updates of linear warmup (warmup, warmup_cosine)", low=0, high=MAX_STEPS)
    decay_steps: int = hparam(0, "updates the cosine takes from 1 to end_ratio (cosine, warmup_cosine); 0 = the "
                                 "whole run", low=0, high=MAX_STEPS)
    end_ratio: float = hparam(0.0, "the multiplier at the end of the cosine", low=0.0, high=1.0)
    step_every: int = hparam(1000, "updates between two steps of the step schedule", low=1, high=MAX_STEPS)
    step_factor: float = hparam(0.5, "the step schedule's multiplier per step", low=0.0, high=1.0, low_open=True)

    def __post_init__(self):
        try:
            object.__setattr__(self, "kind", ScheduleKind(self.kind))
        except ValueError:
            raise ValueError(f"schedule kind {self.kind!r} is not one of "
                             f"{', '.join(k.value for k in ScheduleKind)}") from None

    @property
    def warms(self) -> bool:
        """Whether this schedule starts with a warmup (``warmup``, ``warmup_cosine``)."""
        return self.kind in WARMING

    def problems(self) -> list[str]:
        """What keeps this schedule from being evaluated: a warmup of 0 updates, a cosine of 0 (unresolved)."""
        out = []
        if self.warms and self.warmup_steps < 1:
            out.append(f"warmup_steps={self.warmup_steps} must be at least 1 for kind={self.kind.value}")
        if self.kind in DECAYING and self.decay_steps < 1:
            out.append(f"decay_steps={self.decay_steps} must be at least 1 for kind={self.kind.value} (0 = the "
                       "whole run, which only the runner knows)")
        return out

    def over(self, steps: int) -> Schedule:
        """This schedule with ``decay_steps = 0`` read as ``steps`` updates (after the warmup, if any)."""
        if self.kind not in DECAYING or self.decay_steps > 0:
            return self
        warm = self.warmup_steps if self.kind is ScheduleKind.warmup_cosine else 0
        return dataclasses.replace(self, decay_steps=max(1, int(steps) - warm))

    def __call__(self, count: jax.Array) -> jax.Array:
        """The float32 multiplier of update ``count`` (1-based, traced or not)."""
        if bad := problems(self):  # its ranges too: a Schedule built by hand (not by create) is checked here
            raise ValueError(f"Schedule: {'; '.join(bad)}")
        t = jnp.asarray(count, jnp.float32)
        if self.kind is ScheduleKind.constant:
            return jnp.ones((), jnp.float32)
        if self.kind is ScheduleKind.step:
            return jnp.float32(self.step_factor) ** jnp.floor(t / self.step_every)
        warm = jnp.minimum(1.0, t / max(self.warmup_steps, 1))
        if self.kind is ScheduleKind.warmup:
            return warm
        start = self.warmup_steps if self.kind is ScheduleKind.warmup_cosine else 0
        frac = jnp.clip((t - start) / max(self.decay_steps, 1), 0.0, 1.0)
        cos = self.end_ratio + (1.0 - self.end_ratio) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
        return cos if self.kind is ScheduleKind.cosine else jnp.where(t <= start, warm, cos)
