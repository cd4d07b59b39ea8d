"""Start N training processes on this machine: ``python -m runner.launch -n 2 -- <runner overrides>``.

Each child is ``python -m runner distributed=local distributed.process_id=i distributed.num_processes=N
distributed.coordinator_address=127.0.0.1:<free port> hydra.run.dir=<one shared dir> <overrides>``. Their
output is streamed line by line with a ``[p<i>]`` prefix. Process 0 writes metrics.jsonl, W&B and the
summary; process i > 0 logs to ``<run dir>/runner_p<i>.log`` and keeps its Hydra files in ``.hydra_p<i>/``.

If any child fails (non-zero exit or killed), the others are stopped (SIGTERM, then SIGKILL after
``--grace`` seconds) and the launcher exits with the failed child's code; otherwise it exits 0.

Ctrl-C stops them together: the terminal sends SIGINT to the launcher and every child, but the children are
started with SIGINT ignored, and the launcher turns it into SIGTERM for all of them, so they stop at one step
boundary with one checkpoint (when checkpoints are on) as for a scheduler's SIGTERM; the launcher exits 130. A
second Ctrl-C stops them at once (SIGKILL; checkpoints already committed stay usable).
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from .command_line import OneLineParser


MAX_PROCESSES = 256  # processes on one machine; more is a typo, not a plan


GRACE_S = 30.0  # SIGTERM asks each runner to stop at its next step and save; SIGKILL only after this long


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now; another program may take it at any moment (``reserved_port`` keeps it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def reserved_port(host: str = "127.0.0.1"):
    """A free port, kept from other programs until the block ends. Process 0 serves the coordinator seconds after
    the port is picked (it imports JAX first); a port only picked, as ``free_port`` does, may meanwhile become the
    local end of any program's outgoing connection (gloo's, a browser's), and process 0 then cannot serve on it.
    On Linux a socket bound with SO_REUSEPORT holds it: the kernel gives a held port to no connection and to no
    other bind, except one with SO_REUSEPORT by the same user, which is how the coordination service (gRPC) binds.
    Elsewhere the port is only picked."""
    if not (sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")):
        yield free_port(host)
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, 0))
        yield s.getsockname()[1]


def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why process 0 could not serve the coordinator on ``port`` (None: it can, as of now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def override_key(override: str) -> str:
    """The key a command-line override sets (``+a.b=1``, ``~a.b`` and ``a.b=1`` all set ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def child_commands(n: int, overrides: Sequence[str], port: int, run_dir: str | None = None,
                   python: str = sys.executable) -> list[list[str]]:
    """The command line of every process: the user's overrides last, so they win over ours."""
    given = {override_key(o) for o in overrides}
    if run_dir is None and "hydra.run.dir" not in given:
        run_dir = datetime.datetime.now().strftime("outputs/%Y-%m-%d/%H-%M-%S")  # Hydra's default, shared
    cmds = []
    for i in range(n):
        cmd = [python, "-m", "runner", "distributed=local", f"distributed.process_id={i}",
               f"distributed.num_processes={n}", f"distributed.coordinator_address=127.0.0.1:{port}"]
        if run_dir is not None:
            cmd.append(f"hydra.run.dir={run_dir}")
        if i > 0:
            cmd += [f"hydra.job.name=runner_p{i}", f"hydra.output_subdir=.hydra_p{i}"]
        cmds.append(cmd + list(overrides))
    return cmds


def _pump(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


def _exit_code(returncode: int) -> int:
    return returncode if returncode > 0 else 128 - returncode  # killed by signal s: 128 + s, as a shell says


def supervise(cmds: Sequence[Sequence[str]], *, grace: float = GRACE_S, out: IO[str] | None = None,
              env: dict | None = None, envs: Sequence[dict] | None = None, poll: float = 0.1) -> int:
    """Run ``cmds`` concurrently, prefixing their output; the first failure stops the rest. Returns the exit
    code: 0 when every process succeeded, else the first failed process's code. ``envs`` adds per-process
    variables to ``env`` (default: this process's environment)."""
    out = out or sys.stdout
    lock = threading.Lock()
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    procs, pumps = [], []

    def say(line: str) -> None:
        with lock:
            out.write(f"[launch] {line}\n")
            out.flush()

    # The children inherit SIGINT ignored (an ignored signal stays ignored across exec, and Python then installs
    # no KeyboardInterrupt handler): a terminal's Ctrl-C reaches them too, and only the launcher acts on it.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for i, cmd in enumerate(cmds):
            p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env={**env, **(envs[i] if envs else {})})
            t = threading.Thread(target=_pump, args=(p.stdout, f"[p{i}] ", out, lock), daemon=True)
            t.start()
            procs.append(p)
            pumps.append(t)
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    code = 0
    try:
        while [p.poll() for p in procs].count(None):  # poll every child (any() would stop at the first)
            failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                i, rc = failed[0]
                say(f"process {i} exited with code {rc}; stopping the others")
                code = _exit_code(rc)
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        code = 130  # 128 + SIGINT, whatever the children's own codes (143: stopped by the launcher's SIGTERM)
        say("Ctrl-C: every process stops after its current step (with a checkpoint if checkpoints are on); "
            "Ctrl-C again stops them at once")
    finally:
        _stop(procs, grace, say)
        for t in pumps:
            t.join(timeout=5)
    if code == 0:
        bad = [p.returncode for p in procs if p.returncode != 0]
        code = _exit_code(bad[0]) if bad else 0
    return code


def _stop(procs: Sequence[subprocess.Popen], grace: float, say) -> None:
    """SIGTERM to every live child, SIGKILL to those still running after ``grace`` seconds, or at once on a
    Ctrl-C while waiting."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    try:
        for p in alive:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    except KeyboardInterrupt:
        for p in alive:
            if p.poll() is None:
                p.kill()
        for p in alive:
            p.wait()
        say("Ctrl-C again: stopped every process at once; checkpoints already committed stay usable")


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m runner.launch", description=__doc__.split("\n\n")[0],
        epilog="example: python -m runner.launch -n 2 -- mesh=data_table mesh.cpu_devices=4 optimizer=async_adam")
    parser.add_argument("-n", "--num-processes", type=int, required=True, help="processes to start")
    parser.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    parser.add_argument("--grace", type=float, default=GRACE_S,
                        help=f"seconds between SIGTERM and SIGKILL (default {GRACE_S:g}: the processes stop at the next "
                             "step and save a checkpoint when one is configured)")
    parser.add_argument("overrides", nargs="*", help="runner overrides, after --")
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    if args.num_processes < 1:
        parser.error(f"-n {args.num_processes}: need at least one process")
    if args.num_processes > MAX_PROCESSES:
        parser.error(f"-n {args.num_processes}: at most {MAX_PROCESSES} processes on one machine (for more, use "
                     f"distributed=slurm or distributed=manual)")
    if args.port is not None and not 1 <= args.port <= 65535:
        parser.error(f"--port {args.port}: a TCP port must be in 1..65535 (or leave it out for a free one)")
    taken = port_problem(args.port) if args.port is not None and 1 <= args.port <= 65535 else None
    if taken:
        parser.error(f"--port {args.port}: the coordinator cannot listen there ({taken}; another run may hold it); "
                     f"pick another, or leave --port out for a free one")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        parser.error(f"--grace {args.grace}: must be a finite number of seconds >= 0")
    if args.overrides and "--" not in raw:
        parser.error(f"runner overrides go after --, e.g. python -m runner.launch -n {args.num_processes} -- "
                     f"{' '.join(args.overrides)}")
    sweep = [o for o in args.overrides if o in ("-m", "--multirun") or o.startswith("hydra.mode=")]
    if sweep:
        parser.error(f"{sweep[0]}: runner.launch runs one training over {args.num_processes} processes, not a sweep; "
                     f"launch each trial on its own (python -m runner.launch -n {args.num_processes} -- <that "
                     f"trial's overrides>), or sweep one process at a time (python -m runner -m ...)")
    flags = [o for o in args.overrides if o.startswith("-") and o not in ("-m", "--multirun")]
    if flags:
        parser.error(f"{flags[0]}: a flag of python -m runner, not an override, and runner.launch starts training "
                     f"processes; use it with python -m runner alone (e.g. python -m runner --cfg job <overrides> "
                     f"prints the config)")
    ours = ("distributed", "distributed.process_id", "distributed.num_processes", "distributed.coordinator_address")
    taken_over = [o for o in args.overrides if override_key(o) in ours]
    if taken_over:
        parser.error(f"{taken_over[0]}: runner.launch sets distributed=local and each process's id, their count "
                     f"and the coordinator itself (-n, --port); leave it out. Its other settings (such as "
                     f"distributed.initialization_timeout_s) may be given")
    signal.signal(signal.SIGTERM, _terminated)  # a scheduler stopping the launcher stops the children too
    with reserved_port() if args.port is None else contextlib.nullcontext(args.port) as port:
        cmds = child_commands(args.num_processes, args.overrides, port)
        refused = refusal(cmds[-1])
        if refused is not None:
            print(f"error: {refused}", file=sys.stderr)
            return 2
        return supervise(cmds, grace=args.grace)


def refusal(cmd: Sequence[str]) -> str | None:
    """Why ``python -m runner`` would refuse the overrides of the child command ``cmd`` before its run starts, in its
    own words (``runner.__main__.refusal``), else None. Every child gets the same overrides but for its id and
    its Hydra file names, so one check answers for all of them: a bad override is said once, with exit code 2,
    and no process starts. With ``HYDRA_FULL_ERROR=1`` each process gives Hydra's full report, as the runner does;
    a command that is not ``python -m runner`` (``child_commands`` replaced) is not checked."""
    from runner import __main__ as runner_main
    from runner.override_errors import full_error

    if full_error() or "runner" not in cmd:
        return None
    return runner_main.refusal(list(cmd[cmd.index("runner") + 1:]))


def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through supervise(), whose cleanup stops every child


if __name__ == "__main__":
    sys.exit(main())
