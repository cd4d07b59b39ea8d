"""Plug-ins by name: one small mechanism for every kind the runner chooses from config.

``runner.tasks.TASKS`` maps a data source (``data.name``) to a task, ``runner.tracking.TRACKERS`` a tracker
name to its factory; the embedding optimizers keep their own ``optimizers.REGISTRY`` (that library knows
nothing of the runner). Adding a task or a tracker is one decorated function::

    @TASKS.register("my_data")
    def my_task(cfg): ...
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name that nothing is registered under; the message lists the known names."""


class Registry(Generic[T]):
    def __init__(self, kind: str, setting: str):
        self.kind = kind  # what is registered: "task", "tracker"
        self.setting = setting  # the config key that names one: "data.name", "logger.kind"
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(f"{self.setting}={name!r} names no {self.kind}; known: "
                              f"{', '.join(sorted(self._entries))}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
