"""Deterministic stochastic rounding of float32 rows to bfloat16, and the counter hash it draws from.

Tables may be stored in bfloat16 while the optimizer state stays in float32: rows are gathered and updated in
float32 and written back rounded up or down at random with probability proportional to proximity (the
unbiased rounding of Gupta et al., "Deep Learning with Limited Numerical Precision", 2015), so updates far below
a bfloat16 ulp still move the row in expectation. The random bits hash (row id, column, update count), so no
extra state is needed, every layout draws the same bits, and a run is reproducible bit for bit.
"""
from __future__ import annotations

from typing import Any

from ._lazy import jax, jnp, lax


def mix32(x: jax.Array) -> jax.Array:
    """A 32-bit integer finaliser (xor-shift-multiply): every input bit flips about half the output bits."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash2d(rows: jax.Array, cols: jax.Array, row_key: Any, col_key: Any) -> jax.Array:
    """uint32 [len(rows), len(cols)]: a hash of (row id, column) under two keys, the same on any layout.
    Shared by stochastic rounding and the runner's table initialisation. Each key is a scalar, or one per row
    (rows of several stacked tables, each under its own keys)."""
    r = mix32(rows.astype(jnp.uint32) * jnp.uint32(0x9E3779B1) + jnp.asarray(row_key).astype(jnp.uint32))
    col_key = jnp.asarray(col_key).astype(jnp.uint32)
    c = (cols.astype(jnp.uint32) * jnp.uint32(0x85EBCA77))[None, :] + (col_key[:, None] if col_key.ndim else col_key)
    return mix32(r[:, None] ^ c)


def rounding_bits(rows: jax.Array, cols: jax.Array, count: jax.Array) -> jax.Array:
    """uint32 [len(rows), len(cols)]: a hash of (row id, column, update count), the same on any layout."""
    return hash2d(rows, cols, count, jnp.uint32(0x6A09E667))


def stochastic_round_bf16(x: jax.Array, bits: jax.Array) -> jax.Array:
    """Round float32 ``x`` to bfloat16 up or down with probability proportional to proximity.

    Adding 16 random low bits to the float32 bit pattern and truncating rounds the magnitude up with
    probability (dropped fraction) / ulp, so the result is unbiased. Non-finite values round to nearest.
    """
    raw = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    noisy = (raw + (bits & jnp.uint32(0xFFFF))) & jnp.uint32(0xFFFF0000)
    rounded = lax.bitcast_convert_type(noisy, jnp.float32).astype(jnp.bfloat16)  # exact: low bits are zero
    return jnp.where(jnp.isfinite(x), rounded, x.astype(jnp.bfloat16))
