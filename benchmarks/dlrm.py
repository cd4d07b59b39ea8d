"""DLRM training throughput: the fused embedding update against the dense optax baseline, on Kaggle's table sizes.

``python -m runner data=criteo model=dlrm`` on generated Criteo-format logs, with the 26 tables sized as the
Criteo Kaggle dataset's features (the cardinalities TorchRec's DLRM example gives for Kaggle, 33.8M rows in
all) divided by ``SCALE`` so that they fit 2 cores' memory (3.4M rows, D = 16: 217 MB a copy), hashed ids
(``data.ids=hash``). Three runs, one after the other:

- **fused**: the runner's default for DLRM, ``async_rowwise_adagrad`` (async mode), the 26 tables stacked into
  one (``model.stack_tables=true``, the default for DLRM);
- **fused, tables apart**: the same with ``model.stack_tables=false``: 26 tables, each its own dedupe, update
  and compiled kernels;
- **dense**: ``optimizer=adagrad async_emb=off``, optax's Adagrad over every row of every table each step.

Throughput is the runner's own ``perf/examples_per_s`` over logging windows of ``LOG`` steps, the first
window (compilation and warm-up) left out: median (min-max) of the rest, and the ratio of the medians.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import common

# TorchRec's examples/dlrm README, Criteo Kaggle: num_embeddings_per_feature
KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10,
          5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
SCALE = 10
LOG = 30
FULL = dict(steps=180, lines=200_000, batch=1024)
QUICK = dict(steps=2 * LOG, lines=20_000, batch=256)
VARIANTS = {"fused (async_rowwise_adagrad)": [], "fused, tables apart (model.stack_tables=false)": ["model.stack_tables=false"],
            "dense (optax adagrad)": ["optimizer=adagrad", "async_emb=off"]}


def tables() -> list[str]:
    """Each table's rows: the Kaggle cardinality over SCALE, plus the padding and missing-value rows."""
    return [f"model.tables.cat_{j + 1:02d}.vocab={max(3, c // SCALE + 2)}" for j, c in enumerate(KAGGLE)]


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    res = {}
    with tempfile.TemporaryDirectory() as d:
        base = ["data=criteo", "model=dlrm", "logger=none", f"data.lines={cfg['lines']}", "data.ids=hash",
                *tables(), f"trainer.steps={cfg['steps']}", f"trainer.log_interval={LOG}",
                f"trainer.batch_size={cfg['batch']}", f"trainer.eval_interval={10 * cfg['steps']}",
                "data.eval_examples=2048", "checkpoint.interval=0", f"data.cache={d}/data"]
        for i, (name, over) in enumerate(VARIANTS.items()):
            run_dir = Path(d) / f"run{i}"
            proc = subprocess.run([sys.executable, "-m", "runner", *base, *over, f"hydra.run.dir={run_dir}"],
                                  cwd=common.ROOT, env=common.child_env(), capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: the run failed:\n{proc.stderr[-3000:]}")
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            rates = [r["perf/examples_per_s"] for r in rows if "perf/examples_per_s" in r][1:]
            took = [r["perf/step_time_ms"] * LOG / 1e3 for r in rows if "perf/step_time_ms" in r][:1]  # compiling too
            res[name] = {"examples_per_s": {"median": float(np.median(rates)), "min": min(rates), "max": max(rates),
                                            "n": len(rates)}, "first_window_s": took[0] if took else None}
            print(f"{name:32s} {res[name]['examples_per_s']['median']:10,.0f} examples/s", flush=True)
    fused, apart, dense = (res[n]["examples_per_s"]["median"] for n in VARIANTS)
    rows_total = sum(max(3, c // SCALE + 2) for c in KAGGLE)
    data = {"config": {**cfg, "scale": SCALE, "rows": rows_total, "width": 16, "log_interval": LOG},
            "results": res, "fused_over_dense": fused / dense, "stacked_over_apart": fused / apart}
    body = (f"DLRM (the runner's defaults: width 16, bottom [64], top [128, 64]) on generated Criteo-format logs, "
            f"26 hashed tables of Kaggle's cardinalities / {SCALE} ({rows_total:,} rows), batches of "
            f"{cfg['batch']:,}, {cfg['steps']} steps; windows of {LOG} steps after the first. "
            f"{common.machine_line()}.\n\n"
            + common.md_table(["embedding optimizer", "examples/s, median (min-max)"],
                              [[n, f"{r['examples_per_s']['median']:,.0f} ({r['examples_per_s']['min']:,.0f}-"
                                   f"{r['examples_per_s']['max']:,.0f})"] for n, r in res.items()])
            + f"\n\nThe fused update trains {data['fused_over_dense']:.1f}x as many examples a second as the dense "
              f"baseline; stacking the 26 tables into one trains {data['stacked_over_apart']:.2f}x as many as keeping "
              "them apart.")
    common.write_result(out, "dlrm", "DLRM throughput: fused against dense embedding updates", body, data)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, None, argv)


if __name__ == "__main__":
    main()
