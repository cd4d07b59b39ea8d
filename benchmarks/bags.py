"""Multi-hot bags: the fused update's cost against the ids a bag adds.

A pooled multi-hot feature of bag size L hands the fused update B x L ids per step (each bag 1..L values
long, uniformly, padded with row 0, which the update drops), so its cost should grow with those ids and no
faster. For L = 1, 2, 4, 8 this times one table's fused row-wise Adagrad step (lookup, per-id gradients,
dedupe, segment-sum, the rule on the touched rows, scatter; table and state donated) at B = 4,096 bags
from Zipf(1.1) over 1M rows, D = 32, the sizes taking turns every round. "x L=1" is the step's time over
the one-hot step's, round by round; "x ids" divides it by the ratio of the ids (padding included) it
received: at most 1 means the cost grows no faster than the ids.
"""
from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from . import common
from .fused_update import Table

FULL = dict(vocab=1_000_000, width=32, bags=4096, sizes=(1, 2, 4, 8), rounds=25, warmup=2)
QUICK = dict(vocab=10_000, width=8, bags=64, sizes=(1, 2, 4), rounds=3, warmup=1)
OPTIMIZER = "async_rowwise_adagrad"


def bag_ids(rng: np.random.Generator, vocab: int, bags: int, size: int) -> np.ndarray:
    """int32 ``[bags * size]``: each bag 1..size Zipf ids long, then row-0 padding (a row of the batch each)."""
    ids = common.zipf_ids(rng, vocab, bags * size).reshape(bags, size)
    length = rng.integers(1, size + 1, bags)
    return np.where(np.arange(size) < length[:, None], ids, 0).astype(np.int32).ravel()


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    rng = np.random.default_rng(0)
    n = cfg["rounds"] + cfg["warmup"]
    host = {L: [bag_ids(rng, cfg["vocab"], cfg["bags"], L) for _ in range(n)] for L in cfg["sizes"]}
    tables = {L: Table(OPTIMIZER, cfg["vocab"], cfg["width"], cfg["bags"] * L, "float32",
                       [jnp.asarray(x) for x in host[L]]) for L in cfg["sizes"]}
    times = common.interleaved({str(L): t for L, t in tables.items()}, cfg["rounds"], cfg["warmup"])
    one = times[str(cfg["sizes"][0])]
    results = []
    for L in cfg["sizes"]:
        ids = [x[x > 0] for x in host[L]]
        res = {"bag": L, "ids": cfg["bags"] * L, "real_ids": float(np.mean([x.size for x in ids])),
               "unique_rows": float(np.mean([np.unique(x).size for x in ids])),
               "step": common.stats(times[str(L)]), "x_one": common.paired_ratio(times[str(L)], one)}
        res["x_ids"] = res["x_one"]["median"] / L
        results.append(res)
        print(f"L={L}  {common.spread(res['step'])} ms  x L=1 {res['x_one']['median']:.2f}  x ids "
              f"{res['x_ids']:.2f}", flush=True)
    big = results[-1]
    data = {"config": cfg, "optimizer": OPTIMIZER, "results": results,
            "targets": [common.target(f"step at L={big['bag']} / step at L=1, over the ids ratio {big['bag']} (x)",
                                      big["x_ids"], 1.0, "lower")]}
    head = ["bag size L", "ids / step (with padding)", "real ids / step", "unique rows / step",
            "step ms median (min-max)", "x L=1", "x ids"]
    rows = [[r["bag"], f"{r['ids']:,}", f"{r['real_ids']:,.0f}", f"{r['unique_rows']:,.0f}", common.spread(r["step"]),
             common.spread(r["x_one"], 1, "{:.2f}"), f"{r['x_ids']:.2f}"] for r in results]
    body = (f"{OPTIMIZER}, V = {cfg['vocab']:,}, D = {cfg['width']}, B = {cfg['bags']:,} bags per step; "
            f"{cfg['rounds']} interleaved rounds after {cfg['warmup']} warm-up steps. {common.machine_line()}.\n\n"
            + common.md_table(head, rows) + "\n\n## Targets\n\n"
            + common.md_table(["target", "measured", "wanted", ""], [common.target_row(t) for t in data["targets"]]))
    common.write_result(out, "bags", "Multi-hot bags: fused update cost against the ids", body, data)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
