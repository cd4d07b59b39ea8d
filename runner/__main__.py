"""Entry point: ``python -m runner [overrides]`` or the ``runner`` console script (Hydra tab completion)."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import register
from .preflight import PreflightError

register()


CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")  # absolute: works for the console script too


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    from .app import run  # imported here so `--help` and completion stay fast

    hc = HydraConfig.get()
    tags = [f"{k}={v}" for k, v in hc.runtime.choices.items() if not k.startswith("hydra")]
    try:
        return run(cfg, hc.runtime.output_dir, tags=tags)
    except PreflightError as e:
        if hc.mode == RunMode.MULTIRUN:
            raise  # the sweep records this trial as failed and carries on
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
