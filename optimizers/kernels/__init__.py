"""Native XLA:CPU kernels for the fused update (``cpu.cc``), with the XLA ops they replace as the fallback and
on every other platform. They are traced into one-device programs (``AsyncEmbContext.one_device``) when JAX's
default backend is the CPU and they could be built (``usable()``); elsewhere the XLA ops are. The choice is made
while tracing, not by ``lax.platform_dependent``, which on CPU left a conditional in the program; and not in
multi-device programs, where a mesh's collectives beside a custom call were seen to deadlock XLA:CPU's pool.

- ``dedupe_keys``: exactly what ``xla_dedupe_keys`` computes (``tests/optimizers/test_kernels.py`` checks them
  equal, bit for bit), by a stable radix sort instead of XLA:CPU's sort, which calls a comparator for every
  comparison: on a 16K-id batch 0.16 ms instead of 0.67 ms.
- ``fused_rows``: an optimizer's gather, rule, gate and in-place scatter in one pass with the touched rows
  prefetched, for ``AsyncRowwiseAdagrad`` and ``AsyncAdam`` on one device (``optimizers.row_update.write_rows``
  takes it; an optimizer names its rule in ``native_rule``); the same values as the XLA ops up to float32
  rounding (sums taken in another order), checked in the tests.

A native segment-sum was tried and left out: alone it was about twice as fast as XLA's scatter-add, but the whole
fused update with it took 0.8-1.2 ms longer at 16K ids (interleaved in one process; the cause was not found).
"""
from __future__ import annotations

import numpy as np

from .._lazy import jax, jnp
from . import build


def xla_dedupe_keys(keys: jax.Array, fill: int, num_unique: int, method: str | None = None
                    ) -> tuple[jax.Array, jax.Array]:
    """``keys`` (int32 ``[n]`` in ``[0, fill]``) -> (their distinct values ascending, padded with ``fill`` to
    ``num_unique``; each key's index into them), with XLA ops. Both methods do one keys-only sort and find run
    starts (``jnp.unique(return_inverse=True)`` lowers to a two-operand sort, about 3x slower on XLA:CPU):

    - ``"search"``: sort the keys, then a scan ``searchsorted`` maps each key to its run;
    - ``"packed"`` (when ``(fill + 1) * n`` fits in int32): sort ``key * n + position``, so each sorted key
      also says which token it came from and one scatter writes the segment ids (about 25% faster at 16K
      keys). None picks it whenever it fits; results are identical.
    """
    n = keys.shape[0]
    method = method or xla_dedupe_method(n, fill)
    if method == "packed":
        if xla_dedupe_method(n, fill) != "packed":
            raise ValueError(f"dedupe method 'packed' needs (vocab + 1) * tokens <= 2**31: vocab={fill}, tokens={n}")
        sorted_keys = jnp.sort(keys * n + jnp.arange(n, dtype=jnp.int32))
        s = sorted_keys // n
        position = sorted_keys - s * n
    elif method == "search":
        s = jnp.sort(keys)
    else:
        raise ValueError(f"unknown dedupe method {method!r} (native, packed or search)")
    starts = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    run = jnp.cumsum(starts) - 1
    slot = jnp.where(starts, run, num_unique)
    unique = jnp.full((num_unique,), fill, jnp.int32).at[slot].set(s, mode="drop", unique_indices=True)
    if method == "packed":
        seg = jnp.zeros((n,), jnp.int32).at[position].set(run.astype(jnp.int32), unique_indices=True)
    else:
        seg = jnp.searchsorted(unique, keys, method="scan").astype(jnp.int32)
    return unique, seg


def xla_dedupe_method(num_keys: int, fill: int) -> str:
    """``"packed"`` when every (key, position) pair fits one int32, else ``"search"``."""
    return "packed" if (fill + 1) * max(num_keys, 1) - 1 <= 2**31 - 1 else "search"


def usable() -> str:
    """"" when programs traced now take the native kernels (JAX's default backend is the CPU and they are built,
    ``build.status()``), else why not."""
    backend = jax.default_backend()
    return f"JAX's default backend is {backend}, not the CPU" if backend != "cpu" else build.status()


def _ffi_dedupe(keys, *, fill: int, num_unique: int):
    out = (jax.ShapeDtypeStruct((num_unique,), jnp.int32), jax.ShapeDtypeStruct(keys.shape, jnp.int32))
    return jax.ffi.ffi_call("rr_dedupe", out, vmap_method="sequential")(keys, fill=np.int64(fill))


def dedupe_keys(keys: jax.Array, fill: int, num_unique: int, method: str | None = None
                ) -> tuple[jax.Array, jax.Array]:
    """``xla_dedupe_keys``'s result; by the native radix-sort kernel when ``method`` is "native" and it is
    usable (``usable()``), else by the XLA ``method`` ("packed", "search", None: the faster that fits). Ask for
    "native" only in a one-device program (``AsyncEmbContext.one_device``)."""
    keys = jnp.asarray(keys, jnp.int32).reshape(-1)
    if method != "native" or usable():
        return xla_dedupe_keys(keys, fill, num_unique, None if method == "native" else method)
    return _ffi_dedupe(keys, fill=fill, num_unique=num_unique)


def fused_rows(rule: str, table: jax.Array, state: list, ids: jax.Array, grads: jax.Array, learning_rate: jax.Array,
               step: jax.Array, pending: jax.Array, gate: jax.Array, **attrs) -> tuple:
    """An optimizer's native update (``rule``: "rowwise_adagrad" or "adam"; CPU only, for when ``usable()`` is
    ""): gather, rule, gate and in-place scatter of ``ids``' rows (outside ``[0, rows)``: skipped) with their
    summed float32 ``grads``, in one pass. ``state``: the rule's per-row state leaves, in its order; ``attrs``:
    its hyperparameters. Returns ``(table, state, norm, valid, rows_written [1])``; the table and state alias the
    inputs, so donate them."""
    f32 = jnp.float32
    buffers = [table, *state]
    out = (*(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in buffers), jax.ShapeDtypeStruct((), f32),
           jax.ShapeDtypeStruct((), bool), jax.ShapeDtypeStruct((1,), jnp.int32))
    call = jax.ffi.ffi_call(f"rr_{rule}", out, input_output_aliases={i: i for i in range(len(buffers))},
                            vmap_method="sequential")
    attrs = {k: (bool(v) if isinstance(v, bool) else np.float32(v)) for k, v in attrs.items()}
    results = call(*buffers, ids.astype(jnp.int32), grads.astype(f32), jnp.asarray(learning_rate, f32),
                   jnp.asarray(step, jnp.int32), jnp.asarray(pending, bool),
                   jnp.ravel(jnp.asarray(gate))[0].astype(f32), **attrs)
    n = len(buffers)
    return results[0], list(results[1:n]), *results[n:]


__all__ = ["dedupe_keys", "xla_dedupe_keys", "xla_dedupe_method", "fused_rows", "usable", "build"]
