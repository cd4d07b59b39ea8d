"""The fused update on an accelerator: step time against the vocabulary for row widths 64 and 128, and for a
64-wide table stored padded to 128 columns (``AsyncEmbContext.stored_width``).

``python -m benchmarks.accelerator`` on a machine with a TPU (or any non-CPU JAX backend; on the CPU it runs
too, but ``fused_update`` is the CPU's benchmark). One step is ``fused_update``'s (lookup, per-token
gradients, dedupe, segment-sum, rule, gate, in-place scatter; table and state donated), B = 16,384 Zipf(1.1)
ids, float32 tables, for row-wise Adagrad and Adam at V = 100K, 1M and 10M and D = 64 and 128, each variant
taking turns with the same optimizer and width at the smallest V (so "x smallest V" is a ratio taken round by
round). Beside each time, read off the compiled step: its temporary bytes, and how many table-sized copies or
transposes it runs (``relayouts``): an XLA backend that stores the table in one layout and gathers or scatters
rows in another copies the whole table around the step, and the step's cost then grows with V.

Why it exists: on a TPU, XLA stores a float32 ``[V, 64]`` array with V along the 128 lanes (row-major would pad
every row to 128 lanes) and moves it to row-major around the row gather and scatter; with D = 128 (a multiple
of the lanes) nothing is copied. The table this writes shows which widths keep the cost of a step independent of
the vocabulary there, and whether padding a narrow table to the lanes (``stored_width``: twice a 64-wide
table's memory, what a row-major layout of it costs anyway) removes the copies.
"""
from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np

from . import common
from .fused_update import Table, update_step

FULL = dict(sizes=(100_000, 1_000_000, 10_000_000), widths=((64, 64), (64, 128), (128, 128)), batch=16_384, rounds=20, warmup=2,
            opts={"async_rowwise_adagrad": 10_000_000, "async_adam": 1_000_000},  # optimizer: largest V
            scan=dict(widths=(8, 16, 32, 48, 64, 96, 128, 192, 256), sizes=(1_000_000, 10_000_000),
                      dtypes=("float32", "bfloat16")))
QUICK = dict(sizes=(1_000, 4_000), widths=((16, 16), (16, 32)), batch=256, rounds=2, warmup=1,
             opts={"async_rowwise_adagrad": 4_000}, scan=dict(widths=(16, 32), sizes=(4_000,),
                                                              dtypes=("float32", "bfloat16")))
_RESULT = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(\w+)\[([0-9,]*)\]\{[^}]*\}\s+([\w\-]+)\(", re.M)


def relayouts(hlo_text: str, rows: int) -> int:
    """How many copies or transposes of a ``[rows, width]`` array (the table, or a per-element state leaf such as
    Adam's moments) the compiled program (``compiled.as_text()``) runs: each moves every byte of it (an
    asynchronous copy counts once, at its ``copy-done``). Copies of per-row state (``[rows]``) are left out."""
    return sum(1 for _, dims, op in _RESULT.findall(hlo_text)
               if op in ("copy", "transpose", "copy-done") and dims.split(",")[0] == str(rows) and "," in dims)


def compiled_facts(step, args, rows: int) -> dict:
    """The step compiled for ``args`` (arrays or shapes): its whole-table copies and its temporary bytes."""
    comp = step.lower(*args).compile()
    mem = comp.memory_analysis()
    return {"relayouts": relayouts(comp.as_text(), rows),
            "temp_bytes": int(mem.temp_size_in_bytes) if mem is not None else 0}


def scan(cfg: dict) -> list[dict]:
    """Compiled, not run: the row-wise Adagrad step's whole-table copies and temporaries for every width and
    dtype of ``cfg['scan']`` (argument shapes only, laid out as the backend lays out a new array)."""
    import optimizers

    out = []
    sc, B = cfg["scan"], cfg["batch"]
    for dtype in sc["dtypes"]:
        for V in sc["sizes"]:
            for D in sc["widths"]:
                opt = optimizers.create("async_rowwise_adagrad")
                step = update_step(opt, optimizers.AsyncEmbContext(V, D, B), True, dtype)
                args = (jax.ShapeDtypeStruct((V, D), dtype), jax.eval_shape(lambda: opt.init(V, D)),
                        jax.ShapeDtypeStruct((B,), "int32"))
                r = {"dtype": dtype, "vocab": V, "width": D, "table_bytes": V * D * jax.numpy.dtype(dtype).itemsize}
                try:
                    r.update(compiled_facts(step, args, V))
                except jax.errors.JaxRuntimeError as e:  # its temporaries would not fit in the device's memory
                    if not common.out_of_device_memory(e):
                        raise
                    out.append({**r, "relayouts": None, "temp_bytes": None})
                    print(f"scan {dtype:<8} V={V:>10,} D={D:<4} does not fit in device memory", flush=True)
                    continue
                out.append(r)
                print(f"scan {dtype:<8} V={V:>10,} D={D:<4} relayouts {r['relayouts']}  "
                      f"temp {r['temp_bytes'] / 2**20:,.0f} MiB", flush=True)
    return out


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    B, sizes = cfg["batch"], cfg["sizes"]
    rng = np.random.default_rng(0)
    n_ids = cfg["rounds"] + cfg["warmup"]
    dev = {V: [jax.numpy.asarray(common.zipf_ids(rng, V, B)) for _ in range(n_ids)] for V in sizes}
    data = {"config": {**cfg, "backend": jax.default_backend(), "device": jax.devices()[0].device_kind},
            "results": []}
    for D, S in cfg["widths"]:  # (row width, stored width)
        for name, largest in cfg["opts"].items():
            smallest = Table(name, sizes[0], D, B, "float32", dev[sizes[0]], S)
            for V in (v for v in sizes if v <= largest):
                t = smallest if V == sizes[0] else Table(name, V, D, B, "float32", dev[V], S)
                runs = {"fused": t} if t is smallest else {"fused": t, "smallest": smallest}
                times = common.interleaved(runs, cfg["rounds"], cfg["warmup"])
                res = {"vocab": V, "width": D, "stored_width": S, "optimizer": name, "step": common.stats(times["fused"]),
                       "x_smallest": (common.paired_ratio(times["fused"], times["smallest"])
                                      if "smallest" in times else None),
                       "bytes": common.tree_bytes((t.table, t.state)),
                       **compiled_facts(t.step, (t.table, t.state, dev[V][0]), V)}
                data["results"].append(res)
                x = res["x_smallest"]["median"] if res["x_smallest"] else 1.0
                print(f"D={D}/{S:<4} V={V:>10,} {name:<22} {common.spread(res['step'])} ms  x smallest V {x:.2f}  "
                      f"relayouts {res['relayouts']}  temp {res['temp_bytes'] / 2**20:,.0f} MiB", flush=True)
                if t is not smallest:
                    del t, runs
                    common.release(quick)
            del smallest
            common.release(quick)
    data["scan"] = scan(cfg)
    report(out, data, sizes)
    return data


def report(out: Path, data: dict, sizes) -> None:
    c = data["config"]
    head = ["D (stored)", "optimizer", "V", "step ms median (min-max)", f"x same at V={sizes[0]:,}",
            "whole-table copies in the step", "step temporaries MiB", "table+state MiB (as stored)"]
    rows = [[f"{r['width']} ({r.get('stored_width', r['width'])})", r["optimizer"], f"{r['vocab']:,}", common.spread(r["step"]),
             common.spread(r["x_smallest"], 1, "{:.2f}") if r["x_smallest"] else "1",
             r["relayouts"], f"{r['temp_bytes'] / 2**20:,.0f}", f"{r['bytes'] / 2**20:,.0f}"]
            for r in data["results"]]
    scan_rows = {}
    for r in data["scan"]:
        scan_rows.setdefault((r["dtype"], r["vocab"]), {})[r["width"]] = (
            "does not fit" if r["relayouts"] is None else f"{r['relayouts']} ({r['temp_bytes'] / r['table_bytes']:.1f})")
    widths = c["scan"]["widths"]
    scan_table = common.md_table(["table dtype", "V"] + [f"D={w}" for w in widths],
                                 [[k[0], f"{k[1]:,}"] + [v.get(w, "") for w in widths] for k, v in scan_rows.items()])
    body = (f"B = {c['batch']:,} Zipf(1.1) lookups per step, float32 tables; {c['rounds']} interleaved rounds after "
            f"{c['warmup']} warm-up steps; medians with (min-max). {common.machine_line()}.\n\n"
            + common.md_table(head, rows) + "\n\n## Whole-table copies by width (compiled, not run)\n\n"
            "The row-wise Adagrad step compiled for each width and table dtype, arrays laid out as the backend "
            "lays out a new one: how many whole-table copies it runs, and (in brackets) its temporaries as a "
            "multiple of the table's logical size. 0 (0.0) is a step whose cost follows the batch alone.\n\n"
            + scan_table + "\n")
    common.write_result(out, "accelerator", "Fused update on an accelerator: step time against V, by row width",
                        body, data)


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
