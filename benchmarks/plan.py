"""A plan for tables this machine cannot hold, checked by the compiler (issue #16).

``python -m benchmarks.plan --rows 1000000000 --width 128 --devices 64 256`` builds the real ranking train step
(``TrainProgram.train_step``: routed lookups, forward/backward, fused update; fused Adam by default, async) with
its ``items`` table resized to ``--rows`` x ``--width`` and sharded by rows over every device (``mesh=table``),
then lowers and compiles it for abstract inputs (``jax.ShapeDtypeStruct`` with shardings: nothing is
allocated) and reads the compiled program's per-device memory (``memory_analysis()``) and the bytes its
collectives move per step (``benchmarks/hlo.py``). Each device count runs in its own process (the number of
virtual CPU devices is fixed when JAX starts). Results go to ``results/plan.md`` / ``plan.json``.
``benchmarks/plan_criteo.py`` compiles Criteo Terabyte's 26 tables at their published sizes with the same
helpers (``compose``, ``even_share_slots``, ``measure``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from . import common

DEVICE_GB = 80  # memory of one accelerator the plan is sized for
DEVICES_PER_HOST = 8


PLAN_CAPACITY = 2.0  # the resized table's slots, as a multiple of the even share (no batches of it to sample)


def compose(overrides: list[str] | tuple[str, ...]) -> Any:
    """The runner's config composed with ``overrides`` (as ``python -m runner <overrides>`` would)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from runner.config import register

    register()
    with initialize_config_dir(config_dir=str(common.ROOT / "conf"), version_base="1.3", job_name="plan"):
        return hydra_compose("config", overrides=list(overrides))


def even_share_slots(program: Any, names, capacity: float = PLAN_CAPACITY) -> Any:
    """``program`` with the route slots of tables ``names`` sized as ``capacity`` x the even share of a device's
    tokens (the sampled peak of a resized table, or of generated data, says nothing of the planned tables)."""
    ctxs = {n: dataclasses.replace(program.contexts[n], route_peak=None, route_capacity=capacity) for n in names}
    return dataclasses.replace(program, contexts={**program.contexts, **ctxs})


def measure(program: Any, task: Any, batch: int) -> tuple[dict[str, Any], Any]:
    """Compile ``program``'s train step for an abstract state and batch (shapes with shardings: nothing is
    allocated) and return its per-device figures (memory, collective bytes of a usual and of the dearest step,
    compile seconds) and the state's shapes."""
    import jax
    import numpy as np

    from runner.core import mesh as mesh_lib

    from .hlo import collectives_by_op, step_collective_bytes

    t0 = time.perf_counter()
    shapes = program.state_shapes(0)
    state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                         program.state_shardings(shapes))
    host = task.batch(0, batch)
    example = {k: jax.ShapeDtypeStruct(np.shape(host[k]), np.asarray(host[k]).dtype,
                                       sharding=mesh_lib.batch_sharding(program.mesh, host[k]))
               for k in program.model_keys}
    step, _, _ = program.compile(state, example)
    compiled = step.lower(state, example).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    args, out, alias, temp = (int(getattr(mem, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp"))
    peak = args + out - alias + temp
    hlo = compiled.as_text()  # printed once, read by the three counts below
    n = jax.device_count()
    return {
        "devices": n, "per_device": {"argument": args, "output": out, "alias": alias, "temp": temp, "peak": peak},
        "collective_bytes": step_collective_bytes(hlo), "compile_s": seconds,
        "dearest_step_bytes": step_collective_bytes(hlo, "dearest"),
        "collectives_by_op": collectives_by_op(hlo),
        "fits_device": peak <= DEVICE_GB * 1e9,
        "min_devices_at_80gb": math.ceil(peak * n / (DEVICE_GB * 1e9)),
    }, shapes


def plan(rows: int, width: int, batch: int, optimizer: str = "async_adam", async_emb: bool = True,
         table: str = "items", overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Compile the train step for a ``rows`` x ``width`` table ``table`` on every device of this process
    (already created) and return its per-device figures. No table, state or batch is allocated."""
    import jax

    from runner.build import build

    cfg = compose(["mesh=table", f"optimizer={optimizer}", f"async_emb={'on' if async_emb else 'off'}",
                   f"trainer.batch_size={batch}", f"model.emb_width={width}", "logger=none", *overrides])
    program, task, mplan = build(cfg)
    shards = mplan.table_shards
    padded = -(-rows // shards) * shards
    # The table's size is past what a config may ask for (model.tables.<t>.vocab <= 1e8): resize it here.
    spec = dataclasses.replace(program.tables[table], vocab=rows, rows=padded)
    ctx = dataclasses.replace(program.contexts[table], stored_rows=padded)
    program = dataclasses.replace(program, tables={**program.tables, table: spec},
                                  contexts={**program.contexts, table: ctx})
    # Its slots: 2x the even share of a device's tokens (its sampled peak was of the table before resizing).
    program = even_share_slots(program, [table])
    ctx = program.contexts[table]
    figures, shapes = measure(program, task, batch)
    state_leaves = jax.tree.leaves(shapes.emb_states[table])
    return {
        "rows": rows, "width": width, "table_shards": shards, "batch": batch, "optimizer": optimizer,
        "async_emb": async_emb, "tokens_per_device": ctx.local_tokens, "route_slots": ctx.route_slots,
        "table_bytes": padded * width * 4,
        "optimizer_state_bytes": sum(math.prod(x.shape) * x.dtype.itemsize for x in state_leaves), **figures,
    }


def child(p: dict) -> dict:
    """One device count's plan, in this (fresh) process: ``p`` holds devices, rows, width, batch."""
    common.set_cpu_devices(p["devices"])
    return plan(p["rows"], p["width"], p["batch"], p.get("optimizer", "async_adam"), p.get("async_emb", True))


def report(results: list[dict], out: Path) -> Path:
    """Write ``plan.md`` / ``plan.json`` under ``out``: one row per device count."""
    head = ["rows x width", "devices (hosts of 8)", "batch (tokens/device)", "table + Adam state",
            "per device: arguments / temp / peak", "collectives / device / usual step",
            "a logged step with every table rerouted",
            "fits 80 GB", "compile s"]
    rows = []
    for r in results:
        pd, cb = r["per_device"], r["collective_bytes"]
        kinds = ", ".join(f"{k} {v / 1e6:.3g} MB" for k, v in cb.items() if v and k != "total")
        rows.append([f"{r['rows']:.3g} x {r['width']}", f"{r['devices']} ({math.ceil(r['devices'] / DEVICES_PER_HOST)})",
                     f"{r['batch']:,} ({r['tokens_per_device']:,} items tokens)",
                     f"{(r['table_bytes'] + r['optimizer_state_bytes']) / 1e9:,.0f} GB",
                     f"{pd['argument'] / 1e9:.2f} / {pd['temp'] / 1e9:.3f} / {pd['peak'] / 1e9:.2f} GB",
                     f"{cb['total'] / 1e6:.3g} MB ({kinds})", _dearest(r),
                     "yes" if r["fits_device"] else "no",
                     f"{r['compile_s']:.1f}"])
    body = ("The real ranking train step (fused Adam, async, routed row layout, `mesh=table`) compiled for abstract "
            "inputs on virtual CPU devices; memory from `compiled.memory_analysis()`, collective bytes from the "
            "compiled HLO (`benchmarks.hlo.step_collective_bytes`): a usual step takes the cheaper branch of each "
            "conditional and runs no rerouting round past the first (no logged-step diagnostics, no overflow); the "
            "next column takes the dearer branch (the diagnostics' dedupe of the whole batch for `emb/unique_rows` "
            "and `emb/stale_rows`) and one more routing round for every table. Peak = arguments + outputs - donated "
            "aliases + temporaries.\n\n"
            + common.md_table(head, rows) + "\n")
    return common.write_result(out, "plan", "A 1B-row plan, checked by the compiler", body, {"results": results})


def _dearest(r: dict) -> str:
    c = r.get("dearest_step_bytes") or {"total": 0}
    kinds = ", ".join(f"{k} {v / 1e6:.3g} MB" for k, v in c.items() if v and k != "total")
    return f"{c['total'] / 1e6:.3g} MB ({kinds})" if c["total"] else "0"


def run(quick: bool, out: Path, devices=(64, 256), rows: int = 10**9, width: int = 128, batch: int = 65_536) -> list:
    """Compile each device count in its own process and write the report; ``quick``: 8 devices, 10^6 x 16."""
    if quick:
        devices, rows, width, batch = (8,), 10**6, 16, 256
    results = []
    for n in devices:
        r = common.run_child("plan", {"devices": n, "rows": rows, "width": width, "batch": batch}, timeout=1800)
        print(f"{n} devices: peak {r['per_device']['peak'] / 1e9:.2f} GB/device, collectives "
              f"{r['collective_bytes']['total'] / 1e6:.3g} MB/device/step, compiled in {r['compile_s']:.1f} s", flush=True)
        results.append(r)
    report(results, out)
    return results


def main(argv=None) -> None:
    """``python -m benchmarks.plan [--rows R] [--width W] [--batch B] [--devices N ...] [--quick] [--out DIR]``."""
    import json
    import sys

    from runner.command_line import OneLineParser

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        common.answer(child(json.loads(argv[1])))
        return
    p = OneLineParser(prog="python -m benchmarks.plan", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=float, help="table rows (default 1e9)")
    p.add_argument("--width", type=int, help="table width (default 128)")
    p.add_argument("--batch", type=int, help="global batch (default 65,536)")
    p.add_argument("--devices", type=int, nargs="+", help="virtual device counts to compile for (default 64 256)")
    p.add_argument("--quick", action="store_true", help="8 devices, 10^6 x 16, batch 256 (a smoke test)")
    p.add_argument("--out", type=Path, help=common.OUT_HELP)
    a = p.parse_args(argv)
    v = common.chosen(a, {"rows": 1e9, "width": 128, "batch": 65_536, "devices": [64, 256]})
    common.check_sizes(p, a.quick, {f"--{k}": getattr(a, k) for k in v}, v["devices"], v["batch"],
                       {"--rows": (v["rows"], 1, 10**12), "--width": (v["width"], 1, 65536)})
    run(a.quick, common.results_dir(p, a.out, a.quick), tuple(v["devices"]), int(v["rows"]), v["width"], v["batch"])


if __name__ == "__main__":
    main()
