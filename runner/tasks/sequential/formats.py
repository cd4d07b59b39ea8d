"""Which interaction file format a file is: from its name and first line, the layout (``_TextSpec``: the
delimiter, the header, which column is the user, item, timestamp and rating) the text reader parses, or
``"parquet"``. A folder is resolved to the one interaction file it holds first."""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from .records import SUPPORTED_FORMATS, DataError

_ROLE_ALIASES = {
    "user": {"user", "userid", "uid"},
    "item": {"item", "itemid", "movieid", "iid", "movie"},
    "timestamp": {"timestamp", "ts", "time"},
    "rating": {"rating", "score"},
}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_RECBOLE_FIELD = re.compile(r"^[^:\s]+:(token|float|token_seq|float_seq)$")
_ML_COLUMNS = ("user", "item", "rating", "timestamp")
_ML_TYPES = {"user": "int", "item": "int", "rating": "float", "timestamp": "int"}
_HEAD_BYTES = 1 << 16
_DIR_NAMES = ("ratings.dat", "ratings.csv", "u.data", "ratings.parquet", "interactions.parquet",
              "interactions.csv", "interactions.tsv")


@dataclass(frozen=True)
class _TextSpec:
    fmt: str
    delimiter: str  # as written in the file: "\t", ",", ";", "|" or "::"
    header: bool
    columns: tuple[str, ...]  # every column of the file, in order
    roles: dict  # role -> column name
    types: dict  # column name -> "int" | "float" | "auto"
    quoted: bool  # whether '"' quoting is honoured (generic CSV only)


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.strip().lower())


def _match_roles(path: Path, names: list[str], base: list[str], fmt: str) -> dict:
    roles: dict = {}
    for name, b in zip(names, base):
        for role, aliases in _ROLE_ALIASES.items():
            if _norm(b) in aliases:
                if role in roles:
                    raise DataError(f"{path}: ambiguous {fmt} columns {roles[role]!r} and {name!r} "
                                    f"both look like the {role} column")
                roles[role] = name
    missing = [r for r in ("user", "item") if r not in roles]
    if missing:
        raise DataError(f"{path}: unknown interaction file format (no {' or '.join(missing)} column "
                        f"among {', '.join(names)}); supported: {SUPPORTED_FORMATS}")
    return roles


def _resolve_path(path: Path) -> Path:
    if not path.exists():
        raise DataError(f"interaction data not found: {path}")
    if path.is_file():
        return path
    if not path.is_dir():
        raise DataError(f"{path}: not a regular file or directory")

    try:
        entries = sorted(path.iterdir())
    except PermissionError:
        raise DataError(f"{path}: cannot read the folder (permission denied)") from None

    def candidates(d: Path) -> list[Path]:
        named = [d / name for name in _DIR_NAMES if (d / name).is_file()]
        if named:  # several: which one is meant is not for the loader to guess
            return named
        for pattern in ("*.inter", "*.parquet", "*.pq"):
            found = sorted(p for p in d.glob(pattern) if p.is_file())
            if found:
                return found
        return []

    found = candidates(path)
    if not found:  # e.g. the folder the zip was extracted into: data/ -> data/ml-1m/ratings.dat
        found = [c for sub in entries if sub.is_dir() for c in candidates(sub)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(f"{path}: directory holds no interaction file (looked for "
                        f"{', '.join(_DIR_NAMES)}, *.inter, *.parquet); supported: {SUPPORTED_FORMATS}")
    raise DataError(f"{path}: directory holds several interaction files "
                    f"({', '.join(str(p.relative_to(path)) for p in found)}); pass one of them")


def _binary(text: str) -> bool:
    """More than 1% undecodable or control characters (tab, CR, LF aside): not a text file."""
    sample = text[:8192]
    bad = sum(1 for c in sample if c == "\ufffd" or (ord(c) < 32 and c not in "\t\r\n") or c == "\x7f")
    return bad > max(len(sample) // 100, 0)


def _detect(path: Path) -> _TextSpec | str:
    """Returns "parquet" or the text layout; raises DataError for empty/unknown files."""
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    if head.startswith(b"PAR1") or path.suffix.lower() in (".parquet", ".pq"):
        if not head:
            raise DataError(f"{path}: file is empty")
        return "parquet"
    if not head.strip():
        raise DataError(f"{path}: file is empty")
    if head.startswith((b"\x1f\x8b", b"PK\x03\x04", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")):
        raise DataError(f"{path}: a compressed file or archive (gzip/zip/bz2/xz/zstd): extract it first and "
                        f"point data.path at the interaction file inside")
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    if b"\x00" in head or _binary(text):
        raise DataError(f"{path}: unknown interaction file format (binary content, not UTF-8 text); if it is "
                        f"text in another encoding (e.g. Latin-1), save it as UTF-8; supported: {SUPPORTED_FORMATS}")
    first = next((ln.rstrip("\r") for ln in text.split("\n") if ln.strip("\r")), "")

    fields = first.split("\t")
    if path.suffix.lower() == ".inter" or (len(fields) >= 2 and all(_RECBOLE_FIELD.match(x) for x in fields)):
        if not all(_RECBOLE_FIELD.match(x) for x in fields):
            raise DataError(f"{path}:1: malformed recbole header (expected tab-separated name:type "
                            f"fields, type token/float/token_seq/float_seq): {first[:200]!r}")
        base = [x.split(":")[0] for x in fields]
        roles = _match_roles(path, fields, base, "recbole")
        types = {c: ("float" if c.endswith(":float") else "auto") for c in fields}
        return _TextSpec("recbole", "\t", True, tuple(fields), roles, types, quoted=False)

    if "::" in first:
        parts = first.split("::")
        if len(parts) == 4 and all(_NUMBER.match(x.strip()) for x in parts):
            return _TextSpec("ml-dat", "::", False, _ML_COLUMNS, {c: c for c in _ML_COLUMNS},
                             dict(_ML_TYPES), quoted=False)
        raise DataError(f"{path}: unknown interaction file format ('::'-separated, but the first line "
                        f"is not user::item::rating::timestamp: {first[:200]!r}); supported: {SUPPORTED_FORMATS}")

    counts = {d: first.count(d) for d in ("\t", ",", ";", "|")}
    delim = max(counts, key=counts.get)
    if counts[delim] == 0:
        raise DataError(f"{path}: unknown interaction file format (first line has no tab, comma, "
                        f"semicolon or '::' separator: {first[:200]!r}); supported: {SUPPORTED_FORMATS}")
    fields = next(csv.reader([first], delimiter=delim))
    if all(_NUMBER.match(x.strip()) for x in fields):
        if delim == "\t" and len(fields) == 4:
            return _TextSpec("ml-100k", "\t", False, _ML_COLUMNS, {c: c for c in _ML_COLUMNS},
                             dict(_ML_TYPES), quoted=False)
        raise DataError(f"{path}: unknown interaction file format (no header and not the 4-column "
                        f"tab-separated u.data layout: {first[:200]!r}); supported: {SUPPORTED_FORMATS}")
    names = [x.strip() for x in fields]
    roles = _match_roles(path, names, names, "csv")
    if delim == "," and names == ["userId", "movieId", "rating", "timestamp"]:
        return _TextSpec("ml-csv", ",", True, tuple(names), roles,
                         {"userId": "int", "movieId": "int", "rating": "float", "timestamp": "int"},
                         quoted=False)
    types = {c: "auto" for c in names}
    if "rating" in roles:
        types[roles["rating"]] = "float"
    return _TextSpec("csv", delim, True, tuple(names), roles, types, quoted=True)
