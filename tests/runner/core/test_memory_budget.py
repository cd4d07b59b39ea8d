"""The memory check before the first step (``runner.core.memory_budget``): a batch whose compiled step needs more
than the devices have left stops with one message naming trainer.batch_size and a batch that fits; a CPU's
devices share the host's memory, an accelerator's each have their own; where the memory left is unknown nothing
is refused."""
import resource
import subprocess
import sys
from types import SimpleNamespace

import jax

import pytest

from runner.app import run
from runner.core import memory_budget
from runner.core.memory_budget import (MemoryBudgetError, address_space_available, cgroup_available, check,
                                       host_available, step_bytes, suggested_batch)

MIB = 2**20


def compiled(temp, out, alias):
    ma = SimpleNamespace(temp_size_in_bytes=temp, output_size_in_bytes=out, alias_size_in_bytes=alias)
    return SimpleNamespace(memory_analysis=lambda: ma)


def devices(n, platform="cpu", limit=None, in_use=0):
    stats = {"bytes_limit": limit, "bytes_in_use": in_use} if limit is not None else {}
    return [SimpleNamespace(platform=platform, memory_stats=lambda: stats) for _ in range(n)]


def test_what_a_step_adds_is_its_temporaries_and_the_outputs_no_argument_is_donated_to():
    assert step_bytes(compiled(100 * MIB, 30 * MIB, 20 * MIB)) == 110 * MIB
    assert step_bytes(compiled(100 * MIB, 30 * MIB, 40 * MIB)) == 100 * MIB  # never less than the temporaries
    assert step_bytes(SimpleNamespace(memory_analysis=lambda: None)) is None


def test_a_cpu_step_counts_once_per_device_against_the_hosts_memory():
    step = compiled(100 * MIB, 0, 0)
    check(step, devices(8), 4096, 8, available=800 * MIB)  # 8 x 100 MiB: fits exactly
    with pytest.raises(MemoryBudgetError) as e:
        check(step, devices(8), 4096, 8, available=400 * MIB)
    fit = 1024  # 4,096 x 400 / 800 x 0.8 = 1,638: the power of two below it
    assert str(e.value) == (
        "trainer.batch_size=4,096: the compiled train step needs 0.1 GB a device beyond the state and the batch "
        "(XLA's temporaries and new outputs) x 8 devices (a CPU's share the host's memory), and this machine's "
        f"memory has 0.4 GB left (available and free swap); the run would be killed mid-step. Lower "
        f"trainer.batch_size (e.g. {fit:,}), or what sizes each example's work (the model's widths, a sequence "
        f"length such as data.max_len, the negatives an example scores such as model.num_negatives), or shard the "
        f"tables over more devices (mesh=data_table)")


def test_an_accelerator_counts_each_device_against_its_own_memory():
    step = compiled(3 * 10**9, 10**9, 0)
    check(step, devices(8, "tpu", limit=16 * 10**9, in_use=10 * 10**9), 8192, 8)  # 4 GB of 6 left, on each
    with pytest.raises(MemoryBudgetError, match=r"needs 4.0 GB a device .*and a TPU device has 3.0 GB left; the "
                                                r"run would be killed mid-step. Lower trainer.batch_size \(e.g. 4,096\)"):
        check(step, devices(8, "tpu", limit=16 * 10**9, in_use=13 * 10**9), 8192, 8)
    check(step, devices(8, "gpu"), 8192, 8)  # no statistics: nothing to compare with
    with pytest.raises(MemoryBudgetError, match=r"Lower trainer.batch_size, or what sizes each example's work"):  # no batch fits
        check(step, devices(1, "tpu", limit=10**8), 4, 4)


def test_the_batch_suggested_is_a_power_of_two_that_splits_over_the_devices_or_the_most_that_does():
    assert suggested_batch(1638, 8) == 1024 and suggested_batch(4912, 8) == 4096 and suggested_batch(8, 8) == 8
    assert suggested_batch(1638, 6) == 1638 and suggested_batch(100, 12) == 96 and suggested_batch(5, 8) == 0


def test_the_hosts_memory_left_is_available_plus_free_swap(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       23000000 kB\nMemFree:  100 kB\nMemAvailable:   2000000 kB\n"
                       "SwapTotal: 10 kB\nSwapFree:        500 kB\n")
    assert host_available(meminfo) == (2000000 + 500) * 1024
    meminfo.write_text("MemTotal: 1 kB\n")
    assert host_available(meminfo) is None and host_available(tmp_path / "none") is None


def _files(root, files: dict) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_memory_cgroup_limit_counts_the_tightest_ancestor_less_what_cannot_be_reclaimed(tmp_path):
    """A container's or a SLURM job's limit, which MemAvailable does not see: cgroup v2 and v1, the tightest
    limit on the process's cgroup or any ancestor, its usage less the inactive page cache."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job/step\n")
    v2 = tmp_path / "v2"
    _files(v2, {"job/memory.max": str(8000 * MIB), "job/memory.current": str(1000 * MIB),
                "job/memory.stat": f"anon 1\ninactive_file {200 * MIB}\n",
                "job/step/memory.max": "max", "job/step/memory.current": str(900 * MIB)})
    assert cgroup_available(proc, v2) == (7200 * MIB, "/job")  # 8000 - (1000 - 200)
    _files(v2, {"job/step/memory.max": str(1000 * MIB)})
    assert cgroup_available(proc, v2) == (100 * MIB, "/job/step")  # the step's own limit is tighter
    _files(v2, {"job/memory.max": "max", "job/step/memory.max": "max"})
    assert cgroup_available(proc, v2) is None  # no limit anywhere
    proc.write_text("4:memory:/slurm/uid_1\n3:cpuset:/\n0::/\n")  # v1 (and an empty v2 line)
    v1 = tmp_path / "v1"
    _files(v1, {"memory/slurm/uid_1/memory.limit_in_bytes": str(4000 * MIB),
                "memory/slurm/uid_1/memory.usage_in_bytes": str(500 * MIB),
                "memory/slurm/memory.limit_in_bytes": str(2**63 - 4096),  # v1's "unlimited"
                "memory/slurm/memory.usage_in_bytes": str(600 * MIB)})
    assert cgroup_available(proc, v1) == (3500 * MIB, "/slurm/uid_1")
    assert cgroup_available(tmp_path / "none", v1) is None


def test_a_cgroup_limit_below_the_hosts_memory_is_the_one_checked_and_named(monkeypatch):
    step = compiled(100 * MIB, 0, 0)
    monkeypatch.setattr(memory_budget, "host_available", lambda: 2**40)
    monkeypatch.setattr(memory_budget, "cgroup_available", lambda: (400 * MIB, "/job"))
    with pytest.raises(MemoryBudgetError) as e:
        check(step, devices(8), 4096, 8)
    assert ("x 8 devices (a CPU's share the host's memory), and this process's memory limit (cgroup /job) leaves "
            "0.4 GB; the run would be killed mid-step. Lower trainer.batch_size (e.g. 1,024)") in str(e.value)
    monkeypatch.setattr(memory_budget, "cgroup_available", lambda: (2**41, "/job"))
    check(step, devices(8), 4096, 8)  # the host's memory is the tighter: it fits
    monkeypatch.setattr(memory_budget, "host_available", lambda: 400 * MIB)
    with pytest.raises(MemoryBudgetError, match=r"this machine's memory has 0.4 GB left \(available and free swap\)"):
        check(step, devices(8), 4096, 8)


def test_an_address_space_limit_is_the_limit_less_what_the_process_has_mapped(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9000000 kB\nVmSize:\t 3000000 kB\nVmRSS:\t 500000 kB\n")
    assert address_space_available(status, limit=8_000_000 * 1024) == 5_000_000 * 1024
    assert address_space_available(status, limit=1_000_000 * 1024) == 0  # already past it
    assert address_space_available(status, limit=resource.RLIM_INFINITY) is None  # no ulimit -v
    assert address_space_available(tmp_path / "none", limit=4096) == 4096  # VmSize unknown: the whole limit


def test_an_address_space_limit_below_the_memory_left_is_the_one_checked_and_named(monkeypatch):
    step = compiled(100 * MIB, 0, 0)
    monkeypatch.setattr(memory_budget, "host_available", lambda: 2**40)
    monkeypatch.setattr(memory_budget, "cgroup_available", lambda: (2**39, "/job"))
    monkeypatch.setattr(memory_budget, "address_space_available", lambda: 300 * MIB)
    with pytest.raises(MemoryBudgetError, match=r"and this process's address-space limit \(ulimit -v\) leaves 0.3 "
                                                r"GB; the run would be killed mid-step"):
        check(step, devices(8), 4096, 8)
    monkeypatch.setattr(memory_budget, "address_space_available", lambda: None)
    check(step, devices(8), 4096, 8)


@pytest.mark.slow
def test_a_run_under_ulimit_v_is_refused_before_it_builds_a_state_the_limit_cannot_hold(tmp_path):
    """Under ``ulimit -v`` (6 GB) a 7.7 GB state (2M item rows of width 320 and Adam's two values each) is refused
    by the check, naming the limit; before the check saw it, XLA failed to allocate the table mid-build and the run
    ended in a traceback. (Wide rows rather than many: generating 20M items' data took a minute.)"""
    cmd = (f"ulimit -v 6000000 && exec {sys.executable} -m runner debug=tiny data.num_items=2000000 "
           f"model.emb_width=320 hydra.run.dir={tmp_path / 'run'}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: the train state needs 7.7 GB on this host's device (tables 2.6 GB, their optimizer state 5.1 GB), and "
        "this process's address-space limit (ulimit -v) leaves "), proc.stderr[-2000:]


@pytest.mark.slow
def test_a_run_whose_step_cannot_fit_stops_before_its_first_step(cfg_of, tmp_path, monkeypatch):
    """The check runs on the real compiled step of a run, before the first step: with 1 KiB left the tiny
    ranking model's step does not fit, and nothing is trained."""
    left = iter([2**40, 1024])  # the state fits (checked first, before it is built), the step does not
    monkeypatch.setattr(memory_budget, "host_available", lambda: next(left))
    with pytest.raises(MemoryBudgetError, match=r"^trainer.batch_size=32: the compiled train step needs .* and this "
                                                r"machine's memory has 0.0 GB left"):
        run(cfg_of(["trainer.steps=3"]), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists() or "train/loss" not in (tmp_path / "metrics.jsonl").read_text()
    monkeypatch.setattr(memory_budget, "host_available", lambda: 2**40)
    run(cfg_of(["trainer.steps=3"]), tmp_path / "fits")
    assert "train/loss" in (tmp_path / "fits" / "metrics.jsonl").read_text()


def test_the_state_counts_each_devices_shard_on_this_host_by_part():
    """On a 2x4 mesh each table row is on the 2 devices of its table shard (padded rows included), replicated
    parameters on all 8; against the sizes computed from the config."""
    from runner.build import build
    from tests.runner.support import compose_config

    program, _, _ = build(compose_config(["mesh=data_table", "mesh.axes.data=2", "mesh.axes.table=4",
                                          "mesh.cpu_devices=8", "optimizer=async_rowwise_adagrad"]))
    shapes = program.state_shapes(0)
    parts = memory_budget.state_bytes(shapes, program.state_shardings(shapes), list(program.mesh.local_devices))
    rows = {n: program.tables[n].rows for n in ("users", "items", "authors")}
    assert all(r % 4 == 0 for r in rows.values())  # padded to split over the 4 table shards
    assert parts["tables"] == sum(rows.values()) * 8 * 4 * 2  # width 8, float32, each row on the 2 data replicas
    assert parts["emb_states"] >= sum(rows.values()) * 4  # row-wise Adagrad: at least one float a row
    params = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes.params))
    assert parts["other"] >= 8 * params  # the dense model on each of the 8 devices


@pytest.mark.slow
def test_a_state_that_cannot_fit_is_refused_naming_its_parts_and_the_ways_out(cfg_of, tmp_path, monkeypatch):
    """Refused before the state is built or a checkpoint is opened: no train step, no checkpoint folder."""
    cfg = cfg_of(["trainer.steps=3", "checkpoint.interval=2", f"checkpoint.dir={tmp_path / 'ck'}",
                  "data.num_items=1000000", "model.emb_width=64"])  # Adam: two state values a table value
    monkeypatch.setattr(memory_budget, "host_available", lambda: 600_000_000)
    monkeypatch.setattr(memory_budget, "cgroup_available", lambda: None)
    with pytest.raises(MemoryBudgetError) as e:
        run(cfg, tmp_path / "run")
    msg = str(e.value)
    table = (1_000_001 + 301 + 51) * 64 * 4  # items, users, authors (their vocab plus one), float32
    assert msg.startswith(f"the train state needs {table * 3 / 1e9:.1f} GB on this host's device (tables "
                          f"{table / 1e9:.1f} GB, their optimizer state {2 * table / 1e9:.1f} GB), and this machine's "
                          f"memory has 0.6 GB left (available and free swap); the run would be killed while building "
                          f"it. Shard the tables over more devices or processes (mesh=data_table"), msg
    assert "optimizer=async_rowwise_adagrad keeps one number a row" in msg
    assert not (tmp_path / "ck").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    tpus = devices(4, "tpu", limit=100)  # each device has its own memory: a quarter of the state on each
    table = SimpleNamespace(_fields=("tables",), tables=[SimpleNamespace(shape=(100, 1), dtype="float32")])
    split = SimpleNamespace(tables=[SimpleNamespace(device_set=tpus, shard_shape=lambda s: (s[0] // 4, s[1]))])
    memory_budget.check_state(table, split, tpus)  # 100 bytes a device: fits exactly
    table.tables[0].shape = (104, 1)
    with pytest.raises(MemoryBudgetError, match=r"^the train state needs 0.0 GB on a device \(tables 0.0 GB\), and a "
                                                r"TPU device has 0.0 GB left"):
        memory_budget.check_state(table, split, tpus)
