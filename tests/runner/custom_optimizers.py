"""User optimizer classes plugged in through ``_target_`` by the preflight and failure tests."""
import dataclasses
import functools

import jax

from optimizers import Adam, AsyncSGD


@dataclasses.dataclass(frozen=True)
class HalfFusedAdam(Adam):
    """Overrides only gradient_update_done: not a fused optimizer."""

    def gradient_update_done(self, context, gate):
        return gate, gate, gate


@dataclasses.dataclass(frozen=True)
class RaisingSGD(AsyncSGD):
    """With ``broken``, its per-row rule raises while the step is traced."""

    broken: bool = False

    def update_rows(self, rows, state, grad, rc):
        if self.broken:
            raise ValueError("this rule is broken")
        return super().update_rows(rows, state, grad, rc)


def _host_check(update, fail_at):
    if fail_at and int(update) >= fail_at:
        raise ValueError(f"host check failed at update {int(update)}")


@dataclasses.dataclass(frozen=True)
class HostCheckedSGD(AsyncSGD):
    """Its per-row rule calls back to the host, which raises from update ``fail_at`` on (0: never): a failure
    while the step runs."""

    fail_at: int = 0

    def update_rows(self, rows, state, grad, rc):
        jax.debug.callback(functools.partial(_host_check, fail_at=self.fail_at), rc.step)
        return super().update_rows(rows, state, grad, rc)


@dataclasses.dataclass(frozen=True)
class OverflowingSGD(AsyncSGD):
    """Its per-row rule writes inf into every row it updates: every update is refused by the gate, and, since the
    tables stay as they were, the loss stays a number."""

    def update_rows(self, rows, state, grad, rc):
        new, state = super().update_rows(rows, state, grad, rc)
        return new * float("inf"), state
