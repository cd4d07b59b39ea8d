"""The documentation site builds in strict mode (what `make docs` runs), shows the optimizer API from the
package's docstrings and the benchmarks' plots, and a broken link fails the build; every runner command the docs
give composes, and every setting they name is one the config has."""
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


@pytest.mark.slow  # a whole mkdocs build (subprocess): make test
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


@pytest.mark.slow  # a whole mkdocs build (subprocess): make test
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


def documented_runner_commands() -> list[tuple[str, list[str]]]:
    """Every ``python -m runner ...`` (and the runner part of ``runner.launch ... -- ...``) in the code blocks of
    the README and the guide and in the config headers, as (where, the words bash passes): ``$HOME`` expanded,
    other variables 0, continued lines joined, comments cut; placeholders (``multirun/<date>/<time>``) skipped."""
    import re
    import shlex

    sources = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md")),
               *sorted((ROOT / "conf").rglob("*.yaml"))]
    found = []
    for path in sources:
        lines, fenced = path.read_text().splitlines(), False
        for i, line in enumerate(lines):
            if path.suffix == ".md":
                fenced = fenced != line.startswith("```")
                text = line.strip() if fenced else ""
            else:
                text = line.lstrip("#").strip().removeprefix("Run:").strip() if line.startswith("#") else ""
            if not text.startswith(("python -m runner", "WANDB_API_KEY=")) or "<" in text:
                continue
            j = i
            while text.endswith("\\") and j + 1 < len(lines):  # a continued line
                j += 1
                text = text[:-1] + " " + lines[j].lstrip("#").strip()
            command = text[text.index("runner"):].split(" #")[0].split("   (")[0]
            words = shlex.split(re.sub(r"\$[A-Z_]+", "0", command.replace("$HOME", "/home/user")))  # $RANK: a number
            module, words = words[0], words[1:]
            if module == "runner.launch":
                words = words[words.index("--") + 1:] if "--" in words else []
            elif module != "runner":
                continue
            found.append((f"{path.relative_to(ROOT)}:{i + 1}", [w for w in words if w not in ("-m", "--multirun")]))
    return found


@pytest.mark.slow
def test_every_documented_command_parses_and_composes():
    """What a user copies from the docs into bash reaches Hydra as written: each override parses (bash passes
    ``data.path=~/x`` with the ``~`` unexpanded, which Hydra's grammar refuses) and the config composes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from tests.runner.support import compose_config

    commands = documented_runner_commands()
    assert len(commands) >= 30, commands
    parser = OverridesParser.create()
    for where, words in commands:
        try:
            parser.parse_overrides(words)  # a word Hydra's grammar refuses raises here
            sweep = [w for w in words if "=" in w and "," in w.split("=", 1)[1] and not w.startswith("hydra.")]
            compose_config([w.split(",")[0] if w in sweep else w for w in words if "=" in w], tiny=False)
        except Exception as e:  # noqa: BLE001 - the command's place in the docs, then why
            raise AssertionError(f"{where}: {' '.join(words)}: {e}") from None


SECTIONS = ("optimizer", "table_optimizers", "async_emb", "mesh", "distributed", "model", "data", "logger", "trainer",
            "dense_optimizer", "checkpoint")
NOT_KEYS = ("py", "yaml", "md", "json", "jsonl", "npz", "npy", "txt", "log", "dat", "csv")  # file names (model.py)


def settings() -> set[str]:
    """Every key the config schemas declare (``runner/config.py``, the optimizers' dataclasses), dotted, with ``*``
    for a name the user picks (a table, a mesh axis): the union over every option of the model, data and optimizer
    groups, read from the schemas (nothing is composed)."""
    import dataclasses
    import typing

    import optimizers
    from runner import config

    def walk(schema: type, prefix: str) -> set[str]:
        out = set()
        for name, hint in typing.get_type_hints(schema).items():
            if name not in {f.name for f in dataclasses.fields(schema)}:
                continue
            out.add(prefix + name)
            args = typing.get_args(hint)
            if dataclasses.is_dataclass(hint):
                out |= walk(hint, f"{prefix}{name}.")
            elif typing.get_origin(hint) is dict:  # Dict[str, X]: keys the user names
                out.add(f"{prefix}{name}.*")
                if dataclasses.is_dataclass(args[1]):
                    out |= walk(args[1], f"{prefix}{name}.*.")
        return out

    groups = {"model": [s for g, _, s in config.task_schemas() if g == "model"]
              + [config.RankingModelConfig, config.SequentialModelConfig],
              "data": [s for g, _, s in config.task_schemas() if g == "data"]
              + [config.SyntheticDataConfig, config.MovieLensDataConfig, config.SyntheticSequencesDataConfig],
              "optimizer": [config.optimizer_schema(c) for c in optimizers.REGISTRY.values()]}
    groups["table_optimizers.*"] = groups["optimizer"]
    known = walk(config.Config, "")
    for prefix, schemas in groups.items():
        for schema in schemas:
            known |= walk(schema, prefix + ".")
    return known


def test_every_setting_the_docs_name_is_in_the_config(checkout):
    """A dotted key the docs or a config's comments name (``trainer.max_skipped_updates``, ``mesh.route_capacity=1.2``,
    ``model.tables.<name>.stored_width``), in prose as in commands, is one the config has: a renamed or mistyped
    key in the text would send a user to a setting that fails to compose."""
    import re

    known = settings()
    pattern = re.compile(r"(?<![\w./+@~-])(?:" + "|".join(SECTIONS) + r")(?:\.(?:<[^>\s]+>|\w+))+")
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "conf").rglob("*.yaml"))]
    def fits(parts: list[str], setting: str) -> bool:  # a key, or a section above keys (mesh.axes); <name>: any
        want = setting.split(".")[:len(parts)]
        return len(want) == len(parts) and all(w in ("*", p) or p.startswith("<") for w, p in zip(want, parts))

    wrong = []
    for path in sources:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for key in pattern.findall(line):
                parts = key.split(".")
                if parts[-1] not in NOT_KEYS and not any(fits(parts, s) for s in known):
                    wrong.append(f"{path.relative_to(ROOT)}:{i}: {key}")
    assert len(known) > 150 and not wrong, wrong
