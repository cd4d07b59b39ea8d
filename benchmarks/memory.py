"""Peak memory of a table and its optimizer state: initialisation and fused update steps, against the bytes
of the table + state themselves. Each configuration runs in a fresh process, so its peak RSS is its own.

In the child: compile the update step, the table's fill (``runner.core.embeddings.table_initializer``, what
``init_table`` runs, as the trainer does) and the optimizer state's init (``opt.init`` under jit, as
``TrainProgram.init_state`` does) from abstract shapes, note the RSS (the process baseline: Python, JAX,
compiled code), initialise table and state, note the peak, run donated update steps (40: the C allocator's copies
of the step's temporaries add up over the first tens of steps; the peak is also noted after steps 1, 5 and 20),
note the peak again. "Overhead" is
(peak - baseline) / (table + state bytes) - 1. The compiled step's temporaries (``memory_analysis``) are recorded
beside it: the part of the overhead that is the step's own working set. Steps are dispatched as JAX and the runner
dispatch them (asynchronously); one row runs the one-device step inline instead
(``jax_cpu_enable_async_dispatch=False``), which keeps one copy of the temporaries. On several devices the step is
the train step's (``fused_update.update_body``): the batch split over the devices, its rows read through the
layout's lookup, routed with the runner's mesh defaults.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from . import common

FULL = dict(width=64, batch=16_384, steps=40, configs=[
    *[dict(vocab=10_000_000, opt=o, dtype="float32") for o in ("async_rowwise_adagrad", "async_adam", "async_adagrad")],
    dict(vocab=10_000_000, opt="async_rowwise_adagrad", dtype="bfloat16"),
    dict(vocab=10_000_000, opt="async_adam", dtype="bfloat16"),
    dict(vocab=10_000_000, opt="async_rowwise_adagrad", dtype="float32", devices=8, layout="row"),
    dict(vocab=1_000_000, opt="async_rowwise_adagrad", dtype="float32"),
    # not the runner's default: the one-device step run inline (jax_cpu_enable_async_dispatch=False)
    dict(vocab=1_000_000, opt="async_rowwise_adagrad", dtype="float32", dispatch="inline"),
    dict(vocab=1_000_000, opt="adam", dtype="float32"),
])
EARLY = (1, 5, 20)  # steps after which the peak is also noted (those within the run's steps)
QUICK = dict(width=16, batch=256, steps=2, configs=[dict(vocab=20_000, opt="async_rowwise_adagrad", dtype="bfloat16")])


def child(cfg: dict) -> dict:
    """Runs in the fresh process: measure one configuration."""
    devices = cfg.get("devices", 1)
    if devices > 1:
        common.set_cpu_devices(devices)
    import jax

    if cfg.get("dispatch") == "inline":  # read when the CPU backend starts, so before anything runs
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    import optimizers
    from runner.config import ROUTE_SAMPLE_BATCHES as SAMPLED, MeshConfig
    from runner.core.embeddings import TableSpec, table_initializer

    from .fused_update import update_step

    V, D, B = cfg["vocab"], cfg["width"], cfg["batch"]
    opt = optimizers.create(cfg["opt"])
    mesh = Mesh(np.array(jax.devices()), ("table",)) if devices > 1 else None
    rng = np.random.default_rng(0)
    host = [common.zipf_ids(rng, V, B) for _ in range(cfg["steps"])]
    if mesh is None:
        ctx = optimizers.AsyncEmbContext(V, D, B)
    else:  # the runner's mesh settings (MeshConfig): ids permuted, slots route_capacity x the most distinct ids
        # one device sent one shard in the first batches (runner.build.route_peaks' way)
        m = MeshConfig()
        ctx = optimizers.AsyncEmbContext(V, D, B, mesh=mesh, table_axis="table", table_layout=cfg.get("layout", "row"),
                                         route_capacity=m.route_capacity)
        permute = jax.jit(lambda x: optimizers.permute_ids(x, V))
        host = [np.asarray(permute(x)) for x in host]
        ctx = dataclasses.replace(ctx, route_peak=max(ctx.layout.sample_peak(ctx, x) for x in host[:SAMPLED]))
    shard = (lambda spec: NamedSharding(mesh, spec)) if mesh else (lambda spec: None)
    state_shape = jax.eval_shape(lambda: opt.init(V, D))
    state_sh = jax.tree.map(shard, ctx.state_specs(state_shape),
                            is_leaf=lambda x: isinstance(x, type(ctx.table_spec())))
    fused = optimizers.supports_async_emb(opt)
    table_abs = jax.ShapeDtypeStruct((V, D), jnp.dtype(cfg["dtype"]), sharding=shard(ctx.table_spec()))
    step = update_step(opt, ctx, fused, cfg["dtype"], devices)  # on a mesh: the train step's split and lookup
    ids_abs = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=shard(jax.sharding.PartitionSpec("table")))
    step = step.lower(table_abs, state_shape, ids_abs).compile()
    # the step's own working set: XLA's temporaries, per device (each of the process's devices runs the program)
    temp_bytes = int(step.memory_analysis().temp_size_in_bytes) * devices
    init_state = jax.jit(lambda: opt.init(V, D), out_shardings=state_sh).lower().compile()
    spec, key = TableSpec("t", V, D, 1, V, dtype=cfg["dtype"]), jax.random.key(0)
    fill = table_initializer(spec, shard(ctx.table_spec())).lower(key).compile()
    ids = [jax.device_put(x, ids_abs.sharding) for x in host]
    jax.block_until_ready(ids)

    base = common.rss_bytes()
    table = fill(key)
    state = init_state()
    jax.block_until_ready((table, state))
    peak_init = common.peak_rss_bytes()
    early = {}  # the peak after the first few steps: the allocator's copies of the temporaries add up over steps
    for i in range(cfg["steps"]):
        table, state, norm = step(table, state, ids[i])
        jax.block_until_ready(norm)
        if i + 1 in EARLY:
            early[i + 1] = common.peak_rss_bytes()
    peak = common.peak_rss_bytes()
    routed = {"slots": ctx.route_slots, "route_capacity": ctx.route_capacity, "sampled": SAMPLED} if mesh else {}
    return {**cfg, **routed, "table_bytes": common.tree_bytes(table), "state_bytes": common.tree_bytes(state),
            "base": base, "peak_init": peak_init, "peak": peak, "peak_early": early, "temp_bytes": temp_bytes}


def targets(results: list[dict]) -> list[dict]:
    """The target, per vocabulary: peak RSS at most 5% above the table + its optimizer state, for the worst fused
    configuration at that V as the runner runs it (on a small table the batch's fixed working set shows). The
    target's name leaves out which configuration was worst, which may differ from run to run (``worst`` says)."""
    fused = [r for r in results if r["opt"].startswith("async_") and r.get("dispatch") != "inline"]
    out = []
    for V in sorted({r["vocab"] for r in fused}):
        worst = max((r for r in fused if r["vocab"] == V), key=lambda r: r["overhead"])
        t = common.target(f"peak RSS above table + state, worst fused config at V={V:,} (%)", 100 * worst["overhead"],
                          5.0, "lower")
        out.append({**t, "worst": f"{worst['opt']} {worst['dtype']} x{worst.get('devices', 1)}"})
    return out


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    results = []
    for c in cfg["configs"]:
        r = common.run_child("memory", {**c, "width": cfg["width"], "batch": cfg["batch"], "steps": cfg["steps"]})
        r["data_bytes"] = r["table_bytes"] + r["state_bytes"]
        r["overhead_init"] = (r["peak_init"] - r["base"]) / r["data_bytes"] - 1
        r["overhead"] = (r["peak"] - r["base"]) / r["data_bytes"] - 1
        r["overhead_early"] = {k: (v - r["base"]) / r["data_bytes"] - 1 for k, v in r["peak_early"].items()}
        r["temp_share"] = r["temp_bytes"] / r["data_bytes"]  # the floor of the overhead: the step's temporaries
        results.append(r)
        print(f"V={r['vocab']:>10,} {r['opt']:<22} {r['dtype']:<8} x{r.get('devices', 1)}  table+state "
              f"{r['data_bytes'] / 2**20:,.0f} MB  peak-base {(r['peak'] - r['base']) / 2**20:,.0f} MB  "
              f"overhead {100 * r['overhead']:+.1f}%", flush=True)
    data = {"config": {k: v for k, v in cfg.items() if k != "configs"}, "results": results,
            "targets": targets(results)}
    report(out, data)
    return data


def report(out: Path, data: dict) -> None:
    mb = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731

    def devices(r):
        return f"{r.get('devices', 1)}" + (f" ({r['layout']})" if r.get("devices", 1) > 1 else "")

    def dispatch(r):  # JAX's default (the runner's), or the one-device step run inline
        return r.get("dispatch", "asynchronous")

    rows = [[f"{r['vocab']:,}", r["opt"], r["dtype"], devices(r), dispatch(r),
             mb(r["table_bytes"]), mb(r["state_bytes"]), mb(r["base"]), mb(r["peak_init"] - r["base"]),
             mb(r["peak"] - r["base"]), f"{100 * r['overhead_init']:+.1f}%",
             " / ".join(f"{100 * v:+.1f}%" for v in r.get("overhead_early", {}).values()), f"{100 * r['overhead']:+.1f}%",
             f"{r['temp_bytes'] / 2**20:,.1f} ({100 * r['temp_share']:.1f}%)"]
            for r in data["results"]]
    head = ["V", "optimizer", "table dtype", "devices", "JAX dispatch", "table MB", "state MB", "process baseline MB",
            "peak after init - baseline MB", "peak after steps - baseline MB", "init overhead",
            f"overhead after {' / '.join(str(k) for k in EARLY if k <= data['config']['steps'])} steps",
            f"overhead after {data['config']['steps']} steps",
            "step temporaries MB, all devices (of table + state)"]
    mesh = next((r for r in data["results"] if r.get("slots")), {"slots": "-", "route_capacity": "-", "sampled": "-"})
    body = (f"B = {data['config']['batch']:,} lookups per step, D = {data['config']['width']}, "
            f"{data['config']['steps']} donated update steps; each row is its own fresh process. The batch's own "
            f"working set (looked-up rows, per-token gradients, segment sums, updated rows) is a fixed few tens "
            f"of MB whatever the vocabulary, so it shows as a percentage only on small tables: the last column is "
            f"the compiled step's temporaries (XLA's `memory_analysis`), a floor no allocator goes below. Steps are "
            f"dispatched asynchronously, as JAX and the runner dispatch them: a thread of XLA's pool runs each, "
            f"and glibc's malloc keeps a freed block of temporaries in that thread's own arena, so the process ends "
            f"up with a copy for each pool thread that has run a step. The row marked inline runs the one-device "
            f"step in the calling thread (`jax_cpu_enable_async_dispatch=False`), which reuses one block. On 8 devices "
            f"the ids are split over the devices and routed to their rows' owners as in the train step, with the "
            f"runner's mesh defaults: ids permuted, and {mesh['slots']} slots a destination (`route_capacity` "
            f"{mesh['route_capacity']} x the most distinct ids one device sent one shard in the first {mesh['sampled']} "
            f"batches). "
            f"{common.machine_line()}.\n\n" + common.md_table(head, rows)
            + "\n\n## Targets\n\n" + "\n".join(f"- {t['target']}: {t['measured']:.1f} (wanted <= "
                                                   f"{t['threshold']:.0f}; worst: {t.get('worst', '-')}): "
                                                   f"{'met' if t['met'] else 'NOT met'}" for t in data["targets"])
            + "\n\n![memory](memory.png)\n")
    common.write_result(out, "memory", "Peak memory against table + optimizer state", body, data)
    labels = [f"{r['opt'].replace('async_', '')} {r['dtype'][:4]} {r['vocab'] // 1000:,}K x{r.get('devices', 1)}"
              for r in data["results"]]
    common.bar_chart(out / "memory.png", "Peak RSS above the process baseline vs table + state", labels,
                     {"table + state": [r["data_bytes"] / 2**20 for r in data["results"]],
                      "peak - baseline": [(r["peak"] - r["base"]) / 2**20 for r in data["results"]]}, "MB", log=True)


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
