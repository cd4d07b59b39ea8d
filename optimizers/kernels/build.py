"""Compile ``cpu.cc`` once per machine and register its kernels with XLA (``jax.ffi``).

The shared library is built on first use with the C++ compiler in ``$CXX`` (else ``g++``, ``c++`` or
``clang++`` on the path) against the XLA FFI headers that jaxlib ships (``jax.ffi.include_dir()``), and kept in
a cache folder: ``$OPTIMIZERS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/recsys-runner/kernels``, else
``~/.cache/recsys-runner/kernels``. Its file name carries a hash of the source, the compile command and the
jaxlib version, so an upgrade builds afresh and never loads a stale library. Processes that start together
(test workers, the processes of a multi-process run) build it once: the first takes a file lock, the others
wait for it and load its result. Building takes about 5 s.

When it cannot be built (no compiler, no headers, a read-only cache, a compile error) or
``OPTIMIZERS_CPU_KERNELS=0`` is set, the update runs the XLA ops it would replace, which compute the same
values (about half a millisecond slower per 16K-id batch); ``status()``
says which and why, and a warning says it once per process.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu.cc")
ENV_SWITCH = "OPTIMIZERS_CPU_KERNELS"
SWITCH_ON, SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
ENV_CACHE = "OPTIMIZERS_KERNEL_CACHE"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-w")
# XLA custom-call name -> C symbol
TARGETS = {"rr_dedupe": "RrDedupe", "rr_rowwise_adagrad": "RrRowwiseAdagrad", "rr_adam": "RrAdam"}

_lock = threading.Lock()
_state: dict[str, object] = {}


def cache_dir() -> Path:
    """Where built libraries are kept (see the module's docstring)."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "recsys-runner" / "kernels"


def switch_problem() -> str:
    """"" when ``$OPTIMIZERS_CPU_KERNELS`` is unset or one of 0/1 (false/true, no/yes, off/on), else a message
    naming its value and the fix (the kernels are then off, and the runner refuses to start)."""
    value = os.environ.get(ENV_SWITCH)
    if value is None or value.strip().lower() in SWITCH_ON + SWITCH_OFF:
        return ""
    return (f"{ENV_SWITCH}={value!r} is not 0 or 1 (false/true, no/yes, off/on also do): set it to 0 to run the XLA "
            f"ops instead of the native CPU kernels, or to 1 (or unset it) to use them")


def compiler() -> str | None:
    """The C++ compiler to build with: ``$CXX`` if set, else the first of g++, c++, clang++ on the path."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)


def _build(cxx: str, include: str, out: Path) -> None:
    """Compile into a temporary file beside ``out``, then move it into place (readers never see half a file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *FLAGS, f"-I{include}", str(SOURCE), "-o", tmp], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise RuntimeError(f"{cxx} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> str:
    """Build (or find) and register the kernels; returns "" when they are usable, else why not."""
    if switch_problem():
        return switch_problem()
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in SWITCH_OFF:
        return f"{ENV_SWITCH}={os.environ[ENV_SWITCH]} is set"
    import jax  # noqa: PLC0415
    import jaxlib  # noqa: PLC0415

    include = jax.ffi.include_dir()
    if not (Path(include) / "xla" / "ffi" / "api" / "ffi.h").is_file():
        return f"jaxlib {jaxlib.__version__} ships no XLA FFI headers in {include}"
    cxx = compiler()
    if cxx is None:
        return "no C++ compiler found (set CXX, or install g++)"
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, cxx, jaxlib.__version__)).encode()).hexdigest()[:16]
    lib_path = cache_dir() / f"cpu-{digest}.so"
    try:
        if not lib_path.is_file():
            lib_path.parent.mkdir(parents=True, exist_ok=True)
            with open(lib_path.parent / f"cpu-{digest}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then look again
                if not lib_path.is_file():
                    _build(cxx, include, lib_path)
        lib = ctypes.cdll.LoadLibrary(str(lib_path))
        handlers = {target: getattr(lib, symbol) for target, symbol in TARGETS.items()}
    except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError) as err:
        return f"building {SOURCE.name} into {lib_path} failed: {err}"
    for target, handler in handlers.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu")
    _state["path"] = str(lib_path)
    return ""


def status() -> str:
    """"" when the CPU kernels are built and registered (building them on the first call), else the reason
    the XLA ops run instead."""
    with _lock:
        if "why" not in _state:
            why = _state["why"] = _load()
            if why and not why.endswith(" is set"):  # off by choice: nothing to warn of
                warnings.warn(f"the fused update's CPU kernels are off ({why}); the XLA ops that compute the same "
                              f"values run instead, a little slower. Set {ENV_SWITCH}=0 to choose that and silence "
                              "this warning.", RuntimeWarning, stacklevel=3)
        return str(_state["why"])


def library_path() -> str | None:
    """The loaded library's file, or None when the kernels are off."""
    return str(_state["path"]) if not status() else None
