"""The distributed group's checks and messages, the launcher's commands and supervision, the SLURM launcher
example; all in this process (the multi-process runs are in test_distributed.py)."""
import io
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from runner import distributed
from runner.config import register
from runner.core import placement
from runner.errors import DistributedError
from runner.launch import child_commands, free_port, supervise
from runner.core.mesh import MeshPlan, batch_sharding, build_mesh
from tests.runner.support import CONF, compose_config


def dist(*overrides):
    return compose_config(list(overrides)).distributed


def test_default_is_one_process_and_initialize_is_a_noop():
    d = dist()
    assert d.kind == "none"
    distributed.initialize(d)
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize("overrides, message", [
    (["distributed=local"], "distributed=local needs distributed.coordinator_address, distributed.num_processes, "
                            "distributed.process_id; python -m runner.launch"),
    (["distributed=manual", "distributed.coordinator_address=10.0.0.1:7777", "distributed.num_processes=4"],
     "distributed=manual needs distributed.process_id; pass them on the command line"),
    (["distributed=manual", "distributed.coordinator_address=10.0.0.1", "distributed.num_processes=2",
      "distributed.process_id=0"], "coordinator_address='10.0.0.1' must be host:port"),
    (["distributed=local", "distributed.coordinator_address=10.0.0.1:7777", "distributed.num_processes=2",
      "distributed.process_id=0"], "is not 127.0.0.1/localhost; use distributed=manual"),
    (["distributed=local", "distributed.coordinator_address=127.0.0.1:7777", "distributed.num_processes=2",
      "distributed.process_id=2"], "distributed.process_id=2 must be in 0..num_processes-1 (num_processes=2)"),
    (["distributed.heartbeat_timeout_s=0"], "distributed.heartbeat_timeout_s=0 must be a positive number"),
    (["distributed.initialization_timeout_s=10000000000"], "distributed.initialization_timeout_s=10000000000 must be a "
                                                           "positive number of seconds up to 604,800 (a week)"),
    (["distributed=manual", "distributed.coordinator_address=10.0.0.1:99999", "distributed.num_processes=2",
      "distributed.process_id=0"], "coordinator_address='10.0.0.1:99999' must be host:port of process 0 with a port "
                                   "in 1..65535"),
    # distributed.kind is an Enum field: a wrong word fails at composition (tests/runner/test_config.py)
])
def test_bad_settings_are_refused_with_the_fix(overrides, message):
    with pytest.raises(DistributedError) as e:
        distributed.initialize(dist(*overrides))
    assert message in str(e.value)


def test_slurm_outside_a_job_step_names_the_missing_variables(monkeypatch):
    for v in distributed.SLURM_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with pytest.raises(DistributedError, match="found no SLURM job step here \\(SLURM_STEP_NODELIST, "
                                                           "SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID unset\\)"):
        distributed.initialize(dist("distributed=slurm"))


@pytest.mark.parametrize("env, shown", [
    ({"SLURM_NTASKS": "abc"}, "SLURM_NTASKS='abc' is not a count"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "5"}, "SLURM_PROCID=5 is not below SLURM_NTASKS=2"),
])
def test_slurm_counts_that_are_not_counts_are_refused(monkeypatch, env, shown):
    base = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "node1", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0"}
    for k, v in {**base, **env}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistributedError) as e:
        distributed.initialize(dist("distributed=slurm"))
    assert str(e.value) == (f"distributed=slurm: {shown}; these come from SLURM itself: launch with srun rather than "
                            f"setting them by hand")


def test_joining_after_jax_started_says_to_use_a_fresh_process():
    jax.devices()  # this test process has started JAX
    d = dist("distributed=local", f"distributed.coordinator_address=127.0.0.1:{free_port()}",
             "distributed.num_processes=2", "distributed.process_id=0")
    with pytest.raises(DistributedError, match="JAX was already started in this process"):
        distributed.initialize(d)
    assert not jax.distributed.is_initialized()


def test_one_process_feeds_the_whole_batch_and_fetches_numpy():
    mesh = build_mesh(MeshPlan((("data", 4), ("table", 2)), "table", "row"))
    assert placement.batch_shard(mesh, 32) == (0, 1)
    host = {"x": np.arange(64, dtype=np.int32).reshape(32, 2)}
    put = placement.put_local(mesh, host, 32)
    assert put["x"].sharding == batch_sharding(mesh, host["x"])
    np.testing.assert_array_equal(placement.fetch(put)["x"], host["x"])
    assert placement.gather_rows(mesh, host, 32)["x"] is host["x"]


def test_check_plan_accepts_every_mesh_on_one_process():
    distributed.check_plan(MeshPlan((("data", 1),), None, "row"))  # process_count() == 1: nothing to check


def test_child_commands_share_the_run_and_keep_user_overrides_last():
    cmds = child_commands(2, ["optimizer=async_sgd", "hydra.run.dir=/tmp/x"], port=4321, python="py")
    assert cmds[0] == ["py", "-m", "runner", "distributed=local", "distributed.process_id=0",
                       "distributed.num_processes=2", "distributed.coordinator_address=127.0.0.1:4321",
                       "optimizer=async_sgd", "hydra.run.dir=/tmp/x"]
    assert cmds[1][3:7] == ["distributed=local", "distributed.process_id=1", "distributed.num_processes=2",
                            "distributed.coordinator_address=127.0.0.1:4321"]
    assert "hydra.job.name=runner_p1" in cmds[1] and "hydra.output_subdir=.hydra_p1" in cmds[1]
    shared = child_commands(3, [], port=1, python="py")
    dirs = {next(a for a in c if a.startswith("hydra.run.dir=")) for c in shared}
    assert len(dirs) == 1 and dirs.pop().startswith("hydra.run.dir=outputs/")


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_supervise_prefixes_output_and_succeeds_when_all_do():
    out = io.StringIO()
    code = supervise([_py("print('a'); print('b')"), _py("print('c')")], out=out)
    lines = out.getvalue().splitlines()
    assert code == 0
    assert [ln for ln in lines if ln.startswith("[p0]")] == ["[p0] a", "[p0] b"]
    assert "[p1] c" in lines


@pytest.mark.slow
def test_supervise_stops_the_others_when_one_fails():
    out = io.StringIO()
    sleeper = _py("import time; print('up', flush=True); time.sleep(120)")
    t0 = time.monotonic()
    code = supervise([sleeper, _py("import time, sys; time.sleep(1); sys.exit(3)")], out=out, grace=2)
    assert code == 3
    assert time.monotonic() - t0 < 60  # a hang guard (the sleeper would run 120 s), not a speed check
    assert "[launch] process 1 exited with code 3; stopping the others" in out.getvalue()


def test_supervise_reports_a_killed_child_as_128_plus_signal():
    code = supervise([_py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")], out=io.StringIO())
    assert code == 128 + 9


@pytest.mark.parametrize("flag", ["-m", "--multirun", "hydra.mode=MULTIRUN"])
def test_launch_refuses_a_sweep_naming_the_flag_and_the_ways_out(flag, capsys):
    from runner.launch import main

    with pytest.raises(SystemExit) as e:
        main(["-n", "2", "--", flag, "trainer.seed=0,1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {flag}: runner.launch runs one training over 2 processes, not a sweep; launch each trial on " \
           f"its own (python -m runner.launch -n 2 -- <that trial's overrides>)" in err


@pytest.mark.parametrize("flag", ["--cfg", "--help", "-c", "--info"])
def test_launch_refuses_a_flag_of_the_runner_naming_it(flag, capsys):
    """Placed after the launcher's own overrides, ``--cfg job`` split them: each process blamed a valid override."""
    from runner.launch import main

    with pytest.raises(SystemExit) as e:
        main(["-n", "2", "--", flag, "job", "trainer.steps=3"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m runner.launch: error: {flag}: a flag of python -m runner, not an override, and runner.launch "
        f"starts training processes; use it with python -m runner alone (e.g. python -m runner --cfg job "
        f"<overrides> prints the config); see python -m runner.launch --help\n")


def test_launch_cli_rejects_zero_processes():
    proc = subprocess.run([sys.executable, "-m", "runner.launch", "-n", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "-n 0: need at least one process" in proc.stderr


def test_slurm_launcher_example_composes_onto_submitit():
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="runner"):
        cfg = compose("config", overrides=["hydra/launcher=slurm_multiprocess", "distributed=slurm",
                                           "hydra.launcher.nodes=2"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 2, 2)
    assert cfg.distributed.kind == "slurm"


SLEEPING_LAUNCHER = """
import sys
import runner.launch as launch
sleeper = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(300)"]
launch.child_commands = lambda n, overrides, port: [sleeper] * n
sys.exit(launch.main(["-n", "2"]))
"""


@pytest.mark.slow
def test_a_terminated_launcher_stops_its_children():
    proc = subprocess.Popen([sys.executable, "-c", SLEEPING_LAUNCHER], stdout=subprocess.PIPE, text=True)
    children = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("process_id", [0, 1])
def test_a_config_every_process_refuses_is_refused_before_the_join_and_said_by_process_0(tmp_path, process_id):
    """A bad value was found only after every process had joined (waiting for the slowest), and each of n processes
    printed the same message; now each refuses at once, process 0 with the message, the others pointing at it."""
    from runner.app import run
    from runner.errors import PreflightError
    from tests.runner.support import compose_config

    cfg = compose_config(["distributed=manual", "distributed.coordinator_address=127.0.0.1:9", "trainer.steps=0",
                          "distributed.num_processes=2", f"distributed.process_id={process_id}",
                          "distributed.initialization_timeout_s=2"])
    with pytest.raises(PreflightError) as e:
        run(cfg, tmp_path)
    assert not jax.distributed.is_initialized()
    if process_id == 0:
        assert str(e.value).startswith("invalid config:\n  - trainer.steps=0 is outside [1, inf)"), str(e.value)
    else:
        assert str(e.value) == "the config is refused (process 1): process 0's output says why"
