"""Where a line of a Criteo-format file ends: at ``\\n`` (``\\r\\n`` too, a Windows copy), never at a lone ``\\r``.

pyarrow's CSV reader also ends a line at a carriage return that no ``\\n`` follows, and cannot be told not to:
one stray ``\\r`` in a line would read as two bad lines, and every line after it would be numbered one too
high. :class:`Lines` hands the reader the file's bytes with each such ``\\r`` replaced by :data:`MARK` (``␍``),
which no field accepts: the line stays one line, bad, and :func:`carriage_return` says where its ``\\r`` was. A ``\\r``
before ``\\n``, or as the file's last byte, ends the line as it did.
"""
from __future__ import annotations

import re

MARK = "\u240d"  # ␍, SYMBOL FOR CARRIAGE RETURN: valid UTF-8 text in place of a stray "\r"
_STRAY = re.compile(rb"\r(?!\n)")


class Lines:
    """A file-like reader of ``raw`` (a pyarrow input stream) for ``pyarrow.csv.open_csv``, each stray ``\\r``
    replaced by :data:`MARK`; ``found`` says whether any was. A ``\\r`` ending a read is held back until the
    next byte (or the file's end) tells whether a ``\\n`` follows it."""

    closed = False

    def __init__(self, raw):
        self.raw, self.found = raw, False
        self._out, self._cr, self._end = b"", b"", False

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
                self.found = True
                chunk = _STRAY.sub(MARK.encode(), chunk)
            self._out += chunk
        if n < 0:
            n = len(self._out)
        data, self._out = self._out[:n], self._out[n:]
        return data

    def close(self) -> None:
        """Closes ``raw``."""
        self.closed = True
        self.raw.close()


def carriage_return(where: str) -> str:
    """Why a line holding :data:`MARK` (a stray ``\\r``) is bad; ``where``: the field it is in, or the line's count
    of fields when that is wrong too."""
    return f"a carriage return (\\r) inside the line, {where}; a line ends at \\n (or \\r\\n) only"
