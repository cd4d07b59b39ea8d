"""The dense parameters' optimizer: optax AdamW after global-norm clipping, with a linear warmup from 0 to the
peak learning rate and then a cosine decay to the end learning rate at the last step.

The schedule's numbers (peak, warmup, length, end) enter the compiled step as arguments, not as constants in
it, so runs that differ only in their length or their dense learning rate share one compiled program (and
JAX's persistent compile cache). ``tx()`` and ``schedule()`` without arguments give the same transformation
with the numbers as Python constants, for code outside the step.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

ScheduleArgs = Mapping[str, "float | jax.Array"]


@dataclasses.dataclass(frozen=True)
class DenseOptimizer:
    """The dense parameters' AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization") after
    global-norm clipping, on a warmup-cosine learning-rate schedule; the config's ``dense_optimizer`` group."""

    learning_rate: float  # the peak, reached after warmup_steps
    warmup_steps: int
    total_steps: int  # the run's length: the decay ends here
    end_learning_rate: float
    b1: float = 0.9
    b2: float = 0.999
    weight_decay: float = 0.0
    clip_norm: float = 1.0

    def schedule_args(self) -> dict[str, float]:
        """The schedule's numbers as the step takes them: ``peak``, ``warmup`` (at least 1), ``total`` (past
        the warmup) and ``end``, as floats."""
        warmup = max(int(self.warmup_steps), 1)
        return {"peak": float(self.learning_rate), "warmup": float(warmup),
                "total": float(max(int(self.total_steps), warmup + 1)), "end": float(self.end_learning_rate)}

    def schedule(self, args: ScheduleArgs | None = None) -> Callable[[jax.Array], jax.Array]:
        """The learning rate at update ``count`` (0-based): linear warmup, then cosine decay (optax's
        ``warmup_cosine_decay_schedule`` from 0, written with ``args`` that may be traced)."""
        a = self.schedule_args() if args is None else args

        def lr(count):
            t = jnp.asarray(count, jnp.float32)
            warm = a["peak"] * t / a["warmup"]
            frac = jnp.clip((t - a["warmup"]) / (a["total"] - a["warmup"]), 0.0, 1.0)
            decayed = a["end"] + (a["peak"] - a["end"]) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
            return jnp.where(t < a["warmup"], warm, decayed)

        return lr

    def tx(self, args: ScheduleArgs | None = None) -> optax.GradientTransformation:
        """The optax transformation: clip by global norm, then AdamW at ``schedule(args)``.

        Args:
            args: the schedule's numbers (``schedule_args``), traced inside the step; None: Python constants.
        """
        return optax.chain(optax.clip_by_global_norm(self.clip_norm),
                           optax.adamw(self.schedule(args), self.b1, self.b2, weight_decay=self.weight_decay))
