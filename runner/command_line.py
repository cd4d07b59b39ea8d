"""The argument parser every ``python -m`` command of the project uses (the runner's tools and the benchmarks).

argparse's own parser answers a bad argument with its usage lines and then ``prog: error: message``: the one
line that matters comes last, under a block of options the reader did not ask for. :class:`OneLineParser`
says only that line, and where the rest is::

    python -m runner.prepare: error: unrecognized arguments: --nosuch; see python -m runner.prepare --help

to stderr, with exit code 2, argparse's own code for a bad argument. ``--help`` prints the full help as
before, and a command's own checks after parsing (``parser.error(...)``) are said the same way.
"""
from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose refusals are one line: ``<prog>: error: <message>; see <prog> --help``,
    exit code 2. Its subcommands' parsers (``add_subparsers``) are of the same class, so they refuse alike, each
    pointing at its own ``--help``."""

    def error(self, message: str) -> NoReturn:
        """Refuse the command line with ``message`` (what was wrong, and the fix where argparse or the caller
        knows it), on one line; no usage block above it."""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")
