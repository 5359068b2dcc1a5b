"""The Event sender: posts core/v1 Events from its own thread (agent/kube/events.py decides
what each occurrence becomes), so a slow API server never delays a dataplane sync or an
allocation.

`record` hands an occurrence to the `EventCorrelator` and returns at once; the thread writes
what the correlator lets go: a create for a new Event, a PATCH of `count`, `lastTimestamp`
and `message` for a repeat (client-go's EventRecorder does the same), so a flood of one
Warning costs a few writes, not one per occurrence. Every occurrence is either counted in an
Event object or in nodelb_events_dropped_total with its reason.

A bulk start (the controller allocating 10k Services) makes one distinct Event per Service,
which no correlation folds: the thread writes what is ready over `senders` concurrent
requests (answers read raw, not through the client's models), and a producer that would
flood the queue waits for room first (`wait_room`, the controller's writers before each
write): the queue is flow-controlled instead of overflowing. What still overflows it (a
producer that does not wait, or gave up waiting) is counted as dropped (queue_full).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent.kube import metrics
from agent.kube.client import read_body
from agent.kube.events import DropReason, Event, EventCorrelator, EventWrite, WriteAction

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
LOG_EVERY = 1000  # a drop is logged the first time for its reason, then once per this many


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(at: datetime.datetime) -> str:
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeEventSink:
    """Posts Events to the API from a background thread, folding repeats into patches.

    `max_pending` bounds the distinct Events waiting (repeats of a waiting one cost nothing);
    `wait_room` lets a producer wait while `room_below` or more are not yet written (default
    half of `max_pending`); `senders` writes go at once (1 by default: the agent's few Events
    stay within its small connection pool; the controller passes 4); `monotonic` and `wall`
    are the clocks (tests pass their own and call `send_ready`, which then writes one at a
    time).
    """

    def __init__(
        self,
        core_v1: Any,
        *,
        component: str,
        host: str,
        max_pending: int = 1000,
        room_below: int | None = None,
        senders: int = 1,
        correlator: EventCorrelator | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self._api = core_v1
        self._component = component
        self._host = host
        self._correlator = correlator or EventCorrelator(max_pending=max_pending)
        self._room_below = room_below if room_below is not None else max(1, max_pending // 2)
        self._senders = senders
        self._pool: ThreadPoolExecutor | None = None
        self._monotonic = monotonic
        self._wall = wall
        self._cond = threading.Condition()
        self._stopping = False
        self._drops: dict[DropReason, int] = {}
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Start the sender thread (and its pool of concurrent writes)."""
        if self._senders > 1:
            self._pool = ThreadPoolExecutor(self._senders, thread_name_prefix="event-write")
        self._thread = threading.Thread(target=self._loop, name="events", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sender after writing what waits (rate limit or not), within `timeout` s;
        what is still waiting then is counted as dropped (shutdown)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        with self._cond:
            lost = self._correlator.drain()
            self._cond.notify_all()  # producers waiting for room stop waiting
        self._dropped(DropReason.SHUTDOWN, lost)

    def wait_room(self, timeout: float) -> bool:
        """Return True once fewer than `room_below` distinct Events wait to be written, False
        when `timeout` seconds pass first or the sender is stopping (any thread but the
        sender's: it blocks)."""
        with self._cond:
            return (
                self._cond.wait_for(
                    lambda: self._stopping or self._correlator.backlog < self._room_below,
                    timeout=timeout,
                )
                and not self._stopping
            )

    def record(self, event: Event) -> None:
        """Take one occurrence of `event` (any thread; never blocks on the API)."""
        with self._cond:
            dropped = self._correlator.record(event, now=self._monotonic(), wall=self._wall())
            self._cond.notify_all()
        metrics.EVENTS_RECORDED.inc()
        if dropped is not None:
            self._dropped(dropped, 1, event)

    def send_ready(self, *, force: bool = False) -> int:
        """Write what the correlator lets go now (this thread); return how many writes."""
        with self._cond:
            writes = self._correlator.writes(now=self._monotonic(), force=force)
        if self._pool is not None and len(writes) > 1:
            list(self._pool.map(self._send, writes))
        else:
            for write in writes:
                self._send(write)
        return len(writes)

    def _loop(self) -> None:
        while True:
            with self._cond:
                stopping = self._stopping
                if not stopping:
                    now = self._monotonic()
                    due = self._correlator.next_due(now)
                    if due is None or due > now:
                        wait = None if due is None else max(0.05, due - now)
                        self._cond.wait(timeout=wait)
                        stopping = self._stopping
            sent = self.send_ready(force=stopping)
            if stopping and not sent:
                return

    def _send(self, write: EventWrite) -> None:
        namespace = write.event.ref.namespace
        try:
            # The answer is not read into the client's models: a bulk start sends thousands.
            if write.action is WriteAction.CREATE:
                resp = self._api.create_namespaced_event(
                    namespace, body=self.body(write), _preload_content=False
                )
            else:
                resp = self._api.patch_namespaced_event(
                    write.name,
                    namespace,
                    body=self.patch(write),
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            read_body(resp)  # gives the connection back to the pool
        except Exception as exc:
            gone = write.action is WriteAction.PATCH and getattr(exc, "status", None) == 404
            with self._cond:
                lost = self._correlator.failed(write, gone=gone)
                self._cond.notify_all()
            if lost:
                log.warning(
                    "cannot post event %s for %s: %s", write.event.reason, write.event.ref.name, exc
                )
                self._dropped(DropReason.API_ERROR, lost)
            return
        with self._cond:
            self._correlator.written(write)
            self._cond.notify_all()
        metrics.EVENT_WRITES.labels(write.action.value).inc()

    def _dropped(self, reason: DropReason, n: int, event: Event | None = None) -> None:
        if n <= 0:
            return
        metrics.EVENTS_DROPPED.labels(reason.value).inc(n)
        before = self._drops.get(reason, 0)
        self._drops[reason] = before + n
        if before == 0 or before // LOG_EVERY != (before + n) // LOG_EVERY:
            about = f" ({event.reason} for {event.ref.name})" if event is not None else ""
            log.warning("events dropped (%s): %d so far%s", reason, before + n, about)

    def body(self, write: EventWrite) -> dict[str, Any]:
        """Return the core/v1 Event object a create of `write` sends."""
        event = write.event
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": write.name, "namespace": event.ref.namespace},
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
            "firstTimestamp": _stamp(write.first),
            "lastTimestamp": _stamp(write.last),
            "count": write.count,
        }

    @staticmethod
    def patch(write: EventWrite) -> dict[str, Any]:
        """Return the merge patch a repeat sends: the new count, time and message."""
        return {
            "count": write.count,
            "lastTimestamp": _stamp(write.last),
            "message": write.event.message[:1024],
        }
