"""bfloat16 tables vs float32: test AUC of a short training run, table memory and step time.

Three runs of the default ranking setup (async_adam, async on): float32 tables with seeds 0 and 1 (the
seed-to-seed spread is the noise floor) and bfloat16 tables (stochastic rounding on write-back, float32
optimizer state) with seed 0. Each run: ``runner.build``, ``TrainProgram.compile``, ``steps`` steps,
the final flush, then the task's evaluation, as the trainer does; in a fresh process each.
"""
from __future__ import annotations

import time
from pathlib import Path

from . import common
from .trainer import compose

FULL = dict(overrides=["trainer.steps=500", "trainer.eval_batches=8"], runs=[
    dict(dtype="float32", seed=0), dict(dtype="float32", seed=1), dict(dtype="bfloat16", seed=0)])
QUICK = dict(overrides=["data.num_users=300", "data.num_items=500", "data.num_authors=50", "data.history_len=4",
                        "model.emb_width=8", "model.hidden=[16]", "trainer.batch_size=32", "trainer.steps=4",
                        "trainer.eval_batches=1"],
             runs=[dict(dtype="float32", seed=0), dict(dtype="bfloat16", seed=0)])
TABLES = ("users", "items", "authors")


def child(p: dict) -> dict:
    import jax

    from runner.build import build
    from runner.core.loop import to_device

    dtype_overrides = [f"model.tables.{t}.dtype={p['dtype']}" for t in TABLES]
    cfg = compose([*p["overrides"], *dtype_overrides, f"trainer.seed={p['seed']}"])
    program, task, _ = build(cfg)
    B, steps = cfg.trainer.batch_size, cfg.trainer.steps
    put = lambda b: to_device(program, b)  # noqa: E731
    state = program.init_state(cfg.trainer.seed)
    table_bytes = sum(common.tree_bytes(t) for t in state.tables.values())
    step, flush, predict = program.compile(state, put(task.batch(0, B)))
    state, m = step(state, put(task.batch(0, B)))  # compile outside the timing
    jax.block_until_ready(m)
    t = time.perf_counter()
    for i in range(1, steps):
        state, m = step(state, put(task.batch(i, B)))
    jax.block_until_ready(m)
    step_s = (time.perf_counter() - t) / max(1, steps - 1)
    state = flush(state)
    ev = task.evaluate(predict, state, put, B)
    return {**p, "table_bytes": table_bytes, "step_s": step_s, "eval": ev,
            "dtypes": {n: str(x.dtype) for n, x in state.tables.items()}}


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    results = []
    for r in cfg["runs"]:  # quick: in this process; full: a fresh process per run
        payload = {**r, "overrides": cfg["overrides"]}
        res = child(payload) if quick else common.run_child("precision", payload)
        print(f"{res['dtype']:<8} seed {res['seed']}  test AUC {res['eval']['test/auc_mean']:.4f}  "
              f"tables {res['table_bytes'] / 2**20:.1f} MB  {res['step_s'] * 1e3:.1f} ms/step", flush=True)
        results.append(res)
    f32 = [r for r in results if r["dtype"] == "float32"]
    bf16 = next(r for r in results if r["dtype"] == "bfloat16")
    auc = lambda r: r["eval"]["test/auc_mean"]  # noqa: E731
    data = {"config": cfg, "results": results,
            "auc_diff_bf16_minus_f32": auc(bf16) - auc(f32[0]),
            "auc_seed_spread_f32": abs(auc(f32[1]) - auc(f32[0])) if len(f32) > 1 else None,
            "memory_ratio_bf16_over_f32": bf16["table_bytes"] / f32[0]["table_bytes"]}
    head = ["tables", "seed", "test AUC (mean over actions)", "Bayes-optimal AUC", "test loss", "table MB", "ms/step"]
    rows = [[r["dtype"], r["seed"], f"{auc(r):.4f}", f"{r['eval']['bayes/test/auc_mean']:.4f}",
             f"{r['eval']['test/loss']:.4f}", f"{r['table_bytes'] / 2**20:.2f}", f"{r['step_s'] * 1e3:.1f}"]
            for r in results]
    spread = data["auc_seed_spread_f32"]
    body = (f"Default ranking config (async_adam, async on) with {' '.join(cfg['overrides'])}; each run in a fresh "
            f"process. {common.machine_line()}.\n\n" + common.md_table(head, rows) + "\n\n"
            f"AUC bf16 - fp32 (seed 0): {data['auc_diff_bf16_minus_f32']:+.4f}"
            + (f"; fp32 seed 1 - seed 0 spread: {spread:.4f}" if spread is not None else "")
            + f". Table memory bf16 / fp32: {data['memory_ratio_bf16_over_f32']:.2f}.\n")
    common.write_result(out, "precision", "bfloat16 tables: quality, memory, speed", body, data)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
