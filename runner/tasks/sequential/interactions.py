"""Interaction files: MovieLens / RecBole / generic CSV and Parquet loaders.

Pure numpy + pyarrow (no JAX): the trainer converts the int32 batches to device arrays itself.

Loading
-------
``load_interactions(path)`` reads one interaction file, or a directory holding one, and detects the
format from the file's name and first line:

=========  ==================================================  ======================================
``fmt``    file                                                layout
=========  ==================================================  ======================================
ml-100k    ``u.data`` (also ``u1.base`` ...)                   ``user<TAB>item<TAB>rating<TAB>ts``, no header
ml-dat     ``ratings.dat`` of ml-1m / ml-10m                   ``user::item::rating::ts``, no header
ml-csv     ``ratings.csv`` of ml-20m / 25m / 32m / latest      header ``userId,movieId,rating,timestamp``
recbole    RecBole atomic ``*.inter``                          TAB, typed header ``user_id:token ...``
csv        any CSV/TSV with a header                           columns user, item[, timestamp, rating]
parquet    any Parquet file                                    columns user, item[, timestamp, rating]
=========  ==================================================  ======================================

Column names of the generic formats are matched case-insensitively, ignoring ``_``/``-``: user
(``user``, ``user_id``, ``userId``, ``uid``), item (``item``, ``item_id``, ``itemId``, ``movieId``,
``movie_id``, ``iid``), timestamp (``timestamp``, ``ts``, ``time``), rating (``rating``, ``score``).
Without a timestamp column every timestamp is 0, so the order of the file decides the sequence
order. Float timestamps are floored to int64 seconds; date/time columns become epoch seconds.
Ids are normally integers and are kept as-is (raw ids). Non-integer (string) ids -- e.g. the
Amazon RecBole sets -- are replaced by int64 codes 0..K-1 in order of first appearance, and the
strings are kept in ``Interactions.user_vocab`` / ``item_vocab`` (code -> string).

Parsing is bulk (pyarrow.csv, multi-threaded); ``::`` files are read as bytes and ``::`` is
replaced with a tab first. Only when parsing fails is the file scanned again to find the first bad
line, so errors name the file, the 1-based line number and the line itself.
"""
from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = ["DataError", "Interactions", "SUPPORTED_FORMATS", "drop_duplicates", "duplicate_rows",
           "load_interactions"]

SUPPORTED_FORMATS = (
    "MovieLens u.data (ml-100k), ratings.dat (ml-1m/ml-10m), ratings.csv (ml-20m/25m/32m/latest), "
    "RecBole atomic .inter, or a Parquet/CSV/TSV file with a header naming user and item "
    "[, timestamp, rating] columns"
)


class DataError(ValueError):
    """Unreadable interaction data; the message is one line naming the file (and line)."""


@dataclass(frozen=True, eq=False)
class Interactions:
    """One row per interaction, in file order."""

    user: np.ndarray  # int64 raw ids (or codes into user_vocab)
    item: np.ndarray  # int64 raw ids (or codes into item_vocab)
    timestamp: np.ndarray  # int64 (seconds for MovieLens)
    rating: np.ndarray | None  # float32, None when the file has no rating column
    source: str  # the file that was read
    fmt: str  # one of: ml-100k, ml-dat, ml-csv, recbole, csv, parquet
    user_vocab: np.ndarray | None = None  # object array of the original string ids, if not integer
    item_vocab: np.ndarray | None = None
    has_timestamp: bool = True  # False: the file has no timestamp column (every timestamp is 0)

    def __len__(self) -> int:
        return int(self.user.shape[0])


# --------------------------------------------------------------------------------------------
# format detection

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
_LOCATE_CHUNK = 1 << 22  # bytes re-parsed at a time when hunting for a bad line
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

    def candidates(d: Path) -> list[Path]:
        for name in _DIR_NAMES:
            if (d / name).is_file():
                return [d / name]
        for pattern in ("*.inter", "*.parquet", "*.pq"):
            found = sorted(p for p in d.glob(pattern) if p.is_file())
            if found:
                return found
        return []

    found = candidates(path)
    if not found:  # e.g. the folder the zip was extracted into: data/ -> data/ml-1m/ratings.dat
        found = [c for sub in sorted(p for p in path.iterdir() if p.is_dir()) for c in candidates(sub)[:1]]
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
        raise DataError(f"{path}: unknown interaction file format (binary content, not text); "
                        f"supported: {SUPPORTED_FORMATS}")
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


# --------------------------------------------------------------------------------------------
# text parsing

def _pa_options(spec: _TextSpec, include: list[str], *, threads: bool = True):
    """pyarrow options reading the data rows (header excluded) of a text file."""
    read = pacsv.ReadOptions(
        column_names=list(spec.columns),
        skip_rows=0,
        autogenerate_column_names=False,
        use_threads=threads,
    )
    parse = pacsv.ParseOptions(
        delimiter="\t" if spec.delimiter == "::" else spec.delimiter,
        quote_char='"' if spec.quoted else False,
        ignore_empty_lines=True,
    )
    pa_types = {"int": pa.int64(), "float": pa.float64()}
    convert = pacsv.ConvertOptions(
        column_types={c: pa_types[spec.types[c]] for c in include if spec.types[c] in pa_types},
        include_columns=include,
        null_values=[],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    return read, parse, convert


def _skip_header(data: bytes) -> bytes:
    """Drops everything up to and including the first non-empty line."""
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        line = data[pos:] if nl < 0 else data[pos:nl]
        if line.strip(b"\r") or nl < 0:
            return b"" if nl < 0 else data[nl + 1:]
        pos = nl + 1


def _read_text_table(path: Path, spec: _TextSpec, include: list[str]) -> pa.Table:
    read, parse, convert = _pa_options(spec, include)
    if spec.delimiter == "::":
        source = pa.BufferReader(path.read_bytes().replace(b"::", b"\t"))
    else:
        source = str(path)
    if spec.header:
        read.skip_rows = 1  # header is the first line; column names come from spec.columns
        with open(path, "rb") as f:
            blank_lead = not f.readline().strip(b"\r\n")
        if blank_lead:  # header after leading blank lines: strip explicitly
            source = pa.BufferReader(_skip_header(path.read_bytes()))
            read.skip_rows = 0
    try:
        return pacsv.read_csv(source, read_options=read, parse_options=parse, convert_options=convert)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        where = _locate_bad_line(path, spec, include)
        if where is not None:
            lineno, line, reason = where
            raise DataError(_malformed(path, spec, lineno, line, reason)) from None
        raise DataError(f"{path}: malformed {spec.fmt} file: {_one_line(str(err))}") from None


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[:limit] + "..."


def _malformed(path: Path, spec: _TextSpec, lineno: int, line: bytes, reason: str) -> str:
    shown = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return f"{path}:{lineno}: malformed {spec.fmt} line ({reason}): {shown!r}"


def _check_line(line: bytes, spec: _TextSpec, include: list[str]) -> str | None:
    """The reason the data line is bad, or None."""
    text = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
    if spec.quoted:
        try:
            fields = next(csv.reader([text], delimiter=spec.delimiter, strict=True))
        except csv.Error as e:
            return f"bad quoting: {e}"
    else:
        fields = text.split(spec.delimiter)
    sep = {"\t": "tabs", ",": "commas", ";": "semicolons", "|": "'|'", "::": "'::'"}[spec.delimiter]
    if len(fields) != len(spec.columns):
        return f"expected {len(spec.columns)} fields separated by {sep}, got {len(fields)}"
    by_name = dict(zip(spec.columns, fields))
    for col in include:
        value, kind = by_name[col], spec.types[col]
        if kind == "int":
            ok = re.fullmatch(r"\s*[+-]?\d+\s*", value) is not None and -(1 << 63) <= int(value) < (1 << 63)
        elif kind == "float":
            try:
                float(value)
                ok = value.strip() != ""
            except ValueError:
                ok = False
        else:
            ok = value.strip() != ""
        if not ok:
            want = {"int": "an integer", "float": "a number"}.get(kind, "a value")
            return f"column {col!r} must be {want}, got {value!r}"
    return None


def _locate_bad_line(path: Path, spec: _TextSpec, include: list[str]) -> tuple[int, bytes, str] | None:
    """First bad data line: re-parse in chunks with pyarrow, then check the failing chunk line by line."""
    data = path.read_bytes()
    chunk_bytes = _LOCATE_CHUNK
    pos, lineno, in_header = 0, 1, spec.header
    read, parse, convert = _pa_options(spec, include, threads=False)
    while pos < len(data):
        end = data.find(b"\n", min(pos + chunk_bytes, len(data)) - 1)
        end = len(data) if end < 0 else end + 1
        chunk = data[pos:end]
        lines = chunk.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        body = chunk
        if in_header:
            body = _skip_header(chunk)
        try:
            if spec.delimiter == "::":
                body = body.replace(b"::", b"\t")
            if body.strip():
                pacsv.read_csv(pa.BufferReader(body), read_options=read, parse_options=parse,
                               convert_options=convert)
            chunk_ok = True
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            chunk_ok = False
        if not chunk_ok:
            for i, line in enumerate(lines):
                if not line.rstrip(b"\r"):
                    continue
                if in_header:
                    in_header = False
                    continue
                reason = _check_line(line, spec, include)
                if reason is not None:
                    return lineno + i, line, reason
        elif in_header and any(ln.rstrip(b"\r") for ln in lines):
            in_header = False
        lineno += len(lines)
        pos = end
    return None


def _data_line(path: Path, row: int, header: bool) -> tuple[int, bytes]:
    """Physical 1-based line number and text of 0-based data row `row` (blank lines skipped)."""
    seen = -1 if header else 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.rstrip(b"\r\n"):
                continue
            if seen == row:
                return lineno, line
            seen += 1
    return -1, b""


# --------------------------------------------------------------------------------------------
# column conversion

class _RowError(Exception):
    def __init__(self, row: int, reason: str):
        super().__init__(reason)
        self.row, self.reason = row, reason


def _first_true(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _ids(col: pa.ChunkedArray, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.cast(t.value_type)
        t = col.type
    if col.null_count:
        raise _RowError(_first_true(col.is_null().to_numpy(zero_copy_only=False)), f"{name} is missing")
    if pa.types.is_integer(t):
        return col.to_numpy().astype(np.int64, copy=False), None
    if pa.types.is_floating(t):
        x = col.to_numpy()
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(x) | (x != np.floor(x)) | (np.abs(x) >= 2.0 ** 63)
        if bad.any():
            r = _first_true(bad)
            raise _RowError(r, f"{name} id must be an integer, got {float(x[r])!r}")
        return x.astype(np.int64), None
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        empty = pc.equal(pc.utf8_trim_whitespace(col) if not pa.types.is_binary(t) else col,
                         "" if not pa.types.is_binary(t) else b"")
        empty = empty.to_numpy(zero_copy_only=False)
        if empty.any():
            raise _RowError(_first_true(empty), f"{name} id is empty")
        enc = pc.dictionary_encode(col.combine_chunks())
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        vocab = np.asarray(enc.dictionary.to_pylist(), dtype=object)
        return codes, vocab
    raise _RowError(0, f"{name} column has unsupported type {t}")


def _timestamps(col: pa.ChunkedArray) -> np.ndarray:
    t = col.type
    if col.null_count:
        raise _RowError(_first_true(col.is_null().to_numpy(zero_copy_only=False)), "timestamp is missing")
    if pa.types.is_integer(t):
        return col.to_numpy().astype(np.int64, copy=False)
    if pa.types.is_floating(t):
        x = col.to_numpy()
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(x) | (np.abs(x) >= 2.0 ** 63)
        if bad.any():
            r = _first_true(bad)
            raise _RowError(r, f"timestamp must be a finite int64-range number, got {float(x[r])!r}")
        return np.floor(x).astype(np.int64)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return col.cast(pa.timestamp("s")).cast(pa.int64()).to_numpy()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        numeric = pc.match_substring_regex(col, _NUMBER.pattern).to_numpy(zero_copy_only=False)
        r = _first_true(~numeric) if not numeric.all() else 0
        raise _RowError(r, f"timestamp must be a number or a date/time, got {col[r].as_py()!r}")
    raise _RowError(0, f"timestamp column has non-numeric type {t}")


def _rating(col: pa.ChunkedArray) -> np.ndarray:
    if col.null_count:
        raise _RowError(_first_true(col.is_null().to_numpy(zero_copy_only=False)), "rating is missing")
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise _RowError(0, f"rating column has non-numeric type {col.type}")
    return col.to_numpy().astype(np.float32)


def _table_to_interactions(table: pa.Table, roles: dict, path: Path, fmt: str) -> Interactions:
    user, user_vocab = _ids(table.column(roles["user"]), "user")
    item, item_vocab = _ids(table.column(roles["item"]), "item")
    if "timestamp" in roles:
        ts = _timestamps(table.column(roles["timestamp"]))
    else:
        ts = np.zeros(len(user), np.int64)
    rating = _rating(table.column(roles["rating"])) if "rating" in roles else None
    return Interactions(user=user, item=item, timestamp=ts, rating=rating, source=str(path), fmt=fmt,
                        user_vocab=user_vocab, item_vocab=item_vocab, has_timestamp="timestamp" in roles)


def _load_parquet(path: Path) -> Interactions:
    try:
        names = pq.ParquetFile(path).schema_arrow.names
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"{path}: cannot read Parquet file: {_one_line(str(err))}") from None
    roles = _match_roles(path, names, names, "parquet")
    try:
        table = pq.read_table(path, columns=list(roles.values()))
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"{path}: cannot read Parquet file: {_one_line(str(err))}") from None
    if table.num_rows == 0:
        raise DataError(f"{path}: file is empty (no interactions)")
    try:
        return _table_to_interactions(table, roles, path, "parquet")
    except _RowError as e:
        raise DataError(f"{path}: row {e.row + 1}: {e.reason}") from None


# --------------------------------------------------------------------------------------------
# exact duplicates

_LINE_SEARCH_ROWS = 1 << 20
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))


def duplicate_rows(inter: Interactions) -> np.ndarray:
    """Increasing indices of the rows equal in user, item and timestamp to an earlier row (int64).

    A file without a timestamp column has none by this rule: its rows are ordered by their position, so a
    repeated (user, item) there is a repeat, not a copy. One sort of a 64-bit hash of every row finds the
    candidates (rows whose hash occurs twice); only those are compared exactly, so a file without
    duplicates costs one hash and one sort."""
    n = len(inter)
    if not inter.has_timestamp or n < 2:
        return np.zeros(0, np.int64)
    with np.errstate(over="ignore"):
        h = (inter.user.astype(np.uint64) * _MIX[0]) ^ (inter.item.astype(np.uint64) * _MIX[1]) \
            ^ (inter.timestamp.astype(np.uint64) * _MIX[2])
    s = np.sort(h)
    repeated = s[1:][s[1:] == s[:-1]]
    if repeated.size == 0:
        return np.zeros(0, np.int64)
    rows = np.flatnonzero(np.isin(h, repeated))
    u, i, t = inter.user[rows], inter.item[rows], inter.timestamp[rows]
    order = np.lexsort((rows, t, i, u))  # equal rows together, each group in file order
    same = (u[order][1:] == u[order][:-1]) & (i[order][1:] == i[order][:-1]) & (t[order][1:] == t[order][:-1])
    return np.sort(rows[order][1:][same])


def drop_duplicates(inter: Interactions) -> tuple[Interactions, np.ndarray]:
    """(``inter`` without the rows ``duplicate_rows`` finds, those rows' indices); the first of each kept."""
    dup = duplicate_rows(inter)
    if dup.size == 0:
        return inter, dup
    keep = np.ones(len(inter), bool)
    keep[dup] = False
    return dataclasses.replace(inter, user=inter.user[keep], item=inter.item[keep],
                               timestamp=inter.timestamp[keep],
                               rating=None if inter.rating is None else inter.rating[keep]), dup


def data_line(inter: Interactions, row: int) -> str:
    """Where 0-based data row ``row`` of ``inter`` is in its file: ``line N`` (text) or ``row N`` (Parquet)."""
    if inter.fmt == "parquet":
        return f"row {row + 1}"
    if row >= _LINE_SEARCH_ROWS:  # finding the line reads the file line by line
        return f"data row {row + 1}"
    lineno, _ = _data_line(Path(inter.source), row, inter.fmt not in ("ml-100k", "ml-dat"))
    return f"line {lineno}" if lineno > 0 else f"data row {row + 1}"


def load_interactions(path: str | Path) -> Interactions:
    """Reads an interaction file (or a directory holding one); see the module docstring for formats."""
    try:
        return _load(Path(path).expanduser())
    except OSError as e:  # unreadable: permissions, a vanished file, an I/O error
        where = e.filename or path
        raise DataError(f"{where}: cannot read: {e.strerror or e}") from None


def _load(path: Path) -> Interactions:
    path = _resolve_path(path)
    spec = _detect(path)
    if spec == "parquet":
        return _load_parquet(path)
    include = list(dict.fromkeys(spec.roles.values()))
    table = _read_text_table(path, spec, include)
    if table.num_rows == 0:
        raise DataError(f"{path}: file is empty (no interactions after the header)")
    try:
        return _table_to_interactions(table, spec.roles, path, spec.fmt)
    except _RowError as e:
        lineno, line = _data_line(path, e.row, spec.header)
        raise DataError(_malformed(path, spec, lineno, line, e.reason)) from None
