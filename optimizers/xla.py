"""XLA options for jitted programs that update tables (what the fused update needs from the compiler)."""
from __future__ import annotations

from typing import Any, Iterable

from ._lazy import jax, jnp


def compiler_options(table_dtypes: Iterable[Any], devices: int | None = None) -> dict[str, Any]:
    """XLA options for a jitted step that updates tables of these dtypes (pass to ``jax.jit``).

    XLA:CPU rewrites every bfloat16 op to float32 (its ``float-normalization-bf16`` pass); around an
    in-place row scatter that converts the whole table to float32 and back on every step (two table-sized
    temporaries, ~1 s per step at 10M x 64). The fused update does its arithmetic in float32 itself and
    only moves bfloat16 rows, so steps that touch a bfloat16 table switch the pass off on CPU.

    ``devices``: the devices the program runs on (None: not said; only the bfloat16 option then). A one-device CPU program is compiled with XLA:CPU's older
    elemental fusion emitters (``xla_cpu_use_fusion_emitters=False``): its gathers, scatters and row-wise
    loops run faster there (the fused row-wise Adagrad update about 1.2x, the default ranking train step
    with ``async_adam`` 1.2-1.4x; ``python -m benchmarks --only fused_update --only trainer``). A program
    over several (virtual) devices keeps the default emitters, which measured faster for the routed layouts.
    """
    if jax.default_backend() != "cpu":
        return {}
    options: dict[str, Any] = {}
    if devices == 1:
        options["xla_cpu_use_fusion_emitters"] = False
    if any(jnp.dtype(d) == jnp.bfloat16 for d in table_dtypes):
        options["xla_disable_hlo_passes"] = "float-normalization-bf16"
    return options
