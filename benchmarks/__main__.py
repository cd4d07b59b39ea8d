"""Run the benchmark suite: ``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``.

Each benchmark runs in its own process (with glibc's transparent-huge-page tunable on), writes
``<name>.md`` / ``<name>.json`` / ``<name>.png`` under the output folder, and this entry point adds
``summary.md``: every target the issues set, measured against its threshold, and how long each part took.
The full suite runs one benchmark at a time and takes about 9 minutes on 2 CPU cores; ``--quick`` runs tiny
sizes (its timings mean nothing; it checks that everything runs), every benchmark in turn in one process with
8 virtual CPU devices (JAX, the runner and matplotlib are imported and started once, not once a benchmark),
in about 30 s, into ``outputs/benchmarks-quick`` unless ``--out`` names another folder (never ``benchmarks/results``,
whose full results its numbers would replace).

Not in the suite: ``python -m benchmarks.accelerator``, the fused update's cost against the vocabulary by
row width, and ``python -m benchmarks.padding``, the runner's step with 64-wide tables padded or not, both meant
for a machine with an accelerator (their TPU runs are kept in ``results/tpu_v5e/``); ``python -m
benchmarks.hash_runner``, the runner's whole step with hash tables against modulo tables (about 3 minutes).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from runner.command_line import OneLineParser

from . import common

BENCHMARKS = ("fused_update", "memory", "sharded", "phases", "trainer", "precision", "async_cost", "bags",
              "hash_tables", "convert")
OPTIONAL = ("checkpoint",)  # run when its module exists (another part of the project provides it)


def available() -> list[str]:
    here = Path(__file__).resolve().parent
    return list(BENCHMARKS) + [n for n in OPTIONAL if (here / f"{n}.py").exists()]


def start(name: str, out: Path) -> subprocess.Popen:
    """A full run of one benchmark in its own process, its output streamed."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out)]
    return subprocess.Popen(cmd, cwd=common.ROOT, env=common.child_env(), text=True)


TOOK = "== took "  # the in-process runner's line for one finished benchmark: TOOK + [name, seconds, exit code]


def run_here(names: list[str], quick: bool, out: Path) -> int:
    """Run the benchmarks one after another in this process (``--quick``'s one process), on 8 virtual CPU
    devices (sharded and trainer need 8; the others run on the first). A benchmark that raises is reported
    failed (exit code 1) and the next one runs."""
    common.set_cpu_devices(8)
    worst = 0
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            importlib.import_module(f"benchmarks.{name}").main((["--quick"] if quick else []) + ["--out", str(out)])
            rc = 0
        except Exception:
            traceback.print_exc()
            rc = 1
        sys.stderr.flush()
        print(TOOK + json.dumps([name, time.perf_counter() - t0, rc]), flush=True)
        worst = max(worst, rc)
    return worst


def finished(took: dict, name: str, secs: float, rc: int, why: str = "") -> None:
    """Record a benchmark's seconds and exit code in ``took`` and say how it went."""
    took[name] = [secs, rc]
    failed = "" if rc == 0 else f", FAILED ({rc}{why})"
    print(f"== {name}: {secs:.0f} s{failed}", flush=True)


def run_quick(names: list[str], out: Path, took: dict) -> None:
    """Quick: every benchmark in one child process (``run_here``), its output shown as it comes."""
    only = [a for name in names for a in ("--only", name)]
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--in-process", "--out", str(out), *only]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=common.ROOT, env=common.child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    done = set()
    for line in proc.stdout:
        if not line.startswith(TOOK):
            print(line, end="", flush=True)
            continue
        name, secs, rc = json.loads(line[len(TOOK):])
        finished(took, name, secs, rc)
        done.add(name)
    proc.wait()
    for name in names:
        if name not in done:  # the process ended before this one finished
            finished(took, name, time.perf_counter() - t0, proc.returncode or 1, ", the process ended")


def run_all(names: list[str], quick: bool, out: Path, took: dict) -> None:
    """One at a time, each in its own process (full: clean timings), or all in one process (quick)."""
    if quick:
        run_quick(names, out, took)
        return
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        rc = start(name, out).wait()
        finished(took, name, time.perf_counter() - t0, rc)


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
    how = "every benchmark in one process (8 virtual CPU devices)" if quick else "each benchmark in its own process"
    return (f"`python -m benchmarks{' --quick' if quick else ''}`: {wall:.0f} s for this run, {how} "
            f"with {common.HUGE_PAGES_ENV}. {os.cpu_count()} CPU cores, load average "
            f"{os.getloadavg()[0]:.1f} at the end.{note}\n\n## Targets\n\n"
            + common.md_table(["target", "measured", "wanted", "", "from"], rows)
            + "\n\n## Benchmarks\n\n" + common.md_table(["benchmark", "seconds", ""], parts) + "\n")


def main(argv=None) -> int:
    names = available()
    p = OneLineParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions (a smoke test)")
    p.add_argument("--only", action="append", choices=names, metavar="NAME",
                   help=f"run only this benchmark (repeatable): {', '.join(names)}")
    p.add_argument("--out", type=Path, help=common.OUT_HELP)
    p.add_argument("--compare", metavar="REF", help="time this tree's fused update against commit REF, alternately "
                                                    "(prints the ratios; --quick and --rounds apply)")
    p.add_argument("--rounds", type=int, help="--compare: alternating rounds (default 4)")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # (internal) --quick's one process
    a = p.parse_args(argv)
    if a.rounds is not None and a.compare is None:
        p.error(f"--rounds {a.rounds}: it counts --compare's rounds; give --compare REF with it, or leave it out")
    if a.compare is not None:
        if not a.compare.strip():
            p.error(f"--compare {a.compare!r}: give a commit to time this tree against, e.g. --compare main")
        ignored = [f for f, v in (("--only", a.only), ("--out", a.out)) if v is not None]
        if ignored:
            p.error(f"{', '.join(ignored)}: --compare times the fused update only and prints its ratios (it writes no "
                    f"results); leave {'it' if len(ignored) == 1 else 'them'} out, or run the suite without --compare")
        from .compare import compare  # noqa: PLC0415

        compare(a.compare, 4 if a.rounds is None else a.rounds, a.quick)
        return 0
    a.out = common.results_dir(p, a.out, a.quick)
    chosen = list(dict.fromkeys(a.only)) if a.only else names  # a name given twice runs once
    if a.in_process:
        return run_here(chosen, a.quick, a.out)
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
