"""The type handlers the checkpoints are written and read with (``manager.py``)."""
from __future__ import annotations

import jax
import orbax.checkpoint as ocp


def type_handlers():
    """Orbax's standard type handlers, with jax.Arrays written one replica at a time in a single process.

    Orbax's default on CPU and TPU is replica-parallel writing: each replica of a replicated shard (a table's
    rows on every row of the data axis) writes its own slice, cut on the device. Across hosts that spreads the
    writes; in one process every replica is local, so the cutting only adds a device copy of every replicated
    byte and a compiled slice program per array (Orbax's default on GPUs is already off). The 2.47 GiB
    state of ``python -m benchmarks.checkpoint`` (a 10M x 64 table) on a 2 x 4 mesh, 2 CPU cores, saved in the
    background as the runner does by default: written in 1.9-3.2 s, training waiting 0.03 s, with no memory
    above the state's, against 7.5-11.8 s, 0.5-0.6 s and 0.98-0.99 of the state's bytes more at the peak
    replica-parallel (medians of three runs). The array on disk is the same either way, so either reads the
    other's checkpoints."""
    handlers = [(ty, ocp.type_handlers.get_type_handler(ty)) for ty in ocp.type_handlers.supported_types()]
    try:  # the metadata store Orbax's default handler writes with; an Orbax that moves it keeps its defaults
        from orbax.checkpoint._src.metadata import array_metadata_store  # noqa: PLC0415
    except ImportError:
        return ocp.type_handlers.create_type_handler_registry(*handlers)
    if jax.process_count() == 1:
        one = ocp.type_handlers.ArrayHandler(use_replica_parallel=False,
                                             array_metadata_store=array_metadata_store.Store())
        handlers = [(ty, one if ty is jax.Array else h) for ty, h in handlers]
    return ocp.type_handlers.create_type_handler_registry(*handlers)
