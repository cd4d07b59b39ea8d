"""The padding benchmark runs the runner's step three ways and writes its table; on the CPU the default stores the
tables as they are (the padding is a TPU default), so its 'default' tables are the unpadded ones."""
import pytest

from benchmarks import padding


@pytest.mark.slow
def test_quick_run_writes_the_table_and_the_cpu_default_is_unpadded(tmp_path):
    data = padding.run(True, tmp_path)
    by = {r["variant"]: r for r in data["results"]}
    assert list(by) == ["unpadded", "default", "width 128"]
    assert by["default"]["tables"] == by["unpadded"]["tables"]
    assert all(s[1] == 64 for s in by["unpadded"]["tables"].values())
    assert all(s[1] == 128 for s in by["width 128"]["tables"].values())
    md = (tmp_path / "padding.md").read_text()
    assert "| unpadded | authors 5,001 x 64, items 2,001 x 64, users 20,001 x 64 |" in md
