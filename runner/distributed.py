"""Multi-process training: start ``jax.distributed`` once, feed each process its rows, fetch global results.

``distributed.kind`` chooses how the processes find each other:

- ``none``: one process (nothing to do);
- ``local``: N processes on this machine, coordinator on 127.0.0.1 (``python -m runner.launch`` fills in the
  address, the count and each id);
- ``slurm``: one process per SLURM task, everything detected from the SLURM environment;
- ``manual``: any other scheduler passes ``coordinator_address``, ``num_processes`` and ``process_id``.

The global mesh spans every process's devices (``jax.devices()`` is global and ordered by process). How each
process feeds its rows of the global batch and fetches global results is ``runner.core.placement``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax._src.distributed import global_state  # the settings jax.distributed runs with (slurm: detected)

from .core.mesh import MeshPlan
from .core.placement import fetch
from .errors import DistributedError, RunnerError, exit_code, first_line, said_by_process_0
from .launch import reserved_port

log = logging.getLogger("runner")

MAX_TIMEOUT_S = 7 * 24 * 3600
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
LAUNCH_HINT = "python -m runner.launch -n N -- <overrides> (it sets all three)"


def check(d: Any) -> None:
    """Refuse a ``distributed`` config that cannot work, before anything starts. (``distributed.kind`` is an
    Enum field of the schema: another word fails when the config is composed.)"""
    for key in ("initialization_timeout_s", "heartbeat_timeout_s", "shutdown_timeout_s"):
        if not 0 < getattr(d, key) <= MAX_TIMEOUT_S:  # JAX's coordination service keeps them in 32-bit ms
            raise DistributedError(f"distributed.{key}={getattr(d, key)!r} must be a positive number of seconds up "
                                   f"to {MAX_TIMEOUT_S:,} (a week)")
    if d.kind in ("local", "manual"):
        missing = [k for k in ("coordinator_address", "num_processes", "process_id") if getattr(d, k) is None]
        if missing:
            how = LAUNCH_HINT if d.kind == "local" else "pass them on the command line of every process"
            raise DistributedError(f"distributed={d.kind} needs {', '.join(f'distributed.{k}' for k in missing)}; "
                                   f"{how}")
        if not re.fullmatch(r"\S+:\d+", str(d.coordinator_address)) or not \
                1 <= int(str(d.coordinator_address).rsplit(":", 1)[1]) <= 65535:
            raise DistributedError(f"distributed.coordinator_address={d.coordinator_address!r} must be host:port "
                                   "of process 0 with a port in 1..65535, e.g. 127.0.0.1:7777")
        if d.kind == "local" and str(d.coordinator_address).rsplit(":", 1)[0] not in ("127.0.0.1", "localhost"):
            raise DistributedError(f"distributed=local runs every process on this machine, but coordinator_address="
                                   f"{d.coordinator_address!r} is not 127.0.0.1/localhost; use distributed=manual "
                                   "for processes on several machines")
        if not (d.num_processes >= 1 and 0 <= d.process_id < d.num_processes):
            raise DistributedError(f"distributed.process_id={d.process_id} must be in 0..num_processes-1 "
                                   f"(num_processes={d.num_processes}); give every process its own id")
    if d.kind == "slurm":
        missing = [v for v in SLURM_VARS if v not in os.environ]
        if missing:
            raise DistributedError(f"distributed=slurm found no SLURM job step here ({', '.join(missing)} unset); "
                                   "run it inside `srun` (or an sbatch script that calls srun, or hydra/launcher="
                                   "slurm_multiprocess), or use distributed=local / manual elsewhere")
        counts = {v: os.environ[v].strip() for v in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")}
        wrong = next((v for v, x in counts.items() if not x.isdigit()), None)
        if wrong or int(counts["SLURM_PROCID"]) >= max(int(counts["SLURM_NTASKS"]), 1):
            shown = f"{wrong}={counts[wrong]!r} is not a count" if wrong else (
                f"SLURM_PROCID={counts['SLURM_PROCID']} is not below SLURM_NTASKS={counts['SLURM_NTASKS']}")
            raise DistributedError(f"distributed=slurm: {shown}; these come from SLURM itself: launch with srun "
                                   "rather than setting them by hand")


def initialize(d: Any) -> None:
    """Start ``jax.distributed`` for this process (before any JAX computation); a no-op for ``kind=none``
    and when this process already joined a run with the same settings."""
    check(d)
    if d.kind == "none":
        return
    want = (d.num_processes, d.process_id)
    if jax.distributed.is_initialized():
        have = (global_state.num_processes, global_state.process_id)
        if d.kind == "slurm" or want == have:
            return
        raise DistributedError(f"jax.distributed is already running as process {have[1]} of {have[0]}, not "
                               f"{want[1]} of {want[0]}; start a fresh process for a different layout")
    address, n, pid = _placement(d)
    kwargs = dict(initialization_timeout=int(d.initialization_timeout_s),
                  heartbeat_timeout_seconds=int(d.heartbeat_timeout_s),
                  shutdown_timeout_seconds=int(d.shutdown_timeout_s), coordinator_address=address,
                  num_processes=n, process_id=pid, cluster_detection_method="deactivate")
    where = address
    log.info("jax.distributed: process %s of %s joining at %s (waiting up to %s s for every process)",
             pid, n, where, d.initialization_timeout_s)
    own = reserved_port() if pid == 0 else contextlib.nullcontext()
    if pid == 0:
        _serve(d, address, n)
    else:
        _wait_for_coordinator(d, address, pid)
    try:
        with own as port, _no_abort_on_errors():
            if pid == 0:  # JAX starts a service in process 0 as well: bound to a port of its own, nobody connects to it
                kwargs["coordinator_bind_address"] = f"127.0.0.1:{port}"
            jax.distributed.initialize(**kwargs)
    except RuntimeError as e:
        if "must be called before" in str(e):
            raise DistributedError(
                f"distributed={d.kind}: JAX was already started in this process, and jax.distributed can only "
                "join a run before that; launch each process fresh (python -m runner / runner.launch), and in "
                "a sweep use hydra/launcher=submitit_local so every trial gets its own process") from None
        raise DistributedError(_unreachable(d, where, e, pid)) from None
    except Exception as e:  # noqa: BLE001 - XLA reports a timeout as its own runtime error type
        raise DistributedError(_unreachable(d, where, e, pid)) from None
    _join_watch(address, pid, n, int(d.initialization_timeout_s))
    # nothing here may ask for devices: that starts the backend, and mesh.cpu_devices is applied after this
    log.info("jax.distributed: process %s of %s joined", global_state.process_id, global_state.num_processes)


def _placement(d: Any) -> tuple[str, int, int]:
    """(coordinator address, number of processes, this process's id): as given, or detected from SLURM."""
    if d.kind != "slurm":
        return str(d.coordinator_address), int(d.num_processes), int(d.process_id)
    from jax._src import clusters  # noqa: PLC0415 - JAX's own SLURM detection (address: the first node)

    address, n, pid, _ = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        d.coordinator_address, None, None, None, "slurm", int(d.initialization_timeout_s))
    return str(address), int(n), int(pid)


_SERVICE: list = []  # process 0's child serving the coordination service (coordinator.py), kept for the run
_WATCH: list = []  # this process's coordinator.Watch
_TRACKER: list = []  # the run's tracker while it trains (fail_fast), finished when a peer's death ends the run
_SAVES: list = []  # while it trains: whether the run saves checkpoints (what a relaunch after a death resumes from)
WATCH_KEY = "runner/watch_port"
REFUSAL_KEY = "runner/refusal/{}"  # process 0's outcome of a run's checks (one_refusal): its refusal, or NOT_REFUSED
NOT_REFUSED = "not refused"
REFUSAL_WAIT_S = 10  # how long another process that refuses waits for it before it gives its own message in full
_RUNS = [0]  # runs this process has started since it joined; every process counts alike (a sweep in one job step)
_REFUSING: list = []  # while this process ends on a refusal: [True, then who died meanwhile (for its next run)]


def _join_watch(address: str, pid: int, n: int, timeout_s: int) -> None:
    """Every process: connect to the watch of process 0's coordinator child (its port goes through JAX's
    key-value store), so the death of any process ends the others at once (``_peer_died``)."""
    from . import coordinator  # noqa: PLC0415

    client = global_state.client
    if pid == 0:
        client.key_value_set(WATCH_KEY, str(_SERVICE[0][1]))
    port = int(client.blocking_key_value_get(WATCH_KEY, timeout_s * 1000))
    host = address.rsplit(":", 1)[0].strip("[]")
    _WATCH.append(coordinator.Watch("127.0.0.1" if pid == 0 else host, port, pid, _peer_died))


def _peer_died(who: int | None) -> None:
    """On the watch's thread: another process died, or the coordinator is gone. A process ending on its own
    refusal (``one_refusal``) is left to print it, since that says why the run stopped (a peer refused alike may
    exit first); the death ends its next run, should it start one (a sweep)."""
    if _REFUSING:
        _REFUSING.append(who)
        return
    what = (f"another process died (process {who} of {_process()[1]}: killed, or it ended on an error; see "
            f"its log)" if who is not None else
            "the coordination service is gone (process 0's machine or its child died)")
    if _SAVES and not _SAVES[-1]:
        _end(f"{what}. The run saves no checkpoints (checkpoint.interval=0): relaunching every process starts it "
             f"again from step 0 (set checkpoint.interval above 0 for a run a relaunch resumes)")
    else:
        _end(f"{what}. Relaunch every process with the same command to resume from the newest checkpoint")


@contextlib.contextmanager
def one_refusal():
    """Around a run's checks after the join (its data, mesh, memory, checkpoint.dir): a refusal every process meets
    is given in full by process 0 alone, as before the join (``app._check_before_joining``); each other process
    raises one line pointing at it (``errors.said_by_process_0``), of the same type, so it exits with the same code.
    Process 0 puts its outcome (its refusal, or that it met none) in the coordination service's key-value store;
    another process that refuses waits up to ``REFUSAL_WAIT_S`` for it and shortens its own only when process 0
    refused with the very same message. A refusal that process 0 does not meet (this process's own data or
    devices), or meets in other words, or does not report in time (it went on and waits for this process, to
    start the devices or in the checkpoint lock's exchange; or it died), is given in full."""
    client, n, pid = global_state.client, global_state.num_processes, global_state.process_id
    _RUNS[0] += 1
    died = _REFUSING[1:]  # a peer died while the previous run was being refused: this one cannot run without it
    _REFUSING.clear()
    if died:
        _peer_died(died[0])
    if client is None or not n or n < 2:
        yield
        return
    key = REFUSAL_KEY.format(_RUNS[0])
    try:
        yield
    except RunnerError as e:
        _REFUSING.append(True)
        said = f"{type(e).__name__}: {e}"
        if pid == 0:
            _post(client, key, said)
        elif _outcome_of_process_0(client, key) == said:
            raise said_by_process_0(e, pid, "the run") from None
        raise
    except BaseException:  # not a refusal (a bug's traceback, a signal): nothing the others could point at
        if pid == 0:
            _post(client, key, NOT_REFUSED)
        raise
    if pid == 0:
        _post(client, key, NOT_REFUSED)


def _post(client: Any, key: str, value: str) -> None:
    try:
        client.key_value_set(key, value)
    except Exception:  # noqa: BLE001 - the service is gone: the others give their own messages after the wait
        pass


def _outcome_of_process_0(client: Any, key: str) -> str | None:
    try:
        return client.blocking_key_value_get(key, REFUSAL_WAIT_S * 1000)
    except Exception:  # noqa: BLE001 - XLA's deadline or a lost service, as its own runtime error type
        return None


def finished() -> None:
    """This process's run is complete: from now on its exit is not a death the others must stop for."""
    for watch in _WATCH:
        watch.finished()


def _serve(d: Any, address: str, n: int) -> None:
    """Process 0: the coordination service in a child process, so the others outlive process 0's death."""
    from . import coordinator  # noqa: PLC0415

    port = int(address.rsplit(":", 1)[1])
    try:
        _SERVICE.append(coordinator.start(port, n, int(d.heartbeat_timeout_s), int(d.shutdown_timeout_s),
                                          timeout_s=60.0))  # a local start (importing jax), not the peers' wait
    except OSError as e:
        raise DistributedError(f"distributed={d.kind}: process 0 could not serve the coordination service on "
                               f"port {port} ({e}); pick a free port in distributed.coordinator_address") from None


def _wait_for_coordinator(d: Any, address: str, pid: int) -> None:
    """Fail with a clear message if nothing listens at the coordinator address (XLA would abort the process
    with a C++ stack trace instead)."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + d.initialization_timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise DistributedError(_unreachable(d, address, e, pid)) from None
            time.sleep(0.2)


@contextlib.contextmanager
def _no_abort_on_errors():
    """JAX's distributed client ends the process from C++ (a check failure: exit 134 and a stack trace) when the
    coordination service reports an error, such as peers that did not all join within the timeout; given an error
    callback of its own instead, it returns the error from ``connect`` to Python, where it is one message. (A
    peer's death mid-run is this runner's to report: ``coordinator.Watch``.)"""
    from jax._src import distributed as jax_distributed

    make = jax_distributed._jax.get_distributed_runtime_client

    def client(*args, **kwargs):
        kwargs.setdefault("missed_heartbeat_callback", _service_error)
        kwargs.setdefault("shutdown_on_destruction", False)  # JAX shuts a joined client down itself, at exit
        return make(*args, **kwargs)

    jax_distributed._jax.get_distributed_runtime_client = client
    try:
        yield
    except BaseException:  # a client that never joined: JAX's exit hook would shut it down and print its error
        jax_distributed.global_state.client = None
        raise
    finally:
        jax_distributed._jax.get_distributed_runtime_client = make


def _service_error(*status: Any) -> None:
    """The client's error callback: nothing to do here (the error also comes back from the call that met it)."""


def _unreachable(d: Any, where: str, e: BaseException, pid: Any = None) -> str:
    first = first_line(e)
    if "bad_cast" in first:  # the service's error, which the client could not hand to the callback as it is
        first = "not every process joined"
    return (f"distributed={d.kind}: process {d.process_id if pid is None else pid} could not join the run at "
            f"{where} within {d.initialization_timeout_s} s ({first}). Check that process 0 is running and every "
            f"process uses the same coordinator_address and num_processes ({d.num_processes}); raise "
            "distributed.initialization_timeout_s if the processes start far apart")


def check_plan(plan: MeshPlan) -> None:
    """With several processes the mesh must use every device, or some processes would feed nothing."""
    n = jax.device_count()
    if jax.process_count() > 1 and plan.num_devices != n:
        raise DistributedError(
            f"mesh {plan.describe()} uses {plan.num_devices} of the {n} devices of {jax.process_count()} "
            f"processes; a multi-process mesh must span them all: give one axis -1 (e.g. mesh=data or "
            f"mesh=data_table) or sizes whose product is {n}")


@contextlib.contextmanager
def fail_fast(tracker: Any = None, saves: bool = True):
    """Several processes: an error here (most often a collective that failed because a peer died) ends this
    process at once with a clear message and exit code 1 (a runner error: its one line and exit code, as for one
    process); a plain exit would wait for its peers at shutdown and then abort with a C++ stack trace. One
    process: errors propagate unchanged. ``saves``: whether the run saves checkpoints, for the advice on a death."""
    if tracker is not None:
        _TRACKER.append(tracker)
    _SAVES.append(saves)
    try:
        yield
    except Exception as e:  # noqa: BLE001
        if jax.process_count() == 1:
            raise
        peer = any(w in str(e) for w in ("Gloo", "Connection reset", "heartbeat", "Socket closed", "UNAVAILABLE"))
        if isinstance(e, RunnerError) and not peer:  # its own message (training diverged, ...): as one process's
            _end(f"error: {e}", code=exit_code(e))
        else:
            first = re.sub(r"(Error dispatching computation: )+", "", str(e).strip()).splitlines()
            why = ("a collective failed, most likely because another process died or lost its connection; see its "
                   "log" if peer else "see the traceback above")
            _end(f"{type(e).__name__}: {first[0] if first else ''} -- {why}", exc_info=not peer)
    finally:
        _SAVES.pop()
        if tracker in _TRACKER:
            _TRACKER.remove(tracker)


_ENDING = threading.Lock()


def _process() -> tuple[int, int]:
    """(this process's index, the processes' count) as ``jax.distributed`` holds them: ``jax.process_index()``
    would start the devices, or wait for a start that hangs on a peer that died before it."""
    return global_state.process_id or 0, global_state.num_processes or 1


def _end(why: str, exc_info: bool = False, code: int = 1) -> None:
    """End this process now: one message, the tracker finished (at most 10 s), exit ``code`` (1; a runner error's
    own, as one process exits with it). The first caller (a failed collective, or the watch's notice of a death)
    speaks; a second one waits for the exit."""
    if not _ENDING.acquire(blocking=False):
        threading.Event().wait()
    log.error("process %d of %d stopped: %s", *_process(), why, exc_info=exc_info)
    for tracker in list(_TRACKER):
        done = threading.Thread(target=tracker.finish, args=(code,), daemon=True)
        done.start()
        done.join(10)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ----- test/debug output ----------------------------------------------------------------------------------
def leaf_name(path) -> str:
    parts = [getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path]
    return "/".join(str(p) for p in parts)


def dump_state(state: Any, path: str | os.PathLike) -> None:
    """Every leaf of ``state``, gathered, into one ``.npz`` written by process 0 (``distributed.dump_state``).

    Keys are the leaves' paths (``tables/items``, ``emb_states/items/m``, ...). Every process must call it.
    """
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    arrays = {leaf_name(p): np.asarray(fetch(x)) for p, x in leaves}
    if jax.process_index() == 0:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **arrays)
