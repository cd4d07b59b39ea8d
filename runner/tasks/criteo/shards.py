"""Random access to converted shards (``prepare.convert``): a split's examples by global index.

``Shards(folder, split)`` maps each shard file (``np.load(mmap_mode="r")``; nothing is read until indexed)
and implements the random-access source protocol Grain's loaders take (``__len__``, ``__getitem__``), so
a shuffled, sharded, checkpointable reader is an index sampler over it. ``take(indices)`` reads many
examples at once, in the order given, with their categorical values mapped to rows by an id map
(``ids.HashIds`` or ``ids.VocabIds``).

Every record ``take`` reads is checked for what a conversion always writes (a 0/1 label, no more values than
a feature's bag, finite integer features >= 0, a click probability in [0, 1] or NaN): a shard damaged in
place is a :class:`DamagedShard` naming the file and the record. The manifest's SHA-256 of each shard is not
checked when a folder is opened: hashing runs at about 1 s/GB on one core (SHA-NI), some 15 minutes at every
start for the ~800 GB of shards of the Terabyte log; the digests fingerprint the folder for checkpoints.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .prepare import FORMAT, SPLITS, record_dtype
from .tsv import check_bags


class DamagedShard(ValueError):
    """A record no conversion writes; the message names the shard file and the record."""


def read_manifest(folder: str | Path) -> dict:
    """``folder/manifest.json``, checked to have the converter's layout: a ValueError (JSON's own included) or
    an OSError says what is wrong."""
    path = Path(folder) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no manifest.json, so no complete conversion; convert the logs with "
                                f"python -m runner.prepare criteo <files> --out {folder}")
    m = json.loads(path.read_text())
    if not isinstance(m, dict):
        raise ValueError(f"{path}: a JSON {type(m).__name__}, not the object the converter writes")
    if m.get("format") != FORMAT:
        raise ValueError(f"{path}: format {m.get('format')!r}, this runner reads {FORMAT}; convert the logs again")

    def listed(x) -> bool:
        return isinstance(x, list) and all(isinstance(e, dict) for e in x)

    def shards(s) -> bool:
        split = m["splits"].get(s)
        return isinstance(split, dict) and listed(split.get("shards")) and all(
            isinstance(e.get("file"), str) and type(e.get("examples")) is int for e in split["shards"])

    checks = {"bags": lambda: check_bags(m["bags"]) and all(type(b) is int for b in m["bags"]),
              "split": lambda: m["split"] in ("day", "seeded"),
              "files": lambda: listed(m["files"]),
              "bad_lines": lambda: type(m.get("bad_lines", 0)) is int and type(m.get("max_bad_lines", 0)) is int,
              "splits": lambda: isinstance(m["splits"], dict) and all(shards(s) for s in SPLITS)}
    wrong = []
    for key, check in checks.items():
        try:
            ok = check()
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            wrong.append(key)
    if wrong:
        raise ValueError(f"{path}: {', '.join(wrong)} not as the converter writes {'them' if len(wrong) > 1 else 'it'}")
    return m


class Shards:
    """One split of a converted folder."""

    def __init__(self, folder: str | Path, split: str):
        folder = Path(folder)
        self.manifest = read_manifest(folder)
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: one of {', '.join(SPLITS)}")
        self.bags = tuple(self.manifest["bags"])
        self.dtype = record_dtype(self.bags)
        entries = self.manifest["splits"][split]["shards"]
        self.files = [folder / e["file"] for e in entries]
        self.arrays = [np.load(f, mmap_mode="r") for f in self.files]
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
        """The ``RECORD`` s at ``indices`` (any order, repeats allowed), each checked (:class:`DamagedShard`)."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"examples outside 0..{len(self) - 1}")
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        out = np.empty(indices.shape, self.dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.arrays[s][indices[sel] - self.starts[s]]
            self._check(out[sel], self.files[s], indices[sel] - self.starts[s])
        return out

    def _check(self, rec: np.ndarray, file: Path, at: np.ndarray) -> None:
        """Refuse records no conversion writes (``at``: their places in ``file``)."""
        label, dense, p = rec["label"], rec["dense"], rec["p"]
        bad = {"the label {}, not 0 or 1": (label != 0) & (label != 1),
               "more values than a feature's bag": np.any(rec["count"] > np.asarray(self.bags, np.int64), axis=1),
               "an integer feature not finite or below 0": ~np.all(np.isfinite(dense) & (dense >= 0), axis=1),
               "a click probability outside [0, 1]": ~(np.isnan(p) | ((p >= 0) & (p <= 1)))}
        for what, mask in bad.items():
            if mask.any():
                i = int(np.argmax(mask))
                raise DamagedShard(f"{file}: record {int(at[i]):,} holds {what.format(label[i])}, which no "
                                   f"conversion writes")

    def take(self, indices: np.ndarray, ids) -> dict[str, np.ndarray]:
        """A batch: ``label`` float32 [n], ``dense`` float32 [n, 13], ``cat`` int32 [n, sum(bags)] rows (``ids``;
        0 pads a bag), ``p`` float32 [n] (the true click probability, NaN where the logs had none)."""
        rec = self.records(indices)
        return {"label": rec["label"].astype(np.float32), "dense": np.asarray(rec["dense"]),
                "cat": ids(rec["cat"], rec["count"]), "p": np.asarray(rec["p"])}
