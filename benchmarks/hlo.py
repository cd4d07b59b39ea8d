"""Collective traffic read from a compiled program: per device, the bytes each kind of collective moves.

``collective_bytes(compiled.as_text())`` sums, over every collective instruction of the per-device (SPMD)
program, the size of what the device puts in: the operands of all-to-all, all-reduce, reduce-scatter and
collective-permute, and the local piece of an all-gather (its result divided by the group size).
"""
from __future__ import annotations

import re
from typing import Mapping

KINDS = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s(" + "|".join(KINDS) + r")(-start)?\(")
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([0-9,]*)\]")


def _bytes(shapes: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(shapes):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _DTYPE_BYTES[dtype]
    return total


def _group_size(line: str) -> int:
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    if iota:
        return int(iota.group(2))
    groups = re.search(r"replica_groups=\{\{([0-9,]*)\}", line)
    return len(groups.group(1).split(",")) if groups else 0  # 0: unknown (e.g. every device)


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """``{kind: bytes}`` (kinds with none are 0) and ``total``, per device, for one run of the program."""
    out = {k: 0 for k in KINDS}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        result, kind, start = m.group(1), m.group(2), m.group(3)
        if _group_size(line) == 1 and "replica_groups" in line:  # a group of one device moves nothing
            continue
        if start:  # an async pair's shape is (operand, result, ...): the first element is what goes in
            first = _SHAPE.search(result)
            size = _bytes(first.group(0)) if first else 0
        else:
            size = _bytes(result)
            if kind == "all-gather":
                size //= max(1, _group_size(line))
            elif kind == "reduce-scatter":
                size *= max(1, _group_size(line))
        out[kind] += size
    out["total"] = sum(out[k] for k in KINDS)
    return out


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%(\S+)\s.*\{\s*$")
_BRANCH_LIST = re.compile(r"branch_computations=\{([^}]*)\}")
_TRUE_FALSE = re.compile(r"(?:true|false)_computation=%([^,\s]+)")


def _computations(hlo_text: str) -> dict[str, list[str]]:
    """Each computation's instruction lines, by name."""
    out: dict[str, list[str]] = {}
    current = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            current = head.group(1)
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def _conditionals(comps: dict[str, list[str]]) -> list[list[str]]:
    """The branch computations' names of every conditional instruction, one list a conditional."""
    found = []
    for lines in comps.values():
        for line in lines:
            if " conditional(" not in line:
                continue
            listed = _BRANCH_LIST.search(line)
            found.append([n.strip().lstrip("%") for n in listed.group(1).split(",") if n.strip()] if listed
                         else _TRUE_FALSE.findall(line))
    return found


_WHILE_BODY = re.compile(r" while\(.*\bbody=%([^,\s]+)")


def _while_bodies(comps: dict[str, list[str]]) -> list[str]:
    """The body computations' names of every while loop."""
    return [m.group(1) for lines in comps.values() for line in lines if (m := _WHILE_BODY.search(line))]


def _branch_bytes(comps: dict[str, list[str]], name: str) -> dict[str, int]:
    """``collective_bytes`` of the collectives written directly in one computation."""
    return collective_bytes("\n".join(comps.get(name, [])))


def step_collective_bytes(hlo_text: str, branch: str = "cheapest") -> dict[str, int]:
    """``collective_bytes`` of one step that takes, at every conditional, its ``"cheapest"`` (by total bytes)
    or ``"dearest"`` branch, instead of counting every branch, and runs the body of every while loop that
    holds collectives zero times (``"cheapest"``) or once (``"dearest"``): a usual step (no logged-step
    diagnostics, no rerouting round past the first) and a step with one such round (the extra rounds of an
    overflowing routed step are the only loops with collectives in the train step). Counts the collectives
    written directly in a branch or loop body (not in computations they call)."""
    if branch not in ("cheapest", "dearest"):
        raise ValueError(f"branch={branch!r}: cheapest or dearest")
    comps = _computations(hlo_text)
    out = collective_bytes(hlo_text)
    if branch == "cheapest":
        for name in _while_bodies(comps):
            body = _branch_bytes(comps, name)
            for k in out:
                out[k] -= body[k]
    for names in _conditionals(comps):
        per = [_branch_bytes(comps, n) for n in names]
        if not per:
            continue
        keep = (min if branch == "cheapest" else max)(per, key=lambda b: b["total"])
        for k in out:
            out[k] += keep[k] - sum(b[k] for b in per)
    return out


def conditional_collective_bytes(hlo_text: str) -> dict[str, int]:
    """The part of ``collective_bytes`` that sits in the branches of a conditional (``lax.cond``): it moves
    only on the steps that take that branch (e.g. diagnostics computed on logged steps only). Counts the
    collectives written directly in a branch computation (not in computations a branch calls)."""
    comps = _computations(hlo_text)
    names = sorted({n for branches in _conditionals(comps) for n in branches})
    return collective_bytes("\n".join(line for n in names for line in comps.get(n, [])))


def collectives_by_op(hlo_text: str, top: int = 8) -> list[tuple[str, str, int]]:
    """The largest collectives: (kind, the JAX op that made it, bytes), biggest first (for reading a plan)."""
    rows = []
    for line in hlo_text.splitlines():
        if _INSTR.match(line):
            name = re.search(r'op_name="([^"]*)"', line)
            rows.append((_INSTR.match(line).group(2), name.group(1) if name else "?", collective_bytes(line)["total"]))
    return sorted(rows, key=lambda r: -r[2])[:top]


def summarize(b: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v / 1e6:.3g} MB" for k, v in b.items() if v and k != "total")
