"""Kubernetes Events as values, a gate that decides what is worth reporting, and the
correlator that decides how each occurrence reaches the API (all pure).

The gate drops repeats (same object, reason and message) inside a window, so a resync loop
never floods the API with the same Warning. `EventCorrelator` is client-go's EventCorrelator
(tools/record/events_cache.go) as a state machine with time passed in: occurrences of one
Event (same object, type, reason, message) are folded into one Event object whose `count` and
`lastTimestamp` a PATCH updates; more than `max_similar` different messages for one object
and reason within `similar_window` become one "(combined from similar events)" Event; and a
token bucket per object (burst 25, one token per 5 minutes, client-go's spam filter) bounds
the API writes an object's Events cost. Unlike client-go, an occurrence the bucket holds back
is not dropped: it waits, folded into its Event's pending count, and goes with the next
write. What must still be dropped (too many distinct Events waiting, the API refused, the
process stopped) is returned with a `DropReason`, for nodelb_events_dropped_total.
agent/kube/event_sender.py is the thread that carries the writes out.
"""

from __future__ import annotations

import datetime
import enum
from collections import OrderedDict
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


# -- correlation -----------------------------------------------------------------------------

COMBINED_PREFIX = "(combined from similar events): "


class DropReason(enum.StrEnum):
    """Why occurrences of an Event never reached the API (the metric's `reason` label)."""

    QUEUE_FULL = "queue_full"  # `max_pending` distinct Events were already waiting
    API_ERROR = "api_error"  # the API server refused the create or the patch
    SHUTDOWN = "shutdown"  # still waiting for the rate limit when the process stopped


class WriteAction(enum.StrEnum):
    """How an Event reaches the API."""

    CREATE = "create"  # a new Event object
    PATCH = "patch"  # count, lastTimestamp and message of the Event object written before


ObjectKey = tuple[str, str, str, str, str]  # api_version, kind, namespace, name, uid
EventKey = tuple[ObjectKey, str, str, str]  # the object, type, reason, message


@dataclass(frozen=True, slots=True)
class EventWrite:
    """One API write: create Event `name` or patch it to say `count` occurrences in all.

    `added` is how many occurrences this write brings (what is dropped if it fails); `first`
    and `last` are the first and latest occurrence's wall time.
    """

    action: WriteAction
    key: EventKey
    event: Event
    name: str
    count: int
    added: int
    first: datetime.datetime
    last: datetime.datetime


@dataclass(slots=True)
class _Pending:
    event: Event
    n: int
    first: datetime.datetime
    last: datetime.datetime


@dataclass(slots=True)
class _Logged:
    name: str
    count: int
    first: datetime.datetime


@dataclass(slots=True)
class _Similar:
    since: float
    messages: set[str]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass
class EventCorrelator:
    """Folds Event occurrences into few API writes; see the module docstring.

    `record` takes an occurrence; `writes` returns what may be written now; the shell reports
    each write's outcome with `written` or `failed`. `now` is monotonic seconds (windows, the
    rate limit), `wall` the time written into the Event. Memory is bounded: `max_pending`
    Events waiting, and `max_logged` Events remembered for patching (least recently used go;
    a later repeat of one forgotten creates a new Event, as client-go's LRU does).
    """

    max_pending: int = 1000
    max_logged: int = 4096
    max_similar: int = 10
    similar_window: float = 600.0
    burst: int = 25
    refill: float = 300.0  # seconds per token
    _pending: OrderedDict[EventKey, _Pending] = field(default_factory=OrderedDict)
    _logged: OrderedDict[EventKey, _Logged] = field(default_factory=OrderedDict)
    _similar: OrderedDict[tuple[ObjectKey, str, str], _Similar] = field(default_factory=OrderedDict)
    _buckets: OrderedDict[ObjectKey, _Bucket] = field(default_factory=OrderedDict)
    _inflight: set[EventKey] = field(default_factory=set)  # written, outcome not yet known
    _serial: int = 0

    @property
    def pending(self) -> int:
        """Return the occurrences waiting to be written."""
        return sum(p.n for p in self._pending.values())

    @property
    def backlog(self) -> int:
        """Return the distinct Events not yet written: waiting, or written with no outcome."""
        return len(self._pending) + len(self._inflight)

    def record(self, event: Event, *, now: float, wall: datetime.datetime) -> DropReason | None:
        """Take one occurrence of `event`; return why it was dropped, or None (it waits)."""
        obj = _object_key(event.ref)
        event = self._aggregate(obj, event, now)
        # A combined Event is one object whatever the message: it says the latest.
        combined = event.message.startswith(COMBINED_PREFIX)
        key = (obj, event.type, event.reason, COMBINED_PREFIX if combined else event.message)
        waiting = self._pending.get(key)
        if waiting is not None:
            waiting.n += 1
            waiting.last = wall
            waiting.event = event
            return None
        if len(self._pending) >= self.max_pending:
            return DropReason.QUEUE_FULL
        self._pending[key] = _Pending(event, 1, wall, wall)
        return None

    def _aggregate(self, obj: ObjectKey, event: Event, now: float) -> Event:
        """Return `event`, or its combined form when its object and reason had too many
        different messages lately (client-go's EventAggregator)."""
        key = (obj, event.type, event.reason)
        similar = self._similar.get(key)
        if similar is None or now - similar.since > self.similar_window:
            similar = _Similar(now, set())
        self._similar[key] = similar
        self._similar.move_to_end(key)
        while len(self._similar) > self.max_logged:
            self._similar.popitem(last=False)
        if event.message in similar.messages:
            return event
        if len(similar.messages) < self.max_similar - 1:
            similar.messages.add(event.message)
            return event
        return Event(event.ref, event.type, event.reason, COMBINED_PREFIX + event.message)

    def writes(self, *, now: float, force: bool = False) -> list[EventWrite]:
        """Return the writes that may go now, oldest first, and stop tracking them as waiting.

        An object whose bucket is empty keeps its Events waiting (their occurrences keep
        folding in), and so does an Event whose previous write has no outcome yet (a second
        create would split its count over two objects). `force` ignores the buckets (the
        last flush before the process stops).
        """
        out: list[EventWrite] = []
        for key in list(self._pending):
            if key in self._inflight:
                continue
            waiting = self._pending[key]
            if not force and not self._take_token(key[0], now):
                continue
            del self._pending[key]
            self._inflight.add(key)
            logged = self._logged.get(key)
            event = waiting.event
            if logged is None:
                self._serial += 1
                stamp = int(waiting.first.timestamp() * 1e9)
                name = f"{event.ref.name}.{stamp:x}{self._serial:x}"
                out.append(
                    EventWrite(
                        WriteAction.CREATE,
                        key,
                        event,
                        name,
                        waiting.n,
                        waiting.n,
                        waiting.first,
                        waiting.last,
                    )
                )
            else:
                out.append(
                    EventWrite(
                        WriteAction.PATCH,
                        key,
                        event,
                        logged.name,
                        logged.count + waiting.n,
                        waiting.n,
                        logged.first,
                        waiting.last,
                    )
                )
        return out

    def _take_token(self, obj: ObjectKey, now: float) -> bool:
        bucket = self._buckets.get(obj)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
        else:
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) / self.refill)
            bucket.at = now
        self._buckets[obj] = bucket
        self._buckets.move_to_end(obj)
        while len(self._buckets) > self.max_logged:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0 - 1e-9:  # a token due just now, give or take rounding
            return False
        bucket.tokens = max(0.0, bucket.tokens - 1.0)
        return True

    def next_due(self, now: float) -> float | None:
        """Return when (monotonic) a waiting Event's bucket next has a token; None: none waits."""
        due: float | None = None
        for key in self._pending:
            if key in self._inflight:
                continue  # its outcome, not the clock, lets it go
            bucket = self._buckets.get(key[0])
            if bucket is None or bucket.tokens >= 1.0:
                return now
            at = bucket.at + (1.0 - bucket.tokens) * self.refill
            due = at if due is None else min(due, at)
        return due

    def written(self, write: EventWrite) -> None:
        """Remember that `write` succeeded: the next occurrence patches that Event."""
        self._inflight.discard(write.key)
        self._logged[write.key] = _Logged(write.name, write.count, write.first)
        self._logged.move_to_end(write.key)
        while len(self._logged) > self.max_logged:
            self._logged.popitem(last=False)

    def failed(self, write: EventWrite, *, gone: bool = False) -> int:
        """Return the occurrences lost with a failed `write` (0 when they wait again).

        `gone`: the patched Event no longer exists (it expired, someone deleted it); as
        client-go does, a new Event is created instead, carrying the whole count.
        """
        self._inflight.discard(write.key)
        self._logged.pop(write.key, None)
        if not gone or write.action is not WriteAction.PATCH:
            return write.added
        waiting = self._pending.get(write.key)
        if waiting is None:
            self._pending[write.key] = _Pending(write.event, write.count, write.first, write.last)
        else:  # more arrived meanwhile
            waiting.n += write.count
            waiting.first = write.first
        self._pending.move_to_end(write.key, last=False)
        return 0

    def drain(self) -> int:
        """Return (and forget) the occurrences still waiting: the process is stopping."""
        lost = self.pending
        self._pending.clear()
        return lost


def _object_key(ref: ObjectRef) -> ObjectKey:
    return (ref.api_version, ref.kind, ref.namespace, ref.name, ref.uid)
