"""The documentation site builds in strict mode (what `make docs` runs), shows the optimizer API from the
package's docstrings and the benchmarks' plots, and a broken link fails the build."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]



def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def checkout():
    if not (ROOT / "mkdocs.yml").is_file():
        pytest.skip("not a source checkout (an installed copy of the tests)")
    return ROOT


def test_the_site_builds_strictly_with_the_api_and_the_plots(checkout, tmp_path):
    result = build(checkout / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    api = (tmp_path / "site" / "reference" / "optimizers.html").read_text()
    for name in ("AsyncEmbOptimizer", "AsyncEmbGradientUpdate", "AsyncEmbContext", "FusedEmbOptimizer",
                 "AsyncAdam", "AsyncRowwiseAdagrad", "make_update", "create"):
        assert f'id="optimizers.{name}"' in api, name
    assert "decay of the first-moment (mean) estimate" in api  # an AsyncAdam field, from the source
    for png in (checkout / "benchmarks" / "results").glob("*.png"):
        assert (tmp_path / "site" / "results" / "img" / png.name).read_bytes() == png.read_bytes()
    bench = (tmp_path / "site" / "results" / "benchmarks.html").read_text()
    assert "<!-- benchmark:" not in bench and "load average" not in bench
    assert 'src="img/fused_update.png"' in bench


def test_a_broken_link_fails_the_build(checkout, tmp_path):
    for item in ("mkdocs.yml", "docs"):
        (shutil.copytree if (checkout / item).is_dir() else shutil.copy)(checkout / item, tmp_path / item)
    for item in ("optimizers", "benchmarks"):  # what the API page and the hook read
        (tmp_path / item).symlink_to(checkout / item)
    page = tmp_path / "docs" / "guide" / "async.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


def test_the_benchmark_include_drops_the_title_and_the_load_average(checkout, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("docs_hooks", checkout / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "x.md").write_text("# Title\n\nB = 16. 2 CPU cores, load average 2.2 at the start, jax 0.10.2.\n\n"
                                   "## Targets\n\n![step time](x.png)\n")
    monkeypatch.setattr(hooks, "RESULTS", tmp_path)
    assert hooks.benchmark_markdown("x") == ("\nB = 16. 2 CPU cores, jax 0.10.2.\n\n#### Targets\n\n"
                                             "![step time](img/x.png)")
    with pytest.raises(Exception, match="python -m benchmarks --only missing"):
        hooks.benchmark_markdown("missing")
