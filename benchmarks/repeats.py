"""The targets of several runs of the same benchmarks side by side: ``python -m benchmarks.repeats DIR DIR DIR
[--out DIR]``.

Each DIR is the ``--out`` folder of one ``python -m benchmarks`` run (its ``<name>.json`` files). A target is
met here only if it was met in every run: the ratios on a shared 2-core machine move by tens of percent from
run to run, so one run's median can meet a threshold the next one misses. Writes ``repeats.md`` and
``repeats.json`` (every run's value per target) to ``--out`` (default ``benchmarks/results``).

``--update``: the DIRs hold runs of some benchmarks only (``python -m benchmarks --only NAME``); their rows
replace those benchmarks' rows of the ``repeats.json`` already in ``--out``, and every other row is kept.
"""
from __future__ import annotations

import json
from pathlib import Path

from runner.command_line import OneLineParser

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


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old``'s rows with those of the benchmarks ``new`` covers replaced by ``new``'s (at the first replaced
    row's place, in ``new``'s order); a benchmark only ``new`` has goes at the end."""
    rerun = {r["benchmark"] for r in new}
    out: list[dict] = []
    for r in old:
        if r["benchmark"] not in rerun:
            out.append(r)
        elif not any(x["benchmark"] == r["benchmark"] for x in out):
            out.extend(x for x in new if x["benchmark"] == r["benchmark"])
    return out + [x for x in new if x["benchmark"] not in {r["benchmark"] for r in old}]


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
    p = OneLineParser(prog="python -m benchmarks.repeats", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="the --out folders of the runs")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    p.add_argument("--update", action="store_true",
                   help="replace only the rerun benchmarks' rows of the repeats.json in --out, keep the others")
    a = p.parse_args(argv)
    missing = [str(d) for d in a.dirs if not any(d.glob("*.json"))]
    if missing:
        p.exit(2, f"python -m benchmarks.repeats: no benchmark results (<name>.json) in {', '.join(missing)}\n")
    rows, runs = collect(a.dirs), len(a.dirs)
    if a.update:
        previous = a.out / "repeats.json"
        if not previous.exists():
            p.exit(2, f"python -m benchmarks.repeats: --update needs an earlier {previous}; run without it first\n")
        old = json.loads(previous.read_text())
        for r in old["targets"]:  # JSON keeps the run numbers as strings
            r["runs"] = {int(k): v for k, v in r["runs"].items()}
        rows, runs = merge(old["targets"], rows), max(runs, old["runs"])
    a.out.mkdir(parents=True, exist_ok=True)
    text = report(rows, runs)
    (a.out / "repeats.md").write_text(text)
    (a.out / "repeats.json").write_text(json.dumps({"runs": runs, "targets": rows}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
