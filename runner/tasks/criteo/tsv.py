"""Reading click logs in the Criteo format, streamed in bounded memory.

One example per line, tab-separated: the label (0 or 1), 13 integer features and 26 categorical features,
each categorical an 8-digit hex string (a 32-bit hash of the raw value, as Criteo ships them). Any feature may
be empty (missing). This is the layout of Kaggle's Display Advertising Challenge ``train.txt`` and of the
Criteo Terabyte log's ``day_0`` ... ``day_23`` (also gzipped).

:func:`read_blocks` parses a file with pyarrow's streaming CSV reader (``pyarrow.csv.open_csv``, one block
of about ``block_bytes`` at a time, never the whole file) into :class:`Block` s of numpy arrays:

- ``label``: int8, 0 or 1.
- ``dense``: float32 ``[n, 13]``: missing -> 0, negative -> 0, then ``log(1 + x)`` (the DLRM reference's
  transform).
- ``cat``: uint32 ``[n, sum(bags)]``, the hex values, feature ``j`` in columns ``offsets(bags)[j]`` onwards
  (one column each unless ``bags`` says otherwise); ``count``: uint8 ``[n, 26]``, the values each field holds
  (0: empty, a missing value; ``missing`` is ``count == 0``).

Multi-hot features (a bag of values per feature, as MLPerf DLRMv2's multi-hot Criteo): with ``bags[j] > 1``,
field ``j`` holds up to ``bags[j]`` values of 8 hex digits joined by commas (``0a1b2c3d,ffff0000``); the
padding columns past a field's count are 0.

A line ends at ``\\n`` or ``\\r\\n``; a ``\\r`` anywhere else is part of its line, which no field takes (pyarrow
would end the line there: ``newlines.py``). A bad line (a wrong number of fields, an empty line, a label that is
not 0 or 1, an integer feature that is not an integer, a categorical that is not 8 hex digits, a bag of more
values than its size, a stray ``\\r``) stops the read with a :class:`FormatError` naming the file,
the line and the field, unless ``max_bad_lines`` allows that many: those lines are then skipped and counted
(:attr:`Reader.bad_lines`). An empty file and a truncated ``.gz`` are refused the same way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import re
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .disk import reason
from .newlines import Lines, carriage_return

NUM_DENSE = 13
NUM_CAT = 26
DENSE = tuple(f"int_{i}" for i in range(1, NUM_DENSE + 1))
CAT = tuple(f"cat_{i}" for i in range(1, NUM_CAT + 1))
COLUMNS = ("label", *DENSE, *CAT)
# pyarrow's block. Its streaming reader holds 30-40 blocks' worth of memory at once (raw and parsed: about 160 MB at
# 4 MB blocks, 510 MB at 16 MB); on a 500 MB generated log 4 MB also converted faster than 16 MB or 2 MB
BLOCK_BYTES = 1 << 22
MAX_BAG = 255  # the most values one field's bag holds (a count is one byte)
ONE_HOT = (1,) * NUM_CAT

_NIBBLE = np.full(256, 255, np.uint8)  # byte -> its hex digit's value, 255 for any other byte
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _NIBBLE[_c] = 10 + _i
_INT = r"^-?[0-9]+$"
GZIP_MAGIC = b"\x1f\x8b"
MAX_SEED = 2**32 - 1  # a split's or a generated log's seed: 0..MAX_SEED, as a run's seeds (runner.config)


class FormatError(ValueError):
    """A line of a Criteo-format file that cannot be read; the message names the file, the line and the fix.
    For a bad line, ``line``, ``why`` and ``count`` (its number, what is wrong with it, the file's bad lines so
    far) let a caller word its own fix; ``line`` is None for a problem of the whole file (empty, truncated)."""

    def __init__(self, message: str, path: Path | None = None, line: int | None = None, why: str = "",
                 count: int = 0):
        super().__init__(message)
        self.path, self.line, self.why, self.count = path, line, why, count


@dataclasses.dataclass
class Block:
    """Parsed examples of consecutive lines (bad lines skipped under ``max_bad_lines``)."""

    label: np.ndarray  # int8 [n]
    dense: np.ndarray  # float32 [n, 13]: log(1 + max(x, 0)), missing -> 0
    cat: np.ndarray  # uint32 [n, sum(bags)]: feature j's values from column offsets(bags)[j], 0 past its count
    count: np.ndarray  # uint8 [n, 26]: the values of each feature (0: missing)
    lines: np.ndarray  # int64 [n]: each example's 1-based line number in its file

    def __len__(self) -> int:
        return int(self.label.shape[0])

    @property
    def missing(self) -> np.ndarray:
        """bool ``[n, 26]``: where the field was empty."""
        return self.count == 0


def check_bags(bags) -> tuple[int, ...]:
    """``bags`` as 26 ints in ``1..MAX_BAG`` (None: one value per feature); a ValueError names a bad one."""
    if bags is None:
        return ONE_HOT
    bags = tuple(bags)
    if len(bags) != NUM_CAT or any(int(b) != b or not 1 <= b <= MAX_BAG for b in bags):
        raise ValueError(f"bag sizes {list(bags)}: {NUM_CAT} integers in 1..{MAX_BAG}, one per categorical "
                         f"feature (1: one value)")
    return tuple(int(b) for b in bags)


def offsets(bags) -> np.ndarray:
    """int64 ``[27]``: feature ``j``'s first column in ``Block.cat`` (and records), then the total."""
    return np.concatenate([[0], np.cumsum(check_bags(bags))]).astype(np.int64)


_EMPTY = "copy it again (an interrupted download or copy leaves an empty file), or leave it out of the inputs"


def unreadable(path: Path) -> FormatError | None:
    """Why ``path`` cannot be read as a log before a line of it is: a folder, or permission denied (on the file,
    or on a folder above it, which makes even its existence unknown); None otherwise (a missing file, a pipe:
    the reader names those). Checked before a conversion takes its output folder, and by the reader itself, so
    the user is told about the file they gave, not an ``[Errno 13]`` about whatever was opened first."""
    try:
        if path.is_dir():
            return FormatError(f"{path}: a folder; give the Criteo-format files in it (train.txt, or day_0 ... "
                               f"day_23, .gz too)", path)
        found = path.is_file()
    except PermissionError:  # stat refused: a folder on the path
        return FormatError(f"{path}: permission denied, a folder above it may not be searched by this user (so not "
                           f"even whether the file exists is known); let it (chmod +x on that folder, as its owner), "
                           f"or run as a user who may read the file", path)
    try:
        if found:
            with open(path, "rb"):
                pass
    except PermissionError:
        return FormatError(f"{path}: permission denied, this user may not read the file; let it (chmod +r {path}, "
                           f"as its owner), or run as a user who may read it", path)
    except OSError:  # anything else the reader reports as it opens the file
        return None
    return None


def _hint(max_bad_lines: int) -> str:
    return (f"fix or remove the line, or convert with --max-bad-lines above {max_bad_lines} (python -m "
            f"runner.prepare criteo) to skip and count such lines (the manifest reports how many)")


class Reader:
    """Iterates a file's :class:`Block` s (``iter(reader)``); ``bad_lines`` counts the lines skipped so far and
    ``first_bad`` describes the first of them."""

    def __init__(self, path: str | Path, max_bad_lines: int = 0, block_bytes: int = BLOCK_BYTES, bags=None):
        self.path, self.max_bad_lines, self.block_bytes = Path(path), int(max_bad_lines), int(block_bytes)
        self.bags = check_bags(bags)
        self.bad_lines, self.first_bad, self.examples = 0, None, 0
        if self.max_bad_lines < 0:
            raise ValueError(f"max_bad_lines={max_bad_lines}: must be >= 0 (0 refuses any bad line)")

    def _bad(self, line: int, why: str) -> None:
        """One bad line: counted, or (past ``max_bad_lines``) refused with a message."""
        self.bad_lines += 1
        self.first_bad = self.first_bad or f"{self.path}:{line}: {why}"
        if self.bad_lines > self.max_bad_lines:
            raise FormatError(f"{self.path}, line {line}: {why}; "
                              + (f"it is bad line {self.bad_lines} (--max-bad-lines {self.max_bad_lines}); "
                                 if self.max_bad_lines else "") + _hint(self.max_bad_lines),
                              self.path, line, why, self.bad_lines)

    def __iter__(self) -> Iterator[Block]:
        problem = unreadable(self.path)
        if problem:
            raise problem
        if not self.path.is_file():
            raise FormatError(f"{self.path}: no such file; give the path of a Criteo-format TSV (or .gz) file")
        if self.path.stat().st_size == 0:
            raise FormatError(f"{self.path}: the file is empty; a Criteo-format file has one example per line: "
                              f"{_EMPTY}")
        gz = self.path.suffix == ".gz"
        try:  # the checks above may pass and the opening still fail (a file changed since, a failing disk)
            if not gz:
                with open(self.path, "rb") as f:
                    magic = f.read(2)
            source = Lines(pa.input_stream(str(self.path), compression="gzip" if gz else None))
        except OSError as e:
            raise self._cannot_read(e) from None
        if not gz and magic == GZIP_MAGIC:
            source.close()
            raise FormatError(f"{self.path}: the file is gzip-compressed, and only a name ending in .gz is "
                              f"read as gzip; rename it to {self.path.name}.gz (or gunzip it)")
        skipped: list[tuple[int, str]] = []

        def on_invalid(row) -> str:
            fields = (f"{row.actual_columns} tab-separated fields, a Criteo line has {len(COLUMNS)} (the label, "
                      f"{NUM_DENSE} integer and {NUM_CAT} categorical features)")
            skipped.append((row.number, carriage_return(f"and {fields}") if row.number in source.stray else fields))
            return "skip"

        try:
            with _quiet_undecodable(on_invalid):  # the first block is read here
                reader = pacsv.open_csv(
                    source,
                    read_options=pacsv.ReadOptions(column_names=list(COLUMNS), block_size=self.block_bytes,
                                                   use_threads=False),
                    parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False,
                                                     escape_char=False, ignore_empty_lines=False,
                                                     invalid_row_handler=on_invalid),
                    convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in COLUMNS},
                                                         strings_can_be_null=False, quoted_strings_can_be_null=False))
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            source.close()
            self._unreadable(e, gz, 1, source.found)
        next_line = 1
        with contextlib.closing(source):
            while True:
                try:
                    with _quiet_undecodable(on_invalid):
                        batch = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError, EOFError) as e:
                    self._unreadable(e, gz, next_line, source.found)
                # pyarrow parses a block ahead: ``skipped`` may hold refused rows of the next block too. The batch's
                # lines are the first ``rows`` numbers from next_line that were not refused
                rows, refused = batch.num_rows, np.array([line for line, _ in skipped], np.int64)
                span = np.arange(next_line, next_line + rows + len(refused), dtype=np.int64)
                lines = span[~np.isin(span, refused)][:rows]
                next_line = int(lines[-1]) + 1 if rows else next_line
                mine = [s for s in skipped if s[0] < next_line]
                skipped[:] = [s for s in skipped if s[0] >= next_line]
                block = self._parse(batch, lines, mine, source.stray)
                if len(block):
                    self.examples += len(block)
                    yield block
        for line, why in skipped:  # rows refused after the last batch (every row, when no line has 40 fields)
            self._bad(line, why)
        if self.examples == 0 and self.bad_lines == 0:
            raise FormatError(f"{self.path}: the file has no lines; a Criteo-format file has one example per line: "
                              f"{_EMPTY}")

    def _cannot_read(self, e: OSError) -> FormatError:
        """The system refused a read of the file (``e`` has an errno; a gzip or parse error has none)."""
        how = (f"let this user read it (chmod +r {self.path}, as its owner), or run as a user who may read it"
               if e.errno in (errno.EACCES, errno.EPERM) else "check the disk it is on, copy it again, or leave it out")
        return FormatError(f"{self.path}: reading the log failed ({reason(e)}); {how}", self.path)

    def _unreadable(self, e: Exception, gz: bool, line: int, stray: bool):
        if isinstance(e, OSError) and e.errno:  # the system's, not the format's
            raise self._cannot_read(e) from None
        if "Empty CSV file" in str(e):
            raise FormatError(f"{self.path}: the file has no lines; a Criteo-format file has one example per "
                              f"line: {_EMPTY}") from None
        row = re.search(r"Row #(\d+)", str(e))  # pyarrow numbers rows from the file's first
        at = f"line {row.group(1)}" if row else f"near line {line}"
        if not gz or isinstance(e, pa.ArrowInvalid):  # a parse error; a gzip stream's own errors are below
            if "straddle" in str(e):
                raise FormatError(f"{self.path}: {at}: a line longer than the reader's block of "
                                  f"{self.block_bytes // 1024:,} KiB (a Criteo line is a few hundred bytes); the file "
                                  f"is not a Criteo log or the line is damaged: fix or remove it"
                                  + ("; it holds carriage returns (\\r) no \\n follows, and only \\n (or \\r\\n) "
                                     "ends a line: if its lines end in \\r alone, convert it (tr '\\r' '\\n')"
                                     if stray else "")
                                  ) from None
            if "UTF8" in str(e) or "UTF-8" in str(e) or "\ufffd" in str(e):  # bytes that are not text
                raise FormatError(f"{self.path}: {at}: not UTF-8 text; a Criteo log is plain text (a compressed "
                                  f"file other than .gz, such as .bz2, .xz or .zip, or a converted shard, is not "
                                  f"one): fix or remove the line, or give the log itself") from None
        if gz:  # the reader reads a block of text at a time: a break in the first one comes before any line
            where = (f"near line {line}" if line > 1 else
                     f"within its first {self.block_bytes // 1024:,} KiB of text (the first block read)")
            raise FormatError(f"{self.path}: the gzip stream ends or breaks {where} ({e}); the file is "
                              f"truncated or damaged: download or copy it again (gzip -t {self.path} checks it)") from None
        shown = re.sub(r"[^\x20-\x7e\t]", "?", str(e))[:300]  # what pyarrow echoes of the line, printable only
        raise FormatError(f"{self.path}: cannot be read as tab-separated text, {at} ({shown}); fix or remove the "
                          f"line") from None

    def _parse(self, batch: pa.RecordBatch, lines: np.ndarray, refused: list[tuple[int, str]],
               stray: dict[int, int]) -> Block:
        """The batch's examples; its bad lines and the ``refused`` rows among them (a wrong field count) are
        counted in the order of their lines. ``stray``: the file's lines holding a stray ``\\r`` and the field
        it is in (``newlines.Lines``)."""
        n = batch.num_rows
        ok = np.ones(n, bool)
        cols = {c: batch.column(i) for i, c in enumerate(COLUMNS)}
        lengths = {c: pc.utf8_length(cols[c]).to_numpy(zero_copy_only=False) for c in COLUMNS}
        empty = np.all(np.stack([lengths[c] == 0 for c in COLUMNS]), axis=0)
        why: dict[int, str] = {}

        def flag(mask: np.ndarray, reason) -> None:
            for i in np.flatnonzero(mask & ok):
                why[int(i)] = reason(int(i))
            ok[mask] = False

        if stray:  # a "\r" inside a line (by its number: a literal MARK is a bad value), before any other reason
            flag(np.isin(lines, np.fromiter(stray, np.int64, len(stray))),
                 lambda i: carriage_return(f"in {_field(COLUMNS[stray[int(lines[i])]])}"))
        flag(empty, lambda i: "the line is empty")
        label = cols["label"]
        flag(~pc.match_substring_regex(label, r"^[01]$").to_numpy(zero_copy_only=False),
             lambda i: f"the label {label[i].as_py()!r} is not 0 or 1")
        dense = np.zeros((n, NUM_DENSE), np.float32)
        for j, c in enumerate(DENSE):
            col = cols[c]
            good = pc.match_substring_regex(col, _INT).to_numpy(zero_copy_only=False) | (lengths[c] == 0)
            flag(~good, lambda i, c=c, col=col: f"integer feature {c} is {col[i].as_py()!r}, not an integer")
            # parsed as float64: an integer of any size (past int64 too) is exact enough for log(1 + x)
            vals = pc.cast(pc.if_else(pa.array(good & (lengths[c] > 0)), col, "0"), pa.float64()).to_numpy()
            dense[:, j] = np.log1p(np.maximum(vals, 0)).astype(np.float32)
            for i in np.flatnonzero(np.isposinf(vals) & ok):  # past float64 (309+ digits): log(x) from its digits
                dense[i, j] = _log_of_digits(col[i].as_py())
        start = offsets(self.bags)
        cat = np.zeros((n, int(start[-1])), np.uint32)
        count = np.zeros((n, NUM_CAT), np.uint8)
        for j, (c, bag) in enumerate(zip(CAT, self.bags)):
            col = cols[c]
            value, count[:, j], good = _hex_values(col, lengths[c], bag)
            want = "8 hex digits" if bag == 1 else f"1 to {bag} values of 8 hex digits joined by commas (its bag size)"
            hint = " (a multi-hot feature: set the bag sizes, --bag-sizes or a run's data.bags)" if bag == 1 else ""
            flag(~good, lambda i, c=c, col=col, w=want, h=hint: f"categorical feature {c} is {col[i].as_py()!r}, "
                                                                 f"not {w}{h if ',' in col[i].as_py() else ''}")
            cat[:, start[j]:start[j + 1]] = value
        for line, reason in sorted([(int(lines[i]), why[i]) for i in why] + refused):
            self._bad(line, reason)
        return Block(np.asarray(pc.cast(pc.if_else(pa.array(ok), label, "0"), pa.int8()))[ok],
                     dense[ok], cat[ok], count[ok], lines[ok])


def _field(column: str) -> str:
    return "the label" if column == "label" else f"{'integer' if column in DENSE else 'categorical'} feature {column}"


def _log_of_digits(text: str) -> float:
    """``log(1 + x)`` of a positive integer ``x`` too large for a float64 (its decimal ``text``): the log of
    its first 17 digits plus the log of ten for each digit after them."""
    digits = text.lstrip("+0")
    return float(np.log(float(digits[:17])) + (len(digits) - 17) * np.log(10.0))


def _hex_values(col: pa.Array, length: np.ndarray, bag: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each field of ``col`` as up to ``bag`` uint32 values (8 hex digits each, joined by commas): the values
    ``[n, bag]`` (0 past a field's count), the count ``[n]`` and whether the field is well formed (empty counts
    as good: a missing value). Read straight from the Arrow string buffer, no Python objects."""
    n = len(col)
    value = np.zeros((n, bag), np.uint32)
    k = np.where((length + 1) % 9 == 0, (length + 1) // 9, 0)  # values, if the length fits k values and k - 1 commas
    good = (length == 0) | ((k >= 1) & (k <= bag))
    k = np.where(good, k, 0)
    offsets = np.frombuffer(col.buffers()[1], np.int32, count=n + 1, offset=4 * col.offset).astype(np.int64)
    data = np.frombuffer(col.buffers()[2], np.uint8) if col.buffers()[2] is not None else np.zeros(0, np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    for i in range(bag):
        rows = np.flatnonzero(k > i)
        if not rows.size:
            break
        at = offsets[rows] + 9 * i
        digits = _NIBBLE[data[at[:, None] + np.arange(8)]]  # [r, 8]
        fine = np.all(digits != 255, axis=1)
        more = k[rows] > i + 1
        fine &= ~more | (data[np.where(more, at + 8, 0)] == ord(","))  # the comma after every value but the last
        good[rows[~fine]] = False
        value[rows, i] = np.where(fine, np.bitwise_or.reduce(digits.astype(np.uint32) << shifts, axis=1), 0)
    value[~good] = 0
    return value, np.where(good, k, 0).astype(np.uint8), good


def read_blocks(path: str | Path, max_bad_lines: int = 0, block_bytes: int = BLOCK_BYTES,
                bags=None) -> Iterator[Block]:
    """The :class:`Block` s of one Criteo-format file (see :class:`Reader` for the counts of what was skipped)."""
    return iter(Reader(path, max_bad_lines, block_bytes, bags))


@contextlib.contextmanager
def _quiet_undecodable(handler):
    """pyarrow cannot hand a line that is not UTF-8 to the invalid-row ``handler`` and prints Python's
    "Exception ignored" traceback for it before failing the read, which ``_unreadable`` reports in one message:
    that traceback alone is dropped, anything else goes to the usual hook."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not (unraisable.object is handler and isinstance(unraisable.exc_value, UnicodeDecodeError)):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
