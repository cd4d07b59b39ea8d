"""Checkpoint save and restore of a 10M x 64 table with row-wise Adagrad state, through the runner's own path
(``runner.checkpoint``: Orbax CheckpointManager, tensorstore zarr3/OCDBT, digests), against plain numpy
``np.save`` / ``np.load`` of the same arrays to the same disk as the reference.

In one fresh process (8 virtual CPU devices, the run itself on one): build the ranking program with the
``items`` table at 10M rows, initialise it, run one async train step (so the deferred update is real), then
  - save: ``Checkpoints.save`` (digest pass + blocking copy, the part training waits for), then ``wait``
    (until the rename commits it); one warm-up save first, then ``rounds`` timed ones;
  - restore: a fresh ``open_checkpoints(resume=auto)`` on the same layout (read + digest check), and one onto
    a 2x4 mesh with the table row-sharded (read straight into the shards);
  - the reference: ``np.save`` of every array of the state (host copy included), then ``np.load``;
  - on the 2x4 mesh (the reshard phase's state): saves with the runner's type handlers (one replica of each
    shard written) against Orbax's default replica-parallel ones, taking turns, each with its peak RSS.
Sizes are the step directory on disk against the state's bytes; peak RSS is the process's, against them.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from . import common
from .trainer import compose

FULL = dict(vocab=10_000_000, width=64, batch=1024, rounds=3)
QUICK = dict(vocab=200_000, width=16, batch=256, rounds=2)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _program(cfg: dict, work: Path, extra: list[str]):
    from runner.build import build

    conf = compose([
        "optimizer=async_rowwise_adagrad", "async_emb=on", f"model.emb_width={cfg['width']}",
        f"model.tables.items.vocab={cfg['vocab']}", f"trainer.batch_size={cfg['batch']}", "checkpoint.interval=1",
        "checkpoint.keep=10", f"checkpoint.dir={work / 'ck'}", *extra])
    return (conf, *build(conf))


def child(cfg: dict) -> dict:
    """One phase in a fresh process (its own peak RSS): ``save`` writes the checkpoints the ``restore`` and
    ``reshard`` phases then read. ``all`` (quick: a smoke run) runs the three in this one process."""
    common.set_cpu_devices(8)
    if cfg["phase"] == "all":
        r = {"save": child({**cfg, "phase": "save"})}
        for phase in ("restore", "reshard"):
            r[phase] = child({**cfg, "phase": phase, "last": r["save"]["last"]})
        return r
    import jax
    import numpy as np

    from runner.checkpoint import meta as checkpoint_meta
    from runner.checkpoint import open_checkpoints
    from runner.core.loop import to_device

    work, phase = Path(cfg["work"]), cfg["phase"]
    if phase != "save":
        extra = ["mesh=single"] if phase == "restore" else [
            "mesh=data_table", "mesh.axes={data:2,table:4}", "mesh.table_layout=row", "checkpoint.interval=0",
            f"checkpoint.resume={work / 'ck' / str(cfg['last'])}"]
        conf, program, _, plan = _program(cfg, work, extra)
        base = common.rss_bytes()
        t = time.perf_counter()
        restored, start, _ = open_checkpoints(conf, program, plan, work / phase).resume_point()
        jax.block_until_ready(restored)
        seconds = time.perf_counter() - t
        assert start == cfg["last"] and restored.tables["items"].shape[0] == program.tables["items"].rows
        r = {"seconds": seconds, "base_rss": base, "peak_rss": common.peak_rss_bytes()}
        if phase == "reshard":  # the state now on the 2x4 mesh, its tables replicated over the data axis
            r["mesh_saves"] = _mesh_saves(restored, work / "mesh", cfg["rounds"])
        return r

    conf, program, task, plan = _program(cfg, work, ["mesh=single"])
    t = time.perf_counter()
    state = program.init_state(0)
    jax.block_until_ready(state)
    t_init = time.perf_counter() - t
    batch = to_device(program, task.batch(0, cfg["batch"]))
    step, _, _ = program.compile(state, batch)
    state, _ = step(state, batch)  # a real deferred update in the state
    jax.block_until_ready(state)
    tables = checkpoint_meta.tables_of(program)
    checkpoint_meta.digests(state, tables)  # compile once
    t = time.perf_counter()
    checkpoint_meta.digests(state, tables)
    t_digest = time.perf_counter() - t

    base = common.rss_bytes()
    ck = open_checkpoints(conf, program, plan, work / "out")
    blocking, total = [], []
    for i in range(cfg["rounds"] + 1):  # the first save is the warm-up
        state = state._replace(step=state.step + 1)
        t = time.perf_counter()
        ck.save(int(state.step), state)
        t_block = time.perf_counter() - t
        ck.wait()
        if i:
            blocking.append(t_block)
            total.append(time.perf_counter() - t)
    ck.close()
    last = int(state.step)
    peak = common.peak_rss_bytes()

    t = time.perf_counter()
    ref = work / "npy"
    ref.mkdir()
    for i, x in enumerate(jax.tree_util.tree_leaves(jax.device_get(state))):
        np.save(ref / f"{i}.npy", x)
    t_npsave = time.perf_counter() - t
    t = time.perf_counter()
    loaded = [np.load(f) for f in sorted(ref.iterdir())]
    t_npload = time.perf_counter() - t
    del loaded
    return {"state_bytes": common.tree_bytes(state), "disk_bytes": _du(work / "ck" / str(last)), "last": last,
            "init_s": t_init, "digest_s": t_digest, "save_blocking_s": blocking, "save_total_s": total,
            "np_save_s": t_npsave, "np_load_s": t_npload, "base_rss": base, "peak_rss": peak}


def _mesh_saves(state, work: Path, rounds: int) -> dict:
    """Saves of the 2x4 mesh's state (asynchronous Orbax PyTree saves as the runner's default, its format) with the runner's
    type handlers (``runner.checkpoint.handlers.type_handlers``: one replica of each shard written, in one
    process) against Orbax's default ones (replica-parallel: each replica cuts and writes its slice on the
    device), taking turns; the first round of each is a warm-up. Per save: the seconds until ``save`` returns
    (training waits that long) and until the write is done, and the peak RSS above the RSS before it (a fresh
    peak window per save)."""
    import orbax.checkpoint as ocp

    from runner.checkpoint.handlers import type_handlers

    variants = {"runner": type_handlers(), "orbax_default": None}
    out = {name: {"seconds": [], "blocking": [], "peak_above": []} for name in variants}
    for i in range(rounds + 1):
        for name, registry in variants.items():
            handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False,
                                                  **({} if registry is None else {"type_handler_registry": registry}))
            path = work / f"{name}-{i}"
            windowed = common.reset_peak_rss()
            before = common.rss_bytes()
            saver = ocp.AsyncCheckpointer(handler)
            t = time.perf_counter()
            saver.save(path, args=ocp.args.PyTreeSave(state))
            blocking = time.perf_counter() - t
            saver.wait_until_finished()
            seconds = time.perf_counter() - t
            saver.close()
            # the kernel's high-water mark can trail an RSS read in the window (memory given back by madvise
            # does not update it), so the window's peak is at least that RSS
            peak = max(common.window_peak_rss_bytes(), before) if windowed else None
            shutil.rmtree(path, ignore_errors=True)
            if i:
                out[name]["seconds"].append(seconds)
                out[name]["blocking"].append(blocking)
                out[name]["peak_above"].append(None if peak is None else peak - before)
    return out


def run(quick: bool, out: Path) -> dict:
    cfg = QUICK if quick else FULL
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    try:
        if quick:  # one process for the three phases: its peak RSS is not each phase's own
            r = common.run_child("checkpoint", {**cfg, "work": str(work), "phase": "all"}, timeout=3600)
        else:
            r = {"save": common.run_child("checkpoint", {**cfg, "work": str(work), "phase": "save"}, timeout=3600)}
            for phase in ("restore", "reshard"):
                r[phase] = common.run_child("checkpoint", {**cfg, "work": str(work), "phase": phase,
                                                           "last": r["save"]["last"]}, timeout=3600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data = {"config": cfg, "result": r, "machine": common.machine_line()}
    report(out, data)
    return data


def _mesh_rows(saves: dict | None, nbytes: int, gb: float) -> list[list[str]]:
    """The 2x4 mesh's saves, the runner's type handlers against Orbax's default (``_mesh_saves``)."""
    if not saves:
        return []
    import statistics

    rows, own = [], statistics.median(saves["runner"]["seconds"])
    for name, label in (("runner", "save on the 2x4 mesh, one replica of each shard (the runner's)"),
                        ("orbax_default", "save on the 2x4 mesh, replica-parallel (Orbax's default)")):
        s = saves[name]
        secs = statistics.median(s["seconds"])
        peaks = [p for p in s["peak_above"] if p is not None]
        rows.append([label, f"{secs:.2f} ({min(s['seconds']):.2f}-{max(s['seconds']):.2f}); blocking "
                            f"{statistics.median(s['blocking']):.2f}", f"{gb / secs:.2f}",
                     f"{secs / own:.2f}x the runner's", f"{max(peaks) / nbytes:.2f}" if peaks else "n/a"])
    return rows


def report(out: Path, data: dict) -> None:
    import statistics

    r = data["result"]
    sv, rs, rh = r["save"], r["restore"], r["reshard"]
    nbytes = sv["state_bytes"]
    gb = nbytes / 1e9
    block, total = statistics.median(sv["save_blocking_s"]), statistics.median(sv["save_total_s"])
    extra = lambda p: f"{(p['peak_rss'] - p['base_rss']) / nbytes:.2f}"  # noqa: E731
    rows = [
        ["save, blocking (training waits)", f"{block:.2f}", f"{gb / block:.2f}",
         f"{block / sv['np_save_s']:.2f}x np.save", ""],
        ["save, until committed", f"{total:.2f}", f"{gb / total:.2f}", f"{total / sv['np_save_s']:.2f}x np.save",
         extra(sv)],
        ["restore, same layout (read + digest check)", f"{rs['seconds']:.2f}", f"{gb / rs['seconds']:.2f}",
         f"{rs['seconds'] / sv['np_load_s']:.2f}x np.load", extra(rs)],
        ["restore onto a 2x4 mesh, row-sharded", f"{rh['seconds']:.2f}", f"{gb / rh['seconds']:.2f}",
         f"{rh['seconds'] / sv['np_load_s']:.2f}x np.load", extra(rh)],
        *_mesh_rows(rh.get("mesh_saves"), nbytes, gb),
        ["digest pass over the state (in save and restore)", f"{sv['digest_s']:.2f}", f"{gb / sv['digest_s']:.2f}",
         f"{sv['digest_s'] / total:.2f}x save", ""],
        ["reference: np.save of the same arrays", f"{sv['np_save_s']:.2f}", f"{gb / sv['np_save_s']:.2f}", "1", ""],
        ["reference: np.load", f"{sv['np_load_s']:.2f}", f"{gb / sv['np_load_s']:.2f}", "1", ""],
    ]
    c = data["config"]
    body = (
        f"Table {c['vocab']:,} x {c['width']} float32 with row-wise Adagrad state (accumulator + last step per "
        f"row), plus the two small tables, dense params, optax state and the deferred update: "
        f"{nbytes / 2**30:.2f} GiB in all. Saves: median of {c['rounds']} after a warm-up; restores: one each, "
        f"in a fresh process. The saves on the 2x4 mesh: the state restored there (tables row-sharded over 4 "
        f"devices, each shard replicated over the data axis of 2), saved in the background as the runner does "
        f"by default, with its type handlers and with Orbax's default ones in turns: until written, median "
        f"(min-max) of {c['rounds']} after a warm-up each, and the median time training waits (blocking); their "
        f"peak is the RSS during the save above the RSS before it. {data['machine']}.\n\n"
        + common.md_table(["operation", "seconds", "GB/s", "ratio", "peak RSS above baseline / state"], rows)
        + f"\n\nOn disk: {sv['disk_bytes'] / 2**30:.2f} GiB per checkpoint, {sv['disk_bytes'] / nbytes:.2f}x the "
        f"state's bytes (uncompressed; `checkpoint.compress=true` adds zstd). Initialising the table took "
        f"{sv['init_s']:.1f} s.\n")
    common.write_result(out, "checkpoint", "Checkpoint save and restore (10M x 64, row-wise Adagrad)", body, data)
    print(body)


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
