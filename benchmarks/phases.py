"""Where the fused update spends its time: milliseconds per phase, on one device and on the routed row layout.

The library runs every op of the fused update under a named scope per phase (``optimizers/scopes.py``:
dedupe, segment-sum, routing, gather, rule, gate, scatter). This benchmark profiles a few steps of each
variant with ``jax.profiler`` and charges every executed XLA op's self time (its time minus the ops that ran
inside it: a loop's body is charged to its own phases) to the phase its ``op_name`` metadata names in the
compiled HLO; ops of no phase (building the record around the dedupe, moving the batch) are ``other``.
Ops run concurrently on the CPU thread pool, so the phase times add up to more than the step's wall time:
read the shares, and compare runs of this script with one another, not with the wall time. On the sharded
layouts a collective's time includes waiting for the slowest device (the 8 virtual devices share 2 cores), so
``routing`` and ``gate`` (whose all-reduce decides for every shard) also hold the other devices' skew.

The step is the sharded benchmark's (``benchmarks/sharded.py``): the update record from the batch's ids and
per-token gradients, then the fused update; V = 1M rows, D = 64, B = 16,384 Zipf(1.1) ids. ``one device``
runs on one of the 8 virtual CPU devices; ``row routed`` is the default sharded layout on all 8 (ids
permuted, slots 1.2 x the sampled peak, as the runner sizes them); ``column`` the column layout.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import re
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from . import common

FULL = dict(vocab=1_000_000, width=64, batch=16_384, steps=20, warmup=3,
            optimizers=("async_rowwise_adagrad", "async_adam"))
QUICK = dict(vocab=8_192, width=16, batch=512, steps=3, warmup=2, optimizers=("async_rowwise_adagrad",))
VARIANTS = ("one device", "row routed", "column")
OTHER = "other"
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?metadata=\{[^}]*op_name=\"([^\"]*)\"", re.M)


def op_phases(hlo_text: str) -> dict[str, str]:
    """Each instruction of a compiled HLO module -> the phase its ``op_name`` names (``OTHER`` when none)."""
    from optimizers.scopes import phase_of

    return {name: phase_of(op) or OTHER for name, op in _INSTR.findall(hlo_text)}


def self_times(events: list[dict]) -> list[tuple[str, float]]:
    """(op name, self time in us) of profiler events: each event's duration minus the events that ran inside
    it on the same thread (a while loop's body ops, a conditional's branch)."""
    out = []
    by_thread = defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [end, name, self]
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]:
                end, name, own = stack.pop()
                out.append((name, own))
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], e["args"]["hlo_op"], e["dur"]])
        out.extend((name, own) for _, name, own in stack)
    return out


def profile(fn, steps: int, module: str) -> list[dict]:
    """Run ``fn(i)`` for ``steps`` steps under the profiler; the executed ops of HLO module ``module``."""
    import jax

    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        try:
            for i in range(steps):
                jax.block_until_ready(fn(i))
        finally:
            jax.profiler.stop_trace()
        path = next(Path(d).rglob("*.trace.json.gz"))
        data = json.load(gzip.open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("hlo_module") == module
            and "hlo_op" in e["args"]]


def child(p: dict) -> dict:
    common.set_cpu_devices(8)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import optimizers
    from optimizers.scopes import PHASES

    V, D, B = p["vocab"], p["width"], p["batch"]
    mesh = Mesh(np.array(jax.devices()), ("table",))
    rng = np.random.default_rng(0)
    n = p["steps"] + p["warmup"]
    raw = [common.zipf_ids(rng, V, B) for _ in range(n)]
    permute = jax.jit(lambda x: optimizers.permute_ids(x, V))
    perm = [np.asarray(permute(x)) for x in raw]
    grads = [rng.normal(size=(B, D)).astype(np.float32) * 0.01 for _ in range(n)]
    results = []
    for name in p["optimizers"]:
        opt = optimizers.create(name)
        for var in VARIANTS:
            if var == "one device":
                ctx, ids = optimizers.AsyncEmbContext(V, D, B), raw
                put = lambda x, spec: jax.device_put(x, jax.devices()[0])  # noqa: E731
            else:
                layout = "row" if var == "row routed" else "column"
                ctx = optimizers.AsyncEmbContext(V, D, B, mesh=mesh, table_axis="table", table_layout=layout)
                ids = perm if layout == "row" else raw
                ctx = dataclasses.replace(ctx, route_peak=max(ctx.layout.sample_peak(ctx, x) for x in ids[:8]))
                put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
            table = put(jnp.zeros((V, D), jnp.float32), ctx.table_spec())
            state = opt.init(V, D)
            state = jax.tree.map(put, state, ctx.state_specs(state))
            bi, bg = [put(i, P("table")) for i in ids], [put(g, P("table", None)) for g in grads]

            def step(table, state, i, g, ctx=ctx, opt=opt):
                c = ctx.fresh()
                update = optimizers.make_update(c, i, g)
                keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros(()))
                norm, valid, _ = opt.gradient_update_done(c, keep[0])
                return table, state, (norm, valid)

            on = 1 if var == "one device" else mesh.size  # compiled as the runner compiles a step on this many devices
            f = jax.jit(step, donate_argnums=(0, 1), compiler_options=optimizers.compiler_options(["float32"], on))
            compiled = f.lower(table, state, bi[0], bg[0]).compile()
            phases_of = op_phases(compiled.as_text())
            h = {"t": table, "s": state}

            def run(i, h=h, f=f, bi=bi, bg=bg):
                h["t"], h["s"], out = f(h["t"], h["s"], bi[i % len(bi)], bg[i % len(bg)])
                return out

            for i in range(p["warmup"]):
                jax.block_until_ready(run(i))
            walls = []
            for i in range(p["steps"]):
                t = time.perf_counter()
                jax.block_until_ready(run(i))
                walls.append(time.perf_counter() - t)
            events = profile(run, p["steps"], re.sub(r"\W", "_", f"jit_{step.__name__}"))
            per = dict.fromkeys((*PHASES, OTHER), 0.0)
            for op, own in self_times(events):
                per[phases_of.get(op, OTHER)] += own / 1e3 / p["steps"]  # ms per step, all devices
            devices = 1 if var == "one device" else mesh.size
            per = {k: v / devices for k, v in per.items()}  # per device
            results.append({"optimizer": name, "variant": var, "wall_ms": statistics.median(walls) * 1e3,
                            "phase_ms": per, "devices": devices})
            print(f"{name:<22} {var:<11} wall {results[-1]['wall_ms']:.2f} ms  "
                  + "  ".join(f"{k} {v:.2f}" for k, v in per.items()), flush=True)
            del h, table, state, f, compiled
    return {"results": results}


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    data = {"config": cfg, **common.run_child("phases", cfg)}
    report(out, data)
    return data


def report(out: Path, data: dict) -> None:
    from optimizers.scopes import PHASES

    names = (*PHASES, OTHER)
    head = ["optimizer", "variant", "step wall ms", *[f"{k} ms (%)" for k in names]]
    rows = []
    for r in data["results"]:
        total = sum(r["phase_ms"].values()) or 1.0
        rows.append([r["optimizer"], r["variant"], f"{r['wall_ms']:.2f}",
                     *[f"{r['phase_ms'][k]:.2f} ({100 * r['phase_ms'][k] / total:.0f}%)" for k in names]])
    c = data["config"]
    body = (f"V = {c['vocab']:,}, D = {c['width']}, B = {c['batch']:,} Zipf(1.1) ids per step; {c['steps']} profiled "
            f"steps after {c['warmup']} warm-up steps; phase times are op self times per step and device (ops "
            f"overlap on the thread pool, so they add up to more than the wall time). On one device the native CPU "
            f"kernel of row-wise Adagrad and Adam (optimizers.kernels) gathers, updates, gates and scatters the "
            f"touched rows in one op, counted as the rule. {common.machine_line()}."
            "\n\n" + common.md_table(head, rows) + "\n")
    common.write_result(out, "phases", "Fused update: time per phase", body, data)


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
