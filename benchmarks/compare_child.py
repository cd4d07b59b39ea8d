"""One side of ``python -m benchmarks --compare``: time the fused update of the ``optimizers`` package on
``PYTHONPATH`` (a checkout of some commit), through its public API only, and print the medians as JSON.

Run as a script (``python benchmarks/compare_child.py '<json>'``), never imported from ``benchmarks``: the
package it measures is whatever ``optimizers`` the environment puts first, so the same file times any
commit whose API has ``optimizers.create``, ``AsyncEmbContext``, ``make_update`` and the protocol's
``gradient_update_start`` / ``gradient_update_done``. The step is the fused-update benchmark's
(``benchmarks/fused_update.py``): lookup, per-token gradients, record, fused update, table and state donated.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path


def compile_options(options) -> dict:
    """The commit's compiler options for a one-device step, as its runner compiles one (older commits' take
    no device count)."""
    try:
        return options(["float32"], 1)
    except TypeError:
        return options(["float32"])


def main(payload: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import optimizers

    here = Path(optimizers.__file__).resolve()
    if not here.is_relative_to(Path.cwd().resolve()):  # the commit has none: the installed project's came instead
        raise SystemExit(f"this commit has no optimizers package (the import found {here.parent} instead), so "
                         f"there is nothing of it to time: compare against a commit that has one")
    options = getattr(optimizers, "compiler_options", None)  # older commits had none
    width, batch, steps, warmup = payload["width"], payload["batch"], payload["steps"], payload["warmup"]
    out = {}
    for name in payload["optimizers"]:
        for vocab in payload["sizes"]:
            rng = np.random.default_rng(0)
            z = rng.zipf(1.1, size=(steps + warmup, batch)).astype(np.int64)
            ids = [jnp.asarray(((r - 1) % (vocab - 1) + 1).astype(np.int32)) for r in z]
            opt = optimizers.create(name)
            ctx = optimizers.AsyncEmbContext(vocab, width, batch)

            def step(table, state, ids, opt=opt, ctx=ctx):
                emb = table.at[ids].get(mode="fill", fill_value=0).astype(jnp.float32)
                grads = 0.5 * emb + 0.01
                c = ctx.fresh()
                update = optimizers.make_update(c, ids, grads)
                keep, table, state = opt.gradient_update_start(c, update, table, state, grads[0, 0])
                norm, _, _ = opt.gradient_update_done(c, keep[0])
                return table, state, norm

            kw = {"compiler_options": compile_options(options)} if options else {}
            fn = jax.jit(step, donate_argnums=(0, 1), **kw)
            table = jax.jit(lambda: jnp.zeros((vocab, width), jnp.float32))()
            state = jax.jit(lambda: opt.init(vocab, width))()
            times = []
            for i in range(steps + warmup):
                t = time.perf_counter()
                table, state, norm = fn(table, state, ids[i])
                jax.block_until_ready((table, norm))
                if i >= warmup:
                    times.append(time.perf_counter() - t)
            out[f"{name}@{vocab}"] = statistics.median(times)
            del table, state, fn
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
