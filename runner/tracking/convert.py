"""Arrays to Python numbers before anything is logged; strict JSON for non-finite floats."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["json_safe", "to_python"]


def _array_to_python(a: np.ndarray) -> Any:
    kind = a.dtype.kind
    if kind not in "biufc":
        # bfloat16 / float8 (ml_dtypes) and other exotic dtypes: go through float64.
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            return a.tolist()
    elif kind == "c":
        a = np.abs(a)
    if a.ndim == 0:
        return a.item()
    return a.tolist()


def _value_to_python(v: Any) -> Any:
    if isinstance(v, np.generic):  # before the builtin check: np.float64 subclasses float
        return _array_to_python(np.asarray(v))
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.ndarray):
        return _array_to_python(v)
    if isinstance(v, Mapping):
        return {str(k): _value_to_python(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_value_to_python(x) for x in v]
    # jax.Array (and anything else array-like with a shape): np.asarray fetches it to host.
    if hasattr(v, "__array__") and hasattr(v, "shape"):
        try:
            return _array_to_python(np.asarray(v))
        except Exception:  # noqa: BLE001 - e.g. non-addressable shards; leave it to the backend
            return v
    return v  # wandb.Image, Table, ... pass through untouched


def to_python(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Convert jax/numpy arrays and numpy scalars to Python floats/ints/bools/lists.

    0-d arrays become scalars, n-d arrays nested lists, nested mappings are converted
    recursively. Non-finite floats stay ``float('nan')`` / ``float('inf')`` (W&B takes
    them); use :func:`json_safe` before ``json.dumps(..., allow_nan=False)``.
    Unknown objects (``wandb.Image`` ...) pass through unchanged.
    """
    return {str(k): _value_to_python(v) for k, v in metrics.items()}


def _float_token(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats by "NaN"/"Infinity"/"-Infinity" and other non-JSON
    values by their ``str``, recursively, so ``json.dumps(obj, allow_nan=False)`` works."""
    if isinstance(obj, np.generic):
        return json_safe(_value_to_python(obj))
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return _float_token(float(obj))
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    converted = _value_to_python(obj)
    if converted is not obj:
        return json_safe(converted)
    return str(obj)
