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

This module reads text and Parquet files; ``formats.py`` detects the format, ``columns.py`` converts the
parsed columns, ``duplicates.py`` finds exact duplicate rows and ``records.py`` holds the
:class:`Interactions` they make and the :class:`DataError` they raise.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .columns import _RowError, _table_to_interactions
from .duplicates import drop_duplicates, duplicate_rows
from .formats import _TextSpec, _detect, _match_roles, _resolve_path
from .records import SUPPORTED_FORMATS, DataError, Interactions

__all__ = ["DataError", "Interactions", "SUPPORTED_FORMATS", "drop_duplicates", "duplicate_rows",
           "load_interactions"]

_LOCATE_CHUNK = 1 << 22  # bytes re-parsed at a time when hunting for a bad line
_LINE_SEARCH_ROWS = 1 << 20  # data_line: past this row, the line is not searched for


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
