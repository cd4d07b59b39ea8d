"""Criteo Terabyte's DLRM on paper: its 26 tables at their published sizes, compiled for 64 and 256 devices.

``python -m benchmarks.plan_criteo --devices 64 256`` builds the DLRM train step of ``experiment=criteo_terabyte``
(width 128, bottom MLP 512-256, top 1024-1024-512-256, fused row-wise Adagrad, async as configured) with the 26
tables ``cat_01`` ... ``cat_26`` at Criteo Terabyte's cardinalities (``CARDINALITIES``), every table sharded by
rows over every device (``mesh=table``: routed row layout, ids permuted as ``mesh.permute_ids=auto`` does), and
compiles it for abstract inputs as ``benchmarks/plan.py`` does (nothing is allocated): per device, table and
optimizer-state bytes, ``memory_analysis()`` (arguments, temporaries, peak), collective bytes of a usual step and
of the dearest (logged, every table rerouted) step, whether it fits an 80 GB device, compile seconds. What a run
compiles by default is the stacked program (``model.stack_tables=true``: one ~204M-row physical table);
``--unstacked`` adds the 26 tables apart. Each device count runs in its own process.

The cardinalities are MLPerf Training's DLRM v1 preprocessing of the Criteo 1TB Click Logs (day_0 ... day_23,
each feature's values capped at 40,000,000 rows: ``--max-ind-range=40000000``), as TorchRec's DLRM example
lists them (pytorch/torchrec ``examples/dlrm/README.MD``, the "MLPerf" row's ``--num_embeddings_per_feature``;
97.36 GiB of fp32 rows at width 128). Nothing here reads Criteo logs: the build needs a data source, so it
generates a few thousand Criteo-format lines (``data.lines``) under a temporary folder, hashed into the
published row counts (``data.ids=hash``, ``model.tables.cat_NN.vocab``). Those lines say nothing of the real
ids' spread over the row shards, so each physical table's route slots are ``plan.PLAN_CAPACITY`` x the even share
of a device's tokens (as ``plan.py`` sizes its resized table), not a sampled peak.
"""
from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import common
from .plan import DEVICE_GB, DEVICES_PER_HOST, PLAN_CAPACITY, compose, even_share_slots, measure

# Criteo Terabyte, MLPerf DLRM v1's 40M cap, C1 ... C26 = cat_01 ... cat_26 (TorchRec examples/dlrm/README.MD).
CARDINALITIES = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282, 10,
                 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36)
BATCH = 65_536  # global batch of TorchRec's MLPerf run (8,192 a GPU on 8); the experiment's 2,048 is 8 a device on 256
LINES = 3_000  # generated Criteo-format lines the build reads (a batch, the route sampling; no result depends on them)


def overrides(cardinalities, batch: int, stacked: bool, cache: str, lines: int = LINES) -> list[str]:
    """The runner overrides of the plan: ``experiment=criteo_terabyte``'s model on ``mesh=table``, each table at its
    cardinality, over ``lines`` generated lines cached in ``cache`` (``data.logs=any``: no real logs needed)."""
    tables = [f"model.tables.cat_{j:02d}.vocab={int(c)}" for j, c in enumerate(cardinalities, start=1)]
    return ["experiment=criteo_terabyte", "mesh=table", "data.logs=any", f"data.lines={lines}", f"data.cache={cache}",
            f"trainer.batch_size={batch}", "trainer.epochs=null", "trainer.steps=1000", "logger=none",
            f"model.stack_tables={'true' if stacked else 'false'}", *tables]


def criteo_plan(cardinalities=CARDINALITIES, batch: int = BATCH, stacked: bool = True, cache: str | None = None,
                lines: int = LINES) -> dict[str, Any]:
    """Compile the Criteo DLRM train step for ``cardinalities`` on every device of this process (already created)
    and return its per-device figures. No table, state or batch is allocated."""
    import numpy as np

    from runner.build import build

    with tempfile.TemporaryDirectory(prefix="plan_criteo-") as tmp:  # the generated lines, read until compiled
        program, task, mplan = build(compose(overrides(cardinalities, batch, stacked, cache or tmp, lines)))
        program = even_share_slots(program, list(program.tables))  # generated ids say nothing of the real spread
        figures, shapes = measure(program, task, batch)
    n = figures["devices"]
    tables = {name: {"rows": s.rows, "width": s.width, "members": list(program.stacking.stacks.get(name, (name,))),
                     "bytes": s.rows * s.width * np.dtype(s.dtype).itemsize,
                     "optimizer_state_bytes": common.tree_bytes(shapes.emb_states[name]),
                     "tokens_per_device": program.contexts[name].local_tokens,
                     "route_slots": program.contexts[name].route_slots}
              for name, s in program.tables.items()}
    table_bytes = sum(t["bytes"] for t in tables.values())
    state_bytes = sum(t["optimizer_state_bytes"] for t in tables.values())
    return {"cardinalities": [int(c) for c in cardinalities], "logical_rows": int(sum(cardinalities)),
            "stacked": stacked, "width": next(iter(tables.values()))["width"], "batch": batch,
            "table_shards": mplan.table_shards, "tables": tables, "physical_tables": len(tables),
            "table_bytes": table_bytes, "optimizer_state_bytes": state_bytes,
            "table_bytes_per_device": table_bytes / n, "optimizer_state_bytes_per_device": state_bytes / n,
            **figures}


def child(p: dict) -> dict:
    """One device count and layout, in this (fresh) process: ``p`` holds devices, batch, stacked, cache."""
    common.set_cpu_devices(p["devices"])
    return criteo_plan(tuple(p.get("cardinalities", CARDINALITIES)), p["batch"], p["stacked"], p.get("cache"))


def _mb(c: dict) -> str:
    kinds = ", ".join(f"{k} {v / 1e6:.3g} MB" for k, v in c.items() if v and k != "total")
    return f"{c['total'] / 1e6:.3g} MB ({kinds})" if c["total"] else "0"


def report(results: list[dict], out: Path, skipped: str = "") -> Path:
    """Write ``plan_criteo.md`` / ``.json`` under ``out``: one row per (layout, device count)."""
    head = ["tables", "devices (hosts of 8)", "route slots / device / shard", "table / Adagrad state per device",
            "per device: arguments / temp / peak", "collectives / device / usual step",
            "a logged step with every table rerouted", "fits 80 GB", "compile s"]
    rows = []
    for r in results:
        pd = r["per_device"]
        slots = sorted({t["route_slots"] for t in r["tables"].values()})
        rows.append([f"{r['physical_tables']} ({'stacked' if r['stacked'] else '26 apart'})",
                     f"{r['devices']} ({math.ceil(r['devices'] / DEVICES_PER_HOST)})",
                     f"{slots[0]:,}" if len(slots) == 1 else f"{slots[0]:,}-{slots[-1]:,}",
                     f"{r['table_bytes_per_device'] / 1e9:.2f} / {r['optimizer_state_bytes_per_device'] / 1e9:.3f} GB",
                     f"{pd['argument'] / 1e9:.2f} / {pd['temp'] / 1e9:.3f} / {pd['peak'] / 1e9:.2f} GB",
                     _mb(r["collective_bytes"]), _mb(r["dearest_step_bytes"]),
                     "yes" if r["fits_device"] else "no", f"{r['compile_s']:.1f}"])
    r0 = results[0]
    body = (f"The DLRM train step of `experiment=criteo_terabyte` (width {r0['width']}, fused row-wise Adagrad, async) "
            f"with Criteo Terabyte's 26 tables at MLPerf's 40M-capped cardinalities ({r0['logical_rows']:,} rows; "
            f"table {r0['table_bytes'] / 1e9:,.1f} GB + Adagrad state {r0['optimizer_state_bytes'] / 1e9:.2f} GB in "
            f"all), row-sharded over every device (`mesh=table`), global batch {r0['batch']:,}, compiled for abstract "
            f"inputs on virtual CPU devices. Route slots: {PLAN_CAPACITY:g} x the even share of a device's tokens "
            "(the generated lines the build reads cannot stand for the real ids). Memory from "
            "`compiled.memory_analysis()`, collectives from the compiled HLO (`benchmarks.hlo`), as in the 1B-row "
            f"plan. Peak = arguments + outputs - donated aliases + temporaries; fits: peak <= {DEVICE_GB} GB.\n\n"
            + common.md_table(head, rows) + "\n" + (f"\n{skipped}\n" if skipped else ""))
    return common.write_result(out, "plan_criteo", "Criteo Terabyte's 26 tables, checked by the compiler", body,
                               {"results": results, "skipped": skipped})


def run(quick: bool, out: Path, devices=(64, 256), batch: int = BATCH, unstacked: bool = False,
        timeout: float = 1800) -> list:
    """Compile each device count (stacked, then with ``unstacked`` the 26 tables apart) in its own process and
    write the report; ``quick``: 8 devices, tables of at most 10,000 rows, batch 256."""
    cards = tuple(min(c, 10_000) for c in CARDINALITIES) if quick else CARDINALITIES
    if quick:
        devices, batch = (8,), 256
    results, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="plan_criteo-") as cache:  # the generated lines, made once
        for stacked in (True, False) if unstacked else (True,):
            for n in devices:
                p = {"devices": n, "batch": batch, "stacked": stacked, "cache": cache, "cardinalities": cards}
                proc = common.start_child("plan_criteo", p)
                try:
                    r = common.child_answer(proc, timeout)
                except subprocess.TimeoutExpired:  # a compile past the timeout is reported, not fatal
                    proc.kill()
                    proc.communicate()
                    skipped.append(f"{n} devices, {'stacked' if stacked else '26 tables apart'}: not compiled "
                                   f"within {timeout:.0f} s")
                    print(skipped[-1], flush=True)
                    continue
                print(f"{n} devices, {r['physical_tables']} tables: peak {r['per_device']['peak'] / 1e9:.2f} "
                      f"GB/device, collectives {r['collective_bytes']['total'] / 1e6:.3g} MB/device/step, compiled in "
                      f"{r['compile_s']:.1f} s", flush=True)
                results.append(r)
    if results:
        report(results, out, "\n".join(skipped))
    return results


def main(argv=None) -> int:
    """``python -m benchmarks.plan_criteo [--devices N ...] [--batch B] [--unstacked] [--quick] [--out DIR]``."""
    import json
    import sys

    from runner.command_line import OneLineParser

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        common.answer(child(json.loads(argv[1])))
        return 0
    p = OneLineParser(prog="python -m benchmarks.plan_criteo", description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, nargs="+", help="virtual device counts to compile for (default 64 256)")
    p.add_argument("--batch", type=int, help=f"global batch (default {BATCH:,})")
    p.add_argument("--unstacked", action="store_true",
                   help="also compile the 26 tables apart (model.stack_tables=false)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one compile may take (default 1800)")
    p.add_argument("--quick", action="store_true", help="8 devices, tables of at most 10,000 rows, batch 256")
    p.add_argument("--out", type=Path, help=common.OUT_HELP)
    a = p.parse_args(argv)
    v = common.chosen(a, {"devices": [64, 256], "batch": BATCH})
    common.check_sizes(p, a.quick, {f"--{k}": getattr(a, k) for k in v}, v["devices"], v["batch"],
                       {"--timeout": (a.timeout, 1, 24 * 3600)})
    a.out = common.results_dir(p, a.out, a.quick)
    if not run(a.quick, a.out, tuple(v["devices"]), v["batch"], a.unstacked, a.timeout):
        print(f"error: nothing was compiled within --timeout {a.timeout:g} s, so no report was written; raise "
              f"--timeout", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
