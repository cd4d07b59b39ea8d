"""The runner's argparse tools (``runner.launch``, ``runner.prepare``, ``runner.report`` and the sequential data
generator) refuse a bad argument with one line, ``<prog>: error: <what and the value>; see <prog> --help``, exit
code 2, and no usage block above it (argparse's own parser printed its usage lines first); ``--help`` still
prints the full help. In-process: each tool's ``main(argv)``."""
from __future__ import annotations

import pytest

from runner import launch, prepare, report
from runner.command_line import OneLineParser
from runner.tasks.sequential import synthetic

LAUNCH, PREPARE = "python -m runner.launch", "python -m runner.prepare"
REPORT, SEQUENCES = "python -m runner.report", "python -m runner.tasks.sequential.synthetic"


def refusal(main, argv, capsys) -> str:
    """The one line ``main(argv)`` refuses ``argv`` with (exit code 2, nothing on stdout)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    said = capsys.readouterr()
    assert e.value.code == 2 and said.out == ""
    assert len(said.err.splitlines()) == 1 and said.err.endswith("\n"), said.err
    return said.err.rstrip("\n")


def one_line(prog: str, message: str) -> str:
    return f"{prog}: error: {message}; see {prog} --help"


@pytest.mark.parametrize("main, prog, argv, message", [
    (launch.main, LAUNCH, ["-n", "2", "--nosuch"], "unrecognized arguments: --nosuch"),
    (launch.main, LAUNCH, ["-n", "abc"], "argument -n/--num-processes: invalid int value: 'abc'"),
    (launch.main, LAUNCH, ["-n", "2", "--grace", "soon"], "argument --grace: invalid float value: 'soon'"),
    (launch.main, LAUNCH, ["-n", "0"], "-n 0: need at least one process"),  # the tool's own check, said alike
    (prepare.main, PREPARE, ["criteo-synthetic", "--out", "o", "--nosuch"], "unrecognized arguments: --nosuch"),
    (prepare.main, PREPARE, [], "the following arguments are required: what"),
    (prepare.main, PREPARE, ["criteo-synthtic"], "argument what: invalid choice: 'criteo-synthtic' (choose from "
                                                 "'criteo', 'criteo-synthetic')"),
    (report.main, REPORT, ["runs", "--nosuch"], "unrecognized arguments: --nosuch"),
    (report.main, REPORT, ["runs", "--goal", "up"], "argument --goal: invalid choice: 'up' (choose from 'maximize', "
                                                    "'minimize')"),
    (synthetic.main, SEQUENCES, ["out", "--nosuch"], "unrecognized arguments: --nosuch"),
    (synthetic.main, SEQUENCES, ["out", "20x"], "argument N: invalid int value: '20x'"),
])
def test_a_bad_flag_or_value_is_one_line_naming_it(capsys, tmp_path, monkeypatch, main, prog, argv, message):
    monkeypatch.chdir(tmp_path)  # a tool that went past its arguments would write here
    assert refusal(main, argv, capsys) == one_line(prog, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["criteo-synthetic", "--out", "o", "--lines", "many"], "argument --lines: invalid int value: 'many'"),
    (["criteo", "train.txt", "--out", "o", "--min-count", "1.5"], "argument --min-count: invalid int value: '1.5'"),
    (["criteo", "train.txt", "--out", "o", "--bag-sizes", "1,x"], "argument --bag-sizes: '1,x': integers joined by "
                                                                  "commas (26 of them, or one for all)"),
    (["criteo", "train.txt"], "the following arguments are required: --out"),
    (["criteo", "train.txt", "--out", "o", "--nosuch"], "unrecognized arguments: --nosuch"),
])
def test_a_subcommands_bad_value_points_at_that_subcommands_help(capsys, tmp_path, monkeypatch, argv, message):
    """``runner.prepare criteo`` parses its own flags: its refusal names it, and its ``--help``."""
    monkeypatch.chdir(tmp_path)
    line = refusal(prepare.main, argv, capsys)
    if message.startswith("unrecognized"):  # the top parser collects what no parser took
        assert line == one_line(PREPARE, message)
    else:
        assert line == one_line(f"{PREPARE} {argv[0]}", message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("main, prog, argv, shown", [
    (launch.main, LAUNCH, ["--help"], "--num-processes"),
    (prepare.main, PREPARE, ["--help"], "criteo-synthetic"),
    (prepare.main, f"{PREPARE} criteo", ["criteo", "--help"], "--min-count"),
    (report.main, REPORT, ["--help"], "--goal"),
    (synthetic.main, SEQUENCES, ["--help"], "OUT_DIR"),
])
def test_help_is_still_the_full_help(capsys, main, prog, argv, shown):
    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: {prog} ") and shown in out and "options:" in out


def test_the_parser_alone(capsys):
    """Without any tool around it: argparse's message, the prog and the pointer to ``--help``, one line."""
    p = OneLineParser(prog="tool")
    p.add_argument("--size", type=int)
    assert refusal(p.parse_args, ["--size", "big"], capsys) == "tool: error: argument --size: invalid int value: " \
                                                                "'big'; see tool --help"
    assert p.parse_args(["--size", "3"]).size == 3
