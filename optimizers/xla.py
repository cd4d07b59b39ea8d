"""XLA options for jitted programs that update tables (what the fused update needs from the compiler)."""
from __future__ import annotations

from typing import Any, Iterable

from ._lazy import jax, jnp


def compiler_options(table_dtypes: Iterable[Any]) -> dict[str, str]:
    """XLA options for a jitted step that updates tables of these dtypes (pass to ``jax.jit``).

    XLA:CPU rewrites every bfloat16 op to float32 (its ``float-normalization-bf16`` pass); around an
    in-place row scatter that converts the whole table to float32 and back on every step (two table-sized
    temporaries, ~1 s per step at 10M x 64). The fused update does its arithmetic in float32 itself and
    only moves bfloat16 rows, so steps that touch a bfloat16 table switch the pass off on CPU.
    """
    if jax.default_backend() == "cpu" and any(jnp.dtype(d) == jnp.bfloat16 for d in table_dtypes):
        return {"xla_disable_hlo_passes": "float-normalization-bf16"}
    return {}
