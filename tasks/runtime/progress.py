"""Progress events from the flow body to whoever shows them (the CLI's Rich display).

A module-level listener keeps the flow's parameters plain data (Prefect validates them)
while the CLI still sees each stage as it starts and ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def emit(event: str, **info: Any) -> None:
    for listener in list(_listeners):
        listener(event, info)
