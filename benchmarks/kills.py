"""SIGKILL at the moments the tests do not reach, ``--trials N`` times each (default 20), on the tiny ranking
run (``debug=tiny``), every kill's timing drawn from a seeded RNG (``--seed``):

- ``peer``: a 2-process run (``distributed=local``, 1 CPU device each, checkpoint every 2 steps); once process
  0 has logged a random step, one process (0 and 1 in turn) is SIGKILLed. The survivor must exit != 0 with the
  runner's one-line message (no C++ stack trace, no Python traceback) within ``heartbeat_timeout_s + 20`` s;
  then both are relaunched and must end bit-identical (final state, metrics rows) to an uninterrupted
  2-process run.
- ``restore``: a run stopped at step 6 (``trainer.stop_after``) is resumed with
  ``RUNNER_TEST_KILL_IN_RESTORE=<seconds>`` (SIGKILL that far into the restore, drawn up to the restore's own
  duration). Nothing in the checkpoint directory may change (file by file, content hashed; the lock the killed
  run leaves aside), and the next launch must resume from step 6 and end bit-identical to a straight run.
- ``commit``: ``RUNNER_TEST_KILL_BEFORE_COMMIT=<step>`` (a random save step) kills the run once every array of
  that step is written, before Orbax's rename commits it. The half-written step must stay uncommitted, the
  relaunch must report it, resume from the save before it and end bit-identical to a straight run.
- ``cleanup``: ``RUNNER_TEST_KILL_IN_CLEANUP=<step>`` (2, 4 or 6: the steps ``checkpoint.keep=3`` retires)
  kills the run halfway through removing that old step's files. Every step left in the checkpoint directory
  must be whole (the half-removed one is under ``_deleting/``), and the relaunch must report the leftover,
  resume from the newest step and end bit-identical to a straight run. Step 6 is retired by the final save,
  so that kill hits a finished run: its relaunch only re-evaluates, and its final row's flush record says
  it flushed nothing (by design; left out of the comparison).

Each scenario's straight run is made once. Final states are compared through ``distributed.dump_state``
(every leaf, gathered) and metrics.jsonl without its wall-clock columns. Runs compile with XLA's backend
optimisation off, as the tests do, and share the tests' persistent compilation cache (``.jax_cache/``).
Writes ``benchmarks/results/kills.{md,json}``.
"""
from __future__ import annotations

import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from runner.command_line import OneLineParser

from . import common
from .kill_runs import (HEARTBEAT_S, SINGLE, committed, final, finish, peer_cmds, relaunch_single, resumed_from,
                        runner_cmd, same, start, tree_digest)

SCENARIOS = ("peer", "restore", "commit", "cleanup")
SURVIVOR_BOUND_S = HEARTBEAT_S + 20  # the survivor must have ended this long after the kill
RESTORED_AT = 6  # the restore scenario's checkpoint
STACK_MARKS = ("Check failure stack trace", "Traceback (most recent call last)", "*** SIG")


# ----- the scenarios -------------------------------------------------------------------------------------
def straight(work: Path, name: str, peer: bool) -> tuple:
    d = work / name
    d.mkdir(parents=True)
    if peer:
        codes = finish(start(peer_cmds(d, d / "ck"), [d / "p0.out", d / "p1.out"]), 600)
    else:
        codes = finish(start([runner_cmd(d, d / "ck", SINGLE)], [d / "p0.out"]), 600)
    if codes != [0] * len(codes):
        raise RuntimeError(f"the straight {name} run failed ({codes}):\n{(d / 'p0.out').read_text()[-3000:]}")
    return final(d)


def peer_trial(work: Path, i: int, rng: random.Random, ref: tuple) -> dict:
    d = work / f"peer{i}"
    d.mkdir()
    victim, at = i % 2, rng.randint(2, 13)
    delay = rng.uniform(0, 0.3)
    procs = start(peer_cmds(d, d / "ck"), [d / "p0.out", d / "p1.out"])
    r = {"victim": victim, "kill_after_step": at, "extra_delay_s": round(delay, 3)}
    deadline = time.monotonic() + 300
    while True:
        rows = (d / "metrics.jsonl").read_text().splitlines() if (d / "metrics.jsonl").exists() else []
        if rows and json.loads(rows[-1])["step"] >= at:
            break
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            finish(procs, 1)
            return {**r, "outcome": "not killed: the run ended or hung before the kill step", "ok": False}
        time.sleep(0.05)
    time.sleep(delay)
    if any(p.poll() is not None for p in procs):
        finish(procs, 1)
        return {**r, "outcome": "not killed: the run ended before the kill", "ok": False}
    procs[victim].send_signal(signal.SIGKILL)
    t = time.monotonic()
    survivor = procs[1 - victim]
    code = finish([survivor], SURVIVOR_BOUND_S)[0]
    procs[victim].wait()
    r["survivor_s"] = round(time.monotonic() - t, 2)
    text = (d / f"p{1 - victim}.out").read_text()
    lines = [ln for ln in text.splitlines() if f"process {1 - victim} of 2 stopped:" in ln]
    stack = [m for m in STACK_MARKS if m in text]
    r["survivor_code"], r["survivor_message"] = code, (lines[0].split("] - ", 1)[-1][:300] if lines else None)
    if code is None:
        r["survivor"] = "hung"
    elif code == 0:
        r["survivor"] = "exit 0"
    elif code < 0:
        r["survivor"] = f"killed by signal {-code}" + (" (stack trace)" if stack else "")
    elif stack or len(lines) != 1:
        r["survivor"] = f"exit {code}, " + (f"with {stack[0]}" if stack else f"{len(lines)} stop messages")
    else:
        r["survivor"] = "clear error"
    for p in ("p0.out", "p1.out"):
        (d / p).rename(d / f"killed_{p}")
    (d / "final_state.npz").unlink(missing_ok=True)
    codes = finish(start(peer_cmds(d, d / "ck"), [d / "p0.out", d / "p1.out"]), 600)
    r["relaunch_codes"] = codes
    if codes != [0, 0]:
        r["resume"] = f"relaunch failed {codes}: {(d / 'p0.out').read_text()[-400:]}"
    else:
        r["resume"] = same(final(d), ref) or "bit-identical"
    r["ok"] = r["survivor"] == "clear error" and r["resume"] == "bit-identical"
    r["outcome"] = f"survivor: {r['survivor']}; resume: {r['resume']}"
    return r


def restore_setup(work: Path) -> tuple[Path, float]:
    """A run stopped at step 6, kept as the pristine copy every trial starts from; the restore's duration."""
    d = work / "restore"
    d.mkdir()
    code = finish(start([runner_cmd(d, d / "ck", SINGLE + [f"trainer.stop_after={RESTORED_AT}"])], [d / "p0.out"]),
                  600)[0]
    if code != 0 or committed(d / "ck")[-1:] != [RESTORED_AT]:
        raise RuntimeError(f"the stopped run failed ({code}):\n{(d / 'p0.out').read_text()[-3000:]}")
    (d / "final_state.npz").unlink(missing_ok=True)
    shutil.copytree(d, work / "restore_pristine")
    took = _killed_restore(d, 1e9)[1]  # killed at the restore's end: how long a whole restore takes
    return d, took


def _killed_restore(d: Path, delay: float) -> tuple[int | None, float | None, str]:
    log = d / "killed.out"
    code = finish(start([runner_cmd(d, d / "ck", SINGLE)], [log], {"RUNNER_TEST_KILL_IN_RESTORE": f"{delay:.6f}"}),
                  300)[0]
    text = log.read_text()
    marks = [ln for ln in text.splitlines() if ln.startswith("RUNNER_TEST_KILL_IN_RESTORE: SIGKILL")]
    secs = float(marks[0].split(", ")[1].split(" s ")[0]) if marks else None
    return code, secs, marks[0] if marks else text[-400:]


def restore_trial(work: Path, i: int, rng: random.Random, ref: tuple, took: float) -> dict:
    d, pristine = work / "restore", work / "restore_pristine"
    shutil.rmtree(d)
    shutil.copytree(pristine, d)
    before = tree_digest(d / "ck")
    delay = rng.uniform(0, took)
    code, secs, mark = _killed_restore(d, delay)
    r = {"delay_s": round(delay, 4), "killed_code": code, "killed_at_s": secs, "hook": mark[:200]}
    r["disk"] = "unchanged" if tree_digest(d / "ck") == before else "CHANGED"
    code, text = relaunch_single(d, d / "ck", d / "again.out")
    if code != 0:
        r["resume"] = f"relaunch failed ({code}): {text[-400:]}"
    elif not resumed_from(text, d / "ck", RESTORED_AT):
        r["resume"] = f"did not resume from step {RESTORED_AT}"
    else:
        r["resume"] = same(final(d), ref) or "bit-identical"
    r["ok"] = code == 0 and r["killed_code"] == -signal.SIGKILL and r["disk"] == "unchanged" \
        and r["resume"] == "bit-identical"
    if r["killed_code"] != -signal.SIGKILL:
        return {**r, "outcome": f"FAILED: the run to kill ended with code {r['killed_code']}: {mark[-200:]}"}
    where = "killed in the restore" if secs is not None else "killed elsewhere"
    r["outcome"] = f"{where}, checkpoint dir {r['disk']}; relaunch resumed from step {RESTORED_AT}: {r['resume']}" \
        if r["resume"] == "bit-identical" else f"{where}, checkpoint dir {r['disk']}; {r['resume']}"
    return r


def commit_trial(work: Path, i: int, rng: random.Random, ref: tuple) -> dict:
    from runner.checkpoint.drills import KILL_ENV
    from runner.checkpoint.manager import TMP_SUFFIX

    d = work / f"commit{i}"
    d.mkdir()
    step = rng.choice(range(2, 13, 2))
    code = finish(start([runner_cmd(d, d / "ck", SINGLE)], [d / "killed.out"], {KILL_ENV: str(step)}), 300)[0]
    partial = [p for p in (d / "ck").iterdir() if p.name.startswith(f"{step}{TMP_SUFFIX}")]
    r = {"step": step, "killed_code": code, "committed_after_kill": committed(d / "ck"),
         "partial_written": bool(partial) and any(f.is_file() for f in (partial[0] / "state").rglob("*"))}
    before = step - 2
    want = [s for s in range(2, step, 2)][-3:]
    code, text = relaunch_single(d, d / "ck", d / "again.out")
    reported = "holds interrupted saves" in text and f"{step}{TMP_SUFFIX}" in text
    if code != 0:
        r["resume"] = f"relaunch failed ({code}): {text[-400:]}"
    elif before and not resumed_from(text, d / "ck", before):
        r["resume"] = f"did not resume from step {before}"
    elif not before and "resuming from" in text:
        r["resume"] = "resumed, but no step was committed before the kill"
    else:
        r["resume"] = same(final(d), ref) or "bit-identical"
    r["reported"] = reported
    r["ok"] = (r["killed_code"] == -signal.SIGKILL and r["partial_written"] and r["committed_after_kill"] == want
               and reported and r["resume"] == "bit-identical")
    if not r["ok"]:
        return {**r, "outcome": f"FAILED: killed with code {r['killed_code']}, committed {r['committed_after_kill']} "
                                f"(want {want}), step written {r['partial_written']}, reported {reported}, "
                                f"resume: {r['resume']}"}
    r["outcome"] = f"killed with the step written, uncommitted; relaunch reported it, resumed from the save " \
                   f"before it: {r['resume']}"
    return r


def cleanup_trial(work: Path, i: int, rng: random.Random, ref: tuple) -> dict:
    from runner.checkpoint.drills import KILL_CLEANUP_ENV
    from runner.checkpoint.trash import TRASH, half_deleted

    d = work / f"cleanup{i}"
    d.mkdir()
    step = rng.choice((2, 4, 6))
    code = finish(start([runner_cmd(d, d / "ck", SINGLE)], [d / "killed.out"], {KILL_CLEANUP_ENV: str(step)}),
                  300)[0]
    left = d / "ck" / TRASH / str(step)
    steps, want = committed(d / "ck"), [step + 2, step + 4, step + 6]
    r = {"step": step, "killed_code": code, "committed_after_kill": steps,
         "half_removed_in_trash": left.is_dir() and any(f.is_file() for f in left.rglob("*")),
         "steps_whole": all(not half_deleted(d / "ck" / str(s)) for s in steps)}
    code, text = relaunch_single(d, d / "ck", d / "again.out")
    r["reported"] = f"held old checkpoints ['{step}'] whose removal was interrupted" in text
    if code != 0:
        r["resume"] = f"relaunch failed ({code}): {text[-400:]}"
    elif not resumed_from(text, d / "ck", want[-1]):
        r["resume"] = f"did not resume from step {want[-1]}"
    else:
        r["resume"] = same(final(d), ref, finished=want[-1] == 12) or "bit-identical"
    r["ok"] = (r["killed_code"] == -signal.SIGKILL and r["half_removed_in_trash"] and r["steps_whole"]
               and steps == want and r["reported"] and r["resume"] == "bit-identical")
    if not r["ok"]:
        return {**r, "outcome": f"FAILED: killed with code {r['killed_code']}, committed {steps} (want {want}), "
                                f"half-removed step under {TRASH}/ {r['half_removed_in_trash']}, steps whole "
                                f"{r['steps_whole']}, reported {r['reported']}, resume: {r['resume']}"}
    r["outcome"] = (f"killed halfway through removing an old step: it was already under {TRASH}/, every step in "
                    f"the directory whole; relaunch reported it, resumed from the newest: {r['resume']}")
    return r


# ----- the benchmark --------------------------------------------------------------------------------------
def run(trials: int, seed: int, only: list[str], out: Path | None, work: Path | None = None) -> dict:
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="kills-")) if own else work
    data = {"scenarios": {}, "machine": common.machine_line()}
    previous = None if out is None else out / "kills.json"
    if previous is not None and previous.exists():  # --only: the other scenarios' last results are kept
        data["scenarios"] = {k: v for k, v in json.loads(previous.read_text())["scenarios"].items() if k not in only}
    try:
        for name in only:
            t0 = time.perf_counter()
            rng = random.Random(f"{seed}-{name}")  # each scenario its own draws, whatever runs with it
            if name == "peer":
                ref = straight(work, "peer_straight", peer=True)
                results = [peer_trial(work, i, rng, ref) for i in range(trials)]
            elif name == "restore":
                ref = straight(work, "restore_straight", peer=False)
                _, took = restore_setup(work)
                results = [restore_trial(work, i, rng, ref, took) for i in range(trials)]
                restore_s = took
            elif name == "commit":
                ref = straight(work, "commit_straight", peer=False)
                results = [commit_trial(work, i, rng, ref) for i in range(trials)]
            else:
                ref = straight(work, "cleanup_straight", peer=False)
                results = [cleanup_trial(work, i, rng, ref) for i in range(trials)]
            for i, r in enumerate(results):
                print(f"{name} {i}: {'ok' if r['ok'] else 'FAILED'}: {r['outcome']}", flush=True)
            data["scenarios"][name] = {"trials": trials, "seed": seed, "results": results,
                                       "seconds": time.perf_counter() - t0}
            if name == "restore":
                data["scenarios"][name]["restore_s"] = restore_s
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    if out is not None:
        report(out, data)
    return data


def counts(results: list[dict], key: str = "outcome") -> dict[str, int]:
    c: dict[str, int] = {}
    for r in results:
        c[r[key]] = c.get(r[key], 0) + 1
    return c


def report(out: Path, data: dict) -> None:
    rows = []
    for name, s in data["scenarios"].items():
        res = s["results"]
        groups = [(f"process {v} killed", [r for r in res if r["victim"] == v]) for v in (0, 1)] \
            if name == "peer" else [("", res)]
        for label, rs in groups:
            for outcome, n in counts(rs).items():
                rows.append([name, label, f"{n}/{len(rs)}", outcome])
        if name == "peer":
            secs = [r["survivor_s"] for r in res if "survivor_s" in r]
            if secs:
                rows.append([name, "survivor's end after the kill", "", f"{min(secs):.2f}-{max(secs):.2f} s "
                             f"(median {np.median(secs):.2f} s; bound {SURVIVOR_BOUND_S} s)"])
    ok = {n: sum(r["ok"] for r in s["results"]) for n, s in data["scenarios"].items()}
    runs = sorted({(s["trials"], s["seed"]) for s in data["scenarios"].values()})
    how = "; ".join(f"`python -m benchmarks.kills --trials {t} --seed {sd}`" for t, sd in runs)
    body = (f"{how}: the tiny ranking run (`debug=tiny`), kill timings from a seeded RNG. {data['machine']}.\n\n"
            + common.md_table(["scenario", "", "trials", "outcome"], rows)
            + "\n\nAs expected: " + ", ".join(f"{n} {k}/{len(data['scenarios'][n]['results'])}"
                                               for n, k in ok.items()) + ".\n")
    common.write_result(out, "kills", "SIGKILL at the moments the tests do not reach", body, data)
    print(body)


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m benchmarks.kills", description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20, help="trials per scenario (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill timings")
    p.add_argument("--only", action="append", choices=SCENARIOS, help="run only this scenario (repeatable)")
    p.add_argument("--out", type=Path, help=common.OUT_HELP)
    p.add_argument("--quick", action="store_true", help="one trial per scenario")
    a = p.parse_args(argv)
    if a.trials < 1:
        p.error(f"--trials {a.trials}: need at least one")
    out = common.results_dir(p, a.out, a.quick)
    data = run(1 if a.quick else a.trials, a.seed, list(dict.fromkeys(a.only)) if a.only else list(SCENARIOS), out)
    return 0 if all(r["ok"] for s in data["scenarios"].values() for r in s["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
