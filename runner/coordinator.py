"""The jax.distributed coordination service in a process of its own, and a watch on every process.

JAX runs the service inside process 0. When process 0 is killed, the other processes lose it mid-step and
XLA's client ends them with a fatal error (SIGABRT and a C++ stack trace) before they can say what happened;
a Python callback for that case cannot be installed (jaxlib 0.10.2 aborts converting its argument). So the
service runs in a small child of process 0 that outlives it by ``GRACE_S`` seconds, and beside it a watch:
every process keeps one TCP connection to the child and says ``bye`` when its run has finished. A connection
that closes without it is a process that died (killed, or ended on an error); the child tells every other
process at once, and each ends with exit code 1 and one message naming the dead process (``Watch``), well
before any XLA timeout.

The child is ``python -m runner.coordinator PORT NUM_PROCESSES HEARTBEAT_S SHUTDOWN_S``; its first line of
output is the watch's port. It serves until its stdin (a pipe from process 0) closes, which happens when
process 0 exits for any reason, then ``GRACE_S`` more seconds. SIGTERM and SIGINT do not stop it: runners
stopping on SIGTERM still need it for their last checkpoint.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

GRACE_S = 5.0  # how long the service outlives process 0, so the others learn of its death from the watch


def start(port: int, num_processes: int, heartbeat_s: int, shutdown_s: int,
          timeout_s: float) -> tuple[subprocess.Popen, int]:
    """Start the service's process; return it and the watch's port once the service listens on ``port``
    (the child prints the watch's port only after the service has started)."""
    child = subprocess.Popen([sys.executable, "-m", "runner.coordinator", str(port), str(num_processes),
                              str(heartbeat_s), str(shutdown_s)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
    ready, _, _ = select.select([child.stdout], [], [], timeout_s)
    line = child.stdout.readline().decode() if ready else ""
    if line.strip().isdigit():
        return child, int(line)
    child.kill()
    raise OSError(f"it exited with code {child.wait()}: is the port in use?" if ready else
                  f"it did not start within {timeout_s:g} s")


class Watch:
    """This process's connection to the watch: ``on_death(pid)`` runs (on a thread of its own) when the
    child reports that process ``pid`` died, or with ``None`` when the child itself is gone."""

    def __init__(self, host: str, port: int, pid: int, on_death: Callable[[int | None], None]):
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.settimeout(None)
        self.sock.sendall(f"hello {pid}\n".encode())
        self.done = False
        threading.Thread(target=self._listen, args=(on_death,), name="runner-watch", daemon=True).start()

    def _listen(self, on_death: Callable[[int | None], None]) -> None:
        data = b""
        while b"\n" not in data:
            chunk = self.sock.recv(64)
            if not chunk:
                if not self.done:
                    on_death(None)
                return
            data += chunk
        word, _, who = data.decode().partition(" ")
        if word == "died" and not self.done:
            on_death(int(who))

    def finished(self) -> None:
        """This process's run has finished: its exit is not a death."""
        self.done = True
        try:
            self.sock.sendall(b"bye\n")
        except OSError:
            pass


def _serve_watch(server: socket.socket) -> None:
    conns: dict[int, socket.socket] = {}
    lock, told = threading.Lock(), [False]

    def died(pid: int) -> None:
        with lock:
            if told[0]:
                return
            told[0] = True
            others = [c for p, c in conns.items() if p != pid]
        for c in others:
            try:
                c.sendall(f"died {pid}\n".encode())
            except OSError:
                pass

    def follow(conn: socket.socket) -> None:
        data = b""
        while b"\n" not in data:
            chunk = conn.recv(64)
            if not chunk:
                return
            data += chunk
        pid = int(data.split()[1])
        with lock:
            conns[pid] = conn
        rest = data.split(b"\n", 1)[1]
        while True:
            if b"bye" in rest:
                return
            chunk = conn.recv(64)
            if not chunk:
                died(pid)
                return
            rest += chunk

    while True:
        conn, _ = server.accept()
        threading.Thread(target=follow, args=(conn,), daemon=True).start()


def main(argv: list[str]) -> int:
    port, n, heartbeat, shutdown = (int(a) for a in argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from jax._src.lib import _jax  # noqa: PLC0415 - the service only; no backend is started here

    server = socket.create_server(("", 0), family=socket.AF_INET)
    _service = _jax.get_distributed_runtime_service(f"[::]:{port}", n, heartbeat_timeout=heartbeat,
                                                    shutdown_timeout=shutdown)
    threading.Thread(target=_serve_watch, args=(server,), daemon=True).start()
    print(server.getsockname()[1], flush=True)
    sys.stdin.buffer.read()  # until process 0 exits
    time.sleep(GRACE_S)
    os._exit(0)  # not the service's destructor, which would wait for clients that are gone


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
