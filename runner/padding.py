"""How wide each table is stored (``model.tables.<name>.stored_width``): a set value, checked, or the backend's
default (``runner.core.embeddings.auto_stored_width``: on a TPU, widths of 64 or more padded to a multiple of
128, so XLA keeps the table row-major and the step copies none of it)."""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import jax
from omegaconf import DictConfig

from .core.embeddings import LANES, TableSpec, auto_stored_width
from .errors import PreflightError

if TYPE_CHECKING:
    from .core.mesh import MeshPlan

log = logging.getLogger("runner")


def stored_widths(cfg: DictConfig, plan: MeshPlan | None, specs: dict[str, TableSpec]) -> dict[str, TableSpec]:
    """Each table with its stored width: ``model.tables.<name>.stored_width`` when set (at least the width; the
    width itself: unpadded), else what ``auto_stored_width`` decides for this backend (on a TPU: widths of 64 or
    more padded to a multiple of 128), logged when it pads one."""
    backend, splits = jax.default_backend(), plan is not None and plan.layout.splits_width
    out = {}
    for name, s in specs.items():
        t = cfg.model.tables.get(name)
        stored = None if t is None else t.get("stored_width")
        if stored is None:
            stored = auto_stored_width(s.width, backend, splits)
            if stored and jax.process_index() == 0:
                log.info("table %s stored %d columns wide for the %s (its width %d; model.tables.%s.stored_width=%d "
                         "keeps it unpadded)", name, stored, backend.upper(), s.width, name, s.width)
        elif int(stored) < s.width:
            raise PreflightError(f"model.tables.{name}.stored_width={stored} is narrower than the table's width "
                                 f"{s.width}: set it to at least {s.width} (e.g. {-(-s.width // LANES) * LANES}, the "
                                 f"TPU's lanes), or null")
        out[name] = dataclasses.replace(s, stored_width=int(stored)) if stored and int(stored) != s.width else s
    return out
