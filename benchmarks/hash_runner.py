"""The runner's train step with hash tables against the same step with modulo tables of as many rows.

``python -m benchmarks.hash_runner`` (not in the suite: about three minutes on 2 CPU cores). The ranking model
(the runner's default, each example a user, a history of items and authors and a candidate) on raw 64-bit ids
(``experiment=hash_tables``), scaled up: batch 16,384, 2M users and 5M items drifting one rank a step, the
users and items tables 200,000 and 500,000 rows wide, width 64, fused async row-wise Adagrad, one device. Two
variants, built with ``runner.build`` and compiled with ``TrainProgram.compile`` as the trainer does
(``benchmarks.trainer.stepper``):

- ``hash``: ``kind=hash`` tables of that many slots (the experiment's admission after 4 sightings, LRU);
- ``modulo``: ``kind=modulo`` tables of that many rows (``hash(id) mod rows``: a dense table the raw ids are
  hashed onto, colliding), the same step with no mapping, no admission and no resets.

Where ``benchmarks.hash_tables`` times one table's update alone, this is the whole step a user runs (the
model's forward and backward pass, three tables, the deferred update and the mapping). The variants take turns,
``steps`` steps per round, timed until the last loss is ready; "x modulo" is their ratio round by round.
"""
from __future__ import annotations

from pathlib import Path

from . import common

FULL = dict(batch=16_384, users=2_000_000, items=5_000_000, user_rows=200_000, item_rows=500_000, width=64,
            rounds=8, steps=5, warmup=1)
QUICK = dict(batch=32, users=400, items=1_000, user_rows=40, item_rows=100, width=8, rounds=2, steps=1, warmup=1)


def variants(cfg: dict) -> dict[str, list[str]]:
    base = ["experiment=hash_tables", "mesh=single", "optimizer=async_rowwise_adagrad", "async_emb=on",
            f"trainer.batch_size={cfg['batch']}", f"data.num_users={cfg['users']}", f"data.num_items={cfg['items']}",
            f"model.emb_width={cfg['width']}"]
    return {
        "hash": [*base, f"model.tables.users.capacity={cfg['user_rows']}",
                 f"model.tables.items.capacity={cfg['item_rows']}"],
        "modulo": [*base, "model.tables.users.kind=modulo", f"model.tables.users.vocab={cfg['user_rows'] + 2}",
                   "model.tables.items.kind=modulo", f"model.tables.items.vocab={cfg['item_rows'] + 2}"],
    }


def run(quick: bool, out: Path) -> dict:
    from .trainer import stepper

    cfg = QUICK if quick else FULL
    runs, rows = {}, {}
    for name, over in variants(cfg).items():
        fn, holder, _, _ = stepper(over, cfg["steps"])
        runs[name] = fn
        rows[name] = {n: int(t.shape[0]) for n, t in holder["state"].tables.items()}
    times = common.interleaved(runs, cfg["rounds"], cfg["warmup"])
    results = [{"variant": name, "table_rows": rows[name],
                "step": common.stats([t / cfg["steps"] for t in times[name]]),
                "x_modulo": common.paired_ratio(times[name], times["modulo"])} for name in runs]
    for r in results:
        print(f"{r['variant']:<7} {common.spread(r['step'])} ms  x modulo {r['x_modulo']['median']:.2f}", flush=True)
    data = {"config": cfg, "results": results}
    report(out, data)
    return data


def report(out: Path, data: dict) -> None:
    c = data["config"]
    table = [[r["variant"], ", ".join(f"{n} {k:,}" for n, k in r["table_rows"].items()), common.spread(r["step"]),
              common.spread(r["x_modulo"], 1, "{:.2f}")] for r in data["results"]]
    body = (f"`experiment=hash_tables` scaled up: the ranking model, batch {c['batch']:,}, {c['users']:,} users and "
            f"{c['items']:,} items, users and items tables of {c['user_rows']:,} and {c['item_rows']:,} rows (the "
            f"authors table dense in both), width "
            f"{c['width']}, fused async row-wise Adagrad, one device; {c['rounds']} interleaved rounds of "
            f"{c['steps']} steps after {c['warmup']} warm-up round; medians with (min-max). "
            f"{common.machine_line()}.\n\n"
            + common.md_table(["tables", "rows as stored", "step ms", "x modulo"], table) + "\n")
    common.write_result(out, "hash_runner", "The runner's step with hash tables against modulo tables", body, data)


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
