"""Sharded fused update (issue #3): rows/s of the fused update with the table split over 8 CPU devices, by
rows and by columns, against the same update on one device, in one process with 8 virtual devices.

One step: dedupe the batch's ids, segment-sum its per-token gradients, apply the optimizer to the touched
rows and scatter them, with the table and state donated (the lookup is not part of it). rows/s counts the
unique rows updated per second. The three layouts take turns every round; ratios are round by round.
"""
from __future__ import annotations

from pathlib import Path

from . import common

FULL = dict(vocab=1_000_000, width=64, batch=16_384, rounds=10, warmup=2,
            optimizers=("async_rowwise_adagrad", "async_adam"))
QUICK = dict(vocab=8_192, width=16, batch=512, rounds=2, warmup=1, optimizers=("async_rowwise_adagrad",))
LAYOUTS = ("single", "row", "column")


def _can_have_8_devices() -> bool:
    try:
        common.set_cpu_devices(8)
    except RuntimeError:  # the backend is already up with its own device count
        pass
    import jax

    return jax.device_count() == 8


def child(p: dict) -> dict:
    common.set_cpu_devices(8)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    import optimizers

    V, D, B = p["vocab"], p["width"], p["batch"]
    mesh = Mesh(np.array(jax.devices()), ("table",))
    rng = np.random.default_rng(0)
    n = p["rounds"] + p["warmup"]
    host_ids = [common.zipf_ids(rng, V, B) for _ in range(n)]
    grads = [rng.normal(size=(B, D)).astype(np.float32) * 0.01 for _ in range(n)]
    unique = float(np.mean([np.unique(x).size for x in host_ids]))
    results = []
    for name in p["optimizers"]:
        opt = optimizers.create(name)
        runs = {}
        for layout in LAYOUTS:
            ctx = (optimizers.AsyncEmbContext(V, D, B) if layout == "single" else
                   optimizers.AsyncEmbContext(V, D, B, mesh=mesh, table_axis="table", layout=layout))
            if layout == "single":
                put = lambda x, spec: jax.device_put(x, jax.devices()[0])  # noqa: E731
            else:
                put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
            table = jax.jit(lambda: jnp.zeros((V, D), jnp.float32), out_shardings=None if layout == "single" else
                            NamedSharding(mesh, ctx.table_spec()))()
            state = opt.init(V, D)
            state = jax.tree.map(put, state, ctx.state_specs(state))
            updates = [jax.device_put(jax.jit(lambda i, g, c=ctx: optimizers.make_update(c, i, g))(i, g))
                       for i, g in zip(host_ids, grads)]

            def step(table, state, update, ctx=ctx, opt=opt):
                c = ctx.fresh()
                keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros(()))
                return table, state, opt.gradient_update_done(c, keep[0])[0]

            holder = {"t": table, "s": state, "f": jax.jit(step, donate_argnums=(0, 1)), "u": updates}

            def run(i, h=holder):
                h["t"], h["s"], norm = h["f"](h["t"], h["s"], h["u"][i % len(h["u"])])
                return norm

            runs[layout] = run
        times = common.interleaved(runs, p["rounds"], p["warmup"])
        for layout in LAYOUTS:
            st = common.stats(times[layout])
            results.append({"optimizer": name, "layout": layout, "step": st, "rows_per_s": unique / st["median"],
                            "vs_single": common.paired_ratio(times["single"], times[layout])})
    return {"results": results, "unique_rows": unique}


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    payload = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    # In this process if JAX has not started here yet (python -m benchmarks.sharded), else in a fresh one.
    res = child(payload) if _can_have_8_devices() else common.run_child("sharded", payload)
    for r in res["results"]:
        print(f"{r['optimizer']:<22} {r['layout']:<7} {common.spread(r['step'])} ms  {r['rows_per_s']:,.0f} rows/s  "
              f"x{r['vs_single']['median']:.2f} of 1 device", flush=True)
    data = {"config": cfg, **res}
    head = ["optimizer", "layout", "devices", "step ms median (min-max)", "rows/s", "speed vs 1 device (x)"]
    rows = [[r["optimizer"], r["layout"], 1 if r["layout"] == "single" else 8, common.spread(r["step"]),
             f"{r['rows_per_s']:,.0f}", common.spread(r["vs_single"], 1, "{:.2f}")] for r in res["results"]]
    body = (f"V = {cfg['vocab']:,} rows, D = {cfg['width']}, B = {cfg['batch']:,} Zipf(1.1) ids per step "
            f"({res['unique_rows']:,.0f} unique on average); {cfg['rounds']} interleaved rounds after "
            f"{cfg['warmup']} warm-up steps. The 8 devices are virtual CPU devices on the same cores, so this "
            f"measures the cost of the sharded kernel (each shard scans every unique id; collectives for the "
            f"norm and, in the column layout, the row statistics), not a speed-up from more hardware. "
            f"{common.machine_line()}.\n\n" + common.md_table(head, rows) + "\n\n![sharded](sharded.png)\n")
    common.write_result(out, "sharded", "Sharded fused update (8 CPU devices)", body, data)
    opts = list(dict.fromkeys(r["optimizer"] for r in res["results"]))
    val = {(r["optimizer"], r["layout"]): r["rows_per_s"] for r in res["results"]}
    common.bar_chart(out / "sharded.png", "Fused update rows/s by layout", [o.replace("async_", "") for o in opts],
                     {lay: [val[(o, lay)] for o in opts] for lay in LAYOUTS}, "rows/s", log=False)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
