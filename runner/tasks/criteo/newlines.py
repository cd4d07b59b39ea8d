"""Where a line of a Criteo-format file ends: at ``\\n`` (``\\r\\n`` too, a Windows copy), never at a lone ``\\r``.

pyarrow's CSV reader also ends a line at a carriage return that no ``\\n`` follows, and cannot be told not to:
one stray ``\\r`` in a line would read as two bad lines, and every line after it would be numbered one too
high. :class:`Lines` hands the reader the file's bytes with each such ``\\r`` replaced by :data:`MARK` (``␍``),
which no field accepts: the line stays one line, bad. A ``\\r`` before ``\\n``, or as the file's last byte, ends the
line as it did.

The mark alone cannot say where a ``\\r`` was: a file may hold the character ``␍`` itself, a bad value like any
other. So :class:`Lines` also notes, for each line holding a stray ``\\r``, the field it is in (``stray``), and the
reader calls that line's fault a carriage return (:func:`carriage_return`) by its number, never by the mark; a
literal ``␍`` is reported as the invalid value of its field. The note costs a count of ``\\n`` per read (a scan
in C) and a few operations per stray ``\\r``; a file without one is only counted.
"""
from __future__ import annotations

import re

MARK = "\u240d"  # ␍, SYMBOL FOR CARRIAGE RETURN: valid UTF-8 text in place of a stray "\r"
_STRAY = re.compile(rb"\r(?!\n)")


class Lines:
    """A file-like reader of ``raw`` (a pyarrow input stream) for ``pyarrow.csv.open_csv``, each stray ``\\r``
    replaced by :data:`MARK`; ``stray`` maps each line (its 1-based number) holding one to the field its first
    one is in (0: the label; a count of tabs before it), and ``found`` says whether any was. A ``\\r`` ending a
    read is held back until the next byte (or the file's end) tells whether a ``\\n`` follows it."""

    closed = False

    def __init__(self, raw):
        self.raw, self.stray = raw, {}
        self._out, self._cr, self._end = b"", b"", False
        self._lines, self._tabs = 0, 0  # the "\n" read so far; the tabs since the last of them

    @property
    def found(self) -> bool:
        """Whether the file (as far as read) holds a stray ``\\r``."""
        return bool(self.stray)

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that are left if ``n`` < 0); fewer only at the end of the file."""
        while (n < 0 or len(self._out) < n) and not self._end:
            chunk = self.raw.read(n if n > 0 else -1)
            if not chunk:  # the end: a last "\r" ends the last line
                self._out, self._cr, self._end = self._out + self._cr, b"", True
                break
            chunk, self._cr = self._cr + chunk, b""
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], b"\r"
            if chunk.count(b"\r") != chunk.count(b"\r\n"):  # two scans in C; the replacement only where needed
                self._note(chunk)
                chunk = _STRAY.sub(MARK.encode(), chunk)
            last = chunk.rfind(b"\n")
            self._tabs = self._tabs + chunk.count(b"\t") if last < 0 else chunk.count(b"\t", last + 1)
            self._lines += chunk.count(b"\n")
            self._out += chunk
        if n < 0:
            n = len(self._out)
        data, self._out = self._out[:n], self._out[n:]
        return data

    def _note(self, chunk: bytes) -> None:
        """Notes the line and field of each stray ``\\r`` in ``chunk`` (the next bytes of the file)."""
        line, tabs, at = self._lines, self._tabs, 0
        for m in _STRAY.finditer(chunk):
            ends = chunk.count(b"\n", at, m.start())
            if ends:
                line += ends
                tabs = chunk.count(b"\t", chunk.rfind(b"\n", at, m.start()) + 1, m.start())
            else:
                tabs += chunk.count(b"\t", at, m.start())
            self.stray.setdefault(line + 1, tabs)
            at = m.start()

    def close(self) -> None:
        """Closes ``raw``."""
        self.closed = True
        self.raw.close()


def carriage_return(where: str) -> str:
    """Why a line in :attr:`Lines.stray` is bad; ``where``: the field its ``\\r`` is in, or the line's count of
    fields when that is wrong too."""
    return f"a carriage return (\\r) inside the line, {where}; a line ends at \\n (or \\r\\n) only"
