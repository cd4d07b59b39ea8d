"""What a restore reads a checkpoint's arrays into: this run's shapes and shardings, and the differences from the
checkpoint's that a restore may carry over (row padding, a table's padding columns, the deferred update's id
list, hash tables placed again); any other difference is refused by name before anything is read."""
from __future__ import annotations

from typing import Any, Mapping

import jax

from optimizers.row_update import GlobalDecay

from ..errors import PreflightError
from .meta import SEGMENT_IDS, UNIQUE_TOKENS, incompatible, table_record


def restore_target(meta: Mapping[str, Any], abstract: Any, shardings: Any, replicated: Any, where: str,
                   read_whole: set[str] = frozenset()):
    """The abstract tree to read into: this run's shapes and shardings. Row-padded leaves may differ in
    their row count (Orbax pads with zeros or truncates padding rows), and tables and their per-element state
    in their padding columns (``stored_width``: the same); the deferred update's id list is
    read whole (replicated) at its stored size and rebuilt for this run afterwards (`_refit`); the tables named
    in ``read_whole`` (hash tables placed again, ``rebucketed``) are read whole at their stored shapes. Any other
    difference is refused by name."""
    stored, problems = meta["arrays"], []
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    sh = jax.tree_util.tree_leaves(shardings)
    out = []
    keys = [jax.tree_util.keystr(p) for p, _ in flat]
    decay_keys = decay_problems(stored, [p for p, _ in flat], meta.get("tables", {}), problems)
    for (path, x), s, key in zip(flat, sh, keys):
        if key not in stored:
            if key not in decay_keys:  # named by decay_problems
                problems.append(f"array {key}: missing from the checkpoint (this config has shape {tuple(x.shape)})")
            out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s))
            continue
        shape, dtype, rows = tuple(stored[key]["shape"]), stored[key]["dtype"], stored[key]["rows"]
        if dtype != str(x.dtype):
            problems.append(f"array {key} dtype: the checkpoint has {dtype}, this config has {x.dtype}")
        if (len(path) >= 2 and getattr(path[0], "name", None) in ("tables", "emb_states", "hashed")
                and getattr(path[1], "key", None) in read_whole):
            out.append(jax.ShapeDtypeStruct(shape, x.dtype, sharding=replicated))  # placed again (rebucket.py)
        elif path[-1] == jax.tree_util.GetAttrKey(SEGMENT_IDS) and shape == tuple(x.shape):
            out.append(jax.ShapeDtypeStruct(shape, x.dtype, sharding=replicated))  # re-placed by the refit
        elif path[-1] == jax.tree_util.GetAttrKey(UNIQUE_TOKENS) and len(shape) == len(x.shape) == 1:
            out.append(jax.ShapeDtypeStruct(shape, x.dtype, sharding=replicated))  # at its stored size
        elif shape == tuple(x.shape) or (
                (shape[0] == x.shape[0] or (rows is not None and min(shape[0], x.shape[0]) >= rows))
                and (shape[1:] == tuple(x.shape[1:]) or _other_padding(meta, path, shape, tuple(x.shape)))):
            out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s))
        elif getattr(path[0], "name", None) == "hashed" and getattr(path[-1], "name", None) == "sketch":
            t = getattr(path[1], "key", "?")  # the admission counts: its width is a setting of the table's
            problems.append(f"table '{t}' admission sketch (model.tables.{t}.sketch_width, model.tables.{t}."
                            f"admit_after): the checkpoint has {shape[-1]} columns, this config {x.shape[-1]}; resume "
                            f"with the sketch it was saved with (model.tables.{t}.sketch_width={shape[-1]})")
            out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s))
        else:
            problems.append(f"array {key} shape: the checkpoint has {shape}, this config has {tuple(x.shape)}")
            out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s))
    extra = sorted(set(stored) - set(keys) - decay_keys)
    if extra:
        problems.append(f"arrays {extra}: in the checkpoint but not in this config's state")
    if problems:
        raise PreflightError(incompatible(where, problems))
    return jax.tree_util.tree_unflatten(treedef, out)


def _other_padding(meta: Mapping[str, Any], path: tuple, shape: tuple, now: tuple) -> bool:
    """A table or per-element state leaf stored with other padding columns (``stored_width``) than this run's,
    both at least the table's width: Orbax pads the columns with zeros or cuts the padding off."""
    t = table_record(path, meta.get("tables", {}))
    return t is not None and len(shape) == len(now) == 2 and min(shape[1], now[1]) >= t["width"]


def decay_table(path: tuple) -> str | None:
    """The table whose ``decoupled_global`` bookkeeping the leaf at ``path`` is (``emb_states[t].decay.<field>``),
    read from the path's key entries, so a table's name is compared whole (``item`` is not ``items``, and a name
    holding ``.decay.`` or a quote is only a name); None for any other leaf."""
    if (len(path) >= 3 and path[0] == jax.tree_util.GetAttrKey("emb_states")
            and isinstance(path[1], jax.tree_util.DictKey) and path[2] == jax.tree_util.GetAttrKey("decay")):
        return path[1].key
    return None


def decay_problems(stored: Mapping[str, Any], ours: list[tuple], tables: Mapping[str, Any],
                   problems: list[str]) -> set[str]:
    """A table whose ``weight_decay_mode=decoupled_global`` bookkeeping (``decay.touch``, ``decay.total``: kept only
    in that mode, with a weight decay above 0) is in the checkpoint or in this config but not both: one line naming
    the setting, not the arrays. ``ours`` are this state's leaf paths, ``tables`` the checkpoint's tables by name;
    a stored array is the bookkeeping of a table only when its key is exactly that table's decay path (the stored
    keys are ``keystr`` text). Returns the keys of all the bookkeeping arrays, ours and the checkpoint's, whose
    absence on the other side is named here rather than array by array."""
    mine = {jax.tree_util.keystr(p): t for p in ours if (t := decay_table(p)) is not None}
    now = set(mine.values())
    theirs: dict[str, set[str]] = {}
    for t in set(tables) | now:
        prefix = (jax.tree_util.GetAttrKey("emb_states"), jax.tree_util.DictKey(t), jax.tree_util.GetAttrKey("decay"))
        found = {k for f in GlobalDecay._fields if (k := jax.tree_util.keystr(prefix + (jax.tree_util.GetAttrKey(f),)))
                 in stored}
        if found:
            theirs[t] = found
    for t in sorted(set(theirs) ^ now):
        saved = "with" if t in theirs else "without"
        problems.append(f"table '{t}' weight decay (optimizer.weight_decay_mode / table_optimizers.{t}."
                        f"weight_decay_mode): the checkpoint was saved {saved} the decay bookkeeping of "
                        f"weight_decay_mode=decoupled_global (with a weight_decay above 0), and this config "
                        f"{'does not keep it' if t in theirs else 'keeps it'}; resume with the mode it was saved with")
    return set(mine).union(*theirs.values())
