"""The benchmarks' command lines (``python -m benchmarks``, the flags every benchmark shares in ``common.main``, and
the studies with their own parsers) refuse a bad argument with one line, ``<prog>: error: <what and the value>; see
<prog> --help``, exit code 2, no usage block above it; ``--help`` still prints the full help. In-process: each
module's ``main(argv)``, which refuses before anything is measured or written."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from benchmarks import __main__ as suite, common, convert, kills, plan, plan_criteo, repeats, staleness


def one_line(prog: str, message: str) -> str:
    return f"{prog}: error: {message}; see {prog} --help\n"


@pytest.mark.parametrize("main, prog, argv, message", [
    (suite.main, "python -m benchmarks", ["--nosuch"], "unrecognized arguments: --nosuch"),
    (suite.main, "python -m benchmarks", ["--rounds", "x"], "argument --rounds: invalid int value: 'x'"),
    (suite.main, "python -m benchmarks", ["--only", "dlmr"], "argument --only: invalid choice: 'dlmr' (choose from "
                                                             + ", ".join(map(repr, suite.available())) + ")"),
    (convert.main, "python -m benchmarks.convert", ["--nosuch"], "unrecognized arguments: --nosuch"),
    (convert.main, "python -m benchmarks.convert", ["--quick=yes"], "argument --quick: ignored explicit argument "
                                                                   "'yes'"),
    (plan.main, "python -m benchmarks.plan", ["--rows", "lots"], "argument --rows: invalid float value: 'lots'"),
    (plan_criteo.main, "python -m benchmarks.plan_criteo", ["--timeout", "soon"], "argument --timeout: invalid "
                                                                                  "float value: 'soon'"),
    (repeats.main, "python -m benchmarks.repeats", [], "the following arguments are required: dirs"),
    (repeats.main, "python -m benchmarks.repeats", ["runs", "--nosuch"], "unrecognized arguments: --nosuch"),
    (kills.main, "python -m benchmarks.kills", ["--trials", "many"], "argument --trials: invalid int value: 'many'"),
    (kills.main, "python -m benchmarks.kills", ["--trials", "0"], "--trials 0: need at least one"),  # its own check
    (staleness.main, "python -m benchmarks.staleness", ["--task", "criteo"], "argument --task: invalid choice: "
                                                                             "'criteo' (choose from 'ml100k', "
                                                                             "'ranking')"),
    (staleness.main, "python -m benchmarks.staleness", ["--seeds", "0", "x"], "argument --seeds: invalid int "
                                                                              "value: 'x'"),
])
def test_a_bad_flag_or_value_is_one_line_naming_it(capsys, main, prog, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    said = capsys.readouterr()
    assert e.value.code == 2 and said.out == ""
    assert said.err == one_line(prog, message)


@pytest.mark.parametrize("main, prog, shown", [
    (suite.main, "python -m benchmarks", "--compare"),
    (convert.main, "python -m benchmarks.convert", "--quick"),
    (plan.main, "python -m benchmarks.plan", "--rows"),
    (plan_criteo.main, "python -m benchmarks.plan_criteo", "--unstacked"),
    (repeats.main, "python -m benchmarks.repeats", "--update"),
    (kills.main, "python -m benchmarks.kills", "--trials"),
    (staleness.main, "python -m benchmarks.staleness", "--lr-grid"),
])
def test_help_is_still_the_full_help(capsys, main, prog, shown):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: {prog} ") and shown in out and "options:" in out


def test_a_benchmark_run_as_main_is_named_by_its_module(monkeypatch):
    """``python -m benchmarks.dlrm`` runs the module as ``__main__``: its spec gives the command its messages name
    (argparse's default was the file's name, ``dlrm.py``, a command that does not exist)."""
    def run(quick, out):
        """A benchmark's ``run``, defined in the module Python runs."""

    run.__module__ = "__main__"
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", SimpleNamespace(name="benchmarks.dlrm"))
    assert common.command(run) == "python -m benchmarks.dlrm"
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)  # run as a script: argparse's own default
    assert common.command(run) is None
    assert common.command(convert.run) == "python -m benchmarks.convert"
