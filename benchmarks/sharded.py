"""Sharded fused update (issues #3, #16): the fused update with the table split over 8 CPU devices, against the
same update on one device, in one process with 8 virtual devices; and what each layout moves and touches.

One step, timed alike on every variant: from the batch's ids and per-token gradients (split over the devices,
as the train step holds them) build the update record (``optimizers.make_update``: one dedupe of the whole
batch, or on the routed row layout each device's dedupe of its own tokens), segment-sum the per-token
gradients, apply the optimizer to the touched rows and scatter them, table and state donated (the lookup is
not part of it).
rows/s counts the batch's unique rows updated per second. Variants take turns every round; ratios are round
by round. Per variant it also reports, per device and step, the bytes each collective moves, read from the
compiled HLO (``benchmarks/hlo.py``), beside the analytic minimum for the layout, and the rows each shard
updates (max and mean over shards) with and without the id permutation (``optimizers.routing.permute_ids``).

Variants: ``single`` (one device), ``row-gather`` (every shard sees every id), ``row-a2a`` (ids routed to
their owner by all-to-all; block split of the raw Zipf ids: the first shard owns the hot ids), ``row-a2a-perm`` (ids permuted first; slots 1.2x, the default, and 1x the most distinct ids one device
sent one shard in the first 8 batches, as the runner sizes them, and ``-even2``: 2x the even share of a
device's tokens, the sizing before), ``column`` (each device exchanges 1.2x the most distinct ids one device
held in the first 8 batches, as the runner sizes it).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from runner.config import ROUTE_SAMPLE_BATCHES

from . import common

FULL = dict(vocab=1_000_000, width=64, batch=16_384, rounds=20, warmup=2,
            optimizers=("async_rowwise_adagrad", "async_adam"))
QUICK = dict(vocab=8_192, width=16, batch=512, rounds=2, warmup=2, optimizers=("async_rowwise_adagrad",))
# name: (layout, routing, capacity, permuted ids, slots sized from sampled batches (the runner's way))
VARIANTS = {
    "single": (None, None, None, False, False),
    "single-perm": (None, None, None, True, False),
    "row-gather": ("row", "gather", None, False, False),
    "row-a2a": ("row", "alltoall", 1.2, False, True),
    "row-a2a-perm": ("row", "alltoall", 1.2, True, True),
    "row-a2a-perm-c1": ("row", "alltoall", 1.0, True, True),
    "row-a2a-perm-even2": ("row", "alltoall", 2.0, True, False),
    "column": ("column", None, 1.2, False, True),
}
SAMPLED = ROUTE_SAMPLE_BATCHES  # batches whose ids size the slots, as runner.build.route_peaks does (the first ones)


def runner_default(layout: str | None, routing: str | None, capacity: float | None, permuted: bool,
                   sampled: bool) -> bool:
    """Whether a variant is what the runner does with its default mesh settings on that layout
    (``runner.config.MeshConfig``: its routing and ``route_capacity`` x the sampled peak, and ``permute_ids``,
    whose ``auto`` permutes the ids exactly where rows are split over several shards)."""
    from runner.config import MeshConfig, permute_ids_setting

    m = MeshConfig()
    setting = permute_ids_setting(m.permute_ids)
    if permuted != (setting == "true" or (setting == "auto" and layout == "row")):
        return False
    if layout is None:  # one device: nothing to route or size
        return True
    return sampled and capacity == m.route_capacity and (layout != "row" or routing == str(m.routing))


def child(p: dict) -> dict:
    common.set_cpu_devices(8)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    import optimizers
    from optimizers import permute_ids

    from .hlo import step_collective_bytes

    V, D, B = p["vocab"], p["width"], p["batch"]
    mesh = Mesh(np.array(jax.devices()), ("table",))
    S = mesh.size
    rng = np.random.default_rng(0)
    n = p["rounds"] + p["warmup"]
    raw = [common.zipf_ids(rng, V, B) for _ in range(n)]
    permute = jax.jit(lambda x: permute_ids(x, V))  # one program for every batch
    perm = [np.asarray(permute(x)) for x in raw]
    grads = [rng.normal(size=(B, D)).astype(np.float32) * 0.01 for _ in range(n)]
    unique = float(np.mean([np.unique(x).size for x in raw]))
    unique_dev = float(np.mean([np.unique(d).size for x in raw for d in x.reshape(S, -1)]))

    def shard_load(ids_list):  # rows each of the 8 row shards would update per step (block split)
        per = np.array([np.bincount(np.unique(x) // (V // S), minlength=S)[:S] for x in ids_list])
        peaks = [np.bincount(np.unique(d) // (V // S), minlength=S)[:S].max() for x in ids_list for d in x.reshape(S, -1)]
        return {"max": float(per.max(1).mean()), "mean": float(per.mean()), "peak_to_device": float(np.mean(peaks)),
                "peak_to_device_max": int(np.max(peaks))}

    load = {"block": shard_load(raw), "permuted": shard_load(perm)}
    results = []
    for name in p["optimizers"]:
        opt = optimizers.create(name)
        runs, info = {}, {}
        for var, (layout, routing, cap, permuted, sampled) in VARIANTS.items():
            kw = {} if layout is None else dict(mesh=mesh, table_axis="table", table_layout=layout)
            if routing:
                kw["routing"] = routing
            if cap:
                kw["route_capacity"] = cap
            ctx = optimizers.AsyncEmbContext(V, D, B, **kw)
            ids = perm if permuted else raw
            # Per batch, the peak the layout sizes its slots from (the most distinct ids one device sends one
            # row shard, or holds: the column exchange): the first ones size the slots, the rest count reroutes.
            peaks = [ctx.layout.sample_peak(ctx, x) for x in ids]
            if sampled:
                ctx = dataclasses.replace(ctx, route_peak=max(peaks[:SAMPLED]))
            # One device: the table committed to it like the state and the batches, so the step's first output
            # (committed) is called with the same argument shardings as the table it was compiled for.
            one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            sh = (lambda spec: one) if layout is None else (lambda spec: NamedSharding(mesh, spec))  # noqa: E731
            put = ((lambda x, spec: jax.device_put(x, jax.devices()[0])) if layout is None else
                   (lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))))
            table = jax.jit(lambda: jnp.zeros((V, D), jnp.float32), out_shardings=sh(ctx.table_spec()))()
            state = opt.init(V, D)
            state = jax.tree.map(put, state, ctx.state_specs(state))
            # As the train step has them: ids and per-token gradients split over the batch; a layout that wants
            # them elsewhere (replicated ids for a whole-batch dedupe, width slices) pays for moving them here.
            P = jax.sharding.PartitionSpec
            bi = [put(i, P("table")) for i in ids]
            bg = [put(g, P("table", None)) for g in grads]

            def step(table, state, i, g, ctx=ctx, opt=opt):
                update = optimizers.make_update(ctx, i, g)
                c = ctx.fresh()
                keep, table, state = opt.gradient_update_start(c, update, table, state, jnp.zeros(()))
                norm, valid, _ = opt.gradient_update_done(c, keep[0])
                return table, state, (norm, valid, c.results.get("rows_per_shard"),
                                      c.results.get("route_refused", jnp.zeros((), jnp.int32)))

            # compiled as the runner compiles a step on this many devices (optimizers.compiler_options)
            f = jax.jit(step, donate_argnums=(0, 1),
                        compiler_options=optimizers.compiler_options(["float32"], 1 if layout is None else S))
            hlo = f.lower(table, state, bi[0], bg[0]).compile().as_text()
            traffic = step_collective_bytes(hlo)  # a usual step: not rerouted
            traffic_rerouted = step_collective_bytes(hlo, "dearest")
            holder = {"t": table, "s": state, "f": f, "i": bi, "g": bg, "out": []}

            def run(i, h=holder):
                k = i % len(h["i"])
                h["t"], h["s"], out = h["f"](h["t"], h["s"], h["i"][k], h["g"][k])
                h["out"].append(out)
                return out[0]

            runs[var] = run
            info[var] = (ctx, traffic, holder, traffic_rerouted, peaks)
        times = common.interleaved(runs, p["rounds"], p["warmup"])
        for var, (layout, routing, cap, permuted, sampled) in VARIANTS.items():
            ctx, traffic, holder, traffic_rerouted, peaks = info[var]
            outs = holder["out"]
            valid = all(bool(o[1]) for o in outs)
            refused = max(int(o[3]) for o in outs)
            # Steps whose ids overflowed some device's slots for one shard (routed in further rounds of the same slots).
            rerouted = sum(k > ctx.route_slots for k in peaks[p["warmup"]:]) if ctx.counts_routes else 0
            rows = [np.asarray(o[2]) for o in outs if o[2] is not None and np.ndim(o[2]) and np.size(o[2]) > 1]
            st = common.stats(times[var])
            base = "single-perm" if permuted else "single"
            minimum = ctx.layout.min_collective_bytes(ctx, unique_dev, unique, row_stats="rowwise" in name)
            results.append({
                "optimizer": name, "variant": var, "default": runner_default(layout, routing, cap, permuted, sampled),
                "layout": layout or "single", "routing": routing,
                "route_capacity": cap, "permuted": permuted, "sampled": sampled,
                "route_peak": ctx.route_peak if ctx.counts_routes else None, "step": st, "rows_per_s": unique / st["median"],
                "vs_single": common.paired_ratio(times[base], times[var]), "valid": valid, "refused": refused,
                "rerouted_steps": int(rerouted),
                "collective_bytes": traffic, "rerouted_step_bytes": traffic_rerouted["total"], "minimum_bytes": minimum,
                "bytes_vs_minimum": traffic["total"] / minimum if minimum else None,
                "shard_rows_max": float(np.mean([r.max() for r in rows])) if rows else None,
                "shard_rows_mean": float(np.mean([r.mean() for r in rows])) if rows else None,
                "route_slots": ctx.route_slots if ctx.counts_routes else None,
                "owner_buffer": ctx.owner_unique if ctx.routed else None,
            })
    return {"results": results, "unique_rows": unique, "unique_rows_per_device": unique_dev, "load": load}


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    payload = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    # In this process if JAX has not started here yet (python -m benchmarks.sharded) or has 8 devices (--quick's
    # one process), else in a fresh one.
    res = child(payload) if common.has_cpu_devices(8) else common.run_child("sharded", payload)
    for r in res["results"]:
        print(f"{r['optimizer']:<22} {r['variant']:<16} {common.spread(r['step'])} ms  {r['rows_per_s']:,.0f} rows/s  "
              f"x{r['vs_single']['median']:.2f} of 1 device  {r['collective_bytes']['total'] / 1e6:.3g} MB "
              f"collectives  valid={r['valid']} rerouted={r['rerouted_steps']} refused={r['refused']}", flush=True)
    targets = []
    for r in res["results"]:
        if r["variant"].startswith("row-a2a-perm"):
            o, c = r["optimizer"].replace("async_", ""), r["route_capacity"]
            what = (f"capacity {c:g} x sampled peak{' (default)' if r['variant'] == 'row-a2a-perm' else ''}"
                    if r["sampled"] else f"capacity {c:g} x even share")
            targets.append(common.target(f"sharded row update, {o}, routed + permuted ids, {what} "
                                         f"({r['route_slots']} slots): speed vs 1 device",
                                         r["vs_single"]["median"], 0.85 if r["default"] else 0.7, "higher"))
            targets.append(common.target(f"sharded row update, {o}, {what}: collective bytes / analytic "
                                         "minimum", r["bytes_vs_minimum"], 1.5, "lower"))
            if r["shard_rows_max"] and r["variant"] == "row-a2a-perm":
                targets.append(common.target(f"sharded row update, {o}: rows per shard max / (unique / shards)",
                                             r["shard_rows_max"] / (res["unique_rows"] / 8), 1.3, "lower"))
        if r["variant"] == "column":
            o = r["optimizer"].replace("async_", "")
            targets.append(common.target(f"sharded column update, {o}, exchange {r['route_capacity']:g} x sampled "
                                         f"peak (default): speed vs 1 device", r["vs_single"]["median"], 0.7,
                                         "higher"))
            targets.append(common.target(f"sharded column update, {o}, exchange {r['route_capacity']:g} x sampled "
                                         f"peak ({r['route_slots']} ids a device): collective bytes / analytic minimum",
                                         r["bytes_vs_minimum"], 1.5, "lower"))
    data = {"config": cfg, **res, "targets": targets}
    from runner.config import MeshConfig

    mesh = MeshConfig()  # the runner's default mesh settings, which the `runner default` column marks
    head = ["optimizer", "variant", "runner default", "step ms median (min-max)", "rows/s", "speed vs 1 device (x)",
            "collective MB / device / step (kinds)", "x analytic minimum", "rows updated per shard max / mean",
            "slots per destination (column: ids a device exchanges)", "valid (refused)", "rerouted steps"]
    rows = []
    for r in res["results"]:
        b = r["collective_bytes"]
        kinds = ", ".join(f"{k} {v / 1e6:.3g}" for k, v in b.items() if v and k != "total")
        rows.append([r["optimizer"], r["variant"], "yes" if r["default"] else "", common.spread(r["step"]), f"{r['rows_per_s']:,.0f}",
                     common.spread(r["vs_single"], 1, "{:.2f}"),
                     f"{b['total'] / 1e6:.3g} ({kinds})" if b["total"] else "-",
                     f"{r['bytes_vs_minimum']:.2f}" if r["bytes_vs_minimum"] else "-",
                     f"{r['shard_rows_max']:,.0f} / {r['shard_rows_mean']:,.0f}" if r["shard_rows_max"] else "-",
                     r["route_slots"] or "-", f"{r['valid']} ({r['refused']})",
                     r["rerouted_steps"] if r["route_slots"] else "-"])
    ld = res["load"]
    body = (f"V = {cfg['vocab']:,} rows, D = {cfg['width']}, B = {cfg['batch']:,} Zipf(1.1) ids per step "
            f"({res['unique_rows']:,.0f} unique on average, {res['unique_rows_per_device']:,.0f} per device's "
            f"{cfg['batch'] // 8:,} tokens); {cfg['rounds']} interleaved rounds after {cfg['warmup']} warm-up "
            f"steps. Timed on every variant: the update record built from the batch's ids and per-token "
            f"gradients (`make_update`: a dedupe of the whole batch, or each device's of its own tokens on the "
            f"routed row layout) and the fused update (segment-sum, rule, in-place scatter); the lookup is not "
            f"part of it. The 8 devices are virtual CPU devices on the same cores, so total work close to one "
            f"device's is what scaling looks like here. `-perm` variants (and their baseline `single-perm`) "
            f"relabel ids with `optimizers.routing.permute_ids` first. Collective bytes are per device per step, "
            f"read from the compiled HLO, for a step that is not rerouted (`benchmarks.hlo.step_collective_bytes`: "
            f"the cheaper branch of each conditional, no rerouting round past the first; the JSON also has "
            f"`rerouted_step_bytes`, one more round); the analytic minimum is a device's distinct ids x (4 D + 4) "
            f"bytes (row) or the batch's distinct ids x (4 D / 8 + 4) (column), plus 4 bytes a distinct id for row-wise "
            f"Adagrad on the column layout (each width shard's partial sum of g**2 over its slice of the row, which "
            f"its rule needs over the whole width). {common.machine_line()}.\n\n"
            f"Rows a row shard updates per step (block split, max / mean over the 8 shards): raw Zipf ids "
            f"{ld['block']['max']:,.0f} / {ld['block']['mean']:,.0f}; permuted {ld['permuted']['max']:,.0f} / "
            f"{ld['permuted']['mean']:,.0f}. The most distinct ids one device sends one shard: "
            f"{ld['block']['peak_to_device']:,.0f} raw, {ld['permuted']['peak_to_device']:,.0f} permuted on "
            f"average over steps, at most {ld['block']['peak_to_device_max']:,} raw and "
            f"{ld['permuted']['peak_to_device_max']:,} permuted in any step of this run (the even share of a "
            f"device's {cfg['batch'] // 8:,} tokens is {cfg['batch'] // 64:,}). Slots per destination: "
            f"`route_capacity` x the most distinct ids one device sent one shard in the first {SAMPLED} batches "
            f"(how the runner sizes them; variants without `-even`), or x the even share of a device's tokens "
            f"(`-even2`, the sizing before). A step where some device has more ids for one shard than its slots "
            f"routes the rest in further rounds of the same slots (`rerouted steps` counts the timed ones); `refused` counts "
            f"ids an update could not deliver (it was then refused whole). `column`: each device exchanges its "
            f"first 1.2 x the most distinct ids one device held in the first {SAMPLED} batches (the runner's "
            f"sizing); a step where some device holds more exchanges every device's whole buffer. `runner default`: "
            f"the variant that is what the runner does with its default mesh settings on that layout (routing "
            f"{mesh.routing}, slots `mesh.route_capacity` = {mesh.route_capacity:g} x the sampled peak, and "
            f"`mesh.permute_ids=auto`, which permutes the ids on the row layout and not on one device or the "
            f"column layout); `default` in the JSON.\n\n"
            + common.md_table(head, rows) + "\n\n" + common.md_table(
                ["target", "measured", "wanted", ""], [common.target_row(t) for t in targets])
            + "\n\n![sharded](sharded.png)\n")
    common.write_result(out, "sharded", "Sharded fused update (8 CPU devices)", body, data)
    opts = list(dict.fromkeys(r["optimizer"] for r in res["results"]))
    val = {(r["optimizer"], r["variant"]): r["rows_per_s"] for r in res["results"]}
    common.bar_chart(out / "sharded.png", "Fused update rows/s by variant", [o.replace("async_", "") for o in opts],
                     {v: [val[(o, v)] for o in opts] for v in VARIANTS}, "rows/s", log=False)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
