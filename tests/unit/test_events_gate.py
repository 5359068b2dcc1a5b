"""The Event gate: repeats inside the window are dropped, new messages always pass."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from agent.kube.event_sender import KubeEventSink
from agent.kube.events import Event, EventGate, ObjectRef

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


def test_event_body_names_the_object_and_truncates_long_messages() -> None:
    sink = KubeEventSink(None, component="nodelb-agent", host="node-1")
    body = sink.body(warning("x" * 5000))
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


def test_events_beyond_the_queue_or_refused_by_the_api_are_counted() -> None:
    class Refusing:
        def create_namespaced_event(self, namespace: str, *, body: Any) -> None:
            raise RuntimeError("apiserver says no")

    def dropped() -> float:
        return REGISTRY.get_sample_value("nodelb_events_dropped_total") or 0.0

    before = dropped()
    sink = KubeEventSink(Refusing(), component="nodelb-agent", host="node-1", maxsize=1)
    ev = Event(ObjectRef("Service", "ns", "web", "u1"), "Warning", "Bad", "bad")
    sink.record(ev)
    sink.record(ev)  # the queue holds one: this one is dropped
    assert dropped() == before + 1
    sink.run()
    sink.close()  # the queued one is sent and refused
    assert dropped() == before + 2
