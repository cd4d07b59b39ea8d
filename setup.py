"""Build hook: ship the repository's top-level ``conf/`` (Hydra's config groups) inside the package, as
``runner/conf/``, so an installed wheel composes configs without the source tree.

Everything else about the distribution is declared in pyproject.toml. The source tree and the editable install
(``pip install -e .``) read ``conf/`` where it is; ``runner/__main__.py`` looks in ``runner/conf/`` first, then in
``<repo>/conf``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

HERE = Path(__file__).resolve().parent
CONF = "conf"  # the repository's config groups
TARGET = Path("runner") / "conf"  # where they land in the built package
PATTERNS = ("*.yaml", "*.yml")


def conf_files() -> list[Path]:
    """conf/'s config files, relative to conf/ (nothing else: no editor or cache files)."""
    root = HERE / CONF
    return sorted(p.relative_to(root) for pattern in PATTERNS for p in root.rglob(pattern) if p.is_file())


class build_py(_build_py):
    """Copies conf/ into the built package as runner/conf (not in editable mode: that reads conf/ in place)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = conf_files()
        if not any(f.as_posix() == "config.yaml" for f in files):
            raise SystemExit(f"error: {HERE / CONF / 'config.yaml'} is missing: the build must run in the "
                             f"repository (or an sdist of it) with its conf/ folder")
        dest = Path(self.build_lib) / TARGET
        if dest.exists():  # a stale copy from an earlier build in the same build/ folder
            shutil.rmtree(dest)
        for rel in files:
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(HERE / CONF / rel), str(out))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [str(Path(self.build_lib) / TARGET / rel) for rel in conf_files()]


setup(cmdclass={"build_py": build_py})
