"""MkDocs hooks: the results pages show the benchmarks' own last output, not a copy of it.

- Every ``benchmarks/results/*.png`` is published as ``results/img/<name>.png``.
- A line ``<!-- benchmark: NAME -->`` in a page is replaced by ``benchmarks/results/NAME.md`` (what
  ``python -m benchmarks`` last wrote; ``FOLDER/NAME`` for a run kept from another machine, e.g. ``tpu_v5e/``): its title line is dropped (the page gives its own heading), its
  headings move two levels down, its plot links point at ``img/``, and the machine's load average at the
  time of the run is left out (a condition of that run, not part of the result). A missing file fails the
  build.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
MARKER = re.compile(r"^<!-- benchmark: ([a-z0-9_]+(?:/[a-z0-9_]+)?) -->$", re.MULTILINE)  # NAME or FOLDER/NAME
LOAD = re.compile(r",? load average [0-9.]+ at the (start|end)")
IMAGE = re.compile(r"\]\(([a-z_]+\.png)\)")


def on_files(files, config):
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/img/{png.name}", abs_src_path=str(png)))
    return files


def benchmark_markdown(name: str) -> str:
    """``benchmarks/results/<name>.md`` as a section of a results page."""
    path = RESULTS / f"{name}.md"
    if not path.is_file():
        raise PluginError(f"docs: <!-- benchmark: {name} --> needs {path}; run python -m benchmarks --only {name}")
    lines = path.read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    text = "\n".join("##" + line if line.startswith("#") else line for line in lines)
    return IMAGE.sub(r"](img/\1)", LOAD.sub("", text))


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: benchmark_markdown(m.group(1)), markdown)
