"""Does the Criteo reader starve the step? DLRM steps fed by the reader against the same steps fed from memory.

The runner's DLRM (``benchmarks/dlrm.py``'s tables: Criteo Kaggle's cardinalities / 10, hashed ids, the
default fused ``async_rowwise_adagrad``) built with ``runner.build`` and compiled as the train loop does.
Two ways to run ``STEPS`` steps, interleaved round by round:

- **reader**: as the train loop does: each step dispatched, then the next batch taken from the loop's feed
  (``runner.core.feed.Feed``: a Grain pipeline whose background thread builds batches ahead, ``task.batch``:
  examples gathered from the memory-mapped shards, ids mapped to rows) and put on the device;
- **reader, 1 worker**: the same with the batches built by one worker process (``trainer.data_workers=1``);
- **memory**: the same batches read and put on the device beforehand; only the steps run.

"reader / memory" is the ratio of their times, round by round (1.0: the reader costs the step nothing).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from . import common
from .dlrm import tables
from .trainer import compose

FULL = dict(lines=200_000, batch=1024, steps=20, rounds=7, warmup=2)
QUICK = dict(lines=20_000, batch=256, steps=3, rounds=2, warmup=1)
TARGET = 1.10


def run(quick: bool, out: Path) -> dict:
    import jax

    from runner.build import build
    from runner.core.feed import Feed
    from runner.core.loop import to_device

    cfg = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as d:
        conf = compose(["data=criteo", "model=dlrm", f"data.lines={cfg['lines']}", "data.ids=hash", *tables(),
                        f"trainer.batch_size={cfg['batch']}", f"data.cache={d}/data", "mesh=single"])
        program, task, _ = build(conf)
        B, n = cfg["batch"], cfg["steps"]
        holder = {"state": program.init_state(0)}
        step, _, _ = program.compile(holder["state"], to_device(program, task.batch(0, B)))
        ready = [to_device(program, task.batch(i, B)) for i in range(n)]
        total = n * (cfg["rounds"] + cfg["warmup"])
        feeds = {w: Feed(task, 0, total, B, workers=w) for w in (0, 1)}  # as the loop feeds it, every round's steps

        def reader(_, workers=0):
            feed = feeds[workers]
            batch = to_device(program, next(feed))
            for k in range(n):
                holder["state"], m = step(holder["state"], batch)
                if k + 1 < n:  # the loop's order: the next batch is taken while this step runs
                    batch = to_device(program, next(feed))
            return m["train/loss"]

        def memory(_):
            for b in ready:
                holder["state"], m = step(holder["state"], b)
            return m["train/loss"]

        t = time.perf_counter()
        for i in range(n):
            task.batch(1000 + i, B)
        read_s = (time.perf_counter() - t) / n
        variants = {"reader": reader, "reader, 1 worker": lambda i: reader(i, 1), "memory": memory}
        times = common.interleaved(variants, cfg["rounds"], cfg["warmup"])
        jax.block_until_ready(holder["state"])
        for f in feeds.values():
            f.close()
    res = {k: common.stats([x / n for x in v]) for k, v in times.items()}
    ratio = common.paired_ratio(times["reader"], times["memory"])
    ratio_w = common.paired_ratio(times["reader, 1 worker"], times["memory"])
    data = {"config": {**cfg, "rows": sum(int(r.split("=")[1]) for r in tables())}, "step": res,
            "reader_over_memory": ratio, "worker_over_memory": ratio_w, "batch_read_s": read_s,
            "targets": [common.target("reader step / memory step (x)", ratio["median"], TARGET, "lower")]}
    body = (f"DLRM on one device, 26 hashed tables of Kaggle's cardinalities / 10, batches of {B:,}; {n} steps a "
            f"round, {cfg['rounds']} interleaved rounds after {cfg['warmup']} warm-up. Reading one batch alone "
            f"(`task.batch`): {read_s * 1e3:.1f} ms. {common.machine_line()}.\n\n"
            + common.md_table(["fed by", "step ms, median (min-max)", "x memory"],
                              [["memory", common.spread(res["memory"]), "1"],
                               ["reader (a background thread, the default)", common.spread(res["reader"]),
                                f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"],
                               ["reader (1 worker process: trainer.data_workers=1)",
                                common.spread(res["reader, 1 worker"]),
                                f"{ratio_w['median']:.2f} ({ratio_w['min']:.2f}-{ratio_w['max']:.2f})"]])
            + "\n\n## Targets\n\n" + common.md_table(["target", "measured", "wanted", ""],
                                                     [common.target_row(t) for t in data["targets"]]))
    common.write_result(out, "criteo_input", "Criteo input: reader against memory", body, data)
    print(body)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
