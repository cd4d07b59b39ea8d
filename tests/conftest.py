"""Every test process sees 8 virtual CPU devices, set before any JAX work so sharding is testable on CPU.

Compiled programs are shared through JAX's persistent compilation cache (``.jax_cache/`` in the repository,
ignored by git; ``RUNNER_TEST_JAX_CACHE`` moves it): many tests compile the same tiny train step, in this
process, in the other xdist worker and in the ``python -m runner`` subprocesses the CLI tests start (they
inherit the environment set here), and each distinct program is compiled once per cache.

Tests compile with XLA's backend (LLVM) optimisation off and XLA:CPU's MLIR fusion emitters off (the older
elemental emitters): they check numbers, not speed, and the tiny programs they run compile in about half
the time (the 2x4 row-sharded async train step, measured with a load of ~4 on 2 cores: 8.6-10.6 s with
the optimisation off alone, 11.3 s with the emitters off alone, 3.8-5.4 s with both; its flush 3.6-4.9 s and
1.3-1.6 s). They also skip XLA's HLO verifier, which checks XLA's own passes' output after each of them
(``--xla_disable_hlo_passes=hlo-verifier``): the 2x4 hash-table train step compiles in 3.45-3.61 s against
3.71-3.95 s with it, six alternating pairs on an idle machine. And they generate each program's code as one
LLVM module (``--xla_cpu_parallel_codegen_split_count=1``) rather than split for a thread pool, which both
cores are already busy with the two xdist workers: 7-15% less CPU a compile (the 2x4 hash-table step 3.4-3.7 s
against 3.6-4.0 s, the one-device step 0.44-0.47 s against 0.53-0.55 s, three rounds).
``RUNNER_TEST_XLA_OPT=1`` keeps XLA's defaults, as the runner and the benchmarks use. Runs compared with each
other in a test are compiled alike.

Two settings for the test processes alone: numpy's OpenBLAS uses one thread (its idle threads spin after
each matrix product, on the cores the other xdist worker compiles on), and Python's full garbage
collections run a tenth as often (``gc.set_threshold(700, 10, 100)``; the default's third number is 10).
A worker's heap grows to about a million objects as its tests compile programs, and each full
collection walks all of it: over ``tests/runner/core`` and ``tests/optimizers`` (701 tests, 2 workers) the
workers spent 12.4 s in full collections with the default and 4.4 s with this setting, with the same peak
memory (1.5 and 2.4 GB).
"""
import gc
import os
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported
gc.set_threshold(700, 10, 100)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
_CACHE = os.environ.setdefault("RUNNER_TEST_JAX_CACHE", str(Path(__file__).resolve().parents[1] / ".jax_cache"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
if os.environ.get("RUNNER_TEST_XLA_OPT", "0") != "1" and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                               " --xla_cpu_use_fusion_emitters=false --xla_disable_hlo_passes=hlo-verifier"
                               " --xla_cpu_parallel_codegen_split_count=1").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# The files whose tests take longest (tens of seconds each: subprocesses, several processes, whole runs on a
# mesh), longest first. They run first: pytest-xdist's work stealing then ends the session on short tests
# instead of leaving one core idle while the other finishes a long one. Order only; every test still runs.
LONGEST_FIRST = (
    "tests/benchmarks/test_suite.py",
    "tests/runner/test_distributed.py",
    "tests/runner/checkpoint/test_kill.py",
    "tests/runner/checkpoint/test_resume.py",
    "tests/runner/core/test_hash_step.py",
    "tests/runner/checkpoint/test_errors.py",
    "tests/runner/test_sweeps.py",
    "tests/runner/core/test_sharded.py",
    "tests/runner/core/test_routing.py",
    "tests/runner/tasks/sequential/test_cli.py",
    "tests/runner/test_cli.py",
    "tests/test_packaging.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept
