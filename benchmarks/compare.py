"""``python -m benchmarks --compare REF``: the fused update of this working tree against commit REF, timed
alternately, so a change can be checked against main before it lands.

REF is checked out into a temporary git worktree (removed afterwards). Each round runs
``benchmarks/compare_child.py`` once on REF's ``optimizers`` and once on this tree's, each in a fresh process
(so both run in the same venv, same machine, same moment); each child times ``steps`` fused updates per
optimizer and vocabulary and reports their median. The ratio (this tree / REF) is taken round by round, and
its median, min and max over the rounds are printed: below 1 is faster. Only the public API is used
(``optimizers.create``, ``AsyncEmbContext``, ``make_update``, the protocol), so any commit that has it works.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from . import common

SETTINGS = dict(width=64, batch=16_384, steps=30, warmup=3, optimizers=["async_rowwise_adagrad", "async_adam"],
                sizes=[100_000, 1_000_000, 10_000_000])
QUICK = dict(width=16, batch=256, steps=3, warmup=1, optimizers=["async_rowwise_adagrad"], sizes=[1_000])
CHILD = Path(__file__).resolve().parent / "compare_child.py"


def side(tree: Path, payload: dict, label: str) -> dict[str, float]:
    """One child on ``tree``'s ``optimizers`` (``label``: the commit or this tree, for a failure's message):
    ``{"<optimizer>@<vocab>": median seconds}``."""
    env = {**common.child_env(), "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(payload)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks --compare: timing {label} failed:\n{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worktree(ref: str, where: Path) -> Path:
    """Check ``ref`` out (detached) under ``where``; a ref git does not know stops with its message."""
    path = where / "ref"
    proc = subprocess.run(["git", "-C", str(common.ROOT), "worktree", "add", "--detach", "-q", str(path), ref],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks --compare: cannot check out {ref!r}: {proc.stderr.strip()}")
    return path


def compare(ref: str, rounds: int = 4, quick: bool = False) -> dict:
    """Time REF and this tree alternately for ``rounds`` rounds; print and return the per-key ratios."""
    if rounds < 1:
        raise SystemExit(f"benchmarks --compare: --rounds must be >= 1, got {rounds}")
    payload = QUICK if quick else SETTINGS
    with tempfile.TemporaryDirectory() as d:
        theirs = worktree(ref, Path(d))
        try:
            samples: dict[str, list] = {"ref": [], "here": []}
            for r in range(rounds):
                for name, tree, label in (("ref", theirs, ref), ("here", common.ROOT, "this tree")):
                    samples[name].append(side(tree, payload, label))
                print(f"round {r + 1}/{rounds} done", flush=True)
        finally:
            subprocess.run(["git", "-C", str(common.ROOT), "worktree", "remove", "--force", str(theirs)],
                           capture_output=True)
    rows, out = [], {}
    for key in samples["here"][0]:
        ratios = [h[key] / t[key] for h, t in zip(samples["here"], samples["ref"])]
        ref_ms = statistics.median(t[key] for t in samples["ref"]) * 1e3
        here_ms = statistics.median(h[key] for h in samples["here"]) * 1e3
        out[key] = {"ref_ms": ref_ms, "here_ms": here_ms, "ratio": common.stats(ratios)}
        opt, vocab = key.split("@")
        st = out[key]["ratio"]
        rows.append([opt, f"{int(vocab):,}", f"{ref_ms:.2f}", f"{here_ms:.2f}",
                     f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f})"])
    print(f"\nfused update, this tree against {ref} ({rounds} alternating rounds, B = {payload['batch']:,}, "
          f"D = {payload['width']})\n")
    print(common.md_table(["optimizer", "V", f"{ref} ms", "this tree ms", "ratio median (min-max)"], rows))
    return out
