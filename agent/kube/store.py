"""A keyed store of parsed API objects that a list+watch keeps current (pure, no I/O).

The reflector feeds it a full list (on start and after 410 Gone) or single watch events; each
call returns the keys whose value changed, so a relist after a reconnect neither loses a
delete that happened while disconnected nor reports unchanged objects again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class EventType(enum.StrEnum):
    """Watch event types as the API server sends them."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


def object_key(obj: Mapping[str, Any]) -> str:
    """Return "namespace/name" (or "name" for cluster-scoped objects) of a raw API object."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = meta.get("name", "")
    return f"{ns}/{name}" if ns else str(name)


def resource_version(obj: Mapping[str, Any]) -> str:
    """Return metadata.resourceVersion of a raw object or list ("" when absent)."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One key whose stored value changed; `new` is None when it was deleted."""

    key: str
    old: T | None
    new: T | None


class Store(Generic[T]):
    """The current parsed value of every object of one resource, keyed by object_key()."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], T]) -> None:
        self._parse = parse
        self._items: dict[str, T] = {}

    def items(self) -> dict[str, T]:
        """Return a shallow copy of the stored values by key."""
        return dict(self._items)

    def get(self, key: str) -> T | None:
        """Return the stored value for `key`, or None when absent."""
        return self._items.get(key)

    def __len__(self) -> int:
        return len(self._items)

    def replace(self, raw_items: Iterable[Mapping[str, Any]]) -> list[Change[T]]:
        """Replace the whole content with a fresh list; return what differs from before.

        Keys missing from the list are reported deleted: this is how a delete that happened
        while the watch was down is not lost.
        Unchanged objects keep the value stored before, so a relist does not leave two equal
        copies of every record alive (the store's and the one its consumers were given).
        `raw_items` may be a lazy iterable (the reflector's pages); if it raises, the store
        is left as it was.
        """
        fresh: dict[str, T] = {}
        updated: list[Change[T]] = []
        for o in raw_items:
            key = object_key(o)
            if key in fresh:  # listed twice: the last copy wins, reported once
                updated = [c for c in updated if c.key != key]
            new = self._parse(o)
            old_value = self._items.get(key)
            if old_value is not None and old_value == new:
                fresh[key] = old_value
            else:
                fresh[key] = new
                updated.append(Change(key, old_value, new))
        changes = [Change(k, old, None) for k, old in self._items.items() if k not in fresh]
        self._items = fresh
        return changes + updated

    def apply(self, event: EventType, raw: Mapping[str, Any]) -> Change[T] | None:
        """Apply one ADDED/MODIFIED/DELETED event; return the change, None if nothing changed."""
        key = object_key(raw)
        old = self._items.get(key)
        if event is EventType.DELETED:
            if key not in self._items:
                return None
            del self._items[key]
            return Change(key, old, None)
        if event in (EventType.ADDED, EventType.MODIFIED):
            new = self._parse(raw)
            if old == new:
                return None
            self._items[key] = new
            return Change(key, old, new)
        return None
