"""Run the benchmark suite: ``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``.

Each benchmark runs in its own process (with glibc's transparent-huge-page tunable on), writes
``<name>.md`` / ``<name>.json`` / ``<name>.png`` under the output folder, and this entry point adds
``summary.md``: every target the issues set, measured against its threshold, and how long each part took.
The full suite takes about 6-9 minutes on 2 CPU cores; ``--quick`` runs tiny sizes in well under a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import common

BENCHMARKS = ("fused_update", "memory", "sharded", "trainer", "precision")
OPTIONAL = ("checkpoint",)  # run when its module exists (another part of the project provides it)


def available() -> list[str]:
    here = Path(__file__).resolve().parent
    return list(BENCHMARKS) + [n for n in OPTIONAL if (here / f"{n}.py").exists()]


def run_one(name: str, quick: bool, out: Path) -> tuple[float, int]:
    env = {**os.environ, **common.HUGE_PAGES_ENV, "PYTHONPATH": str(common.ROOT)}
    cmd = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out)] + (["--quick"] if quick else [])
    t = time.perf_counter()
    rc = subprocess.run(cmd, cwd=common.ROOT, env=env).returncode
    return time.perf_counter() - t, rc


def summary(out: Path, names: list[str], took: dict[str, tuple[float, int]], quick: bool) -> str:
    rows, parts = [], []
    for name in names:
        f = out / f"{name}.json"
        data = json.loads(f.read_text()) if f.exists() and took[name][1] == 0 else {}
        for t in data.get("targets", []):
            rows.append([t["target"], f"{t['measured']:.2f}", f"{'<=' if t['better'] == 'lower' else '>='} "
                         f"{t['threshold']}", "met" if t["met"] else "NOT met", f"[{name}]({name}.md)"])
        secs, rc = took[name]
        parts.append([f"[{name}]({name}.md)", f"{secs:.0f}", "ok" if rc == 0 else f"failed (exit {rc})"])
    total = sum(s for s, _ in took.values())
    note = " Quick mode: tiny sizes, a smoke test; its ratios say nothing about the targets." if quick else ""
    return (f"`python -m benchmarks{' --quick' if quick else ''}`: {total:.0f} s in all, each benchmark in its own "
            f"process with {common.HUGE_PAGES_ENV}. {os.cpu_count()} CPU cores, load average "
            f"{os.getloadavg()[0]:.1f} at the end.{note}\n\n## Targets\n\n"
            + common.md_table(["target", "measured", "wanted", "", "from"], rows)
            + "\n\n## Benchmarks\n\n" + common.md_table(["benchmark", "seconds", ""], parts) + "\n")


def main(argv=None) -> int:
    names = available()
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions (a smoke test)")
    p.add_argument("--only", action="append", choices=names, metavar="NAME",
                   help=f"run only this benchmark (repeatable): {', '.join(names)}")
    p.add_argument("--out", type=Path, default=common.RESULTS, help="results folder (default benchmarks/results)")
    a = p.parse_args(argv)
    chosen = a.only or names
    took = {}
    for name in chosen:
        print(f"== {name}", flush=True)
        took[name] = run_one(name, a.quick, a.out)
        print(f"== {name}: {took[name][0]:.0f} s" + ("" if took[name][1] == 0 else f", FAILED ({took[name][1]})"),
              flush=True)
    text = summary(a.out, chosen, took, a.quick)
    common.write_result(a.out, "summary", "Benchmark summary", text, {"seconds": took})
    print(text)
    return max((rc for _, rc in took.values()), default=0)


if __name__ == "__main__":
    sys.exit(main())
