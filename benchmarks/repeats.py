"""The targets of several runs of the same benchmarks side by side: ``python -m benchmarks.repeats DIR DIR DIR
[--out DIR]``.

Each DIR is the ``--out`` folder of one ``python -m benchmarks`` run (its ``<name>.json`` files). A target is
met here only if it was met in every run: the ratios on a shared 2-core machine move by tens of percent from
run to run, so one run's median can meet a threshold the next one misses. Writes ``repeats.md`` and
``repeats.json`` (every run's value per target) to ``--out`` (default ``benchmarks/results``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import common


def collect(dirs: list[Path]) -> list[dict]:
    """Per target (in the first run's order): its threshold, direction and every run's measured value and
    verdict. A target that some run lacks is listed with the runs that have it."""
    by_name: dict[str, dict] = {}
    for i, d in enumerate(dirs):
        for f in sorted(d.glob("*.json")):
            if f.stem in ("summary", "repeats"):
                continue
            for t in json.loads(f.read_text()).get("targets", []):
                row = by_name.setdefault(t["target"], {"target": t["target"], "benchmark": f.stem,
                                                       "threshold": t["threshold"], "better": t["better"],
                                                       "runs": {}})
                row["runs"][i] = {"measured": t["measured"], "met": t["met"]}
    for row in by_name.values():
        values = [r["measured"] for r in row["runs"].values()]
        row.update(min=min(values), max=max(values), met_in=sum(r["met"] for r in row["runs"].values()),
                   n=len(values), met_every_run=all(r["met"] for r in row["runs"].values()))
    return list(by_name.values())


def _num(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}"


def report(rows: list[dict], runs: int) -> str:
    head = ["target", *[f"run {i + 1}" for i in range(runs)], "min-max", "wanted", "met in"]
    table = []
    for r in rows:
        cells = [_num(r["runs"][i]["measured"]) if i in r["runs"] else "-" for i in range(runs)]
        wanted = f"{'<=' if r['better'] == 'lower' else '>='} {r['threshold']}"
        table.append([r["target"], *cells, f"{_num(r['min'])}-{_num(r['max'])}", wanted, f"{r['met_in']} of {r['n']}"])
    return (f"# Targets over {runs} runs\n\n`python -m benchmarks.repeats` over {runs} runs of the same benchmarks "
            "(each its own `python -m benchmarks` process, one after another on the same machine): each run's "
            "value, their range, and in how many runs the target was met. A target counts as met only if it "
            "was met in every run.\n\n" + common.md_table(head, table) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.repeats", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="the --out folders of the runs")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    a = p.parse_args(argv)
    missing = [str(d) for d in a.dirs if not any(d.glob("*.json"))]
    if missing:
        p.exit(2, f"python -m benchmarks.repeats: no benchmark results (<name>.json) in {', '.join(missing)}\n")
    rows = collect(a.dirs)
    a.out.mkdir(parents=True, exist_ok=True)
    text = report(rows, len(a.dirs))
    (a.out / "repeats.md").write_text(text)
    (a.out / "repeats.json").write_text(json.dumps({"runs": len(a.dirs), "targets": rows}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
