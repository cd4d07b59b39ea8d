"""Hash tables: what the mapping costs a step, and what it buys on a drifting id stream.

Cost: one table's fused row-wise Adagrad step (the lookup, per-token gradients, dedupe, segment-sum, the rule
on the touched rows, scatter; table and state donated; ``fused_update.update_step``) on a dense table of
``capacity + 2`` rows fed ids in range, against the same step on a hash table of ``capacity`` slots fed raw
64-bit ids, which first maps them (``runner.core.hash_tables.assign``: window probe, admission, eviction)
and resets the rows it gives to new ids. Both tables are stored as a run stores them (``stored_width``).
B = 16,384 lookups per step, Zipf(1.1) ids from a population 10x the capacity whose ranks drift, D = 64,
capacity 1M; the variants take turns every round, "x dense" is their ratio round by round. Beside the whole
hash step: its first parts alone (the mapping; the mapping and the resets), and the whole step on a table
that ``fill`` untimed steps of another stream have filled, so every new id evicts.

Quality (``--quality``): ``experiment=hash_tables`` (raw ids, drifting ranks, 10x more distinct ids than
slots) three ways, seeds 0-2: the hash tables; modulo tables of the same rows (``kind=modulo``: hash(id)
mod rows, colliding; its batch collision rate beside it); and dense tables of the whole population (the
small ids themselves, no memory limit: the ceiling). Test AUC is reported; nothing is selected on it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import optimizers
from optimizers import compiler_options
from runner.core import hash_rows as hr, hash_tables as ht
from runner.core.embeddings import auto_stored_width

from . import common
from .fused_update import Table, update_body

FULL = dict(capacity=1_000_000, width=64, batch=16_384, population=10_000_000, drift=50, rounds=25, warmup=3,
            fill=250)
QUICK = dict(capacity=10_000, width=16, batch=512, population=100_000, drift=5, rounds=3, warmup=1, fill=60)
OPTIMIZER = "async_rowwise_adagrad"
SEEDS = (0, 1, 2)


def stored_width(width: int) -> int | None:
    """The runner's default stored width of a table this wide on this backend (on a TPU, 64 -> 128 columns;
    ``runner.core.embeddings.auto_stored_width``): both tables are measured as a run stores them."""
    return auto_stored_width(width, jax.default_backend())


def drifting_ids(rng: np.random.Generator, population: int, batch: int, steps: int, drift: int) -> list[np.ndarray]:
    """Per step, ``batch`` Zipf ranks shifted by ``drift`` per step over the population (0-based ids)."""
    return [(common.zipf_ids(rng, population, batch).astype(np.int64) + s * drift) % population for s in range(steps)]


class HashTable:
    """A hash table, its slots, its optimizer state and its compiled step (mapping, then the fused update)."""

    def __init__(self, capacity: int, width: int, batch: int, keys: list, upto: str = "update"):
        """``upto``: the step whole (``update``), or only its first part: the mapping (``map``: ``assign``) or
        the mapping and the reset of the rows given to new ids (``reset``), to show what each part costs."""
        self.spec = ht.HashSpec(capacity)
        opt = optimizers.create(OPTIMIZER)
        rows = self.spec.rows
        ctx = optimizers.AsyncEmbContext(rows, width, batch, stored_width=stored_width(width))
        stored = ctx.stored_width
        self.table = jax.jit(lambda: jnp.zeros((rows, stored), jnp.float32))()
        self.state = jax.jit(lambda: opt.init(rows, stored))()
        self.slots = jax.jit(lambda: ht.init_state(self.spec))()
        self.bytes = common.tree_bytes((self.table, self.state))
        self.slot_bytes = common.tree_bytes(self.slots)
        # what grows with capacity: the per-slot arrays (the sketch and the fill counter are fixed-size)
        self.per_slot_bytes = sum(x.nbytes for x in jax.tree.leaves(self.slots)
                                  if x.ndim and x.shape[0] == capacity) / capacity
        initial = opt.init(1, stored)
        spec, seed = self.spec, jnp.zeros((2,), jnp.uint32)
        update = update_body(opt, ctx, fused=True)  # the dense table's step, on the rows the mapping gives

        def step(table, state, slots, keys, s):
            slots, got = ht.assign(spec, slots, keys, s)
            if upto == "map":
                return table, state, slots, got.slots, got.admitted
            table, state = hr.reset_rows(spec, table, state, initial, got, seed, 0.05, width=width)
            ids = hr.key_rows(spec, keys, got.slots, rows)
            if upto == "reset":
                return table, state, slots, ids, got.admitted
            table, state, norm = update(table, state, ids)
            return table, state, slots, norm, got.admitted

        self.step = jax.jit(step, donate_argnums=(0, 1, 2), compiler_options=compiler_options(["float32"], 1))
        self.keys, self.admitted = keys, []

    def __call__(self, i: int):
        self.table, self.state, self.slots, out, new = self.step(self.table, self.state, self.slots,
                                                                 self.keys[i % len(self.keys)], jnp.int32(i))
        self.admitted.append(new)
        return out


def cost(cfg: dict) -> dict:
    rng = np.random.default_rng(0)
    n = cfg["rounds"] + cfg["warmup"]
    raw = drifting_ids(rng, cfg["population"], cfg["batch"], n, cfg["drift"])
    scramble = rng.permutation(cfg["population"]).astype(np.int64) * 7919 + 12345  # distinct, never 0
    keys = [jnp.asarray(ht.fingerprint(scramble[x])) for x in raw]
    dense_ids = [jnp.asarray((x % cfg["capacity"] + 1).astype(np.int32)) for x in raw]
    dense = Table(OPTIMIZER, cfg["capacity"] + 2, cfg["width"], cfg["batch"], "float32", dense_ids,
                  stored_width(cfg["width"]))
    hashed = HashTable(cfg["capacity"], cfg["width"], cfg["batch"], keys)
    parts = {p: HashTable(cfg["capacity"], cfg["width"], cfg["batch"], keys, p) for p in ("map", "reset")}
    # the same step on a table the stream has filled (every new id evicts): ``fill`` untimed steps of another
    # stream of the same kind first, then its next batches in the timed rounds
    later = drifting_ids(np.random.default_rng(1), cfg["population"], cfg["batch"], cfg["fill"] + n, cfg["drift"])
    full = HashTable(cfg["capacity"], cfg["width"], cfg["batch"], [jnp.asarray(ht.fingerprint(scramble[x]))
                                                                    for x in later])
    for i in range(cfg["fill"]):
        jax.block_until_ready(full(i))
    filled = float(ht.occupancy(full.slots))
    variants = {"dense": dense, "hash": hashed, **parts, "full": lambda i: full(cfg["fill"] + i)}
    times = common.interleaved(variants, cfg["rounds"], cfg["warmup"])
    res = {"dense": common.stats(times["dense"]), "hash": common.stats(times["hash"]),
           "x_dense": common.paired_ratio(times["hash"], times["dense"]),
           **{f"hash_{p}": common.stats(times[p]) for p in parts},
           **{f"{p}_x_dense": common.paired_ratio(times[p], times["dense"]) for p in parts},
           "admitted_per_step": float(np.mean([int(a) for a in hashed.admitted[cfg["warmup"]:]])),
           "hash_full": common.stats(times["full"]), "full_x_dense": common.paired_ratio(times["full"], times["dense"]),
           "full_occupancy_before": filled, "full_occupancy": float(ht.occupancy(full.slots)),
           "full_admitted_per_step": float(np.mean([int(a) for a in full.admitted[cfg["fill"] + cfg["warmup"]:]])),
           "table_bytes": dense.bytes, "slot_bytes": hashed.slot_bytes,
           "slot_bytes_per_slot": hashed.per_slot_bytes, "sketch_bytes": 4 * hashed.spec.sketch_depth * hashed.spec.sketch_width,
           "occupancy": float(ht.occupancy(hashed.slots)),
           "distinct_per_step": float(np.mean([np.unique(x).size for x in raw]))}
    print(f"dense {common.spread(res['dense'])} ms  hash {common.spread(res['hash'])} ms  x dense "
          f"{res['x_dense']['median']:.2f}  slots {res['slot_bytes_per_slot']:.0f} B/slot", flush=True)
    return res


def quality(quick: bool) -> list[dict]:
    """``experiment=hash_tables`` as hash, modulo and dense-ceiling tables, per seed (subprocesses)."""
    base = ["experiment=hash_tables", "logger=none"] + (["trainer.steps=60", "trainer.eval_interval=60",
                                                          "trainer.eval_batches=2"] if quick else [])
    variants = {
        "hash": [],
        "modulo": ["model.tables.users.kind=modulo", "model.tables.users.vocab=2002",
                   "model.tables.items.kind=modulo", "model.tables.items.vocab=5002"],
        "dense (whole population)": ["data.raw_ids=false", "model.tables.users.kind=dense",
                                     "model.tables.items.kind=dense"],
    }
    out = []
    for seed in SEEDS[:1] if quick else SEEDS:
        for name, over in variants.items():
            with tempfile.TemporaryDirectory() as d:
                cmd = [sys.executable, "-m", "runner", *base, *over, f"data.seed={seed}", f"trainer.seed={seed}",
                       f"hydra.run.dir={d}"]
                subprocess.run(cmd, check=True, capture_output=True)
                s = json.loads((Path(d) / "summary.json").read_text())
                rows = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
            last = [r for r in rows if "train/loss" in r][-1]
            res = {"seed": seed, "tables": name, "test_auc": s["test/auc_mean"], "valid_auc": s["valid/auc_mean"],
                   "bayes_test_auc": s["bayes/test/auc_mean"],
                   "collision_rate_items": last.get("emb/collision_rate/items"),
                   "evicted_items": last.get("emb/evicted/items"),
                   "unadmitted_items": last.get("emb/unadmitted_lookups/items")}
            out.append(res)
            print(f"seed {seed} {name:<26} test AUC {res['test_auc']:.4f} (valid {res['valid_auc']:.4f})"
                  + (f"  item collision rate {res['collision_rate_items']:.3f}" if res["collision_rate_items"]
                     is not None else ""), flush=True)
    return out


def run(quick: bool, out: Path, with_quality: bool = False) -> dict:
    cfg = QUICK if quick else FULL
    res = cost(cfg)
    data = {"config": cfg, "optimizer": OPTIMIZER, "cost": res,
            "targets": [common.target("hash step / dense step (x)", res["x_dense"]["median"], 1.3, "lower"),
                        common.target("slot array and metadata, bytes per slot", res["slot_bytes_per_slot"], 16,
                                      "lower")]}
    head = ["table", "step ms median (min-max)", "x dense"]
    rows = [["dense, capacity + 2 rows", common.spread(res["dense"]), "1"],
            ["hash, capacity slots", common.spread(res["hash"]), common.spread(res["x_dense"], 1, "{:.2f}")],
            ["of which: the mapping alone (assign)", common.spread(res["hash_map"]),
             common.spread(res["map_x_dense"], 1, "{:.2f}")],
            ["of which: the mapping and the new ids' resets", common.spread(res["hash_reset"]),
             common.spread(res["reset_x_dense"], 1, "{:.2f}")],
            ["hash, the table full (every new id evicts)", common.spread(res["hash_full"]),
             common.spread(res["full_x_dense"], 1, "{:.2f}")]]
    body = (f"{OPTIMIZER}, capacity {cfg['capacity']:,}, D = {cfg['width']}, B = {cfg['batch']:,} lookups per step "
            f"({res['distinct_per_step']:,.0f} distinct), ids from a drifting population of {cfg['population']:,}; "
            f"{cfg['rounds']} interleaved rounds after {cfg['warmup']} warm-up steps; the hash table gave "
            f"{res['admitted_per_step']:,.0f} ids a slot a step (each one's row and state reset) and ended "
            f"{res['occupancy']:.0%} full. The two partial steps run the same stream on their own tables. The full "
            f"table ran {cfg['fill']} untimed steps of another stream of the same kind first "
            f"({res['full_occupancy']:.0%} of its slots held after the rounds) and gave "
            f"{res['full_admitted_per_step']:,.0f} ids a slot a step. "
            + (f"Both tables stored {stored_width(cfg['width'])} columns wide (the runner's default here). "
               if stored_width(cfg["width"]) else "")
            + f"{common.machine_line()}.\n\n" + common.md_table(head, rows)
            + f"\n\nSlots: {res['slot_bytes_per_slot']:.0f} bytes each (key 8, last step 4, count 4) and a "
            f"{res['sketch_bytes'] / 2**20:.1f} MiB admission sketch, fixed; the table and its optimizer state: "
            f"{res['table_bytes'] / 2**20:,.0f} MiB.\n")
    if with_quality:
        q = quality(quick)
        data["quality"] = q
        qrows = []
        for name in dict.fromkeys(r["tables"] for r in q):
            rs = [r for r in q if r["tables"] == name]
            test, valid = np.array([r["test_auc"] for r in rs]), np.array([r["valid_auc"] for r in rs])
            col = [r["collision_rate_items"] for r in rs if r["collision_rate_items"] is not None]
            qrows.append([name, f"{test.mean():.4f} ({test.min():.4f}-{test.max():.4f})",
                          f"{valid.mean():.4f}", f"{np.mean(col):.3f}" if col else "0 (none)"])
        body += ("\n## Quality on the drifting stream\n\n`experiment=hash_tables`, seeds "
                 f"{', '.join(str(s) for s in sorted({r['seed'] for r in q}))}; mean (min-max) over seeds.\n\n"
                 + common.md_table(["tables", "test AUC", "valid AUC", "item collision rate (last batch)"], qrows))
    body += "\n\n## Targets\n\n" + common.md_table(["target", "measured", "wanted", ""],
                                                 [common.target_row(t) for t in data["targets"]])
    common.write_result(out, "hash_tables", "Hash tables: step cost and quality on a drifting stream", body, data)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv, flags={"--quality": (
        "with_quality", "also train experiment=hash_tables three ways (hash, modulo, dense tables), seeds 0-2: "
                        "minutes on 2 cores")})


if __name__ == "__main__":
    main()
