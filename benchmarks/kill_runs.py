"""The runs the kill benchmark (``benchmarks.kills``) starts, kills and compares: the tiny ranking run's
commands (one process, or two through ``runner.launch``), starting and waiting for them, and the final state
and metrics rows two runs are compared by (bit for bit)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import common

TINY = ["debug=tiny", "distributed.dump_state=true", "trainer.log_interval=1", "checkpoint.interval=2"]
SINGLE = TINY + ["trainer.steps=12", "trainer.eval_interval=4"]
PEER = TINY + ["trainer.steps=16", "trainer.eval_interval=8", "mesh=data", "mesh.cpu_devices=1",
               "distributed.heartbeat_timeout_s=10"]
HEARTBEAT_S = 10


def env(**extra: str) -> dict[str, str]:
    e = {**common.child_env(), "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
         "JAX_COMPILATION_CACHE_DIR": os.environ.get("RUNNER_TEST_JAX_CACHE", str(common.ROOT / ".jax_cache")),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.2", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
         "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"}
    for k in ("RUNNER_TEST_KILL_BEFORE_COMMIT", "RUNNER_TEST_KILL_IN_RESTORE", "RUNNER_TEST_KILL_IN_CLEANUP"):
        e.pop(k, None)
    return {**e, **extra}


def runner_cmd(run_dir: Path, ckpt: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "runner", *overrides, f"checkpoint.dir={ckpt}", f"hydra.run.dir={run_dir}"]


def peer_cmds(run_dir: Path, ckpt: Path) -> list[list[str]]:
    from runner.launch import child_commands, free_port

    return child_commands(2, [*PEER, f"checkpoint.dir={ckpt}"], free_port(), run_dir=str(run_dir))


def start(cmds: list[list[str]], logs: list[Path], extra_env: dict | None = None) -> list[subprocess.Popen]:
    return [subprocess.Popen(c, cwd=common.ROOT, env=env(**(extra_env or {})), stdout=open(log, "w"),
                             stderr=subprocess.STDOUT) for c, log in zip(cmds, logs)]


def finish(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    """Wait for every process up to ``timeout`` s in all; the ones still running are killed (None)."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.01)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append(None)
    return codes


def final(run_dir: Path) -> tuple[dict[str, np.ndarray], list[dict]]:
    """(every leaf of the final state, metrics rows without wall-clock columns) of a finished run."""
    with np.load(run_dir / "final_state.npz") as z:
        arrays = {k: z[k] for k in z.files}
    rows = [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return arrays, rows


def same(a: tuple, b: tuple, finished: bool = False) -> str:
    """'' when two ``final`` results are bit-identical, else what differs. ``finished``: ``b`` is the relaunch
    of a run that had finished (killed after its final checkpoint): it restores the flushed state, so its final
    row's flush record (``emb/flush_*``) says it flushed nothing, as ``test_relaunch_of_finished_run_only_evaluates``
    has it; that record is left out of the comparison."""
    (xa, ra), (xb, rb) = a, b
    if finished and ra and rb:
        ra = ra[:-1] + [{k: v for k, v in ra[-1].items() if not k.startswith("emb/flush_")}]
        rb = rb[:-1] + [{k: v for k, v in rb[-1].items() if not k.startswith("emb/flush_")}]
    if xa.keys() != xb.keys():
        return f"state leaves differ: {sorted(set(xa) ^ set(xb))[:3]}"
    wrong = [k for k in xa if not np.array_equal(xa[k], xb[k])]
    if wrong:
        return f"state differs in {wrong[:3]}"
    if ra != rb:
        return f"metrics rows differ ({len(ra)} vs {len(rb)} rows)"
    return ""


def tree_digest(d: Path, skip: tuple[str, ...] = ("run.lock",)) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name not in skip}


def committed(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []


def relaunch_single(run_dir: Path, ckpt: Path, log: Path) -> tuple[int | None, str]:
    (run_dir / "final_state.npz").unlink(missing_ok=True)
    code = finish(start([runner_cmd(run_dir, ckpt, SINGLE)], [log]), 300)[0]
    return code, log.read_text()


def resumed_from(text: str, ckpt: Path, step: int) -> bool:
    return f"resuming from {ckpt / str(step)}: step {step} of" in text
