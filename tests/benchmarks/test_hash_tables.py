"""benchmarks.hash_tables stores both tables as a run of the runner would on the backend it runs on."""
import jax

from benchmarks import hash_tables


def test_tables_are_stored_as_the_runner_stores_them(monkeypatch):
    """Unpadded on a CPU; 64-wide rows padded to 128 columns on a TPU (faked here), 128-wide ones kept."""
    assert hash_tables.stored_width(64) is None
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert hash_tables.stored_width(64) == 128 and hash_tables.stored_width(16) is None
    assert hash_tables.stored_width(128) is None
