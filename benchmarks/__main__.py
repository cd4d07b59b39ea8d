"""Run the benchmark suite: ``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``.

Each benchmark runs in its own process (with glibc's transparent-huge-page tunable on), writes
``<name>.md`` / ``<name>.json`` / ``<name>.png`` under the output folder, and this entry point adds
``summary.md``: every target the issues set, measured against its threshold, and how long each part took.
The full suite runs one benchmark at a time and takes about 5-8 minutes on 2 CPU cores; ``--quick`` runs tiny
sizes, two benchmarks at a time (its timings mean nothing; it checks that everything runs), in about 30 s.
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


def start(name: str, quick: bool, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out)] + (["--quick"] if quick else [])
    # Quick runs overlap, so their output is collected and shown whole; full runs stream theirs.
    pipe = subprocess.PIPE if quick else None
    return subprocess.Popen(cmd, cwd=common.ROOT, env=common.child_env(), stdout=pipe, stderr=subprocess.STDOUT if quick else None,
                            text=True)


def run_all(names: list[str], quick: bool, out: Path, took: dict) -> None:
    """One at a time (full: clean timings), or two at a time (quick: a smoke run on 2 cores)."""
    longest_first = ("trainer", "checkpoint", "precision")  # quick: start the long ones first, finish sooner
    pending = sorted(names, key=lambda n: longest_first.index(n) if n in longest_first else 9) if quick else list(names)
    running = {}
    while pending or running:
        while pending and len(running) < (2 if quick else 1):
            name = pending.pop(0)
            print(f"== {name}", flush=True)
            running[name] = (start(name, quick, out), time.perf_counter())
        time.sleep(0.05)
        for name, (proc, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            if quick:
                print(proc.stdout.read(), end="", flush=True)
            took[name] = [time.perf_counter() - t0, proc.returncode]
            failed = "" if proc.returncode == 0 else f", FAILED ({proc.returncode})"
            print(f"== {name}: {took[name][0]:.0f} s{failed}", flush=True)


def summary(out: Path, took: dict[str, list], quick: bool, wall: float) -> str:
    """Every benchmark with results in ``out`` (run now or before: ``took`` holds [seconds, exit code])."""
    rows, parts = [], []
    for name in available():
        f = out / f"{name}.json"
        if name not in took or not f.exists():
            continue
        data = json.loads(f.read_text()) if took[name][1] == 0 else {}
        for t in data.get("targets", []):
            rows.append([*common.target_row(t), f"[{name}]({name}.md)"])
        secs, rc = took[name]
        parts.append([f"[{name}]({name}.md)", f"{secs:.0f}", "ok" if rc == 0 else f"failed (exit {rc})"])
    note = " Quick mode: tiny sizes, a smoke test; its ratios say nothing about the targets." if quick else ""
    return (f"`python -m benchmarks{' --quick' if quick else ''}`: {wall:.0f} s for this run, each benchmark in "
            f"its own process with {common.HUGE_PAGES_ENV}. {os.cpu_count()} CPU cores, load average "
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
    previous = a.out / "summary.json"  # --only: the other benchmarks' last results stay in the summary
    took = json.loads(previous.read_text()).get("seconds", {}) if a.only and previous.exists() else {}
    took = {k: v for k, v in took.items() if k in names}
    t0 = time.perf_counter()
    run_all(chosen, a.quick, a.out, took)
    text = summary(a.out, took, a.quick, time.perf_counter() - t0)
    common.write_result(a.out, "summary", "Benchmark summary", text, {"seconds": took})
    print(text)
    return max((took[n][1] for n in chosen), default=0)


if __name__ == "__main__":
    sys.exit(main())
