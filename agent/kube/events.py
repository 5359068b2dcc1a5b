"""Kubernetes Events: a pure gate that decides what is worth reporting, and a thin sender.

The gate drops repeats (same object, reason and message) inside a window, so a resync loop
never floods the API with the same Warning; the sender posts core/v1 Events from its own
thread so a slow API server never delays a dataplane sync.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.kube import metrics

log = logging.getLogger(__name__)


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


class KubeEventSink:
    """Posts Events to the API from a background thread; drops them when the queue is full."""

    def __init__(self, core_v1: Any, *, component: str, host: str, maxsize: int = 1000) -> None:
        self._api = core_v1
        self._component = component
        self._host = host
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=maxsize)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Start the sender thread."""
        self._thread = threading.Thread(target=self._loop, name="events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the sender after the Events already queued."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)

    def record(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            metrics.EVENTS_DROPPED.inc()
            log.warning("event queue full, dropping %s %s", event.reason, event.ref.name)

    def _loop(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                self._api.create_namespaced_event(event.ref.namespace, body=self.body(event))
            except Exception as exc:
                metrics.EVENTS_DROPPED.inc()
                log.warning("cannot post event %s for %s: %s", event.reason, event.ref.name, exc)

    def body(self, event: Event) -> dict[str, Any]:
        """Return the core/v1 Event object for `event`."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{event.ref.name}.{uuid.uuid4().hex[:16]}",
                "namespace": event.ref.namespace,
            },
            "involvedObject": {
                "apiVersion": event.ref.api_version,
                "kind": event.ref.kind,
                "namespace": event.ref.namespace,
                "name": event.ref.name,
                "uid": event.ref.uid,
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
