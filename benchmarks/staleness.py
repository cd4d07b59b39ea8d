"""What staleness costs and whether delay compensation wins it back: ``python -m benchmarks.staleness``.

Every configuration is one ``python -m runner`` run (W&B off) with the task's defaults and the same budget,
changed only in the embedding side: sync (``async_emb=off``); async with ``async_emb.staleness`` k = 1, 2, 4, 8,
each without and with delay compensation (``async_emb.compensation=dc`` at the default ``dc_lambda``); and, in
the default async mode, the fused optimizers side by side (Adam, row-wise Adagrad, partial row-wise Adam, FTRL),
each at its configured learning rate, or where the task pins one rate for all (ML-100K) at the rate that scored
best on validation in ``--lr-grid``. Each is run for every seed; a result is the run's summary (validation and
test metric of the checkpoint selected on validation) and its wall seconds.

    python -m benchmarks.staleness                       # the ranking task (synthetic), seeds 0 1 2
    python -m benchmarks.staleness --task ml100k --data ~/data/ml-100k
    python -m benchmarks.staleness --lambdas 1e3 1e4 1e5 --seeds 0   # choose dc_lambda (on validation)
    python -m benchmarks.staleness --task ml100k --data ~/data/ml-100k --lr-grid --seeds 0   # the optimizers' rates

Results accumulate in ``<out>/staleness.json`` (a configuration already there is not run again, so an
interrupted study resumes) and ``<out>/staleness.md`` is rewritten from it after every run. It takes about a
minute a ranking run and 4-5 minutes an ML-100K run on 2 CPU cores, so it is not part of ``python -m
benchmarks``.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.command_line import OneLineParser

from . import common

TASKS = {  # task -> (overrides every run gets, the validation metric, the test metric, its name)
    "ranking": ([], "valid/auc_mean", "test/auc_mean", "AUC"),
    "ml100k": (["experiment=ml100k_sasrec"], "valid/ndcg@10", "test/ndcg@10", "NDCG@10"),
}
DEFAULT_OPTIMIZER = {"ranking": "async_rowwise_adagrad", "ml100k": "async_adam"}  # what the task's own runs use
STALENESS = (1, 2, 4, 8)
OPTIMIZERS = ("async_adam", "async_rowwise_adagrad", "async_partial_rowwise_adam", "async_ftrl")
# Each optimizer's learning rate where the task does not use its configured one. The ML-100K recipe pins
# optimizer.learning_rate=0.002 (chosen for its Adam at the recipe's full budget), so there every optimizer
# compared, its Adam included, gets the rate that scored best on validation in --lr-grid (seed 0, the study's
# budget). The ranking task keeps each optimizer's configured rate (chosen on its validation data).
LEARNING_RATE = {"ml100k": {"async_adam": 0.005, "async_rowwise_adagrad": 0.03, "async_partial_rowwise_adam": 0.005,
                            "async_ftrl": 1.0}}
LR_GRID = {"async_adam": (0.001, 0.002, 0.005, 0.02), "async_rowwise_adagrad": (0.01, 0.03, 0.1, 0.3),
           "async_partial_rowwise_adam": (0.001, 0.002, 0.005, 0.02), "async_ftrl": (0.0625, 0.25, 1.0, 4.0, 16.0)}


def variants(task: str, lambdas: list[float] | None = None, lr_grid: bool = False) -> dict[str, list[str]]:
    """Name -> the overrides of each configuration studied (``lambdas``: only the dc_lambda choice instead;
    ``lr_grid``: only the learning-rate choice of the optimizers compared)."""
    if lr_grid:
        return {f"optimizer={o} lr={lr:g}": [f"optimizer={o}", f"optimizer.learning_rate={lr}"]
                for o in LEARNING_RATE.get(task, {}) for lr in LR_GRID[o]}
    compared = [o for o in OPTIMIZERS if o != DEFAULT_OPTIMIZER[task] or o in LEARNING_RATE.get(task, {})]
    if lambdas:
        out = {"k=4": ["async_emb.staleness=4"]}
        out.update({f"k=4 dc lambda={lam:g}": ["async_emb.staleness=4", "async_emb.compensation=dc",
                                               f"async_emb.dc_lambda={lam}"] for lam in lambdas})
        return out
    out = {"sync": ["async_emb=off"]}
    for k in STALENESS:
        out[f"k={k}"] = [f"async_emb.staleness={k}"]
        out[f"k={k} dc"] = [f"async_emb.staleness={k}", "async_emb.compensation=dc"]
    for o in compared:
        lr = LEARNING_RATE.get(task, {}).get(o, "configured")  # None: not chosen yet (main refuses to run it)
        out[f"optimizer={o}"] = None if lr is None else [f"optimizer={o}"] + (
            [] if lr == "configured" else [f"optimizer.learning_rate={lr}"])
    return out


def run_one(task: str, overrides: list[str], seed: int, data: str | None, common_overrides: list[str]) -> dict:
    """One runner run; its summary's metrics, exit code and wall seconds."""
    base, valid, test, _ = TASKS[task]
    base = [*base, *common_overrides]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "runner", *base, *overrides, f"trainer.seed={seed}", "logger=none",
               f"hydra.run.dir={tmp}", *([f"data.path={data}"] if data else [])]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=common.ROOT, env=common.child_env(), capture_output=True, text=True)
        secs = time.perf_counter() - t0
        summary = Path(tmp) / "summary.json"
        s = json.loads(summary.read_text()) if summary.exists() else {}
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
    # with model selection on (the sequential task's default) the selected evaluation's numbers are best/...
    return {"rc": proc.returncode, "seconds": secs, "valid": s.get(f"best/{valid}", s.get(valid)),
            "test": s.get(f"best/{test}", s.get(test))}


def mean_sd(xs: list[float]) -> str:
    if not xs:
        return ""
    return f"{statistics.mean(xs):.4f}" + (f" ({statistics.stdev(xs):.4f})" if len(xs) > 1 else "")


def table(task: str, results: dict, names: list[str]) -> str:
    """The task's markdown table: per variant, valid and test mean (sd) over its seeds, each seed's valid."""
    metric = TASKS[task][3]
    rows = []
    for name in names:
        runs = results.get(task, {}).get(name, {})
        ok = {s: r for s, r in sorted(runs.items(), key=lambda x: int(x[0])) if r["rc"] == 0}
        if not runs:
            continue
        valid = [r["valid"] for r in ok.values()]
        test = [r["test"] for r in ok.values()]
        per_seed = ", ".join(f"{s}: {r['valid']:.4f}" for s, r in ok.items())
        secs = statistics.median(r["seconds"] for r in ok.values()) if ok else float("nan")
        failed = len(runs) - len(ok)
        rows.append([name, mean_sd(valid), mean_sd(test), per_seed + (f" ({failed} failed)" if failed else ""),
                     f"{secs:.0f}"])
    return common.md_table(["configuration", f"valid {metric}, mean (sd)", f"test {metric}, mean (sd)",
                            "valid by seed", "median s"], rows)


def study_order(task: str, names) -> list[str]:
    """``names`` in the study's order (configurations, then the learning-rate and lambda choices), whatever ran
    first."""
    order = [*variants(task), *variants(task, lr_grid=True)]
    return sorted(dict.fromkeys(names), key=lambda n: order.index(n) if n in order else len(order))


def write(out: Path, results: dict) -> None:
    body = [__doc__.split("\n\n")[1].replace("\n", " "), ""]
    for task in results:
        if task == "settings":
            continue
        sets = results.get("settings", {}).get(task) or []
        body += [f"## {task}", "", f"Every run: the task's defaults{' with ' + ' '.join(f'`{o}`' for o in sets) if sets else ''}.",
                 "", table(task, results, study_order(task, results[task])), ""]
    common.write_result(out, "staleness", "Staleness and delay compensation: quality", "\n".join(body), results)


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m benchmarks.staleness", description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(TASKS), default="ranking")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--data", help="the task's data.path (ml100k: the folder of u.data)")
    p.add_argument("--lambdas", type=float, nargs="+", help="study dc_lambda at k=4 instead")
    p.add_argument("--lr-grid", action="store_true",
                   help="choose the compared optimizers' learning rates instead (run with --seeds 0)")
    p.add_argument("--only", nargs="+", help="run only these configurations (by name)")
    p.add_argument("--set", nargs="+", default=[], metavar="OVERRIDE",
                   help="overrides every run of the study gets (e.g. trainer.steps=1500: the same budget for all)")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    a = p.parse_args(argv)
    path = a.out / "staleness.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    settings = results.setdefault("settings", {}).setdefault(a.task, a.set)
    if settings != a.set:
        raise SystemExit(f"{path} holds {a.task} runs made with --set {' '.join(settings)}; use the same, or --out "
                         f"another folder")
    todo = variants(a.task, a.lambdas, a.lr_grid)
    if a.only:
        todo = {k: v for k, v in todo.items() if k in a.only}
    for seed in a.seeds:  # seed by seed: an interrupted study has every configuration at the same seeds
        for name, overrides in todo.items():
            done = results.setdefault(a.task, {}).setdefault(name, {})
            if str(seed) in done and done[str(seed)]["rc"] == 0:
                continue
            if overrides is None:
                raise SystemExit(f"{a.task}: {name} has no learning rate chosen for this task yet; run --lr-grid "
                                 f"--seeds 0 and set the best on validation in LEARNING_RATE")
            r = run_one(a.task, overrides, seed, a.data, a.set)
            done[str(seed)] = r
            print(f"{a.task} {name} seed {seed}: valid {r['valid']} test {r['test']} ({r['seconds']:.0f} s, "
                  f"rc {r['rc']})", flush=True)
            write(a.out, results)


if __name__ == "__main__":
    main()
