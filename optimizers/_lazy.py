"""JAX and optax for this package, imported on first use.

The optimizer dataclasses are also config schemas: ``runner.config`` derives the Hydra schema of every
optimizer from its fields, so anything that only composes a config (``runner --help``, tab completion,
``--cfg``) imports this package. Its modules name ``jax``, ``jnp``, ``lax``, ``optax`` and ``P``
(``jax.sharding.PartitionSpec``) through these stand-ins, so importing them costs no JAX import (about a
second and a half); the first attribute read (``jnp.zeros``, at trace time) or call of ``P`` imports the real
module, and every read returns the real module's attribute. Type checkers see the real modules.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class Deferred:
    """A module imported on first attribute access (``Deferred("jax.numpy").zeros``)."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}>"


if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax
    from jax.sharding import PartitionSpec as P
else:
    jax = Deferred("jax")
    jnp = Deferred("jax.numpy")
    lax = Deferred("jax.lax")
    optax = Deferred("optax")

    def P(*axes: Any):  # noqa: N802 - jax.sharding.PartitionSpec, built on first call
        """``jax.sharding.PartitionSpec(*axes)``, importing JAX on the first call."""
        return jax.sharding.PartitionSpec(*axes)
