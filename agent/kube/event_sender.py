"""The Event sender: posts core/v1 Events from its own thread (agent/kube/events.py decides
which), so a slow API server never delays a dataplane sync or an allocation."""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import uuid
from typing import Any

from agent.kube import metrics
from agent.kube.events import Event

log = logging.getLogger(__name__)


log = logging.getLogger(__name__)


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
