"""How wide each table is stored (``model.tables.<name>.stored_width``): a set value, checked, or the backend's
default (``runner.core.embeddings.auto_stored_width``: on a TPU, widths of 64 or more padded to a multiple of
128, so XLA keeps the table row-major and the step copies none of it)."""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import jax
from omegaconf import DictConfig

from .core.embeddings import TableSpec, auto_stored_width
from .errors import PreflightError

if TYPE_CHECKING:
    from .core.mesh import MeshPlan

log = logging.getLogger("runner")


def stored_width(name: str, t: DictConfig, emb_width: int) -> int | None:
    """``model.tables.<name>.stored_width``, checked: at least the table's width. None when it is the width or
    null (``padded_for_backend`` then applies the backend's default to a null one)."""
    stored, width = t.get("stored_width"), t.width or emb_width
    if stored is None or int(stored) == width:
        return None
    if int(stored) < width:
        raise PreflightError(f"model.tables.{name}.stored_width={stored} is narrower than the table's width {width}: "
                             f"set it to at least {width} (e.g. {-(-width // 128) * 128}, the TPU's lanes), or null")
    return int(stored)


def padded_for_backend(cfg: DictConfig, plan: MeshPlan | None, specs: dict[str, TableSpec]) -> dict[str, TableSpec]:
    """The tables whose ``stored_width`` is null, stored as ``auto_stored_width`` decides for this backend (on a
    TPU: widths of 64 or more padded to a multiple of 128); logged when it pads one."""
    backend, splits = jax.default_backend(), plan is not None and plan.layout.splits_width
    out = {}
    for name, s in specs.items():
        t = cfg.model.tables.get(name)
        auto = auto_stored_width(s.width, backend, splits) if t is None or t.get("stored_width") is None else None
        out[name] = dataclasses.replace(s, stored_width=auto) if auto else s
        if auto and jax.process_index() == 0:
            log.info("table %s stored %d columns wide for the %s (its width %d; model.tables.%s.stored_width=%d "
                     "keeps it unpadded)", name, auto, backend.upper(), s.width, name, s.width)
    return out
