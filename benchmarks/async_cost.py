"""What delay compensation and bounded staleness cost per step, and the memory the queue holds.

Two measurements, in this one process, each as ratios taken round by round (``common.interleaved``):

- **The fused update with delay compensation**: row-wise Adagrad and Adam through the public API (the
  lookup, ``make_update``, ``gradient_update_start/done``; Zipf(1.1) ids, B = 16,384, D = 64, V = 1M), with
  ``AsyncEmbContext.dc_lambda`` set (the record carries each token's looked-up row, and the rule corrects the
  gradient by it) against without. The target: at most 1.2x.
- **The runner's train step at staleness k** = 1, 2, 4, 8 (and k = 1 with compensation), default ranking
  config built by ``runner.build`` and compiled by ``TrainProgram.compile`` as the trainer does: ms per step
  against k = 1, and the bytes of the deferred updates in the train state (``TrainState.pending``).
"""
from __future__ import annotations

from pathlib import Path

from . import common

FULL = dict(vocab=1_000_000, width=64, batch=16_384, rounds=25, warmup=2, opts=("async_rowwise_adagrad", "async_adam"),
            staleness=(1, 2, 4, 8), overrides=[], step_rounds=8, steps=4)
QUICK = dict(vocab=10_000, width=16, batch=256, rounds=3, warmup=1, opts=("async_rowwise_adagrad",),
             staleness=(1, 2), overrides=["data.num_users=300", "data.num_items=500", "data.num_authors=50",
                                          "data.history_len=4", "model.emb_width=8", "model.hidden=[16]",
                                          "trainer.batch_size=32"], step_rounds=2, steps=2)


def fused_cost(cfg: dict, quick: bool) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import optimizers
    from optimizers.indexing import take_rows

    V, D, B = cfg["vocab"], cfg["width"], cfg["batch"]
    rng = np.random.default_rng(0)
    ids = [jnp.asarray(common.zipf_ids(rng, V, B)) for _ in range(cfg["rounds"] + cfg["warmup"])]
    out = []
    for name in cfg["opts"]:
        runs = {}
        for dc in (False, True):
            opt = optimizers.create(name)
            ctx = optimizers.AsyncEmbContext(V, D, B, dc_lambda=1.0 if dc else None)

            def step(table, state, i, opt=opt, ctx=ctx, dc=dc):
                emb = take_rows(table, i).astype(jnp.float32)  # the lookup: the runner's one-device gather
                grads = 0.5 * emb + 0.01
                c = ctx.fresh()
                update = optimizers.make_update(c, i, grads, rows=emb if dc else None)
                keep, table, state = opt.gradient_update_start(c, update, table, state, grads[0, 0])
                norm, _, _ = opt.gradient_update_done(c, keep[0])
                return table, state, norm

            jitted = jax.jit(step, donate_argnums=(0, 1), compiler_options=optimizers.compiler_options(["float32"], 1))
            holder = {"t": jax.jit(lambda: jnp.full((V, D), 0.01, jnp.float32))(),
                      "s": jax.jit(lambda opt=opt: opt.init(V, D))()}

            def run(i, jitted=jitted, holder=holder):
                holder["t"], holder["s"], norm = jitted(holder["t"], holder["s"], ids[i % len(ids)])
                return norm

            runs["dc" if dc else "plain"] = run
        times = common.interleaved(runs, cfg["rounds"], cfg["warmup"])
        r = {"optimizer": name, "vocab": V, "plain": common.stats(times["plain"]), "dc": common.stats(times["dc"]),
             "x_plain": common.paired_ratio(times["dc"], times["plain"])}
        print(f"{name:<24} plain {common.spread(r['plain'])} ms  dc {common.spread(r['dc'])} ms  "
              f"x {r['x_plain']['median']:.2f}", flush=True)
        out.append(r)
        del runs
        common.release(quick)
    return out


def step_cost(cfg: dict) -> list[dict]:
    from .trainer import stepper

    variants = [(k, False) for k in cfg["staleness"]] + [(1, True)]
    runs, meta = {}, {}
    for k, dc in variants:
        run, holder, _, _ = stepper([*cfg["overrides"], "mesh=single", "async_emb=on", f"async_emb.staleness={k}",
                                     *(["async_emb.compensation=dc"] if dc else [])], cfg["steps"])
        name = f"k={k}" + (" dc" if dc else "")
        runs[name] = run
        pending = holder["state"].pending
        meta[name] = {"staleness": k, "dc": dc, "queue_bytes": common.tree_bytes(pending),
                      # k > 1: each table's queue is a tuple of k records
                      "grads_bytes": common.tree_bytes({n: [r.grads for r in (u if k > 1 else (u,))]
                                                        for n, u in pending.items()})}
    times = common.interleaved(runs, cfg["step_rounds"], 2)
    out = []
    for name, m in meta.items():
        per_step = [t / cfg["steps"] for t in times[name]]
        r = {"name": name, **m, "step": common.stats(per_step), "x_k1": common.paired_ratio(times[name], times["k=1"])}
        print(f"{name:<8} {common.spread(r['step'])} ms/step  x k=1 {r['x_k1']['median']:.2f}  "
              f"queue {m['queue_bytes'] / 2**20:.1f} MiB", flush=True)
        out.append(r)
    return out


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    fused = fused_cost(cfg, quick)
    steps = step_cost(cfg)
    worst = max(r["x_plain"]["median"] for r in fused)
    data = {"config": cfg, "fused": fused, "steps": steps,
            "targets": [common.target("delay compensation / plain fused update, worst optimizer (x)", worst, 1.2,
                                      "lower")]}
    report(out, data)
    return data


def report(out: Path, data: dict) -> None:
    c = data["config"]
    fused_rows = [[r["optimizer"], common.spread(r["plain"]), common.spread(r["dc"]),
                   common.spread(r["x_plain"], 1, "{:.2f}")] for r in data["fused"]]
    step_rows = [[r["name"], common.spread(r["step"]), common.spread(r["x_k1"], 1, "{:.2f}"),
                  f"{r['queue_bytes'] / 2**20:.3f}"] for r in data["steps"]]
    t = data["targets"][0]
    body = (f"{__doc__.split(chr(10) * 2, 1)[1]}\n"
            f"Fused update: V = {c['vocab']:,}, B = {c['batch']:,}, D = {c['width']}, {c['rounds']} interleaved rounds. "
            f"{common.machine_line()}.\n\n"
            + common.md_table(["optimizer", "plain ms median (min-max)", "with dc ms", "dc / plain (x)"], fused_rows)
            + f"\n\nTrain step: the default ranking config{' with ' + ' '.join(c['overrides']) if c['overrides'] else ''}"
            f", one device, {c['step_rounds']} interleaved rounds of {c['steps']} steps.\n\n"
            + common.md_table(["async mode", "ms per step median (min-max)", "vs k=1 (x)", "deferred updates MiB"],
                              step_rows)
            + f"\n\n## Target\n\n{t['target']}: {t['measured']:.2f} (wanted <= {t['threshold']}): "
            f"{'met' if t['met'] else 'NOT met'}\n")
    common.write_result(out, "async_cost", "Delay compensation and staleness: cost", body, data)


def main(argv=None) -> None:
    common.main(__doc__, run, argv=argv)


if __name__ == "__main__":
    main()
