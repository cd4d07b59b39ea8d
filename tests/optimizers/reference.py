"""Plain-numpy dense reference of every fused embedding optimizer, written from the docs, not the library.

A reference holds a float64 copy of the whole table and its per-row state (leaves named as the library
names them, so the two can be compared leaf by leaf) and applies one batch as the semantics say:

1. drop padding tokens (id 0) and ids outside ``[0, vocab)``;
2. dedupe with ``np.unique`` and sum each row's token gradients;
3. ``norm`` = global L2 norm of those sums; the step is valid when something is pending and the norm is
   finite, otherwise nothing changes at all;
4. count the valid step (1-based) and apply the optimizer's rule to the touched rows only;
5. if any touched row or its state is not finite once stored as float32 (NaN, or beyond float32's range),
   the step is not valid after all: table, state and count go back to what they were.

Nothing here imports ``optimizers``: a reference is built from the optimizer's hyperparameters alone
(``reference_for`` reads them off the config dataclass), so a wrong rule in the library cannot agree
with itself here.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

PAD_ID = 0


def dedupe_sum(ids, grads, vocab: int, pad_id: int | None = PAD_ID) -> tuple[np.ndarray, np.ndarray]:
    """Sorted touched rows and each one's float64 gradient sum; padding and out-of-range tokens dropped."""
    ids = np.asarray(ids).reshape(-1)
    grads = np.asarray(grads, np.float64).reshape(ids.size, -1)
    keep = (ids >= 0) & (ids < vocab)
    if pad_id is not None:
        keep &= ids != pad_id
    rows, inverse = np.unique(ids[keep], return_inverse=True)
    summed = np.zeros((rows.size, grads.shape[1]))
    np.add.at(summed, inverse.reshape(-1), grads[keep])
    return rows, summed


def global_norm(summed: np.ndarray) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.sqrt(np.sum(summed * summed)))


class Reference:
    """The shared part: table, state, step count, dedupe, norm and gating. Subclasses give the rule, with
    ``self.lr``: the learning rate times the schedule's multiplier of the update being applied."""

    base_lr = 0.0
    wd_mode = "decoupled"  # weight_decay_mode: decoupled (in the rule), l2 (in the gradient), decoupled_global

    def __init__(self, table, multiplier=None):
        self.table = np.array(table, np.float64)
        self.count = 0  # valid updates applied so far
        self.multiplier = multiplier or (lambda t: 1.0)
        self.scale = 1.0
        self.state = self.init_state(*self.table.shape)

    @property
    def lr(self) -> float:
        return self.base_lr * self.scale

    @property
    def vocab(self) -> int:
        return self.table.shape[0]

    def init_state(self, num_rows: int, width: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def apply(self, rows: np.ndarray, grad: np.ndarray, step: int) -> None:
        raise NotImplementedError

    def step(self, ids, grads, pending: bool = True, then=None, dc_lambda: float = 0.0) -> tuple[float, bool, np.ndarray]:
        """Apply one batch; returns ``(norm, valid, touched_rows)`` (no rows when not valid).

        ``then`` (delay compensation, DC-ASGD): each token's row as its gradient was computed on it; every
        touched row's summed gradient ``g`` becomes ``g + dc_lambda * g * g * (w_now - w_then)`` before the
        rule (``w_now``: the row now), and the norm stays that of ``g``."""
        rows, summed = dedupe_sum(ids, grads, self.vocab)
        norm = global_norm(summed)
        if then is not None:
            flat = np.asarray(ids).reshape(-1)
            first = np.array([np.flatnonzero(flat == r)[0] for r in rows], dtype=np.int64)
            w_then = np.asarray(then, np.float64).reshape(flat.size, -1)[first]
            summed = summed + dc_lambda * summed * summed * (self.table[rows] - w_then)
        valid = bool(pending) and math.isfinite(norm)
        if not valid:
            return norm, False, rows[:0]
        saved = self.table.copy(), {k: v.copy() for k, v in self.state.items()}, self.count
        self.count += 1
        self.scale = self.multiplier(self.count)
        wd = getattr(self, "wd", 0.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # checked just below
            if self.wd_mode == "l2" and wd:  # the penalty's gradient, then the rule without its own decay
                self.wd = 0.0
                self.apply(rows, summed + wd * self.table[rows], self.count)
                self.wd = wd
            else:
                self.apply(rows, summed, self.count)
            if self.wd_mode == "decoupled_global" and wd:  # every other row decays too, at every update
                others = np.setdiff1d(np.arange(self.vocab), rows)
                self.table[others] *= 1.0 - self.lr * wd
        if not self.stored_finite(rows):
            self.table, self.state, self.count = saved
            return norm, False, rows[:0]
        return norm, True, rows

    def stored_finite(self, rows: np.ndarray) -> bool:
        """Whether the touched rows and their state are finite as float32 (what the library stores)."""
        with np.errstate(over="ignore", invalid="ignore"):
            arrays = [self.table[rows]] + [v[rows] for v in self.state.values() if v.dtype.kind == "f"]
            return all(np.isfinite(a.astype(np.float32)).all() for a in arrays)


class AdamReference(Reference):
    """Lazy Adam: per-row moments and per-row update counts for bias correction; decoupled weight decay."""

    def __init__(self, table, *, learning_rate, b1, b2, eps, weight_decay, bias_correction="per_row"):
        self.base_lr, self.b1, self.b2, self.eps, self.wd = learning_rate, b1, b2, eps, weight_decay
        self.global_count = getattr(bias_correction, "value", bias_correction) == "global"
        super().__init__(table)

    def init_state(self, num_rows, width):
        return {"mu": np.zeros((num_rows, width)), "nu": np.zeros((num_rows, width)),
                "count": np.zeros(num_rows, np.int64)}

    def apply(self, rows, grad, step):
        s = self.state
        s["count"][rows] += 1
        t = float(step) if self.global_count else s["count"][rows][:, None].astype(np.float64)
        s["mu"][rows] = self.b1 * s["mu"][rows] + (1 - self.b1) * grad
        s["nu"][rows] = self.b2 * s["nu"][rows] + (1 - self.b2) * grad**2
        mu_hat = s["mu"][rows] / (1 - self.b1**t)
        nu_hat = s["nu"][rows] / (1 - self.b2**t)
        x = self.table[rows]
        self.table[rows] = x - self.lr * (mu_hat / (np.sqrt(nu_hat) + self.eps) + self.wd * x)


class RowwiseAdagradReference(Reference):
    """One accumulator per row: ``accum = accum * decay**k + mean(g**2)``; ``k`` = 1 per touch, or the
    number of valid steps since the row's last touch (step 0 = never) with ``lazy_decay``."""

    def __init__(self, table, *, learning_rate, eps, initial_accumulator_value, half_life_steps, lazy_decay,
                 weight_decay):
        self.base_lr, self.eps, self.init_accum = learning_rate, eps, initial_accumulator_value
        self.decay = 0.5 ** (1.0 / half_life_steps) if half_life_steps > 0 else 1.0
        self.lazy, self.wd = lazy_decay, weight_decay
        super().__init__(table)

    def init_state(self, num_rows, width):
        return {"accum": np.full(num_rows, self.init_accum, np.float64), "last_step": np.zeros(num_rows, np.int64)}

    def apply(self, rows, grad, step):
        s = self.state
        k = (step - s["last_step"][rows]) if self.lazy else np.ones(rows.size)
        s["accum"][rows] = s["accum"][rows] * self.decay**k + np.mean(grad**2, axis=1)
        s["last_step"][rows] = step
        x = self.table[rows]
        self.table[rows] = x - self.lr * (grad / (np.sqrt(s["accum"][rows]) + self.eps)[:, None] + self.wd * x)


class AdagradReference(Reference):
    """Element-wise Adagrad: ``accum += g**2``; decoupled weight decay."""

    def __init__(self, table, *, learning_rate, eps, initial_accumulator_value, weight_decay):
        self.base_lr, self.eps, self.init_accum, self.wd = learning_rate, eps, initial_accumulator_value, weight_decay
        super().__init__(table)

    def init_state(self, num_rows, width):
        return {"accum": np.full((num_rows, width), self.init_accum, np.float64)}

    def apply(self, rows, grad, step):
        s = self.state
        s["accum"][rows] += grad**2
        x = self.table[rows]
        self.table[rows] = x - self.lr * (grad / (np.sqrt(s["accum"][rows]) + self.eps) + self.wd * x)


class SGDReference(Reference):
    def __init__(self, table, *, learning_rate, weight_decay):
        self.base_lr, self.wd = learning_rate, weight_decay
        super().__init__(table)

    def init_state(self, num_rows, width):
        return {}

    def apply(self, rows, grad, step):
        x = self.table[rows]
        self.table[rows] = x - self.lr * (grad + self.wd * x)


class FtrlReference(Reference):
    """FTRL-Proximal per coordinate, McMahan et al. (2013), Algorithm 1, with ``n**(-p)`` for ``sqrt(n)``
    (``p = lr_power``) and ``beta`` as TensorFlow adds them; the l2 term of the denominator is ``2 * l2``
    with ``tensorflow_l2`` (TensorFlow's convention), ``l2`` without (the paper's). At a row's first update
    ``z`` is set to the value whose closed-form weights are the row's current values, so the first update
    starts from them. The rule always runs on the paper's ``z``; with ``multiply_linear_by_learning_rate`` the
    state holds ``learning_rate * z``, as the library stores it, and the weights must be the same."""

    def __init__(self, table, *, learning_rate, lr_power, l1, l2, beta, initial_accumulator, tensorflow_l2,
                 multiply_linear_by_learning_rate):
        self.base_lr, self.p, self.l1, self.beta = learning_rate, lr_power, l1, beta
        self.l2 = 2.0 * l2 if tensorflow_l2 else l2
        self.n0 = initial_accumulator
        self.multiply = multiply_linear_by_learning_rate  # the state holds alpha * z (this update's alpha)
        super().__init__(table)

    @property
    def alpha(self) -> float:
        return self.lr

    @property
    def stored(self) -> float:
        return self.alpha if self.multiply else 1.0

    def init_state(self, num_rows, width):
        return {"accum": np.full((num_rows, width), self.n0, np.float64), "linear": np.zeros((num_rows, width)),
                "count": np.zeros(num_rows, np.int64)}

    def weights(self, z, n):
        """The closed form: 0 where |z| <= l1, else -(z - sign(z) l1) / ((beta + n**-p) / alpha + l2)."""
        denom = (self.beta + n ** -self.p) / self.alpha + self.l2
        return np.where(np.abs(z) <= self.l1, 0.0, -(z - np.sign(z) * self.l1) / denom)

    def apply(self, rows, grad, step):
        s = self.state
        w, n, z = self.table[rows], s["accum"][rows], s["linear"][rows] / self.stored
        fresh = s["count"][rows] == 0
        denom = (self.beta + n ** -self.p) / self.alpha + self.l2
        z = np.where(fresh[:, None], -(w * denom + np.sign(w) * self.l1), z)  # weights(z, n) == w
        new_n = n + grad**2
        sigma = (new_n ** -self.p - n ** -self.p) / self.alpha
        z = z + grad - sigma * w
        s["accum"][rows], s["linear"][rows] = new_n, z * self.stored
        s["count"][rows] += 1
        self.table[rows] = self.weights(z, new_n)


class PartialRowwiseAdamReference(Reference):
    """FBGEMM's PARTIAL_ROWWISE_ADAM: first moment per element, second moment per row of mean(g**2); bias
    correction by the row's update count, or the table's (``global``); decoupled weight decay."""

    def __init__(self, table, *, learning_rate, b1, b2, eps, weight_decay, bias_correction):
        self.base_lr, self.b1, self.b2, self.eps, self.wd = learning_rate, b1, b2, eps, weight_decay
        self.global_count = getattr(bias_correction, "value", bias_correction) == "global"
        super().__init__(table)

    def init_state(self, num_rows, width):
        return {"mu": np.zeros((num_rows, width)), "nu": np.zeros(num_rows), "count": np.zeros(num_rows, np.int64)}

    def apply(self, rows, grad, step):
        s = self.state
        s["count"][rows] += 1
        t = np.full(rows.size, float(step)) if self.global_count else s["count"][rows].astype(np.float64)
        s["mu"][rows] = self.b1 * s["mu"][rows] + (1 - self.b1) * grad
        s["nu"][rows] = self.b2 * s["nu"][rows] + (1 - self.b2) * np.mean(grad**2, axis=1)
        mu_hat = s["mu"][rows] / (1 - self.b1 ** t[:, None])
        nu_hat = s["nu"][rows] / (1 - self.b2 ** t)
        x = self.table[rows]
        self.table[rows] = x - self.lr * (mu_hat / (np.sqrt(nu_hat) + self.eps)[:, None] + self.wd * x)


class RowwiseAdagradMomentumReference(Reference):
    """Row-wise Adagrad feeding heavy-ball momentum: ``accum += mean(g**2)``, ``m = momentum * m + g /
    (sqrt(accum) + eps)``, ``row -= lr * (m + weight_decay * row)``."""

    def __init__(self, table, *, learning_rate, momentum, eps, initial_accumulator_value, weight_decay):
        self.base_lr, self.beta, self.eps, self.init_accum, self.wd = (learning_rate, momentum, eps,
                                                                       initial_accumulator_value, weight_decay)
        super().__init__(table)

    def init_state(self, num_rows, width):
        return {"accum": np.full(num_rows, self.init_accum, np.float64), "momentum": np.zeros((num_rows, width))}

    def apply(self, rows, grad, step):
        s = self.state
        s["accum"][rows] += np.mean(grad**2, axis=1)
        s["momentum"][rows] = self.beta * s["momentum"][rows] + grad / (np.sqrt(s["accum"][rows]) + self.eps)[:, None]
        x = self.table[rows]
        self.table[rows] = x - self.lr * (s["momentum"][rows] + self.wd * x)


REFERENCES: dict[str, type[Reference]] = {
    "async_adam": AdamReference,
    "async_rowwise_adagrad": RowwiseAdagradReference,
    "async_adagrad": AdagradReference,
    "async_sgd": SGDReference,
    "async_ftrl": FtrlReference,
    "async_partial_rowwise_adam": PartialRowwiseAdamReference,
    "async_rowwise_adagrad_momentum": RowwiseAdagradMomentumReference,
}


def schedule_multiplier(kind: str, warmup_steps: int, decay_steps: int, end_ratio: float, step_every: int,
                        step_factor: float):
    """The learning-rate multiplier of the ``t``-th update (1-based), as ``optimizers.schedules`` documents it."""
    def warm(t):
        return min(1.0, t / warmup_steps)

    def cos(t, start):
        frac = min(max((t - start) / decay_steps, 0.0), 1.0)
        return end_ratio + (1 - end_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    return {"constant": lambda t: 1.0, "warmup": warm, "cosine": lambda t: cos(t, 0),
            "step": lambda t: step_factor ** (t // step_every),
            "warmup_cosine": lambda t: warm(t) if t <= warmup_steps else cos(t, warmup_steps)}[kind]


def reference_for(name: str, opt, table) -> Reference:
    """The reference of registry name ``name`` with ``opt``'s hyperparameters (a frozen config dataclass) and
    its learning-rate schedule."""
    hp = dataclasses.asdict(opt)
    schedule = hp.pop("schedule", None)
    mode = hp.pop("weight_decay_mode", "decoupled")
    ref = REFERENCES[name](table, **hp)
    ref.wd_mode = getattr(mode, "value", mode)
    if schedule is not None:
        schedule["kind"] = getattr(schedule["kind"], "value", schedule["kind"])
        ref.multiplier = schedule_multiplier(**schedule)
    return ref
