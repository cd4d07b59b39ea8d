"""Summarise a run or a Hydra multirun sweep: ``report.md``, ``report.csv`` and charts.

Usage::

    python -m runner.report multirun/2026-11-29/12-00-00 [--out DIR] [--metric valid/auc_mean] [--overwrite]

A *trial* is a directory holding ``metrics.jsonl`` (written by
:class:`runner.tracking.JsonlTracker`), ``.hydra/overrides.yaml`` or a ``FAILED``
marker. ``<dir>`` may be a single run directory or any directory above trials (a
Hydra multirun day/time directory, or the whole ``multirun/`` tree).

What is shown of the trials' metrics is the task's (``runner.tasks.ReportMetrics``, each task package's
``report.py``), found from the data source a trial's ``.hydra/config.yaml`` names (without one: the default
data source's, the ranking task). The objective trials are ranked by is the task's unless ``--metric``
names another (``valid/auc_mean`` for ranking, ``valid/ndcg@10`` for the next-item task).

Per trial: overrides, last step, final ``train/loss``, best and final value of the
objective metric, and status -- ``failed`` when the trial has a ``FAILED`` file or a
``summary.json`` with ``"status": "failed"``, otherwise ``ok``. Trials are labelled by the
overrides that differ between them; the overrides every trial shares are listed once, in
the report's header (``common: ...``). ``report.csv`` keeps each trial's full overrides.

Charts (matplotlib, Agg): ``loss.png`` (``train/loss`` vs step per trial), the task's metrics chart and
``final_metric.png`` (final objective per configuration). The metrics chart has one panel per charted key
per trial vs step; a reference metric is a dotted horizontal line on its metric's panel, not a panel of its
own. For ranking that is ``auc.png``: one panel per AUC key (e.g. ``train/auc_click``, ``valid/auc_mean``),
the Bayes-optimal AUC ``bayes/<metric>`` on the ``<metric>`` panel (``bayes/test/auc_mean`` on
``test/auc_mean``; a run that named its one held-out split ``eval/``: ``bayes/auc_mean`` on
``eval/auc_mean``). Malformed lines (such as a truncated last line of a trial that was killed), ``null``
values and missing keys are tolerated. A folder without any trial is refused and nothing is written.

``report.md`` records the folder it reports (a comment under its title): a report of the same folder updates it,
while an output folder holding another folder's report, or files of the report's names that are no report of
DIR, is refused (nothing written) unless ``--overwrite`` is given; so is an ``--out`` in another run's folder.
It also records the files the report wrote: a report replacing one removes those of the one before it does not write
(the chart of another task). One report at a time writes a folder (a lock on its ``.report.lock``); another
into it meanwhile is refused.

- ``trials.py``: finding and reading the trials, labelling them;
- ``charts.py``: the charts;
- ``summary.py``: ``report.md`` and ``report.csv``;
- ``folder.py``: whose report an output folder holds, and putting a report into it.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..command_line import OneLineParser
from ..errors import Terminated, sigterm_unwinds, stopped
from .charts import AucPanels, auc_figure, auc_panels
from .summary import build_report
from .trials import (ReportError, Trial, common_overrides, find_trials, label_trials, load_trial, read_metrics,
                     shown_metrics)

__all__ = ["AucPanels", "ReportError", "Trial", "auc_figure", "auc_panels", "build_report", "common_overrides",
           "find_trials", "label_trials", "load_trial", "main", "read_metrics", "shown_metrics"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runner.report DIR [--out DIR] [--metric M] [--goal G] [--overwrite]``; returns the exit code (2:
    refused; 130/143: stopped by Ctrl-C/SIGTERM, the report's temporary folder removed)."""
    p = OneLineParser(prog="python -m runner.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="run directory or Hydra multirun directory")
    p.add_argument("--out", default=None, help="output directory (default: DIR)")
    p.add_argument("--metric", default=None,
                   help="objective metric (default: the task's, e.g. valid/auc_mean for ranking)")
    p.add_argument("--goal", choices=["maximize", "minimize"], default="maximize")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the report of another folder, or files named like the report's, already in the "
                        "output folder (a report of DIR there is always updated)")
    args = p.parse_args(argv)
    notes: list[str] = []
    with sigterm_unwinds():  # SIGTERM unwinds like Ctrl-C: build_report's finally removes its temporary folder
        try:
            if not args.dir.strip():  # Path("") is ".": the report would walk and write the current folder
                raise ReportError("DIR is empty; give a run folder (outputs/<date>/<time>) or a sweep folder "
                                  "(multirun/<date>/<time>); for the current folder, give .")
            if args.out is not None and not args.out.strip():
                raise ReportError("--out is empty; give a folder (it is created if missing), or leave --out out to "
                                  "write into the run or sweep folder")
            path = build_report(Path(args.dir), Path(args.out) if args.out is not None else None,
                                metric=args.metric, goal=args.goal, notes=notes, overwrite=args.overwrite)
        except ReportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Terminated) as e:
            return stopped("runner.report", e, " before the report was complete; its temporary folder was removed. "
                                               "Run the same command again to write it")
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    print(path)
    return 0
