"""Kubernetes Events as values, and a pure gate that decides what is worth reporting.

The gate drops repeats (same object, reason and message) inside a window, so a resync loop
never floods the API with the same Warning; agent/kube/event_sender.py posts what passes,
from its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = "v1"


@dataclass(frozen=True, slots=True)
class Event:
    """One Event to report: type is "Normal" or "Warning"; reason is CamelCase."""

    ref: ObjectRef
    type: str
    reason: str
    message: str


class EventSink(Protocol):
    """Where decision code sends Events (the API in production, a list in tests)."""

    def record(self, event: Event) -> None: ...


@dataclass
class EventGate:
    """Return True for Events worth sending: new ones, or repeats older than `window` s."""

    window: float = 600.0
    _last: dict[tuple[str, str, str, str, str], float] = field(default_factory=dict)

    def admit(self, event: Event, now: float) -> bool:
        key = (event.ref.namespace, event.ref.name, event.ref.uid, event.reason, event.message)
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        self._last[key] = now
        return True

    def forget(self, namespace: str, name: str) -> None:
        """Drop the memory of a deleted object's Events."""
        self._last = {k: v for k, v in self._last.items() if (k[0], k[1]) != (namespace, name)}


class ListSink:
    """An EventSink that keeps Events in memory (tests, `nodelb render`)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def record(self, event: Event) -> None:
        self.events.append(event)
