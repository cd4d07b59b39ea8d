"""What every benchmark shares: interleaved timing, statistics, Zipf ids, RSS, child processes, and writing
a markdown table + JSON (+ PNG chart) to the results folder.

Timing: each variant is warmed up (compiled) first, then the variants run in turn, one repetition each per
round, so a slow spell on a shared machine hits every variant alike. A ratio is taken pair by pair: the
median over rounds of (a's time / b's time) in the same round, with its min and max.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
# --quick's results when no --out is given: a smoke test's numbers never replace the committed full ones.
QUICK_RESULTS = ROOT / "outputs" / "benchmarks-quick"
OUT_HELP = "results folder (default benchmarks/results; with --quick, outputs/benchmarks-quick)"
# glibc's malloc then asks for transparent huge pages on its large (mmap'd) blocks, which is where XLA and
# numpy put tables: row gathers from a 2.5 GB table stop missing the TLB (about 2-3x faster at 10M rows).
HUGE_PAGES_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


# ----- timing ---------------------------------------------------------------------------------------
def release(quick: bool) -> None:
    """Free the tables a benchmark has finished with before it builds the next: a full collection, since a
    jitted step can hold its table in a reference cycle (full sizes: hundreds of MB to GB each). Quick mode's
    tables are a few KB, so it skips the collection, which costs about 0.6 s in a process with a large heap
    (a test process that has compiled many programs) and frees nothing worth having."""
    if not quick:
        gc.collect()


def interleaved(variants: Mapping[str, Callable[[int], Any]], rounds: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call of each variant, ``rounds`` samples each, the variants taking turns every round.

    A variant is ``fn(i) -> value`` and is timed until its value is ready (``block_until_ready``).
    """
    for fn in variants.values():
        for i in range(warmup):
            _block(fn(i))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, fn in variants.items():
            t = time.perf_counter()
            _block(fn(warmup + r))
            times[name].append(time.perf_counter() - t)
    return times


def _block(value: Any) -> None:
    import jax

    jax.block_until_ready(value)


def stats(samples: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """a / b, round by round (the samples must come from the same ``interleaved`` call)."""
    return stats([x / y for x, y in zip(a, b)])


# ----- workload ---------------------------------------------------------------------------------------
def zipf_ids(rng: np.random.Generator, vocab: int, n: int, a: float = 1.1) -> np.ndarray:
    """n ids in [1, vocab) drawn from Zipf(a), folded into range as the runner hashes raw ids."""
    z = rng.zipf(a, size=n).astype(np.int64)
    return ((z - 1) % (vocab - 1) + 1).astype(np.int32)


# ----- memory --------------------------------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def window_peak_rss_bytes() -> int:
    """The peak RSS since ``reset_peak_rss`` (``VmHWM``; since the start where it was never reset)."""
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) * 1024


def tree_bytes(tree: Any) -> int:
    import jax

    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree))


# ----- child processes ---------------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    """The environment every benchmark process runs in: huge pages on, this checkout importable."""
    return {**os.environ, **HUGE_PAGES_ENV, "PYTHONPATH": str(ROOT)}


def start_child(module: str, payload: Mapping[str, Any]) -> subprocess.Popen:
    """Start ``python -m benchmarks.<module> --child '<json>'`` in a fresh process (a clean peak RSS, its
    own JAX device count); ``child_answer`` waits for it."""
    proc = subprocess.Popen([sys.executable, "-m", f"benchmarks.{module}", "--child", json.dumps(payload)],
                            cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.payload = (module, payload)
    return proc


def child_answer(proc: subprocess.Popen, timeout: float = 600) -> dict[str, Any]:
    """The child's JSON answer (its last stdout line); raises with its stderr if it failed."""
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        module, payload = proc.payload
        raise RuntimeError(f"benchmarks.{module} child {payload} failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_child(module: str, payload: Mapping[str, Any], timeout: float = 600) -> dict[str, Any]:
    return child_answer(start_child(module, payload), timeout)


def answer(result: Mapping[str, Any]) -> None:
    """A child's last stdout line: its JSON result."""
    print(json.dumps(result), flush=True)


def set_cpu_devices(n: int) -> None:
    """Ask for ``n`` virtual CPU devices; only works before the JAX backend starts (so: in a child)."""
    import jax

    jax.config.update("jax_num_cpu_devices", int(n))
    jax.config.update("jax_platforms", "cpu")


def has_cpu_devices(n: int) -> bool:
    """Whether this process has ``n`` devices, asking for ``n`` virtual CPU devices first if JAX has not
    started here yet (once it has, its device count stays what it is)."""
    try:
        set_cpu_devices(n)
    except RuntimeError:  # the backend is already up with its own device count
        pass
    import jax

    return jax.device_count() == n


# ----- command line --------------------------------------------------------------------------------------
def command(run: Callable[..., Any]) -> str | None:
    """``python -m benchmarks.<name>``, the command of the module defining ``run`` (when it runs as ``__main__``,
    its module spec names it), for the parser's messages; None (argparse's default: the file's name) where
    neither says."""
    module = run.__module__
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None else None
    return f"python -m {module}" if module else None


def main(doc: str, run: Callable[..., Any], child: Callable[[dict], Any] | None = None,
         argv: Sequence[str] | None = None, flags: Mapping[str, tuple[str, str]] | None = None) -> None:
    """Every benchmark module's ``python -m benchmarks.<name> [--quick] [--out DIR]``; with ``child``, also
    the internal ``--child '<json>'`` that measures one configuration in a fresh process. ``flags``: a module's
    own on/off options (``{"--quality": ("with_quality", help)}``), shown by ``--help`` and handed to ``run``
    by keyword."""
    from runner.command_line import OneLineParser  # noqa: PLC0415

    p = OneLineParser(prog=command(run), description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, help=OUT_HELP)
    for flag, (dest, text) in (flags or {}).items():
        p.add_argument(flag, dest=dest, action="store_true", help=text)
    if child is not None:
        p.add_argument("--child", help="(internal) run the measurement given as JSON")
    a = p.parse_args(argv)
    if getattr(a, "child", None):
        answer(child(json.loads(a.child)))
    else:
        run(a.quick, results_dir(p, a.out, a.quick), **{dest: getattr(a, dest) for dest, _ in (flags or {}).values()})


def chosen(args: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Each of ``defaults``' options as given on the command line (``None``: not given), else its default; a value
    given as 0 stays 0, for the checks to refuse."""
    return {k: d if getattr(args, k) is None else getattr(args, k) for k, d in defaults.items()}


def check_sizes(parser: Any, quick: bool, given: Mapping[str, Any], devices: Sequence[int], batch: int,
                ranges: Mapping[str, tuple[float, float, float]]) -> None:
    """Refuse (``parser.error``) sizes a compiled plan cannot take: ``--quick`` beside sizes of one's own (it sets
    its own), a device count outside 1..4096, a batch that does not split over every device count, and each of
    ``ranges`` (name: value, low, high) outside its range."""
    mine = [k for k, v in given.items() if v is not None]
    if quick and mine:
        parser.error(f"{', '.join(mine)}: --quick sets its own sizes; give either --quick or the sizes")
    bad = [n for n in devices if not 1 <= n <= 4096]
    if bad:
        parser.error(f"--devices {bad[0]}: a device count must be in 1..4096")
    if not quick and (batch < 1 or any(batch % n for n in devices)):
        parser.error(f"--batch {batch}: must be a positive multiple of every device count ({', '.join(map(str, devices))})")
    for name, (value, low, high) in ranges.items():
        if not low <= value <= high:
            parser.error(f"{name} {value:g}: must be in {low:g}..{high:g}")


def results_dir(parser: Any, out: Path | None, quick: bool) -> Path:
    """The results folder for ``--out`` (None: not given), checked: ``benchmarks/results`` for a full run,
    ``outputs/benchmarks-quick`` for ``--quick``, whose tiny sizes are refused (``parser.error``) in
    ``benchmarks/results``, where they would replace the committed full results."""
    if out is None:
        out = QUICK_RESULTS if quick else RESULTS
    elif quick and out.resolve() == RESULTS.resolve():
        parser.error(f"--out {out}: --quick's tiny sizes would replace the full results kept there; give another "
                     f"folder, or leave --out out (--quick writes to {QUICK_RESULTS.relative_to(ROOT)})")
    check_out(parser, out)
    return out


def check_out(parser: Any, out: Path) -> None:
    """Refuse (``parser.error``: one line, exit 2) a results folder that cannot be made or written, before a
    benchmark runs for minutes and then cannot save what it measured."""
    from runner.outputs import unusable_dir  # noqa: PLC0415

    why = unusable_dir(out)
    if why:
        parser.error(f"--out {out}: cannot be made or written ({why}); give a folder this user can write")


# ----- output --------------------------------------------------------------------------------------------
def spread(st: Mapping[str, float], scale: float = 1e3, fmt: str = "{:.3g}") -> str:
    """'median (min-max)' of a stats dict, scaled (default: seconds -> ms)."""
    f = lambda v: fmt.format(v * scale)  # noqa: E731
    return f"{f(st['median'])} ({f(st['min'])}-{f(st['max'])})"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line() -> str:
    import jax

    load = os.getloadavg()[0]
    line = (f"{os.cpu_count()} CPU cores, load average {load:.1f} at the start, jax {jax.__version__}, "
            f"{'huge pages on' if 'hugetlb' in os.environ.get('GLIBC_TUNABLES', '') else 'huge pages off'}")
    if jax.default_backend() != "cpu":  # the steps ran on an accelerator; the numpy floor on the host's CPU
        line = f"{jax.devices()[0].device_kind} ({jax.default_backend()}, steps on it), host: {line}"
    return line


def out_of_device_memory(e: Exception) -> bool:
    """Whether a JAX runtime error is the device running out of memory (XLA's RESOURCE_EXHAUSTED): a size a
    benchmark records as not fitting, where any other error stops it."""
    return "RESOURCE_EXHAUSTED" in str(e)


def write_result(out: Path, name: str, title: str, body: str, data: Mapping[str, Any]) -> Path:
    """``<name>.md`` (title, body) and ``<name>.json`` (data) under ``out``; returns the markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{name}.md"
    md.write_text(f"# {title}\n\n{body.strip()}\n")
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=float))
    return md


def target(name: str, measured: float, threshold: float, better: str) -> dict[str, Any]:
    """One of the issue's targets: ``better`` is 'lower' or 'higher' than ``threshold``."""
    met = measured <= threshold if better == "lower" else measured >= threshold
    return {"target": name, "measured": measured, "threshold": threshold, "better": better, "met": bool(met)}


def target_row(t: Mapping[str, Any]) -> list[str]:
    """A target as table cells: name, measured, wanted, met or not."""
    wanted = f"{'<=' if t['better'] == 'lower' else '>='} {t['threshold']}"
    return [t["target"], f"{t['measured']:.2f}", wanted, "met" if t["met"] else "NOT met"]


def bar_chart(path: Path, title: str, groups: Sequence[str], series: Mapping[str, Sequence[float]],
              ylabel: str, log: bool = True) -> None:
    """Grouped bars: one group per x label, one bar per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(series)) / 3), 4))
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, values, width, label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
