"""``logger.mode=online`` without a W&B API key stops before anything compiles with one message naming the setting
and the ways out; with a key but no server reachable, the run stops after ``logger.init_timeout`` seconds with one
message (never wandb's traceback, never a hang). The server here is a closed port on the loopback address. A
``WANDB_*`` variable W&B refuses (``WANDB_MODE=`` left empty) and any other failure to start an offline run are
one message too."""
from __future__ import annotations

import json

import pytest

from runner import preflight
from runner.build import build
from runner.errors import PreflightError
from runner.app import run_tracker
from runner.tracking.wandb import TrackerStartError, WandbTracker
from tests.runner.support import compose_config

ONLINE = ["logger=wandb", "logger.mode=online"]
NO_SERVER = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture
def no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", NO_SERVER)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login user password secret\n")  # an entry, for another host
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_online_without_a_key_is_refused_with_the_ways_out(no_key):
    with pytest.raises(PreflightError) as e:
        build(compose_config(ONLINE))
    assert ("logger.mode=online needs a W&B API key and none is configured (WANDB_API_KEY is unset and no netrc entry "
            "has one): set WANDB_API_KEY (or run `wandb login`), or use logger.mode=offline (the default; `wandb sync` "
            "uploads the run later) or logger=none") in str(e.value)


def test_a_key_in_the_environment_or_netrc_is_found(no_key, monkeypatch):
    assert preflight.wandb_key_source() is None
    no_key.write_text(f"machine 127.0.0.1 login user password {'k' * 40}\n")
    assert preflight.wandb_key_source() == str(no_key)  # the entry `wandb login` writes for the server's host
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert preflight.wandb_key_source() == "WANDB_API_KEY"
    build(compose_config(ONLINE))  # accepted: the key is there
    build(compose_config(["logger=wandb", "logger.mode=offline"]))  # offline needs no key at all


@pytest.mark.parametrize("value", ["0", "-1", "601", "nan"])
def test_a_bad_init_timeout_is_refused(value):
    with pytest.raises(PreflightError) as e:
        build(compose_config([f"logger.init_timeout={value}"]))
    assert f"logger.init_timeout={float(value)!r} is outside (0, 600]" in str(e.value)


@pytest.mark.slow
def test_online_with_a_key_and_no_server_stops_after_the_timeout_with_one_message(no_key, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    with pytest.raises(TrackerStartError) as e:
        WandbTracker(project="p", mode="online", dir=tmp_path / "wb", init_timeout=2)
    text = str(e.value)
    assert text.startswith("logger.mode=online: W&B could not start the run (")
    assert text.endswith("check WANDB_API_KEY and the network (logger.init_timeout=2 s), or use logger.mode=offline "
                         "(the default; `wandb sync` uploads the run later) or logger=none"), text


@pytest.mark.parametrize("value", ["", "bogus"])
def test_a_wandb_mode_in_the_environment_that_wandb_refuses_is_one_message(monkeypatch, tmp_path, value):
    import wandb

    wandb.teardown()  # W&B reads its environment once a process (wandb.setup): start as a new run's process does
    monkeypatch.setenv("WANDB_MODE", value)
    with pytest.raises(PreflightError) as e:
        run_tracker(compose_config(["logger=wandb"]), tmp_path, process_index=0)
    text = str(e.value)
    assert text.startswith(f"W&B refused a setting from the environment (WANDB_MODE={value!r}: "), text
    assert text.endswith("): fix or unset WANDB_MODE (`unset WANDB_MODE`; logger.mode=offline sets the run's mode), "
                         "or use logger=none"), text
    summary = json.loads((tmp_path / "summary.json").read_text())  # the folder records the failure
    assert summary["status"] == "failed" and summary["exit_code"] == 2 and summary["error"] == f"PreflightError: {text}"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # a valid value: logger.mode still decides (an offline run)
    tracker = run_tracker(compose_config(["logger=wandb"]), tmp_path / "ok", process_index=0)
    try:
        assert list((tmp_path / "ok" / "wandb").glob("offline-run-*"))
    finally:
        tracker.finish()
        wandb.teardown()  # the next test's runs read the environment afresh


@pytest.mark.parametrize("name, value, why", [
    ("WANDB_RUN_ID", "a/b", "a run id holds letters, digits, _ and - only"),
    ("WANDB_PROJECT", "a/b", "Invalid project name 'a/b'"),  # W&B's message quotes the value, not the variable
])
def test_a_value_from_the_environment_that_wandb_refuses_is_named_by_its_variable(monkeypatch, tmp_path, name, value,
                                                                                   why):
    import wandb

    wandb.teardown()
    monkeypatch.setenv(name, value)
    try:
        with pytest.raises(PreflightError) as e:
            run_tracker(compose_config(["logger=wandb"]), tmp_path, process_index=0)
    finally:
        monkeypatch.delenv(name)
        wandb.teardown()
    assert str(e.value).startswith(f"W&B refused a setting from the environment ({name}='{value}': {why}"), str(e.value)
    assert str(e.value).endswith(f"fix or unset {name} (`unset {name}`; logger.mode=offline sets the run's mode), or "
                                 f"use logger=none"), str(e.value)


def test_a_disabled_wandb_run_writes_no_run_record_and_a_run_without_a_group_records_none(tmp_path):
    import wandb

    from runner.sweeps import RUN_INFO_FILE

    for mode, out in (("disabled", tmp_path / "off"), ("offline", tmp_path / "on")):
        tracker = run_tracker(compose_config(["logger=wandb", f"logger.mode={mode}"]), out, process_index=0)
        try:
            if mode == "disabled":  # no W&B run: nothing to name (its id and folder were placeholders)
                assert not (out / RUN_INFO_FILE).exists()
            else:
                assert json.loads((out / RUN_INFO_FILE).read_text())["group"] is None
        finally:
            tracker.finish()
            wandb.teardown()


def test_an_offline_run_that_cannot_start_is_one_message(monkeypatch, tmp_path):
    import wandb

    def refuse(**kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(TrackerStartError) as e:
        WandbTracker(project="p", mode="offline", dir=tmp_path / "wb")
    assert str(e.value) == ("logger.mode=offline: W&B could not start the run (OSError: No space left on device): "
                            "check the WANDB_* environment variables and that the output directory is writable, or "
                            "use logger=none")
