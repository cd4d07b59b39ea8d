"""Hydra's errors for a command-line override it cannot apply, said in one line that names the bad value and the fix.

Hydra reports them itself, in four to twenty lines ending "Set the environment variable HYDRA_FULL_ERROR=1 for a
complete stack trace", with exit code 1. ``python -m runner`` (``runner.__main__.entry``) has Hydra raise them
instead (``raised``) and prints ``message(error)`` with exit code 2, as it does for every other bad input:

- no ``=`` (``trainer.steps``): the override as it should be written, ``trainer.steps=<value>``;
- a value of the wrong type (``trainer.steps=abc``): the type the setting takes, with its range where the schema
  declares one (``optimizers.hparam``) and ``null`` where it may be unset;
- a key the schema lacks (``trainer.nosuchkey=1``): the closest keys of that node, else all of them;
- an option a config group lacks (``optimizer=nosuch``): the closest options, and all of them;
- a value with a comma without ``-m`` (``trainer.seed=1,2``): a sweep with ``-m``, a list, or a string;
- a swept value without a sweep (``model.emb_width=choice(8,16)``, Hydra's "requires --multirun"): ``-m``, an Optuna
  search (``hparams_search=...``), or one value.

An error of another kind is said by its first lines, joined. With ``HYDRA_FULL_ERROR=1`` Hydra's own report (its
stack trace) is left as it is.
"""
from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Sequence

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig

from optimizers.hparams import ranges

GRAMMAR = "https://hydra.cc/docs/1.2/advanced/override_grammar/basic"
KINDS = {"Integer": "an integer", "Float": "a number", "bool": "true or false", "String": "a string"}


def raised() -> None:
    """Have Hydra raise an override it cannot apply out of ``hydra.main`` rather than report it. Hydra catches
    every error of the run in ``run_and_report``; this wraps it (once) so that those of composing the config pass
    through, and every other error is reported by Hydra as before."""
    import hydra._internal.utils as hydra_utils

    report: Callable[[Callable[[], Any]], Any] = hydra_utils.run_and_report
    if getattr(report, "raises_override_errors", False):
        return

    def run_and_report(func: Callable[[], Any]) -> Any:
        if full_error():
            return report(func)
        failed: list[BaseException] = []

        def composing() -> Any:
            try:
                return func()
            except (OverrideParseException, ConfigCompositionException) as e:
                failed.append(e)
                return None

        out = report(composing)
        if failed:
            raise failed[0]
        return out

    run_and_report.raises_override_errors = True
    hydra_utils.run_and_report = run_and_report


def full_error() -> bool:
    """Whether Hydra is asked for its full report, stack trace included (as Hydra reads it)."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def message(error: BaseException, searches: Sequence[str] = ()) -> str:
    """One line for Hydra's ``error`` (without ``error: ``); ``searches``: the ``hparams_search`` options, named as
    the way to search a swept value given without a sweep."""
    cause = error.__cause__
    if isinstance(error, OverrideParseException):
        return _unparsed(error)
    swept = re.match(r"Sweep parameters '(.*)' requires --multirun", str(error))
    if swept:
        return _swept(swept.group(1), searches)
    ambiguous = re.match(r"Ambiguous value for argument '(.*)'", str(error))
    if ambiguous:  # Hydra's three ways out, in one line
        given = ambiguous.group(1)
        key, _, value = given.partition("=")
        return (f"{given}: a value with a comma is a sweep or a list: sweep it with -m (--multirun), give a list as "
                f"{key}=[{value}], or a string as {key}='{value}' (quoted for the shell: \"{key}='{value}'\")")
    if isinstance(error, MissingConfigException) and error.options and error.missing_cfg_file:
        return _no_option(error.missing_cfg_file, list(error.options))
    if getattr(cause, "key", None) is not None and isinstance(getattr(cause, "parent_node", None), DictConfig):
        text = str(cause)
        if text.startswith("Key '"):
            given = re.search(r"use \+(\S+)", str(error))
            return _no_key(given.group(1) if given else str(cause.full_key), str(cause.full_key), str(cause.key),
                           list(cause.parent_node.keys()))
        kind = re.search(r"converted to (\w+)|is not a valid (\w+)|expected one of \[(.*)\]", text)
        if kind:
            word = kind.group(1) or kind.group(2)
            return _wrong_type(error, cause, KINDS.get(word, word) if word else f"one of {kind.group(3)}")
    lines = [ln.strip() for e in (error, cause) if e is not None for ln in str(e).splitlines()[:2] if ln.strip()]
    return " ".join(ln for ln in lines if "HYDRA_FULL_ERROR" not in ln) or type(error).__name__


def _unparsed(error: OverrideParseException) -> str:
    given = error.override
    if "missing EQUAL" in error.message:
        return (f"override '{given}' has no '=': give it a value ({given}=<value>), or remove a key with ~{given}; "
                f"`python -m runner --cfg job` lists the settings")
    why = error.message.splitlines()[-2 if "\nSee " in error.message else -1].strip()
    return f"override '{given}' cannot be parsed ({why}): quote a value holding , [ ] {{ }} ( ) or = ({GRAMMAR})"


def _swept(given: str, searches: Sequence[str]) -> str:
    """A swept value (``choice``, ``range``, ``interval``) given to a single run: the sweeps that take it, and the
    value to give instead (a ``choice``'s or ``range``'s first; an interval is searched by Optuna only)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, _, _ = given.partition("=")
    one, interval = f"{key}=<value>", False
    try:
        override = OverridesParser.create().parse_override(given)
        key, interval = override.get_key_element(), override.is_interval_sweep()
        one = f"{key}={next(iter(override.sweep_string_iterator()))}" if not interval else f"{key}=<value>"
    except Exception:  # noqa: BLE001 - Hydra parsed it already; a value it cannot list is written <value>
        pass
    search = f"hparams_search=<one of {', '.join(searches)}>" if searches else "hparams_search=<a search>"
    multirun = "" if interval else "sweep it with -m (--multirun: one run per value, Hydra's basic sweeper), "
    return (f"{given}: a swept value needs a sweep: {multirun}search it with {search} (an Optuna search), or give "
            f"one value ({one})")


def _no_option(missing: str, options: list[str]) -> str:
    group, _, name = missing.rpartition("/")
    near = difflib.get_close_matches(name, options, n=3)
    guess = f"did you mean {' or '.join(f'{group}={n}' for n in near)}? " if near else ""
    return f"{group}={name}: the config group {group} has no option '{name}'; {guess}its options: {', '.join(options)}"


def _no_key(given: str, full_key: str, key: str, keys: list[str]) -> str:
    parent = full_key.rpartition(".")[0]
    where = f"{parent}." if parent else ""
    near = difflib.get_close_matches(key, keys, n=3)
    fix = (f"did you mean {' or '.join(where + n for n in near)}?" if near
           else f"its keys: {', '.join(keys)}")
    return (f"{given}: {'the config' if not parent else parent} has no key '{key}'; {fix} (`python -m runner "
            f"--cfg job` lists the settings)")


def _wrong_type(error: BaseException, cause: Any, kind: str) -> str:
    given = str(error).split("override ", 1)[-1] if str(error).startswith("Error merging override") else None
    key = str(cause.full_key)
    given = given or f"{key}={cause.value}"
    rng = ranges(getattr(cause, "object_type", None)).get(str(cause.key))
    node = cause.parent_node._get_node(cause.key)
    takes = kind + (f" in {rng}" if rng is not None and kind in ("an integer", "a number") else "")
    takes += ", or null" if node is not None and node._is_optional() else ""
    return f"{given}: {key} takes {takes}, not {str(cause.value)!r}"
