"""The Event gate (repeats inside the window are dropped, new messages always pass), the
correlator (repeats fold into one Event's count, a flood costs few writes, every occurrence
is written or counted as dropped) and the sender that carries its writes out."""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.kube.event_sender import KubeEventSink
from agent.kube.events import (
    COMBINED_PREFIX,
    DropReason,
    Event,
    EventCorrelator,
    EventGate,
    EventWrite,
    ObjectRef,
    WriteAction,
)
from lab.wait import wait_until

REF = ObjectRef(kind="Service", namespace="ns", name="web", uid="u1")


def warning(message: str) -> Event:
    return Event(REF, "Warning", "ExternalIPRefused", message)


def test_a_repeat_inside_the_window_is_dropped_and_passes_after_it() -> None:
    gate = EventGate(window=60)
    assert gate.admit(warning("a"), now=0)
    assert not gate.admit(warning("a"), now=59)
    assert gate.admit(warning("a"), now=61)


def test_a_new_message_or_object_passes_at_once() -> None:
    gate = EventGate(window=60)
    assert gate.admit(warning("a"), now=0)
    assert gate.admit(warning("b"), now=1)
    other = Event(ObjectRef("Service", "ns", "db", "u2"), "Warning", "ExternalIPRefused", "a")
    assert gate.admit(other, now=2)


def test_forgetting_an_object_lets_its_events_through_again() -> None:
    gate = EventGate(window=60)
    assert gate.admit(warning("a"), now=0)
    gate.forget("ns", "web")
    assert gate.admit(warning("a"), now=1)


WALL0 = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return WALL0 + datetime.timedelta(seconds=seconds)


def flush(c: EventCorrelator, now: float, *, force: bool = False) -> list[EventWrite]:
    """Return the writes due at `now`, each reported as written."""
    out = c.writes(now=now, force=force)
    for w in out:
        c.written(w)
    return out


# -- the correlator, step by step ------------------------------------------------------------


def test_a_new_event_is_created_and_its_repeat_patches_the_same_object_with_the_count() -> None:
    c = EventCorrelator()
    assert c.record(warning("a"), now=0, wall=at(0)) is None
    (first,) = flush(c, 0)
    assert (first.action, first.count, first.added) == (WriteAction.CREATE, 1, 1)
    for i in range(1, 4):
        c.record(warning("a"), now=i, wall=at(i))
    (again,) = flush(c, 4)
    assert (again.action, again.name, again.count, again.added) == (
        WriteAction.PATCH,
        first.name,
        4,
        3,
    )
    assert (again.first, again.last) == (at(0), at(3))


def test_repeats_waiting_for_their_write_fold_into_one_write() -> None:
    c = EventCorrelator()
    for i in range(500):
        c.record(warning("a"), now=i * 0.001, wall=at(0))
    assert c.pending == 500
    writes = flush(c, 1)
    assert [(w.action, w.count) for w in writes] == [(WriteAction.CREATE, 500)]
    assert c.pending == 0


def test_different_messages_are_different_events_until_too_many_become_one_combined() -> None:
    c = EventCorrelator(max_similar=10, burst=100)
    for i in range(30):
        c.record(warning(f"m{i}"), now=i, wall=at(i))
    writes = flush(c, 30)
    plain = [w for w in writes if not w.event.message.startswith(COMBINED_PREFIX)]
    combined = [w for w in writes if w.event.message.startswith(COMBINED_PREFIX)]
    assert len(plain) == 9  # client-go: the 10th similar message starts the combined Event
    assert [(w.count, w.event.message) for w in combined] == [(21, COMBINED_PREFIX + "m29")]
    assert sum(w.count for w in writes) == 30


def test_a_combined_event_is_patched_with_the_latest_message() -> None:
    c = EventCorrelator(max_similar=2)
    c.record(warning("m0"), now=0, wall=at(0))
    c.record(warning("m1"), now=1, wall=at(1))
    first = flush(c, 1)
    assert [w.event.message for w in first] == ["m0", COMBINED_PREFIX + "m1"]
    c.record(warning("m7"), now=2, wall=at(2))
    (patch,) = flush(c, 2)
    assert (patch.action, patch.name, patch.count, patch.event.message) == (
        WriteAction.PATCH,
        first[1].name,
        2,
        COMBINED_PREFIX + "m7",
    )


def test_similar_messages_are_forgotten_after_the_window() -> None:
    c = EventCorrelator(max_similar=2, similar_window=600)
    c.record(warning("m0"), now=0, wall=at(0))
    c.record(warning("m1"), now=1, wall=at(1))
    c.record(warning("m2"), now=700, wall=at(700))
    messages = [w.event.message for w in flush(c, 700)]
    assert messages == ["m0", COMBINED_PREFIX + "m1", "m2"]


def test_the_rate_limit_holds_occurrences_back_and_never_loses_them() -> None:
    c = EventCorrelator(burst=2, refill=300)
    total = 0
    writes: list[EventWrite] = []
    for second in range(0, 1000):
        c.record(warning("a"), now=second, wall=at(second))
        total += 1
        writes += flush(c, second)
    # burst 2, then one write per 300 s: at 0, 1, then 300, 600, 900.
    assert len(writes) == 5
    assert writes[-1].count + c.pending == total
    assert c.next_due(999) == pytest.approx(1200)
    writes += flush(c, 1200)
    assert writes[-1].count == total
    assert c.pending == 0


def test_one_object_spamming_does_not_hold_back_another() -> None:
    c = EventCorrelator(burst=1, refill=300)
    for i in range(5):
        c.record(warning(f"spam {i}"), now=0, wall=at(0))
    other = Event(ObjectRef("Service", "ns", "db", "u2"), "Warning", "ExternalIPRefused", "x")
    c.record(other, now=0, wall=at(0))
    names = sorted(w.event.ref.name for w in flush(c, 0))
    assert names == ["db", "web"]


def test_distinct_events_beyond_the_pending_bound_are_dropped_with_a_reason() -> None:
    c = EventCorrelator(max_pending=3)
    refs = [ObjectRef("Service", "ns", f"s{i}", f"u{i}") for i in range(5)]
    out = [c.record(Event(r, "Warning", "Bad", "x"), now=0, wall=at(0)) for r in refs]
    assert out == [None, None, None, DropReason.QUEUE_FULL, DropReason.QUEUE_FULL]
    assert c.record(Event(refs[0], "Warning", "Bad", "x"), now=0, wall=at(0)) is None
    assert c.pending == 4


def test_an_event_whose_write_is_in_flight_is_not_created_twice() -> None:
    c = EventCorrelator()
    c.record(warning("a"), now=0, wall=at(0))
    (create,) = c.writes(now=0)
    c.record(warning("a"), now=1, wall=at(1))
    assert c.writes(now=1) == []  # the create has no outcome yet
    c.written(create)
    (patch,) = c.writes(now=2)
    assert (patch.action, patch.name, patch.count) == (WriteAction.PATCH, create.name, 2)


def test_a_patch_of_a_vanished_event_creates_it_again_with_the_whole_count() -> None:
    c = EventCorrelator()
    c.record(warning("a"), now=0, wall=at(0))
    flush(c, 0)
    c.record(warning("a"), now=1, wall=at(1))
    (patch,) = c.writes(now=1)
    assert c.failed(patch, gone=True) == 0
    (create,) = c.writes(now=2)
    assert (create.action, create.count) == (WriteAction.CREATE, 2)


def test_a_refused_write_returns_the_occurrences_it_loses() -> None:
    c = EventCorrelator()
    c.record(warning("a"), now=0, wall=at(0))
    c.record(warning("a"), now=0, wall=at(0))
    (create,) = c.writes(now=0)
    assert c.failed(create) == 2
    assert c.pending == 0


def test_drain_returns_what_still_waits() -> None:
    c = EventCorrelator(burst=1)
    for _ in range(3):
        c.record(warning("a"), now=0, wall=at(0))
        flush(c, 0)
    assert c.pending == 2
    assert c.drain() == 2
    assert c.pending == 0


# -- the sender ----------------------------------------------------------------------------


@dataclass
class RawAnswer:
    """A raw response (`_preload_content=False`): its connection is held until released."""

    api: FakeEvents
    data: bytes = b"{}"

    def release_conn(self) -> None:
        with self.api.lock:
            self.api.held -= 1


@dataclass
class FakeEvents:
    """The Event part of CoreV1Api, in memory: creates, patches, and refusals on demand.
    `held` counts the connections answers still hold (a raw answer keeps its connection until
    it is released)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)
    refuse: bool = False
    held: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self) -> RawAnswer:
        with self.lock:
            self.held += 1
        return RawAnswer(self)

    def create_namespaced_event(
        self, namespace: str, *, body: Any, _preload_content: bool = True
    ) -> RawAnswer:
        with self.lock:
            self.writes.append("create")
            if self.refuse:
                raise RuntimeError("apiserver says no")
            self.objects[body["metadata"]["name"]] = body
        return self.answer()

    def patch_namespaced_event(
        self,
        name: str,
        namespace: str,
        *,
        body: Any,
        _content_type: str,
        _preload_content: bool = True,
    ) -> RawAnswer:
        with self.lock:
            self.writes.append("patch")
            if name not in self.objects:
                exc = RuntimeError("not found")
                exc.status = 404  # type: ignore[attr-defined]
                raise exc
            self.objects[name].update(body)
        return self.answer()

    def total(self) -> int:
        with self.lock:
            return sum(int(o["count"]) for o in self.objects.values())


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime.datetime:
        return at(self.now)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def sink_with(api: FakeEvents, clock: Clock, **kw: Any) -> KubeEventSink:
    return KubeEventSink(
        api,
        component="nodelb-agent",
        host="node-1",
        monotonic=clock.monotonic,
        wall=clock.wall,
        **kw,
    )


def test_event_body_names_the_object_and_truncates_long_messages() -> None:
    api, clock = FakeEvents(), Clock()
    sink = sink_with(api, clock)
    sink.record(warning("x" * 5000))
    assert sink.send_ready() == 1
    (body,) = api.objects.values()
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Service",
        "namespace": "ns",
        "name": "web",
        "uid": "u1",
    }
    assert body["type"] == "Warning"
    assert len(body["message"]) == 1024
    assert body["metadata"]["name"].startswith("web.")
    assert (body["count"], body["firstTimestamp"]) == (1, "2026-12-01T12:00:00Z")


def test_a_flood_costs_few_writes_and_every_occurrence_is_counted() -> None:
    api, clock = FakeEvents(), Clock()
    sink = sink_with(api, clock)
    recorded = sample("nodelb_events_recorded_total")
    for i in range(10_000):
        clock.now = i * 0.1
        sink.record(warning(f"problem {i % 3}"))
        sink.send_ready()
    clock.now = 2000
    sink.send_ready()
    assert len(api.objects) == 3
    assert len(api.writes) <= 3 * 25 + 3 * (2000 // 300 + 1)
    assert api.total() == 10_000
    assert sample("nodelb_events_recorded_total") - recorded == 10_000
    patched = next(o for o in api.objects.values() if o["message"] == "problem 0")
    assert patched["lastTimestamp"] == "2026-12-01T12:16:39Z"  # the last occurrence, at 999.9 s


def test_a_refused_create_counts_its_occurrences_as_dropped() -> None:
    api, clock = FakeEvents(refuse=True), Clock()
    sink = sink_with(api, clock)
    before = sample("nodelb_events_dropped_total", reason="api_error")
    sink.record(warning("a"))
    sink.record(warning("a"))
    sink.send_ready()
    assert sample("nodelb_events_dropped_total", reason="api_error") - before == 2


def test_a_full_queue_and_a_stop_count_their_drops() -> None:
    api, clock = FakeEvents(), Clock()
    sink = sink_with(api, clock, max_pending=1)
    full = sample("nodelb_events_dropped_total", reason="queue_full")
    sink.record(warning("a"))
    sink.record(warning("b"))  # a second distinct Event while one waits
    assert sample("nodelb_events_dropped_total", reason="queue_full") - full == 1
    sink.close()  # never started: the waiting one cannot be written
    assert sample("nodelb_events_dropped_total", reason="shutdown") >= 1


def test_the_thread_writes_what_is_recorded_and_flushes_held_repeats_on_close() -> None:
    api = FakeEvents()
    sink = KubeEventSink(api, component="nodelb-agent", host="node-1")
    sink.run()
    try:
        for _ in range(100):
            sink.record(warning("a"))
        wait_until(lambda: api.total() == 100, 10, "100 occurrences written")
    finally:
        sink.close()
    assert len(api.objects) == 1


# -- a bulk start: flow control and concurrent writes ----------------------------------------


def allocated(i: int) -> Event:
    """Return Service i's allocation Event: one distinct Event per Service, nothing folds."""
    ref = ObjectRef(kind="Service", namespace="ns", name=f"svc-{i}", uid=f"u{i}")
    return Event(ref, "Normal", "IPAllocated", f"allocated 198.19.0.{i % 250}")


def test_a_bulk_start_without_flow_control_overflows_the_queue_and_counts_it() -> None:
    # The failure the flow control exists for: 10x the bound, recorded faster than written.
    api, clock = FakeEvents(), Clock()
    sink = sink_with(api, clock, max_pending=50)
    full = sample("nodelb_events_dropped_total", reason="queue_full")
    for i in range(500):
        sink.record(allocated(i))
    assert sample("nodelb_events_dropped_total", reason="queue_full") - full == 450


def test_a_bulk_start_that_waits_for_room_loses_no_event() -> None:
    api = FakeEvents()
    sink = KubeEventSink(api, component="nodelb-controller", host="c", max_pending=50, senders=4)
    full = sample("nodelb_events_dropped_total", reason="queue_full")
    sink.run()
    try:
        for i in range(2000):
            assert sink.wait_room(10.0), f"no room after 10 s at Event {i}"
            sink.record(allocated(i))
        wait_until(lambda: len(api.objects) == 2000, 10, "2000 Events created")
    finally:
        sink.close()
    assert sample("nodelb_events_dropped_total", reason="queue_full") == full
    assert api.writes.count("create") == 2000 and api.total() == 2000
    # Every answer gave its connection back: unreleased, they drain the client's pool and
    # every later request opens a new TLS connection.
    assert api.held == 0


def test_wait_room_says_false_when_the_queue_stays_full_and_true_once_it_drains() -> None:
    api, clock = FakeEvents(), Clock()
    sink = sink_with(api, clock, max_pending=10, room_below=3)
    for i in range(3):
        sink.record(allocated(i))
    assert sink.wait_room(0.01) is False  # three waiting, room only below three
    sink.send_ready()
    assert sink.wait_room(0.0) is True
    sink.close()
    assert sink.wait_room(0.0) is False  # a stopped sink has no room to offer


@dataclass
class RendezvousEvents(FakeEvents):
    """Creates return only once `parties` of them are in flight together."""

    parties: int = 4
    barrier: threading.Barrier = field(init=False)

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.parties, timeout=10)

    def create_namespaced_event(
        self, namespace: str, *, body: Any, _preload_content: bool = True
    ) -> RawAnswer:
        self.barrier.wait()  # serial writes would break it (BrokenBarrierError: a refusal)
        return super().create_namespaced_event(namespace, body=body)


def test_the_sender_writes_a_backlog_over_concurrent_requests() -> None:
    api = RendezvousEvents(parties=4)
    sink = KubeEventSink(api, component="nodelb-controller", host="c", senders=4)
    errors = sample("nodelb_events_dropped_total", reason="api_error")
    for i in range(8):
        sink.record(allocated(i))
    sink.run()
    try:
        wait_until(lambda: len(api.objects) == 8, 15, "8 Events created four at a time")
    finally:
        sink.close()
    assert sample("nodelb_events_dropped_total", reason="api_error") == errors
