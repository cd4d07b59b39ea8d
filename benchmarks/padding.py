"""The runner's train step with 64-wide tables: stored as they are, stored as the default decides, and 128 wide.

``python -m benchmarks.padding`` on a machine with a TPU (not in the CPU suite: on a CPU the default stores
tables unpadded, so two of the three variants are the same step). The ranking model (``model=ranking``, the
runner's default) with ``data.num_items`` items, built with ``runner.build`` and compiled with
``TrainProgram.compile`` as the trainer does (``benchmarks.trainer.stepper``), fused async row-wise Adagrad:

- ``unpadded``: width 64, every table ``stored_width=64``;
- ``default``: width 64, ``stored_width`` left null (on a TPU every table is stored 128 wide:
  ``runner.core.embeddings.auto_stored_width``);
- ``width 128``: the tables 128 wide.

The variants take turns, ``steps`` steps per round, timed until the last loss is ready.
"""
from __future__ import annotations

from pathlib import Path

from . import common

TABLES = ("users", "items", "authors")
FULL = dict(items=5_000_000, batch=8192, rounds=5, steps=10, warmup=1)
QUICK = dict(items=2_000, batch=64, rounds=2, steps=2, warmup=1)
VARIANTS = {
    "unpadded": ["model.emb_width=64", *[f"model.tables.{n}.stored_width=64" for n in TABLES]],
    "default": ["model.emb_width=64"],
    "width 128": ["model.emb_width=128"],
}


def run(quick: bool, out: Path) -> dict:
    import jax

    from .trainer import stepper

    cfg = QUICK if quick else FULL
    base = [f"data.num_items={cfg['items']}", f"trainer.batch_size={cfg['batch']}", "mesh=single",
            "optimizer=async_rowwise_adagrad"]
    runs, shapes = {}, {}
    for name, extra in VARIANTS.items():
        fn, holder, _, _ = stepper([*base, *extra], cfg["steps"])
        runs[name] = fn
        shapes[name] = {n: list(t.shape) for n, t in holder["state"].tables.items()}
    times = common.interleaved(runs, cfg["rounds"], cfg["warmup"])
    results = []
    for name in VARIANTS:
        step = common.stats([t / cfg["steps"] for t in times[name]])
        results.append({"variant": name, "tables": shapes[name], "step": step,
                        "examples_per_s": cfg["batch"] / step["median"],
                        "x_unpadded": common.paired_ratio(times["unpadded"], times[name])})
        print(f"{name:<10} {common.spread(step)} ms  tables {shapes[name]}", flush=True)
    data = {"config": {**cfg, "backend": jax.default_backend(), "device": jax.devices()[0].device_kind},
            "results": results}
    report(out, data)
    return data


def report(out: Path, data: dict) -> None:
    c = data["config"]
    rows = [[r["variant"], ", ".join(f"{n} {s[0]:,} x {s[1]}" for n, s in r["tables"].items()),
             common.spread(r["step"]), f"{r['examples_per_s']:,.0f}", common.spread(r["x_unpadded"], 1, "{:.2f}")]
            for r in data["results"]]
    body = (f"The ranking model, {c['items']:,} items, batch {c['batch']:,}, fused async row-wise Adagrad, one device; "
            f"{c['rounds']} interleaved rounds of {c['steps']} steps after {c['warmup']} warm-up round; medians with "
            f"(min-max). {common.machine_line()}.\n\n"
            + common.md_table(["variant", "tables as stored", "step ms", "examples/s", "unpadded step / this step"],
                              rows) + "\n")
    common.write_result(out, "padding", "The runner's step with 64-wide tables, padded or not", body, data)


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
