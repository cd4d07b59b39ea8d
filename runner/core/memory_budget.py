"""Before the state is built: its own size against what the devices have left (``check_state``), so a table
that cannot fit stops with one message naming what sizes it. Before the first step: the compiled train step's memory, by XLA's own accounting, against what the devices
have left, so a batch that cannot fit stops with one message naming ``trainer.batch_size`` instead of the
operating system killing the process (exit code 137, no word) or the accelerator failing mid-step.

What a step adds to what is already allocated (the state and the batch, its arguments) is its temporaries and
its outputs that do not reuse a donated argument: ``temp + output - alias`` bytes a device, from
``Compiled.memory_analysis()``. A CPU's devices share the host's memory, so there it counts once per local
device, against the memory Linux can still give (``MemAvailable`` plus free swap: a run that would only swap is
slow, not refused), or what the process's memory cgroup still allows where that is less (a container's or a
SLURM job's limit, which ``MemAvailable`` does not see), or the address space its ``ulimit -v`` still allows. An accelerator's devices each have their own, ``bytes_limit - bytes_in_use``
(``Device.memory_stats()``). Where either is unknown (another OS, a backend without the statistics) nothing is
checked.
"""
from __future__ import annotations

import math
import resource
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..errors import MemoryBudgetError

MEMINFO = Path("/proc/meminfo")
PROC_CGROUP, CGROUP_ROOT = Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")
PROC_STATUS = Path("/proc/self/status")
UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def step_bytes(compiled: Any) -> int | None:
    """Bytes a device the compiled step allocates beyond its arguments (None when XLA does not say)."""
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    return int(ma.temp_size_in_bytes) + max(int(ma.output_size_in_bytes) - int(ma.alias_size_in_bytes), 0)


def host_available(meminfo: Path = MEMINFO) -> int | None:
    """Bytes Linux can still give this process (``MemAvailable`` + ``SwapFree``), None when unknown."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "SwapFree"))
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _number(path: Path, key: str | None = None) -> int | None:
    """The integer in a cgroup file, or under ``key`` in a ``memory.stat``; None when absent ("max" included)."""
    try:
        text = path.read_text()
        if key is not None:
            text = dict(line.split(" ", 1) for line in text.splitlines() if " " in line).get(key, "")
        return int(text.strip())
    except (OSError, ValueError):
        return None


def cgroup_available(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> tuple[int, str] | None:
    """(bytes, cgroup) of the tightest memory limit on this process's cgroup or an ancestor (v2 or v1), less what
    it uses that the kernel cannot reclaim first (its inactive page cache is reclaimed before anything is
    killed); None where no cgroup limits memory."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":  # v2: one hierarchy for every controller
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        folder = base / path.strip("/")
        while True:  # the limits nest: an ancestor's may be the tighter one
            limit, used = _number(folder / files[0]), _number(folder / files[1])
            if limit is not None and used is not None and limit < UNLIMITED:
                cache = _number(folder / "memory.stat", files[2]) or 0
                found.append((limit - max(used - cache, 0), "/" + str(folder.relative_to(base)).strip(".")))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(found) if found else None


def device_available(device: Any) -> int | None:
    """Bytes an accelerator can still allocate, None when its backend keeps no statistics."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 (a backend without the call)
        return None
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def suggested_batch(most: int, data_parallel: int) -> int:
    """A batch of at most ``most`` examples to suggest: a power of two where that splits over the
    ``data_parallel`` devices, else the most that does (0: none does)."""
    if most < data_parallel:
        return 0
    power = 1 << (most.bit_length() - 1)
    return power if power % data_parallel == 0 else most // data_parallel * data_parallel


def address_space_available(status: Path = PROC_STATUS, limit: int | None = None) -> int | None:
    """Bytes of address space this process may still map under its ``ulimit -v`` (``RLIMIT_AS``, soft): the limit
    less its ``VmSize``; None without such a limit. Every allocation counts against it, touched or not, and
    ``MemAvailable`` and cgroups do not see it. ``limit``: instead of asking (tests)."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0] if limit is None else limit
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        used = int(fields["VmSize"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        used = 0
    return max(soft - used, 0)


def _room(devices: list, available: int | None) -> tuple[int | None, str]:
    """(bytes left, where, in words): a CPU's host memory, or its cgroup's limit or its address-space limit
    (``ulimit -v``) where one is less; an accelerator's own. ``available`` given (tests): taken as the host's or
    the device's."""
    on_cpu = devices[0].platform == "cpu"
    if available is not None or not on_cpu:
        available = available if available is not None else device_available(devices[0])
        if available is None:
            return None, ""
        return available, (f"this machine's memory has {_gb(available)} left (available and free swap)" if on_cpu
                           else f"a {devices[0].platform.upper()} device has {_gb(available)} left")
    options, host, limit, space = [], host_available(), cgroup_available(), address_space_available()
    if host is not None:
        options.append((host, f"this machine's memory has {_gb(host)} left (available and free swap)"))
    if limit is not None:
        options.append((limit[0], f"this process's memory limit (cgroup {limit[1]}) leaves {_gb(limit[0])}"))
    if space is not None:
        options.append((space, f"this process's address-space limit (ulimit -v) leaves {_gb(space)}"))
    return min(options, key=lambda o: o[0]) if options else (None, "")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def check(compiled: Any, devices: list, batch_size: int, data_parallel: int = 1,
          available: int | None = None) -> None:
    """Raise :class:`MemoryBudgetError` when the step ``compiled`` for ``devices`` (this process's devices of the
    mesh) cannot fit in what they have left. ``data_parallel``: the devices the batch is split over (a smaller
    batch suggested is a multiple of them). ``available``: the bytes left, instead of asking the system (tests)."""
    per_device = step_bytes(compiled)
    if per_device is None or not devices:
        return
    on_cpu = devices[0].platform == "cpu"
    need = per_device * len(devices) if on_cpu else per_device
    available, where = _room(devices, available)
    if available is None or need <= available:
        return
    fit = suggested_batch(int(batch_size * available / need * 0.8), data_parallel)  # a fifth kept spare
    count = f" x {len(devices)} devices (a CPU's share the host's memory)" if on_cpu and len(devices) > 1 else ""
    fix = f"lower trainer.batch_size (e.g. {fit:,})" if fit else "lower trainer.batch_size"
    raise MemoryBudgetError(
        f"trainer.batch_size={batch_size:,}: the compiled train step needs {_gb(per_device)} a device beyond the "
        f"state and the batch (XLA's temporaries and new outputs){count}, and {where}; the run would be killed "
        f"mid-step. {fix[0].upper()}{fix[1:]}, or what sizes each example's work (the model's widths, a sequence "
        f"length such as data.max_len, the negatives an example scores such as model.num_negatives), or shard the "
        f"tables over more devices (mesh=data_table)")


STATE_PARTS = {"tables": "tables", "emb_states": "their optimizer state", "hashed": "hash-table slots",
               "pending": "deferred updates"}


def state_bytes(shapes: Any, shardings: Any, devices: list) -> dict[str, int]:
    """Bytes the train state of ``shapes`` (``TrainProgram.state_shapes``) placed by ``shardings`` takes on
    ``devices`` together (this process's), by part: tables, their optimizer state, ..., the rest as "other"."""
    mine = {id(d) for d in devices}
    out: dict[str, int] = {}
    for part in shapes._fields:
        leaves = zip(jax.tree.leaves(getattr(shapes, part)), jax.tree.leaves(getattr(shardings, part)))
        total = 0
        for leaf, sharding in leaves:
            shard = math.prod(sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            total += shard * sum(id(d) in mine for d in sharding.device_set)
        key = part if part in STATE_PARTS else "other"
        out[key] = out.get(key, 0) + total
    return out


def check_state(shapes: Any, shardings: Any, devices: list, available: int | None = None) -> None:
    """Raise :class:`MemoryBudgetError` when the train state cannot fit in what this process's devices have
    left: the run would be killed while building or restoring it. ``available``: instead of asking (tests)."""
    if not devices:
        return
    parts = state_bytes(shapes, shardings, devices)
    on_cpu = devices[0].platform == "cpu"
    need = sum(parts.values()) if on_cpu else max(sum(parts.values()) // len(devices), 1)
    available, where = _room(devices, available)
    if available is None or need <= available:
        return
    scope = ("this host's device" if len(devices) == 1 else f"this host's {len(devices)} devices") if on_cpu \
        else "a device"
    shown = {STATE_PARTS[k]: parts[k] for k in STATE_PARTS if parts.get(k, 0) * 100 >= sum(parts.values())}
    rest = sum(parts.values()) - sum(shown.values())  # the dense model and counters, and parts under 1%
    split = ", ".join(f"{name} {_gb(v if on_cpu else v // len(devices))}" for name, v in
                      [*shown.items(), *([("the rest", rest)] if rest * 100 >= sum(parts.values()) else [])])
    raise MemoryBudgetError(
        f"the train state needs {_gb(need)} on {scope} ({split}), and {where}; the run would be killed while "
        f"building it. Shard the tables over more devices or processes (mesh=data_table, python -m runner.launch), "
        f"make them smaller (their vocab or capacity, model.emb_width, model.tables.<name>.dtype=bfloat16), or "
        f"pick an embedding optimizer with less state a row (optimizer=async_rowwise_adagrad keeps one number a row)")
