"""Table stacking: the dense tables of one width, dtype, initial scale and embedding optimizer, kept as one table.

A model with many tables (Criteo's 26 categorical features) would otherwise get, per table and per step, its
own dedupe, fused update, routing exchange and update record, and a compiled copy of each: a 26-table DLRM
on a 2x4 mesh compiled its train step for minutes on 2 cores. Stacked, the members share one physical table
and one update, as FBGEMM's table-batched embeddings (TorchRec's fused EmbeddingBagCollection) and
jax-tpu-embedding's table stacking do. Nothing else changes for the model or the user: the model still gets
each member's rows under the member's name, ids are checked against each member's own vocab (out-of-range
ids read zeros and count in ``emb/dropped_ids/<member>``), and a member's rows take the same updates as an
unstacked table's would.

Layout of a stack: row 0 is the shared padding row (id 0 of every member reads it and no update writes it);
member ``m``'s id ``i`` in ``[1, vocab_m)`` is row ``base_m + i - 1``, members one after another in name order.
Per physical table: one optimizer state, one update count, one gate (a non-finite update of any member refuses
the stack's whole update), and the per-table metrics (``emb/grad_norm/<stack>``, routing) under the stack's
name. A table that stacks with no other keeps its own name and layout, exactly as without stacking.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.numpy as jnp

from .embeddings import TableSpec

PREFIX = "stack"  # a stack of several tables is named stack0, stack1, ... (in the order of its first member)


@dataclasses.dataclass(frozen=True)
class Member:
    """One logical table's place in its physical table."""

    stack: str  # the physical table
    base: int  # the physical row of its id 1
    vocab: int  # its own ids: [0, vocab)


@dataclasses.dataclass(frozen=True)
class Stacking:
    """Which logical tables live in which physical table (``plan``); the identity when nothing is stacked."""

    members: Mapping[str, Member]  # every dense logical table -> its place
    stacks: Mapping[str, tuple[str, ...]]  # physical tables of several members -> the members, in row order

    def physical_ids(self, ids: Mapping[str, Any], bad: Mapping[str, Any]) -> dict[str, Any]:
        """Each stack's ids ``[B, sum of its members' tokens]`` (its members' ``[B, ...]`` ids side by side, in
        member order): id 0 -> row 0, id i -> ``base + i - 1``, a ``bad`` id -> -1 (outside every table). A
        table not in a stack keeps its ids as they are. Works on jax and numpy arrays alike."""
        out = {n: x for n, x in ids.items() if n not in self.members or self.members[n].stack == n}
        for stack, names in self.stacks.items():
            parts = []
            for n in names:
                x = ids[n]
                m = self.members[n]
                x = x.reshape(x.shape[0], -1)
                b = bad[n].reshape(x.shape[0], -1)
                parts.append(_where(b, -1, _where(x == 0, 0, x + (m.base - 1))))
            out[stack] = _concat(parts)
        return out

    def logical_rows(self, rows: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
        """Each logical table's looked-up rows ``[*its id shape, width]`` from the physical tables' rows."""
        out = {n: x for n, x in rows.items() if n not in self.stacks}
        for stack, names in self.stacks.items():
            x, start = rows[stack], 0
            for n in names:
                shape = tuple(shapes[n])
                size = _prod(shape[1:])
                out[n] = x[:, start:start + size].reshape(*shape, x.shape[-1])
                start += size
        return out

    def stack_of(self, name: str) -> str:
        """The physical table a logical table lives in (itself when it is not stacked)."""
        m = self.members.get(name)
        return m.stack if m is not None else name


def identity(specs: Mapping[str, TableSpec]) -> Stacking:
    """Nothing stacked: every table its own physical table."""
    return Stacking({n: Member(n, 1, s.vocab) for n, s in specs.items() if s.kind == "dense"}, {})


def plan(specs: Mapping[str, TableSpec], optimizers: Mapping[str, Any], shards: int = 1,
         key: Callable[[TableSpec], Any] | None = None) -> tuple[Stacking, dict[str, TableSpec], dict[str, Any]]:
    """Stack the dense tables that share width, dtype, initial scale, id permutation and embedding optimizer (an
    equal optimizer config, as ``table_optimizers`` may give several tables); hash and modulo tables stay
    alone. Returns the stacking, the physical tables' specs (rows padded to ``shards``) and their optimizers.
    ``key``: more of a spec that must match to stack (default: nothing more)."""
    groups: dict[Any, list[str]] = {}
    for n in sorted(specs):
        s = specs[n]
        if s.kind != "dense":
            groups[("alone", n)] = [n]
            continue
        k = (s.width, s.columns, s.dtype, s.init_scale, s.permute_ids, _opt_key(optimizers[n]), key(s) if key else None)
        groups.setdefault(k, []).append(n)
    members: dict[str, Member] = {}
    stacks: dict[str, tuple[str, ...]] = {}
    out_specs: dict[str, TableSpec] = {}
    out_opts: dict[str, Any] = {}
    taken = set(specs)
    for names in sorted(groups.values(), key=lambda g: g[0]):
        first = specs[names[0]]
        if len(names) == 1:
            out_specs[names[0]], out_opts[names[0]] = first, optimizers[names[0]]
            if first.kind == "dense":
                members[names[0]] = Member(names[0], 1, first.vocab)
            continue
        stack = f"{PREFIX}{len(stacks)}"
        if stack in taken:
            raise ValueError(f"a table is named {stack!r}, the name a stack of tables gets: rename the table or set "
                             "model.stack_tables=false")
        base = 1
        for n in names:
            members[n] = Member(stack, base, specs[n].vocab)
            base += specs[n].vocab - 1
        vocab = base
        stacks[stack] = tuple(names)
        out_specs[stack] = dataclasses.replace(
            first, name=stack, vocab=vocab, rows=-(-vocab // shards) * shards,
            tokens_per_example=sum(specs[n].tokens_per_example for n in names),
            bases=tuple(members[n].base for n in names))
        out_opts[stack] = optimizers[names[0]]
    return Stacking(members, stacks), out_specs, out_opts


def _opt_key(opt: Any) -> Any:
    """What makes two tables' embedding optimizers the same: an equal object (a frozen dataclass config), else
    the very same object."""
    try:
        hash(opt)
        return ("eq", opt)
    except TypeError:
        return ("id", id(opt))


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def _where(c, a, b):
    import numpy as np  # noqa: PLC0415

    return np.where(c, a, b) if isinstance(c, np.ndarray) else jnp.where(c, a, b)


def _concat(parts):
    import numpy as np  # noqa: PLC0415

    return np.concatenate(parts, axis=1) if all(isinstance(p, np.ndarray) for p in parts) else \
        jnp.concatenate(parts, axis=1)
