"""``python -m runner.prepare``: turn raw logs into what a run reads.

    python -m runner.prepare criteo train.txt --out data/criteo_kaggle            # Kaggle: seeded 90/5/5
    python -m runner.prepare criteo day_{0..23}.gz --out data/criteo_tb --min-count 3   # Terabyte: by day
    python -m runner.prepare criteo-synthetic --out data/criteo_gen --lines 200000       # generated logs
    python -m runner.prepare criteo-synthetic --out data/mh --bag-sizes 3,2,1,... (26)  # multi-hot logs

``criteo`` streams the files once (``runner.tasks.criteo.prepare``); ``criteo-synthetic`` writes
Criteo-format files with a planted click model (``runner.tasks.criteo.synthetic``). A bad value or a bad
input line stops it with one message naming it and the fix, exit code 2; so does a file that cannot be read or
written (a full disk, a folder this user may not write: the message names the file, what was being done and the
fix), and the output folder is left as it was found.
"""
from __future__ import annotations

import argparse
import json
import sys

from .command_line import OneLineParser
from .errors import Terminated, sigterm_unwinds, stopped
from .tasks.criteo.disk import fix, reason
from .tasks.criteo.prepare import PrepareError, convert
from .tasks.criteo.synthetic import CriteoSpec, NoRoom, write_logs
from .tasks.criteo.tsv import NUM_CAT, ONE_HOT, FormatError, check_bags


INT32_MAX = 2**31 - 1


def bag_sizes(text: str) -> tuple[int, ...]:
    """``--bag-sizes``: 26 comma-separated sizes, or one size for every feature."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: integers joined by commas (26 of them, or one for all)") from None
    sizes = sizes * NUM_CAT if len(sizes) == 1 else sizes
    try:
        return check_bags(sizes)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m runner.prepare", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("criteo", help="convert Criteo-format TSV files (or .gz) into shards")
    c.add_argument("inputs", nargs="+", help="train.txt, or day_0 ... day_23 (.gz too)")
    c.add_argument("--out", required=True, help="a new or empty folder for the shards")
    c.add_argument("--min-count", type=int, default=1, help="the saved vocabulary's threshold (>= 1)")
    c.add_argument("--max-bad-lines", type=int, default=0, help="bad lines to skip and count per file (0: refuse)")
    c.add_argument("--seed", type=int, default=0, help="the seeded 90/5/5 split's seed (single-file logs)")
    c.add_argument("--shard-lines", type=int, default=1 << 20, help="examples per shard file")
    bags = dict(type=bag_sizes, default=None, help="multi-hot: the most values (comma-separated in a field) each of "
                "the 26 categorical features holds, 26 sizes joined by commas or one for all (default: 1 each)")
    c.add_argument("--bag-sizes", **bags)
    g = sub.add_parser("criteo-synthetic", help="write Criteo-format files with a planted click model")
    g.add_argument("--out", required=True)
    g.add_argument("--lines", type=int, default=CriteoSpec.lines)
    g.add_argument("--days", type=int, default=1, help="1: train.txt; more: day_0 ... day_<days-1>")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--gzip", action="store_true")
    g.add_argument("--bag-sizes", **bags)
    a = p.parse_args(argv)
    limits = {"--min-count": ("min_count", 1), "--max-bad-lines": ("max_bad_lines", 0), "--shard-lines": ("shard_lines", 1),
              "--lines": ("lines", 1), "--days": ("days", 1)}
    for flag, (name, low) in limits.items():  # the ranges a run takes (data.min_count, data.max_bad_lines, ...)
        value = getattr(a, name, None)
        if value is not None and not low <= value <= INT32_MAX:
            p.error(f"{flag} {value}: must be an integer in {low}..{INT32_MAX:,}")
    if not a.out.strip():  # Path("") is the current folder: it would be written into when empty
        p.error(f"--out {a.out!r}: an empty name; give a new or empty output folder")
    with sigterm_unwinds():  # stopped like Ctrl-C: the output folder as it was found
        try:
            if a.what == "criteo":
                m = convert(a.inputs, a.out, seed=a.seed, min_count=a.min_count, max_bad_lines=a.max_bad_lines,
                            shard_lines=a.shard_lines, bags=a.bag_sizes, refuse_small=True)
                print(json.dumps({"splits": {s: v["examples"] for s, v in m["splits"].items()},
                                  "split": m["split"], "bad_lines": m["bad_lines"]}))
            else:
                spec = CriteoSpec(lines=a.lines, days=a.days, seed=a.seed, gzip=a.gzip, bags=a.bag_sizes or ONE_HOT)
                try:
                    for path in write_logs(spec, a.out):
                        print(path)
                except NoRoom as e:
                    raise ValueError(f"--lines {a.lines}: {e}; give fewer --lines, "
                                     + ("" if a.gzip else "add --gzip (about a third of the size), ")
                                     + "or an --out on a file system with room. Nothing was written") from None
        except (FormatError, PrepareError, ValueError) as e:
            print(f"runner.prepare: {e}", file=sys.stderr)
            return 2
        except OSError as e:  # one no check above words (those name the file, what was done and the fix)
            print(f"runner.prepare: {e.filename or a.out}: {reason(e)}; {fix(e, 'give --out')}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Terminated) as e:
            return stopped("runner.prepare", e, f"; --out {a.out} was left as it was found (new: removed; empty: "
                                                f"emptied). Run the same command again to start over")
    return 0


if __name__ == "__main__":
    sys.exit(main())
