"""Docstring coverage of the public API, measured by ``interrogate`` with the settings in pyproject.toml
([tool.interrogate]: private names, ``__init__``, magic methods and nested functions need none): at least 90%
of the public modules, classes, functions and methods of each package have a docstring."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAIL_UNDER = 90


@pytest.mark.parametrize("package", ["optimizers", "runner/core"])
def test_public_api_has_docstrings(package):
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("not a source checkout (an installed copy of the tests)")
    pytest.importorskip("interrogate")
    result = subprocess.run([sys.executable, "-m", "interrogate", "-c", str(ROOT / "pyproject.toml"),
                             "--fail-under", str(FAIL_UNDER), "-vv", str(ROOT / package)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    missed = [line for line in result.stdout.splitlines() if "MISSED" in line]
    assert result.returncode == 0, f"{package}: docstring coverage under {FAIL_UNDER}%; missing:\n" + "\n".join(missed) \
        + "\n" + result.stdout[-400:]
