"""End-to-end trainer throughput (examples/s): sync vs async, every fused optimizer, 1 device vs an
8-device CPU mesh (tables row-sharded over all 8, the batch split over them).

Each device count runs in its own process (``jax_num_cpu_devices`` must be set before JAX starts; ``--quick``
runs both in one process with 8 virtual devices, the 1-device runs on a one-device mesh). In it,
every (optimizer, mode) is built with ``runner.build``, initialised and compiled with
``TrainProgram.compile`` exactly as the trainer does, then the configurations take turns: one round is
``steps`` jitted steps of each, on pre-generated device batches, timed until the last step's loss is
ready. The async/sync ratio is taken round by round.
"""
from __future__ import annotations

from pathlib import Path

from . import common

FULL = dict(overrides=[], rounds=5, steps=4, warmup=2,
            optimizers=("async_adam", "async_rowwise_adagrad", "async_adagrad", "async_sgd"))
QUICK = dict(overrides=["data.num_users=300", "data.num_items=500", "data.num_authors=50", "data.history_len=4",
                        "model.emb_width=8", "model.hidden=[16]", "trainer.batch_size=32"],
             rounds=2, steps=2, warmup=1, optimizers=("async_rowwise_adagrad",))
MESHES = {1: ["mesh=single"], 8: ["mesh=table", "mesh.cpu_devices=8"]}


def compose(overrides):
    from hydra import compose as hydra_compose, initialize_config_dir

    from runner.config import register

    register()
    with initialize_config_dir(config_dir=str(common.ROOT / "conf"), version_base="1.3", job_name="bench"):
        return hydra_compose("config", overrides=["logger=none", *overrides])


def stepper(overrides: list[str], steps: int):
    """The config ``overrides`` built with ``runner.build`` and compiled with ``TrainProgram.compile`` as the
    trainer does: ``(run, holder, batch_size, plan)``, where ``run(i)`` takes ``steps`` jitted steps from
    ``holder["state"]`` (its state, updated in place) and returns the last loss."""
    from runner.build import build
    from runner.core.loop import to_device

    cfg = compose(overrides)
    program, task, plan = build(cfg)
    B = cfg.trainer.batch_size
    batches = [to_device(program, task.batch(i, B)) for i in range(4)]
    holder = {"state": program.init_state(0)}
    step, _, _ = program.compile(holder["state"], batches[0])

    def run(i):
        for k in range(steps):
            holder["state"], metrics = step(holder["state"], batches[(i + k) % len(batches)])
        return metrics["train/loss"]

    return run, holder, B, plan


def child(p: dict) -> dict:
    devices = p["devices"]
    if devices > 1:
        common.set_cpu_devices(devices)
    import jax

    runs, meta = {}, {}
    for opt in p["optimizers"]:
        for mode in ("off", "on"):
            run, holder, B, plan = stepper([*p["overrides"], *MESHES[devices], f"optimizer={opt}",
                                            f"async_emb={mode}"], p["steps"])
            name = f"{opt}/{'async' if mode == 'on' else 'sync'}"
            runs[name] = run
            meta[name] = {"optimizer": opt, "mode": "async" if mode == "on" else "sync", "batch": B,
                          "mesh": plan.describe(), "devices": plan.num_devices}
    times = common.interleaved(runs, p["rounds"], p["warmup"])
    out = []
    for name, m in meta.items():
        per_step = [t / p["steps"] for t in times[name]]
        st = common.stats(per_step)  # the slowest step gives the lowest throughput
        r = {**m, "step": st, "examples_per_s": {"median": m["batch"] / st["median"], "min": m["batch"] / st["max"],
                                                 "max": m["batch"] / st["min"]}}
        if m["mode"] == "async":  # sync time / async time, round by round: > 1 means async is faster
            r["async_speedup"] = common.paired_ratio(times[f"{m['optimizer']}/sync"], times[name])
        out.append(r)
    return {"results": out}


def _single_device_here() -> bool:
    import jax

    return jax.device_count() == 1


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    results = []
    payloads = {d: {"devices": d, "optimizers": list(cfg["optimizers"]), "overrides": cfg["overrides"],
                    "rounds": cfg["rounds"], "steps": cfg["steps"], "warmup": cfg["warmup"]} for d in (1, 8)}
    # Quick (a smoke run; its timings mean nothing): both device counts in this process when it has, or can
    # still get, 8 virtual devices (the 1-device runs on a one-device mesh, mesh=single); else the 8-device
    # child runs beside the 1-device part.
    both_here = quick and common.has_cpu_devices(8)
    early = common.start_child("trainer", payloads[8]) if quick and not both_here else None
    for devices in (1, 8):
        # One device: this process when JAX here has one device (as under python -m benchmarks), else a child.
        if both_here or (devices == 1 and _single_device_here()):
            res = child(payloads[devices])["results"]
        else:
            proc = early if devices == 8 and early else common.start_child("trainer", payloads[devices])
            res = common.child_answer(proc)["results"]
        for r in res:
            print(f"{r['devices']} device(s) {r['optimizer']:<22} {r['mode']:<5} "
                  f"{r['examples_per_s']['median']:>10,.0f} ex/s" +
                  (f"  async/sync x{r['async_speedup']['median']:.2f}" if "async_speedup" in r else ""), flush=True)
        results += res
    single = {(r["optimizer"], r["mode"]): r for r in results if r["devices"] == 1}
    for r in results:
        if r["devices"] > 1:
            one = single[(r["optimizer"], r["mode"])]
            r["vs_1_device"] = r["examples_per_s"]["median"] / one["examples_per_s"]["median"]
    speedups = [r["async_speedup"]["median"] for r in results if "async_speedup" in r]
    data = {"config": {k: v for k, v in cfg.items()}, "results": results,
            "targets": [common.target("async / sync throughput, worst optimizer and mesh (x)", min(speedups), 1.0,
                                      "higher")]}
    report(out, data)
    return data



def report(out: Path, data: dict) -> None:
    rows = []
    for r in data["results"]:
        e = r["examples_per_s"]
        rows.append([r["mesh"], r["optimizer"], r["mode"], f"{e['median']:,.0f} ({e['min']:,.0f}-{e['max']:,.0f})",
                     common.spread(r["step"]),
                     common.spread(r["async_speedup"], 1, "{:.2f}") if "async_speedup" in r else "",
                     f"{r['vs_1_device']:.2f}" if "vs_1_device" in r else ""])
    head = ["mesh", "optimizer", "mode", "examples/s median (min-max)", "step ms", "async speed-up vs sync (x)",
            "vs 1 device (x)"]
    t = data["targets"][0]
    c = data["config"]
    body = (f"`runner.build` + the jitted step of `TrainProgram.compile`, default config"
            f"{' with ' + ' '.join(c['overrides']) if c['overrides'] else ''}; {c['rounds']} interleaved rounds of "
            f"{c['steps']} steps after {c['warmup']} warm-up rounds. 8 devices are virtual CPU devices sharing "
            f"the same cores. {common.machine_line()}.\n\n" + common.md_table(head, rows)
            + f"\n\n## Target\n\n{t['target']}: {t['measured']:.2f} (wanted >= {t['threshold']}): "
            f"{'met' if t['met'] else 'NOT met'}\n\n![throughput](trainer.png)\n")
    common.write_result(out, "trainer", "End-to-end trainer throughput", body, data)
    groups = sorted({(r["devices"], r["optimizer"]) for r in data["results"]})
    val = {(r["devices"], r["optimizer"], r["mode"]): r["examples_per_s"]["median"] for r in data["results"]}
    common.bar_chart(out / "trainer.png", "Trainer throughput", [f"{o.replace('async_', '')} x{d}" for d, o in groups],
                     {m: [val[(d, o, m)] for d, o in groups] for m in ("sync", "async")}, "examples/s", log=False)


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
