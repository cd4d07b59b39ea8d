"""The run folder's file names, in one place: the loop and trackers write them, sweeps and the report read them.

A run's output folder (Hydra's ``outputs/<date>/<time>``, or one trial of a ``multirun/``) holds::

    metrics.jsonl        one JSON object per logged step (runner.tracking.JsonlTracker)
    summary.json         the last/best values and the run's status
    wandb_run.json       the W&B run's id, group, tags and directory (runner.sweeps)
    FAILED               a sweep trial that failed: the error and its traceback
    .hydra/overrides.yaml  the command-line overrides of the run (Hydra)
    wandb/               the offline W&B run, to ``wandb sync`` later
"""
from __future__ import annotations

from pathlib import Path

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
RUN_INFO_FILE = "wandb_run.json"
FAILED_MARKER = "FAILED"
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"


def read_overrides(run_dir: Path) -> list[str]:
    """The command-line overrides Hydra recorded for a run (``[]`` when there are none)."""
    path = Path(run_dir) / OVERRIDES_FILE
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        import yaml

        data = yaml.safe_load(text)
        if isinstance(data, list):
            return [str(x) for x in data]
        if data is None:
            return []
    except Exception:  # noqa: BLE001 - fall through to a line-based parse
        pass
    return [ln.strip()[2:].strip() for ln in text.splitlines() if ln.strip().startswith("- ")]
