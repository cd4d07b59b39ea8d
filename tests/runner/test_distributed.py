"""Several processes on this machine (jax.distributed over localhost, gloo collectives): 2 processes x 4 CPU
devices train like 1 process x 8 devices, only process 0 writes outputs, each process feeds exactly its rows
of the global batch, SLURM's environment is detected, and a dead peer or coordinator ends the run."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from runner import coordinator, distributed
from runner.app import run
from runner.build import build
from runner.checkpoint import open_checkpoints
from runner.launch import child_commands, free_port, reserved_port, supervise
from tests.runner.support import TINY, compose_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = TINY + ["logger=wandb"]  # the tiny run with the default logger; each test sets its steps and intervals
BASE = SMALL + ["trainer.steps=4", "trainer.log_interval=1", "trainer.eval_interval=2", "distributed.dump_state=true"]
ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
# 8 column shards spanning both processes: every exchange of the step crosses the process boundary (a mesh whose
# table axis stays inside each process, as mesh=data_table's, only adds the data axis's reductions, which the
# preemption and checkpoint tests' multi-process runs on mesh=data exercise)
MULTI = ["async_emb=on", "optimizer=async_adam", "mesh=table", "mesh.table_layout=column"]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class _Capture:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def slurm_step(run_dir: Path, *overrides: str) -> str:
    """Two processes as `srun --ntasks=2` starts them: SLURM's variables, `distributed=slurm`, no addresses."""
    with reserved_port() as port:
        return _slurm_step(run_dir, port, *overrides)


def _slurm_step(run_dir: Path, port: int, *overrides: str) -> str:
    envs = [{"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
             "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "JAX_COORDINATOR_PORT": str(port)} for i in range(2)]
    cmd = [sys.executable, "-m", "runner", "distributed=slurm", f"hydra.run.dir={run_dir}", *overrides]
    out = _Capture()
    code = supervise([cmd, cmd + ["hydra.job.name=runner_p1", "hydra.output_subdir=.hydra_p1"]], out=out,
                     env=ENV, envs=envs)
    assert code == 0, out.text[-4000:]
    return out.text


def restore_in_one_process(source: Path, overrides: list[str], out: Path) -> tuple[dict, int]:
    """The checkpoint at ``source`` read into a one-process program (this test process, 8 devices)."""
    cfg = compose_config(overrides + [f"checkpoint.resume={source}", "checkpoint.interval=0", "logger=none"],
                         tiny=False)
    program, _, plan = build(cfg)
    state, start, _ = open_checkpoints(cfg, program, plan, out).resume_point()
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {distributed.leaf_name(p): np.asarray(x) for p, x in leaves}, start


@pytest.mark.slow
def test_two_processes_train_like_one_process(tmp_path):
    """Started as SLURM's srun starts them (``python -m runner.launch`` starts the preemption tests' runs)."""
    multi, single = tmp_path / "multi", tmp_path / "single"
    over = BASE + MULTI
    out = slurm_step(multi, *over, "mesh.cpu_devices=4", "logger=wandb",
                     "checkpoint.interval=4", f"checkpoint.dir={tmp_path / 'ck'}")  # one save: step 4
    run(compose_config(over + ["mesh.cpu_devices=8", "logger=none"], tiny=False), single)  # 1 process, 8 devices

    a, b = np.load(multi / "final_state.npz"), np.load(single / "final_state.npz")
    assert sorted(a.files) == sorted(b.files) and any(k.startswith("emb_states/") for k in a.files)
    for k in a.files:
        if a[k].dtype.kind in "biu":
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:  # cross-process reductions add in another order: equal up to float rounding
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7, err_msg=k)

    got, want = rows(multi), rows(single)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4, 4]
    for g, w in zip(got, want):
        for key in ("train/loss", "train/auc_mean", "emb/grad_norm", "valid/auc_mean", "test/loss"):
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), (g["step"], key)

    # process 0 alone writes W&B, metrics and the summary, and speaks for the run
    assert len(list(multi.glob("wandb/offline-run-*"))) == 1
    assert len(list(multi.rglob("metrics.jsonl"))) == 1 and len(list(multi.rglob("summary.json"))) == 1
    assert "[p0]" in out and "[p1]" in out
    assert "(2 processes x 4 devices)" in out and "done: 4 steps" in out
    assert not [ln for ln in out.splitlines() if ln.startswith("[p1]") and ("step " in ln or "done:" in ln)]
    assert (multi / "runner.log").exists() and (multi / "runner_p1.log").exists()

    # the final checkpoint, written by both processes together, restores in one process bit for bit
    restored, step = restore_in_one_process(tmp_path / "ck" / "4", over + ["mesh.cpu_devices=8"], tmp_path / "r")
    assert step == 4 and sorted(restored) == sorted(a.files)
    for k in a.files:
        np.testing.assert_array_equal(restored[k], a[k], err_msg=k)


LAYOUT_CHECK = r"""
import sys
import jax
import numpy as np
from omegaconf import OmegaConf
from runner import coordinator, distributed
from runner.core import placement
from runner.config import DistributedConfig
from runner.tasks.ranking.synthetic import SyntheticRanking, SyntheticSpec
from runner.core.mesh import MeshPlan, build_mesh

pid, port = int(sys.argv[1]), sys.argv[2]
jax.config.update("jax_num_cpu_devices", 4)
distributed.initialize(OmegaConf.structured(DistributedConfig(
    kind="local", coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)))
data = SyntheticRanking(SyntheticSpec(num_users=300, num_items=500, num_authors=50, history_len=4))
B = 64
for axes in ((("data", 4), ("table", 2)), (("table", 8),), (("data", 8),)):
    mesh = build_mesh(MeshPlan(axes, None, "row"))
    shard, n = placement.batch_shard(mesh, B)
    assert (shard, n) == (pid, 2), (axes, shard, n)
    local = data.batch(3, B, shard=shard, num_shards=n)
    full = data.batch(3, B)
    fed = placement.fetch(placement.put_local(mesh, local, B))
    whole = placement.fetch(placement.put_global(mesh, full))
    rows = placement.gather_rows(mesh, local, B)
    for k in full:
        np.testing.assert_array_equal(fed[k], full[k], err_msg=k)
        np.testing.assert_array_equal(whole[k], full[k], err_msg=k)
        np.testing.assert_array_equal(rows[k], full[k], err_msg=k)
    summed = jax.jit(lambda x: x.sum())(placement.put_local(mesh, local, B)["user"])
    assert int(placement.fetch(summed)) == int(full["user"].sum())
print("layout ok", pid)
"""


@pytest.mark.slow
def test_each_process_feeds_its_rows_and_the_global_batch_equals_one_process():
    out = _Capture()
    with reserved_port() as port:
        cmds = [[sys.executable, "-c", LAYOUT_CHECK, str(i), str(port)] for i in range(2)]
        code = supervise(cmds, out=out, env={**ENV, "PYTHONPATH": str(ROOT)})
    assert code == 0, out.text
    assert "[p0] layout ok 0" in out.text and "[p1] layout ok 1" in out.text


def _runner(tmp_path: Path, pid: int, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "runner", "distributed=local", f"distributed.process_id={pid}",
           "distributed.num_processes=2", f"distributed.coordinator_address=127.0.0.1:{port}",
           f"hydra.run.dir={tmp_path}", *LONG, *extra]
    if pid:
        cmd += [f"hydra.job.name=runner_p{pid}", f"hydra.output_subdir=.hydra_p{pid}"]
    log = open(tmp_path / f"p{pid}.out", "w")
    return subprocess.Popen(cmd, cwd=ROOT, env={**ENV, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)


LONG = TINY + ["mesh=data", "trainer.steps=100000", "trainer.log_interval=5",
                "trainer.eval_interval=100000"]


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_a_dead_process_ends_the_others_with_an_error(tmp_path, victim):
    ck = tmp_path / "ck"
    with reserved_port() as port:
        _a_dead_process_ends_the_others(tmp_path, ck, port, victim)


def _a_dead_process_ends_the_others(tmp_path, ck, port, victim):
    procs = [_runner(tmp_path, i, port, "mesh.cpu_devices=1", "distributed.heartbeat_timeout_s=6",
                     "checkpoint.interval=5", f"checkpoint.dir={ck}") for i in range(2)]
    try:
        deadline = time.monotonic() + 300
        while not (ck / "5").is_dir():  # both are training and have committed a checkpoint
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                (tmp_path / "p0.out").read_text()[-3000:]
            time.sleep(0.5)
        procs[victim].send_signal(signal.SIGKILL)
        survivor = procs[1 - victim]
        code = survivor.wait(timeout=120)  # heartbeat 6 s: a hang would hit this timeout instead
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = (tmp_path / f"p{1 - victim}.out").read_text()
    assert code == 1, text[-3000:]  # not SIGABRT (-6): process 0's death used to take the coordination service along
    assert f"process {1 - victim} of 2 stopped: " in text and "another process died" in text, text[-3000:]
    assert not any(w in text for w in ("Traceback", "Check failure stack trace", "Terminating process")), text[-3000:]
    # the newest complete checkpoint is usable: it restores in one process
    restored, step = restore_in_one_process(ck, LONG + ["mesh.cpu_devices=8"], tmp_path / "r")
    assert step >= 5 and step % 5 == 0 and int(restored["step"]) == step


@pytest.mark.slow
def test_an_unreachable_coordinator_is_a_clear_error(tmp_path):
    port = free_port()  # nobody listens there
    proc = subprocess.run([sys.executable, "-m", "runner", "distributed=local", "distributed.process_id=1",
                           "distributed.num_processes=2", f"distributed.coordinator_address=127.0.0.1:{port}",
                           "distributed.initialization_timeout_s=1", f"hydra.run.dir={tmp_path}", *TINY],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert (f"error: distributed=local: process 1 could not join the run at 127.0.0.1:{port} within 1 s"
            in proc.stderr), proc.stderr[-3000:]
    assert "Check that process 0 is running" in proc.stderr


@pytest.mark.slow
def test_a_peer_that_never_joins_ends_process_0(tmp_path):
    with reserved_port() as port:
        proc = _runner(tmp_path, 0, port, "mesh.cpu_devices=1", "distributed.initialization_timeout_s=1")
        try:
            code = proc.wait(timeout=120)  # XLA gives up after the timeout, plus ~5 s of its own (and aborts it)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = (tmp_path / "p0.out").read_text()
    assert code != 0
    assert "process 0 of 2 joining at 127.0.0.1" in text and "DEADLINE_EXCEEDED" in text, text[-3000:]


def test_a_reserved_port_is_kept_from_other_programs_but_the_coordinator_serves_on_it():
    """A port only picked could be taken before process 0 served on it (a test run lost one so)."""
    import socket

    with reserved_port() as port:
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))
        child, watch = coordinator.start(port, 1, 10, 10, timeout_s=60.0)  # gRPC binds it, as the same user
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
            assert watch > 0
        finally:
            child.kill()
            child.wait()


@pytest.mark.slow
def test_a_coordinator_port_in_use_is_a_clear_error_of_process_0(tmp_path):
    import socket

    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "runner", "distributed=local", "distributed.process_id=0",
                               "distributed.num_processes=2", f"distributed.coordinator_address=127.0.0.1:{port}",
                               f"hydra.run.dir={tmp_path}", *TINY], cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: distributed=local: process 0 could not serve the coordination service on port {port} (it " \
           f"exited with code" in proc.stderr and "is the port in use?); pick a free port in " \
           "distributed.coordinator_address" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


OBJECTIVE_REFUSED = (
    "error: trainer.objective='nosuch' is not a metric this run reports; use one of valid/auc_click, valid/auc_like, "
    "valid/auc_share, valid/auc_mean, test/auc_click, test/auc_like, test/auc_share, test/auc_mean, "
    "bayes/valid/auc_click, bayes/valid/auc_like, bayes/valid/auc_share, bayes/valid/auc_mean, bayes/test/auc_click, "
    "bayes/test/auc_like, bayes/test/auc_share, bayes/test/auc_mean, valid/loss, test/loss (or trainer.objective=null "
    "for the task's own, valid/auc_mean)")


def error_lines(text: str) -> list[str]:
    """The processes' ``error: ...`` lines as the launcher relays them, in process order."""
    return sorted(line for line in text.splitlines() if re.match(r"\[p\d+\] error: ", line))


@pytest.mark.slow
def test_a_refusal_every_process_meets_after_the_join_is_given_by_process_0_alone(tmp_path):
    """A data.path that does not exist is found after the processes joined; each of them printed its message."""
    proc = subprocess.run([sys.executable, "-m", "runner.launch", "-n", "2", "--", "debug=tiny_criteo",
                           "data.path=/nonexistent/train.txt", f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert error_lines(proc.stdout) == [
        "[p0] error: data.path=/nonexistent/train.txt: no such file or folder; give data.path a folder converted by "
        "python -m runner.prepare criteo, a Criteo-format log (train.txt, day_<d>, .gz too), a folder of them or a "
        "glob such as '/data/day_?.gz'; or unset it to train on generated logs",
        "[p1] error: the run is refused (process 1): process 0's output says why"], proc.stdout[-3000:]


def _two_runners(tmp_path: Path, env_of, *extra: str) -> tuple[list[int | None], list[str]]:
    """Processes 0 and 1 started without the launcher (which reports the first failed process's code only), one
    CPU device each, process ``i`` with ``env_of(i)`` added to its environment; their exit codes and outputs."""
    with reserved_port() as port:
        procs = [_runner(tmp_path, i, port, "mesh.cpu_devices=1", *extra, env=env_of(i)) for i in range(2)]
        try:
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return codes, [(tmp_path / f"p{i}.out").read_text() for i in range(2)]


@pytest.mark.slow
def test_each_process_refused_after_the_join_exits_with_the_refusals_code(tmp_path):
    """Started without the launcher, which reports the first failed process's code only."""
    codes, texts = _two_runners(tmp_path, lambda i: {}, "trainer.objective=nosuch")
    assert codes == [2, 2], texts
    assert [line for line in texts[0].splitlines() if line.startswith("error: ")] == [OBJECTIVE_REFUSED], texts[0]
    assert [line for line in texts[1].splitlines() if line.startswith("error: ")] == [
        "error: the run is refused (process 1): process 0's output says why"], texts[1]


@pytest.mark.slow
def test_a_refusal_only_another_process_meets_is_given_in_full(tmp_path):
    """Process 1 alone is refused (its own trainer.objective here, as its own data would be). Process 0 goes on and
    waits for process 1 to start its devices, so it never says how it fared: process 1 gives its message in full
    after distributed.REFUSAL_WAIT_S, and process 0 ends on its death at once, or on the launcher's SIGTERM (both
    exit about together: the launcher reports the code of the one it sees first, 2 or 1)."""
    out = _Capture()
    with reserved_port() as port:
        cmds = child_commands(2, [*TINY, "trainer.objective=${oc.env:OBJECTIVE}", f"hydra.run.dir={tmp_path}"], port)
        code = supervise(cmds, out=out, env={**ENV, "PYTHONPATH": str(ROOT)}, grace=5,
                         envs=[{"OBJECTIVE": "valid/auc_mean"}, {"OBJECTIVE": "nosuch"}])
    assert code in (1, 2), out.text[-3000:]
    assert error_lines(out.text) == [f"[p1] {OBJECTIVE_REFUSED}"], out.text[-3000:]  # in full; no pointer line


@pytest.mark.slow
def test_a_peer_refused_while_process_0_starts_its_devices_ends_process_0_with_one_message(tmp_path):
    """Process 1 alone is refused after the join, before it starts its devices; process 0 waits in the devices'
    start for it. The watch's notice of the death must not ask JAX for the process count (that waits for the same
    start): process 0 ends at once with its one line, where it hung until the heartbeat ran out and then died in
    a C++ abort (exit -6)."""
    codes, texts = _two_runners(tmp_path, lambda i: {"OBJECTIVE": "valid/auc_mean" if i == 0 else "nosuch"},
                                "trainer.objective=${oc.env:OBJECTIVE}")
    assert codes == [1, 2], texts
    assert "process 0 of 2 stopped: another process died (process 1 of 2: killed, or it ended on an error; see its " \
           "log)" in texts[0], texts[0][-3000:]
    assert "Check failure stack trace" not in texts[0] and "Traceback" not in texts[0], texts[0][-3000:]
    assert [line for line in texts[1].splitlines() if line.startswith("error: ")] == [OBJECTIVE_REFUSED], texts[1]


@pytest.mark.slow
def test_a_resume_with_changed_settings_names_them_once_not_once_per_process(tmp_path):
    """Every process restores the checkpoint; process 0 alone says which settings the resume changes, and what the
    restore found (here a hash table placed again for other partitions, and its best state left behind)."""
    hashed = ["model.tables.users.kind=hash", "model.tables.users.capacity=120", "checkpoint.interval=2",
              "trainer.eval_interval=2", "trainer.select_best=true"]
    run(compose_config([*hashed, "trainer.steps=2", f"checkpoint.dir={tmp_path / 'ck'}"]), tmp_path / "first")
    proc = subprocess.run([sys.executable, "-m", "runner.launch", "-n", "2", "--", *TINY, *hashed, "mesh=data",
                           "trainer.steps=3", "model.tables.users.partitions=2",
                           f"checkpoint.resume={tmp_path / 'ck' / '2'}", f"checkpoint.dir={tmp_path / 'ck2'}",
                           f"hydra.run.dir={tmp_path / 'second'}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for says, ends in [("resuming with settings that differ", "trainer.steps: 2 -> 3"),
                       ("hash table 'users' was saved with 1 partitions and this run has 2", "dropped)"),
                       ("the best state saved beside it is not carried over", "from the restored record")]:
        said = [line for line in proc.stdout.splitlines() if says in line]
        assert len(said) == 1 and said[0].startswith("[p0] ") and said[0].endswith(ends), (says, said)
