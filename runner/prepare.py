"""``python -m runner.prepare``: turn raw logs into what a run reads.

    python -m runner.prepare criteo train.txt --out data/criteo_kaggle            # Kaggle: seeded 90/5/5
    python -m runner.prepare criteo day_{0..23}.gz --out data/criteo_tb --min-count 3   # Terabyte: by day
    python -m runner.prepare criteo-synthetic --out data/criteo_gen --lines 200000       # generated logs

``criteo`` streams the files once (``runner.tasks.criteo.prepare``); ``criteo-synthetic`` writes
Criteo-format files with a planted click model (``runner.tasks.criteo.synthetic``). A bad value or a bad
input line stops it with one message naming it and the fix, exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from .tasks.criteo.prepare import PrepareError, convert
from .tasks.criteo.synthetic import CriteoSpec, write_logs
from .tasks.criteo.tsv import FormatError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runner.prepare", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("criteo", help="convert Criteo-format TSV files (or .gz) into shards")
    c.add_argument("inputs", nargs="+", help="train.txt, or day_0 ... day_23 (.gz too)")
    c.add_argument("--out", required=True, help="a new or empty folder for the shards")
    c.add_argument("--min-count", type=int, default=1, help="the saved vocabulary's threshold (>= 1)")
    c.add_argument("--max-bad-lines", type=int, default=0, help="bad lines to skip and count per file (0: refuse)")
    c.add_argument("--seed", type=int, default=0, help="the seeded 90/5/5 split's seed (single-file logs)")
    c.add_argument("--shard-lines", type=int, default=1 << 20, help="examples per shard file")
    g = sub.add_parser("criteo-synthetic", help="write Criteo-format files with a planted click model")
    g.add_argument("--out", required=True)
    g.add_argument("--lines", type=int, default=CriteoSpec.lines)
    g.add_argument("--days", type=int, default=1, help="1: train.txt; more: day_0 ... day_<days-1>")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--gzip", action="store_true")
    a = p.parse_args(argv)
    try:
        if a.what == "criteo":
            m = convert(a.inputs, a.out, seed=a.seed, min_count=a.min_count, max_bad_lines=a.max_bad_lines,
                        shard_lines=a.shard_lines)
            print(json.dumps({"splits": {s: v["examples"] for s, v in m["splits"].items()},
                              "split": m["split"], "bad_lines": m["bad_lines"]}))
        else:
            for path in write_logs(CriteoSpec(lines=a.lines, days=a.days, seed=a.seed, gzip=a.gzip), a.out):
                print(path)
    except (FormatError, PrepareError, ValueError, OSError) as e:
        print(f"runner.prepare: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
