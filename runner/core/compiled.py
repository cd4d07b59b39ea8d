"""The compiled entry points a ``TrainProgram`` hands out (``TrainProgram.compile``): the jitted step and
flush behind small callables, and the process-wide cache that lets programs of the same shape share them."""
from __future__ import annotations

from typing import Any

from .state import TrainState

# (reuse_key, what) -> the jitted init or (step, flush, predict) of the programs used last in this process
_JITTED: dict[tuple, Any] = {}
_JITTED_KEEP = 8


def reused(key: tuple, make):
    """The jitted function(s) cached under ``key`` in this process, made by ``make()`` the first time; the
    ``_JITTED_KEEP`` used last are kept."""
    jitted = _JITTED.pop(key, None)
    _JITTED[key] = make() if jitted is None else jitted  # the most recently used last
    while len(_JITTED) > _JITTED_KEEP:
        _JITTED.pop(next(iter(_JITTED)))
    return _JITTED[key]


class FlushFn:
    """``flush(state) -> state``: the jitted flush, the state donated; ``with_metrics(state)`` also returns
    its record (``TrainProgram.flush``). ``lower`` takes the same argument, for inspecting the compiled flush."""

    def __init__(self, jitted):
        self.jitted = jitted

    def __call__(self, state: TrainState) -> TrainState:
        return self.jitted(state)[0]

    def with_metrics(self, state: TrainState):
        """``(state, metrics)``: the flushed state and the flushed update's record."""
        return self.jitted(state)

    def lower(self, state: TrainState):
        """The lowered flush (``jax.stages.Lowered``), e.g. to read its HLO."""
        return self.jitted.lower(state)


class StepFn:
    """``step(state, batch) -> (state, metrics)``: the jitted step (``TrainProgram.step_core``), every state
    buffer donated except the deferred updates. The record applied is written anew while it is still being
    applied, so donating it only makes XLA copy both (four copies of the per-token gradients per table per
    step); fresh buffers cost nothing. Under staleness k > 1 the step gets the head of each queue and the
    later records' ids, and the queue is shifted here (``TrainProgram.shift_queue``), so the records that
    stay queued never pass through the compiled step (which would copy each). The run's numbers
    (``TrainProgram.run_args``) go in as arguments too. ``lower`` takes the same arguments, for inspecting
    the compiled step."""

    def __init__(self, jitted, args, program):
        self.jitted, self.args, self.program = jitted, args, program

    def _inputs(self, state: TrainState, batch):
        head, later = self.program.split_queue(state.pending)
        return (state._replace(pending={}), head, self.program.later_ids(later), batch, self.args), later

    def __call__(self, state: TrainState, batch):
        inputs, later = self._inputs(state, batch)
        new, metrics = self.jitted(*inputs)
        return new._replace(pending=self.program.shift_queue(later, new.pending)), metrics

    def lower(self, state: TrainState, batch):
        """The lowered step (``jax.stages.Lowered``) for ``state`` and ``batch``, e.g. to read its HLO."""
        return self.jitted.lower(*self._inputs(state, batch)[0])
