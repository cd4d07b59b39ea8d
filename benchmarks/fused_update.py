"""The fused embedding update against the memory floor and against plain optax, at 100K, 1M and 10M rows.

One step = what a training step does to one table: gather the batch's rows (the lookup), per-token
gradients, dedupe, segment-sum, the optimizer rule on the touched rows, scatter back; jitted once with the
table and optimizer state donated. B = 16,384 lookups per step from Zipf(1.1), D = 64.

Side by side, in this one process:
- every fused optimizer (float32 tables; bfloat16 tables for row-wise Adagrad and Adam);
- the memory floor: numpy fancy-index gather of the batch's rows plus gather + scatter of its unique rows;
- the same update through plain optax on the dense table (``optimizers.Adam`` / ``Adagrad.apply_dense``).
Each fused variant runs in turn with the floor and with the same optimizer at the smallest vocabulary,
so "x floor" and "x smallest V" are ratios taken round by round.
"""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import optimizers
from optimizers import compiler_options
from optimizers.indexing import take_rows

from . import common

FULL = dict(sizes=(100_000, 1_000_000, 10_000_000), width=64, batch=16_384, rounds=25, warmup=2,
            dense_rounds={100_000: 8, 1_000_000: 4, 10_000_000: 2},
            opts=optimizers.FUSED, bf16_opts=("async_rowwise_adagrad", "async_adam"), dense=("adam", "adagrad"))
QUICK = dict(sizes=(1_000, 10_000), width=16, batch=256, rounds=3, warmup=1, dense_rounds={},
             opts=("async_rowwise_adagrad", "async_adam"), bf16_opts=("async_rowwise_adagrad",), dense=("adam",))


def update_body(opt, ctx: optimizers.AsyncEmbContext, fused: bool):
    """``(table, state, ids) -> (table, state, norm)``, unjitted: the lookup, per-token gradients of a quadratic
    loss and the update. On a mesh (``ctx.mesh``) as the train step runs it: the ids split over the devices and
    their rows read through the layout's lookup (``runner.core.embeddings.lookup_counted``: routed to their
    owners on the row layout); on one device the one gather the runner's one-device layout does
    (``optimizers.indexing.take_rows``: ids outside the table read zeros)."""
    sharded = ctx.mesh is not None and ctx.mesh.size > 1
    if sharded:
        from runner.core.embeddings import lookup_counted  # noqa: PLC0415

    def step(table, state, ids):
        if sharded:
            emb = lookup_counted(ctx, table, ids[:, None])[0][:, 0]  # ids [B, n]: one id an example
        else:
            emb = take_rows(table, ids)
        grads = 0.5 * ctx.narrow(emb).astype(jnp.float32) + 0.01  # per-token gradients of a quadratic loss
        c = ctx.fresh()
        update = optimizers.make_update(c, ids, grads)
        if fused:
            keep, table, state = opt.gradient_update_start(c, update, table, state,
                                                           jnp.zeros(()) if sharded else grads[0, 0])
            norm, _, _ = opt.gradient_update_done(c, keep[0])
        else:
            table, state, norm, _ = opt.apply_dense(c, update, table, state)
        return table, state, norm

    return step


def update_step(opt, ctx: optimizers.AsyncEmbContext, fused: bool, dtype: str = "float32", devices: int = 1):
    """``update_body`` jitted with table and state donated, compiled as the runner compiles a step on
    ``devices`` devices (``optimizers.compiler_options``)."""
    return jax.jit(update_body(opt, ctx, fused), donate_argnums=(0, 1),
                   compiler_options=compiler_options([dtype], devices))


class Table:
    """A table, its optimizer state and its compiled step; calling it runs one step on batch ``i``."""

    def __init__(self, name: str, vocab: int, width: int, batch: int, dtype: str, ids: list,
                 stored_width: int | None = None):
        self.opt = optimizers.create(name)
        self.fused = optimizers.supports_async_emb(self.opt)
        ctx = optimizers.AsyncEmbContext(vocab, width, batch, stored_width=stored_width)
        self.table = jax.jit(lambda: jnp.zeros((vocab, ctx.stored_width), dtype))()
        self.state = jax.jit(lambda: self.opt.init(vocab, ctx.stored_width))()
        self.bytes = common.tree_bytes((self.table, self.state))
        self.step, self.ids = update_step(self.opt, ctx, self.fused, dtype), ids

    def __call__(self, i: int):
        self.table, self.state, norm = self.step(self.table, self.state, self.ids[i % len(self.ids)])
        return norm


def numpy_floor(table: np.ndarray, ids: list[np.ndarray], uniq: list[np.ndarray]):
    def floor(i: int):
        k = i % len(ids)
        table[ids[k]]  # the lookup's rows
        table[uniq[k]] = table[uniq[k]]  # read and write back every touched row
    return floor


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    D, B, sizes = cfg["width"], cfg["batch"], cfg["sizes"]
    n_ids = cfg["rounds"] + cfg["warmup"]
    rng = np.random.default_rng(0)
    host = {V: [common.zipf_ids(rng, V, B) for _ in range(n_ids)] for V in sizes}
    dev = {V: [jnp.asarray(x) for x in host[V]] for V in sizes}
    variants = [(n, "float32") for n in cfg["opts"]] + [(n, "bfloat16") for n in cfg["bf16_opts"]]
    smallest = {v: Table(v[0], sizes[0], D, B, v[1], dev[sizes[0]]) for v in variants}
    data = {"config": {k: v for k, v in cfg.items() if k != "dense_rounds"}, "results": []}

    for V in sizes:
        np_table = np.zeros((V, D), np.float32)
        np_table.fill(1.0)  # touch every page now: calloc'd zeros would fault in during the timed rounds
        uniq = [np.unique(x) for x in host[V]]
        floor = numpy_floor(np_table, host[V], uniq)
        unique_rows = float(np.mean([u.size for u in uniq]))
        for name, dtype in variants:
            t = smallest[(name, dtype)] if V == sizes[0] else Table(name, V, D, B, dtype, dev[V])
            runs = {"fused": t, "floor": floor}
            if V != sizes[0]:
                runs["smallest"] = smallest[(name, dtype)]
            times = common.interleaved(runs, cfg["rounds"], cfg["warmup"])
            res = {"vocab": V, "optimizer": name, "dtype": dtype, "kind": "fused", "bytes": t.bytes,
                   "unique_rows": unique_rows, "step": common.stats(times["fused"]),
                   "floor": common.stats(times["floor"]),
                   "x_floor": common.paired_ratio(times["fused"], times["floor"]),
                   "x_smallest": (common.paired_ratio(times["fused"], times["smallest"]) if "smallest" in times
                                  else None)}
            data["results"].append(res)
            print(f"V={V:>10,} {name:<22} {dtype:<8} {common.spread(res['step'])} ms  "
                  f"x floor {res['x_floor']['median']:.2f}", flush=True)
            del t, runs
            common.release(quick)
        del np_table, floor
        common.release(quick)
        for name in cfg["dense"]:
            res = {"vocab": V, "optimizer": f"optax.{name}", "dtype": "float32", "kind": "dense",
                   "unique_rows": unique_rows}
            try:
                t = Table(name, V, D, B, "float32", dev[V])
                n = cfg["dense_rounds"].get(V, 3)
                res.update(bytes=t.bytes, step=common.stats(common.interleaved({"dense": t}, n, warmup=1)["dense"]))
            except jax.errors.JaxRuntimeError as e:  # an accelerator's memory: the dense step's table-sized
                if not common.out_of_device_memory(e):  # temporaries do not fit beside the table
                    raise
                res.update(bytes=None, step=None, error="out of device memory")
            t = None
            data["results"].append(res)
            said = common.spread(res["step"]) + " ms" if res["step"] else res["error"]
            print(f"V={V:>10,} optax.{name:<16} dense    {said}", flush=True)
            common.release(quick)

    data["targets"] = targets(data["results"], sizes)
    report(out, data, sizes)
    return data


def _find(results, V, opt, dtype="float32"):
    return next(r for r in results if r["vocab"] == V and r["optimizer"] == opt and r["dtype"] == dtype)


def targets(results, sizes) -> list[dict]:
    big, rw = sizes[-1], "async_rowwise_adagrad"
    out = [common.target(f"row-wise Adagrad step / numpy floor at V={V:,} (x)",
                         _find(results, V, rw)["x_floor"]["median"], 1.5, "lower") for V in sizes]
    out.append(common.target(f"row-wise Adagrad step at V={big:,} / at V={sizes[0]:,} (x)",
                             _find(results, big, rw)["x_smallest"]["median"], 1.2, "lower"))
    if any(r["optimizer"] == "optax.adam" and r["vocab"] == big and r["step"] for r in results):
        dense = _find(results, big, "optax.adam")["step"]["median"]
        out.append(common.target(f"optax.adam dense step / async_adam step at V={big:,} (x)",
                                 dense / _find(results, big, "async_adam")["step"]["median"], 150.0, "higher"))
    return out



def report(out: Path, data: dict, sizes) -> None:
    head = ["V", "optimizer", "table dtype", "step ms median (min-max)", "x numpy floor", f"x same at V={sizes[0]:,}",
            "unique rows/step", "table+state MB"]
    rows = []
    for r in data["results"]:
        fused = r["kind"] == "fused"
        rows.append([f"{r['vocab']:,}", r["optimizer"], r["dtype"], common.spread(r["step"]) if r["step"] else r["error"],
                     common.spread(r["x_floor"], 1, "{:.2f}") if fused else "",
                     f"{r['x_smallest']['median']:.2f}" if fused and r["x_smallest"] else "",
                     f"{r['unique_rows']:,.0f}", f"{r['bytes'] / 2**20:,.0f}" if r["bytes"] else ""])
    floors = {r["vocab"]: r["floor"] for r in data["results"] if r["kind"] == "fused"}
    for V, st in floors.items():
        rows.append([f"{V:,}", "numpy gather+scatter floor", "float32", common.spread(st), "1.00", "", "", ""])
    t_rows = [common.target_row(t) for t in data["targets"]]
    c = data["config"]
    body = (f"B = {c['batch']:,} Zipf(1.1) lookups per step, D = {c['width']}; {c['rounds']} interleaved rounds after "
            f"{c['warmup']} warm-up steps; medians with (min-max). {common.machine_line()}.\n\n"
            + common.md_table(head, rows) + "\n\n## Targets\n\n"
            + common.md_table(["target", "measured", "wanted", ""], t_rows)
            + "\n\n![step time](fused_update.png)\n")
    common.write_result(out, "fused_update", "Fused embedding update: step time", body, data)
    series = {}
    for r in data["results"]:
        label = r["optimizer"] + (" bf16" if r["dtype"] == "bfloat16" else "")
        if r["step"]:
            series.setdefault(label, {})[r["vocab"]] = r["step"]["median"] * 1e3
    series["numpy floor"] = {V: st["median"] * 1e3 for V, st in floors.items()}
    common.bar_chart(out / "fused_update.png", f"Embedding update step, B={c['batch']:,}, D={c['width']}",
                     [f"V={V:,}" for V in sizes], {k: [v.get(V, 0) for V in sizes] for k, v in series.items()},
                     "ms per step (log)")


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
