"""Hyperparameters declared once, beside their field: meaning, valid range, default.

Each optimizer dataclass declares its fields with :func:`hparam`; :func:`problems` checks an instance
against those ranges (``optimizers.create`` and the runner's preflight call it for built-in and ``_target_``
optimizers alike, and an update once more when it is traced: ``optimizers.checks.check_hparams``) and
:func:`describe` renders the table a docstring or ``--help`` shows.

``weight_decay`` of the fused optimizers is, in the default ``weight_decay_mode=decoupled``, **lazy**: an update decays only the rows its batch touches
(each once, however many tokens share the row; padding and out-of-range ids touch nothing), inside the
row's own rule (``row -= lr * (... + weight_decay * row)``). A row no batch touches keeps its value: it is
not decayed for the steps it waited, neither then nor on its next touch. So over a run a row decays once
per update that touches it, not once per step: frequent ids are regularised more than rare ones, and the
cost stays proportional to the touched rows. ``tests/optimizers/test_contract.py::test_weight_decay_is_lazy``
checks it against a dense numpy table decayed on the touched rows only. ``weight_decay_mode=l2`` adds the
penalty's gradient before the rule instead, and ``decoupled_global`` makes a touched row catch up on the
decay it missed (``optimizers.row_update.WeightDecayMode``). The dense optax baseline (``optimizer=adam``,
AdamW) decays every row every step.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, NamedTuple

INF = math.inf
FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: the precision an update's arithmetic runs in
# The smallest normal float32. A nonzero number below it is 0 in float32, or a denormal, which XLA flushes to 0 on
# CPUs and TPUs alike: a learning rate of 1e-50 would leave every row as it is.
FLOAT32_TINY = 1.1754943508222875e-38


def is_number(x: Any) -> bool:
    """Whether ``x`` is a real number a hyperparameter can take: an int or a float (numpy's too), not a bool,
    not a string that spells one."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _finite(x: numbers.Real) -> bool:
    return isinstance(x, numbers.Integral) or math.isfinite(x)  # an int of any size is finite


def float32_problem(name: str, value: Any) -> str | None:
    """``<name>=<value> ...`` when ``value`` is a number float32 cannot hold: beyond its largest (it would be inf
    in the update) or, nonzero, below its smallest normal number (it would be 0 there)."""
    if not is_number(value) or not _finite(value):
        return None
    if abs(value) > FLOAT32_MAX:
        return (f"{name}={value!r} is beyond float32's largest number ({FLOAT32_MAX:.3g}), the precision the "
                f"update runs in: it would be inf there")
    if 0 < abs(value) < FLOAT32_TINY:
        return (f"{name}={value!r} is below float32's smallest normal number ({FLOAT32_TINY:.3g}), the precision "
                f"the update runs in: it would be 0 there")
    return None


class Range(NamedTuple):
    """A hyperparameter's valid interval; each end closed unless its ``*_open`` flag is set."""

    low: float = -INF
    high: float = INF
    low_open: bool = False  # True: the low end itself is not allowed (x > low)
    high_open: bool = False  # True: the high end itself is not allowed (x < high)

    def contains(self, x: float) -> bool:
        """Whether ``x`` is a real number (not a bool, not NaN) inside the interval."""
        if not is_number(x) or not isinstance(x, numbers.Integral) and math.isnan(x):
            return False
        above = x > self.low if self.low_open else x >= self.low
        below = x < self.high if self.high_open else x <= self.high
        return above and below

    def __str__(self) -> str:
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open else "]"
        return f"{lo}{_num(self.low)}, {_num(self.high)}{hi}"


def _num(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"  # 2147483647, not 2.14748e+09


def hparam(default: Any, doc: str, *, low: float = -INF, high: float = INF, low_open: bool = False,
           high_open: bool = False) -> Any:
    """A dataclass field with its meaning and valid range; ``low``/``high`` are inclusive unless ``*_open``.
    Infinite ends are always open: a hyperparameter must be finite."""
    rng = Range(low, high, low_open or low == -INF, high_open or high == INF)
    return dataclasses.field(default=default, metadata={"doc": doc, "range": rng})


def ranges(obj_or_cls: Any) -> dict[str, Range]:
    """``{field: Range}`` for every field declared with :func:`hparam`."""
    if not dataclasses.is_dataclass(obj_or_cls):
        return {}
    return {f.name: f.metadata["range"] for f in dataclasses.fields(obj_or_cls) if "range" in f.metadata}


INT_TYPES = (int, "int", "Optional[int]", "int | None")  # a field declared so takes ints only (numpy's too)


def problems(obj: Any, prefix: str = "") -> list[str]:
    """One line per hyperparameter that is not a number (``<prefix><name>='0.1' is not a number (<doc>)``), is
    outside its range (``<prefix><name>=<value> is outside <range> (<doc>)``), is a fraction where the field is
    an ``int`` (``warmup_steps=2.5 is not an int``) or is a number float32 cannot hold
    (:func:`float32_problem`). A field that is itself such a dataclass (an optimizer's ``schedule``) is
    checked the same way under ``<prefix><name>.``, and one that holds something else than the class its
    field declares (``metadata["instance_of"]``: a dict or a word given for a ``Schedule``) is named with the
    class it needs. Then, if all of that holds, the lines of the object's own ``problems()`` method, if it has
    one (checks across fields)."""
    out = []
    fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
    for name, rng in ranges(obj).items():
        value, doc = getattr(obj, name), fields[name].metadata["doc"]
        if not is_number(value):
            out.append(f"{prefix}{name}={value!r} is not a number ({doc})")
        elif not rng.contains(value):
            out.append(f"{prefix}{name}={value!r} is outside {rng} ({doc})")
        elif fields[name].type in INT_TYPES and not isinstance(value, numbers.Integral):
            out.append(f"{prefix}{name}={value!r} is not an int ({doc})")
        elif too_big := float32_problem(f"{prefix}{name}", value):
            out.append(too_big)
    for name, f in fields.items():
        value, cls = getattr(obj, name), f.metadata.get("instance_of")
        if cls is not None and not isinstance(value, cls):
            out.append(f"{prefix}{name}={value!r} is a {type(value).__name__}, not a {cls.__name__} "
                       f"({f.metadata['doc']})")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += problems(value, f"{prefix}{name}.")
    own = getattr(obj, "problems", None)  # checks across fields, once every field is in its range
    if not out and callable(own):
        out += [f"{prefix}{line}" for line in own()]
    return out


def describe(cls: type) -> str:
    """``name (default, range): meaning`` per hyperparameter, one a line."""
    return "\n".join(f"{f.name} (default {f.default!r}, range {f.metadata['range']}): {f.metadata['doc']}"
                     for f in dataclasses.fields(cls) if "range" in f.metadata)
