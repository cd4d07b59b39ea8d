"""Random access to converted shards (``prepare.convert``): a split's examples by global index.

``Shards(folder, split)`` maps each shard file (``np.load(mmap_mode="r")``; nothing is read until indexed)
and implements the random-access source protocol Grain's loaders take (``__len__``, ``__getitem__``), so
a shuffled, sharded, checkpointable reader is an index sampler over it. ``take(indices)`` reads many
examples at once, in the order given, with their categorical values mapped to rows by an id map
(``ids.HashIds`` or ``ids.VocabIds``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .prepare import FORMAT, SPLITS, record_dtype


class Shards:
    """One split of a converted folder."""

    def __init__(self, folder: str | Path, split: str):
        folder = Path(folder)
        manifest = folder / "manifest.json"
        if not manifest.exists():
            raise FileNotFoundError(f"{folder}: no manifest.json, so no complete conversion; convert the logs with "
                                    f"python -m runner.prepare criteo <files> --out {folder}")
        self.manifest = json.loads(manifest.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest}: format {self.manifest.get('format')!r}, this runner reads {FORMAT}; "
                             f"convert the logs again")
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: one of {', '.join(SPLITS)}")
        self.bags = tuple(self.manifest["bags"])
        self.dtype = record_dtype(self.bags)
        entries = self.manifest["splits"][split]["shards"]
        self.arrays = [np.load(folder / e["file"], mmap_mode="r") for e in entries]
        for e, a in zip(entries, self.arrays):
            if a.dtype != self.dtype or len(a) != e["examples"]:
                raise ValueError(f"{folder / e['file']}: {len(a)} records of {a.dtype}, the manifest says "
                                 f"{e['examples']} of the converter's record; the folder is damaged: convert again")
        self.starts = np.concatenate([[0], np.cumsum([len(a) for a in self.arrays])]).astype(np.int64)
        self.arrays = [np.asarray(a) for a in self.arrays]  # plain views of the maps: indexing skips np.memmap's wrapper

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> np.void:
        if not -len(self) <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        index %= len(self)
        s = int(np.searchsorted(self.starts, index, side="right") - 1)
        return self.arrays[s][index - self.starts[s]]

    def records(self, indices: np.ndarray) -> np.ndarray:
        """The ``RECORD`` s at ``indices`` (any order, repeats allowed)."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"examples outside 0..{len(self) - 1}")
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        out = np.empty(indices.shape, self.dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.arrays[s][indices[sel] - self.starts[s]]
        return out

    def take(self, indices: np.ndarray, ids) -> dict[str, np.ndarray]:
        """A batch: ``label`` float32 [n], ``dense`` float32 [n, 13], ``cat`` int32 [n, sum(bags)] rows (``ids``;
        0 pads a bag), ``p`` float32 [n] (the true click probability, NaN where the logs had none)."""
        rec = self.records(indices)
        return {"label": rec["label"].astype(np.float32), "dense": np.asarray(rec["dense"]),
                "cat": ids(rec["cat"], rec["count"]), "p": np.asarray(rec["p"])}
