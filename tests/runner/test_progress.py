"""What a run shows while it trains (runner/progress.py): a bar on a terminal, plain lines elsewhere, in-process.
Times come from a fake clock; nothing here depends on how fast the machine is."""
import io
import re
import sys

import pytest

from runner import progress
from runner.build import build
from runner.core.loop import train
from runner.tracking.base import NoopTracker
from tests.runner.support import compose_config

STEP_LINE = re.compile(r"^step +(\d+)/6  loss \d+\.\d{4}(  valid/auc_mean \d\.\d{4})?  emb\|g\| \S+  [\d,]+ ex/s$")
COMPILE = re.compile(r"^compiling the train step \(async_emb=on, 1 device\) \.\.\. done in \d+\.\d s$")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Terminal(io.StringIO):
    def isatty(self):
        return True


def run_tiny(mode):
    """debug=tiny (6 steps of 32, a log row and an evaluation every 3 steps) with trainer.progress=mode; returns
    the log lines."""
    cfg = compose_config([f"trainer.progress={mode}"])
    program, task, _ = build(cfg)
    lines = []
    train(program, task, cfg.trainer, NoopTracker(), log=lines.append)
    return lines


@pytest.mark.slow
def test_lines_mode_logs_the_plain_lines_and_the_compilation(capsys):
    lines = run_tiny("lines")
    steps = [ln for ln in lines if ln.startswith("step")]
    assert [int(STEP_LINE.match(ln).group(1)) for ln in steps] == [3, 6], lines
    assert "valid/auc_mean" in steps[0]  # the objective where it was evaluated
    assert lines[0] == "compiling the train step (async_emb=on, 1 device) ..."
    assert COMPILE.match(lines[1]), lines
    assert "%|" not in capsys.readouterr().err  # no bar


@pytest.mark.slow
def test_bar_mode_draws_step_loss_rate_eta_and_the_objective(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # where a bar goes (read when the loop starts)
    lines = run_tiny("bar")
    out = terminal.getvalue()
    final = out.replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"100%\|.*\| step 6/6, loss \d\.\d{4}, valid/auc_mean \d\.\d{4}, [\d,]+ ex/s, ETA \S+$", final), out
    assert "evaluating at step" in out  # the evaluation's own bar (left=False: erased when done)
    # The plain lines still go to the log (runner.log), written above the bar; the compile line too.
    assert [ln.split("/")[0] for ln in lines if ln.startswith("step")] == ["step      3", "step      6"]
    assert any(COMPILE.match(ln) for ln in lines), lines


def test_auto_is_a_bar_on_a_terminal_and_lines_elsewhere():
    assert type(progress.make("auto", stream=Terminal())) is progress.Bar
    assert type(progress.make("auto", stream=io.StringIO())) is progress.Progress
    assert type(progress.make("lines", stream=Terminal())) is progress.Progress
    assert type(progress.make("bar", stream=io.StringIO())) is progress.Bar
    assert type(progress.make("bar", stream=Terminal(), enabled=False)) is progress.Quiet  # not process 0
    with pytest.raises(ValueError, match=r"trainer.progress='fancy': use one of auto, bar, lines, off"):
        progress.make("fancy")


def test_compile_line_and_slow_work_lines_with_a_fake_clock():
    clock, lines = Clock(), []
    p = progress.make("lines", log=lines.append, clock=clock)

    def compile_step():
        clock.t += 4.2
        return "executable"

    assert p.compile("the train step (async_emb=on, 1 device)", compile_step) == "executable"
    assert lines == ["compiling the train step (async_emb=on, 1 device) ...",
                     "compiling the train step (async_emb=on, 1 device) ... done in 4.2 s"]
    lines.clear()
    p.step(500)
    with p.timed("checkpoint at step 500"):
        clock.t += 1.0  # fast: nothing to say
    with p.timed("checkpoint at step 500"):
        clock.t += 3.25
    assert lines == ["checkpoint at step 500 ... done in 3.2 s"]

    def evaluate(predict, state, put, batch_size):
        clock.t += 14.0
        return {"n": sum(predict(state, b) for b in range(3))}

    assert p.evaluation(evaluate)(lambda s, b: 1, None, None, 8) == {"n": 3}
    assert lines[-1] == "evaluating at step 500 ... done in 14.0 s"


def test_bar_content_in_a_string_buffer():
    out, lines = io.StringIO(), []
    p = progress.Bar(lines.append, out, mininterval=0)
    p.start(20, batch_size=8, steps_per_epoch=4, objective="valid/ndcg@10")
    for s in range(1, 21):
        p.step(s)
        if s % 10 == 0:
            p.logged({"train/loss": 1.0 / s, "perf/examples_per_s": 1000.0, "valid/ndcg@10": 0.25})
    p.write("a log line")
    p.close()
    final = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"^100%\|.*\| step 20/20, loss 0\.0500, valid/ndcg@10 0\.2500, [\d,]+ ex/s, epoch 5\.0, "
                     r"ETA \S+$", final), out.getvalue()
    assert lines == ["a log line"]
    assert not progress._OPEN  # closed


def test_resumed_bar_starts_at_the_resumed_step():
    out = io.StringIO()
    p = progress.Bar(print, out, mininterval=0)
    p.start(10, first=6, batch_size=1)
    p.step(7)
    assert "step 7/10" in out.getvalue()
    progress.close_open()
    assert p.bar is None


def test_quiet_lets_only_warnings_through():
    lines = []
    p = progress.make("off", log=lines.append)
    p.compiled("the train step", 3.0)
    p.write("step 3/6  loss 0.1")
    p.write("warning: 300 epochs")
    assert lines == ["warning: 300 epochs"]
