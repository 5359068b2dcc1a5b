"""Pure parts of the controller: the Lease election rules, node reports, status planning."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from agent.controller.allocator import Allocator
from agent.controller.leader import (
    ElectionTiming,
    LeaseRecord,
    LeaseVerdict,
    Observation,
    decide,
    observe,
    record_from_raw,
    released_spec,
)
from agent.controller.service_status import (
    allocation_events,
    parse_view,
    plan_status,
    problem_event,
)
from agent.kube.node_report import next_expiry, parse_report, report_body, serving_ips
from agent.model.pools import Forbidden, parse_pools

WALL = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


def record(holder: str, rv: str = "1", duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, 3, "2026-12-01T11:00:00.000000Z", rv)


@dataclass(frozen=True, slots=True)
class ElectionCase:
    observation: Observation | None
    now: float
    verdict: LeaseVerdict


ELECTION_CASES = [
    pytest.param(ElectionCase(None, 0.0, LeaseVerdict.CREATE), id="no Lease yet: create it"),
    pytest.param(
        ElectionCase(Observation(record("me"), 0.0), 100.0, LeaseVerdict.RENEW),
        id="our own Lease is renewed however old it looks",
    ),
    pytest.param(
        ElectionCase(Observation(record("other"), 10.0), 24.9, LeaseVerdict.WAIT),
        id="another holder seen changing 14.9 s ago with a 15 s lease: wait",
    ),
    pytest.param(
        ElectionCase(Observation(record("other"), 10.0), 25.0, LeaseVerdict.ACQUIRE),
        id="another holder silent for the whole lease duration: take over",
    ),
    pytest.param(
        ElectionCase(Observation(record(""), 10.0), 10.0, LeaseVerdict.ACQUIRE),
        id="a released Lease (no holder) is taken at once",
    ),
]


@pytest.mark.parametrize("case", ELECTION_CASES)
def test_decide(case: ElectionCase) -> None:
    decision = decide(me="me", observation=case.observation, now=case.now, wall=WALL, duration=15)
    assert decision.verdict is case.verdict
    if case.verdict is LeaseVerdict.WAIT:
        assert decision.spec is None
    else:
        assert decision.spec is not None
        assert decision.spec["holderIdentity"] == "me"
        assert decision.spec["renewTime"] == "2026-12-01T12:00:00.000000Z"


def test_taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() -> None:
    taken = decide(me="me", observation=Observation(record("x"), 0), now=99, wall=WALL, duration=9)
    assert taken.spec is not None and taken.spec["leaseTransitions"] == 4
    assert taken.spec["acquireTime"] == "2026-12-01T12:00:00.000000Z"
    kept = decide(me="me", observation=Observation(record("me"), 0), now=99, wall=WALL, duration=9)
    assert kept.spec is not None and kept.spec["leaseTransitions"] == 3
    assert kept.spec["acquireTime"] == "2026-12-01T11:00:00.000000Z"


def test_expiry_is_timed_from_the_last_change_this_candidate_saw() -> None:
    seen = observe(None, record("other", rv="5"), now=100.0)
    again = observe(seen, record("other", rv="5"), now=110.0)
    assert again.seen_at == 100.0  # unchanged record: the clock keeps running
    renewed = observe(again, record("other", rv="6"), now=112.0)
    assert renewed.seen_at == 112.0  # a renewal restarts it


def test_a_released_lease_has_no_holder_and_a_one_second_duration() -> None:
    spec = released_spec(record("me"), WALL)
    assert spec["holderIdentity"] is None and spec["leaseDurationSeconds"] == 1
    raw = {"metadata": {"resourceVersion": "7"}, "spec": {"leaseDurationSeconds": 4}}
    assert record_from_raw(raw) == LeaseRecord("", 4, 0, None, "7")


def test_election_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        ElectionTiming(lease_duration=5, renew_deadline=6, retry_period=1)


IP = ipaddress.ip_address


def test_reports_round_trip_and_expire() -> None:
    body = report_body(
        node="n1", namespace="ns", ips=[IP("2001:db8::1"), IP("198.19.0.9")], now=WALL, duration=30
    )
    assert body["metadata"]["annotations"]["nodelb.io/serving-ips"] == "198.19.0.9,2001:db8::1"
    report = parse_report(body)
    assert report.node == "n1" and report.problem is None
    assert report.ips == {IP("198.19.0.9"), IP("2001:db8::1")}
    assert serving_ips([report], WALL + datetime.timedelta(seconds=29)) == report.ips
    assert serving_ips([report], WALL + datetime.timedelta(seconds=30)) == frozenset()
    assert next_expiry([report], WALL) == WALL + datetime.timedelta(seconds=30)


def test_a_malformed_report_counts_as_holding_nothing() -> None:
    body = report_body(node="n1", namespace="ns", ips=[], now=WALL, duration=30)
    body["metadata"]["annotations"]["nodelb.io/serving-ips"] = "198.19.0.9,bogus"
    report = parse_report(body)
    assert report.ips == frozenset() and report.problem is not None and "bogus" in report.problem
    body["spec"]["renewTime"] = "yesterday"
    assert parse_report(body).expires is None


def service(status: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> Any:
    return {
        "metadata": {
            "name": "web",
            "namespace": "default",
            "uid": "u1",
            "resourceVersion": "42",
            "generation": 2,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "annotations": annotations or {},
        },
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"port": 80, "protocol": "TCP"}],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
        },
        "status": status or {},
    }


POOLS = parse_pools([{"name": "p", "addresses": ["198.19.0.0/30"]}], forbidden=Forbidden())


def test_a_fresh_allocation_plans_ingress_and_conditions_then_nothing_more() -> None:
    assert POOLS is not None
    view = parse_view(service(), lb_class="nodelb.io/lb", handle_classless=True)
    assert view.request is not None
    result = Allocator(POOLS).allocate(view.request, now=0.0)
    plan = plan_status(view, view.request, result, serving_ips=frozenset(), now=WALL)
    assert plan is not None
    assert plan.ingress == [{"ip": "198.19.0.0", "ipMode": "VIP"}]
    assert [c["type"] for c in plan.conditions] == [
        "LoadBalancerServing",
        "LoadBalancerProvisioning",
        "LoadBalancerDegraded",
    ]
    assert plan.patch("42")["metadata"] == {"resourceVersion": "42"}
    events = allocation_events(view, result, plan, reallocated=None)
    assert [(e.type, e.reason) for e in events] == [("Normal", "IPAllocated")]
    # Once status says exactly that, the same allocation plans no write.
    written = service({"loadBalancer": {"ingress": plan.ingress}, "conditions": plan.conditions})
    again = parse_view(written, lb_class="nodelb.io/lb", handle_classless=True)
    assert plan_status(again, view.request, result, serving_ips=frozenset(), now=WALL) is None


def test_a_reallocated_address_is_a_warning_naming_why() -> None:
    assert POOLS is not None
    old = service({"loadBalancer": {"ingress": [{"ip": "198.18.9.9"}]}})
    view = parse_view(old, lb_class="nodelb.io/lb", handle_classless=True)
    assert view.request is not None
    result = Allocator(POOLS).allocate(view.request, now=0.0)
    plan = plan_status(view, view.request, result, serving_ips=frozenset(), now=WALL)
    assert plan is not None
    events = allocation_events(view, result, plan, reallocated="198.18.9.9 lies outside")
    assert [(e.type, e.reason) for e in events] == [("Warning", "IPReallocated")]
    assert events[0].message.startswith("198.18.9.9 lies outside; now 198.19.0.0")


def test_invalid_requests_and_unparseable_services_get_specific_warnings() -> None:
    assert POOLS is not None
    bad = service(annotations={"nodelb.io/load-balancer-ips": "nope"})
    view = parse_view(bad, lb_class="nodelb.io/lb", handle_classless=True)
    assert view.request is not None
    result = Allocator(POOLS).allocate(view.request, now=0.0)
    event = problem_event(view, result)
    assert event is not None and event.reason == "IPRequestInvalid"
    assert "InvalidAnnotation" in event.message and "'nope'" in event.message
    broken = service()
    broken["spec"]["ports"] = [{"port": "eighty"}]
    view = parse_view(broken, lb_class="nodelb.io/lb", handle_classless=True)
    assert view.request is None
    event = problem_event(view, None)
    assert event is not None and event.reason == "InvalidService"


def test_a_service_without_generation_is_not_rewritten_after_the_api_drops_zero() -> None:
    assert POOLS is not None
    obj = service()
    del obj["metadata"]["generation"]  # Services carry none; the API omits a zero
    view = parse_view(obj, lb_class="nodelb.io/lb", handle_classless=True)
    assert view.request is not None
    result = Allocator(POOLS).allocate(view.request, now=0.0)
    plan = plan_status(view, view.request, result, serving_ips=frozenset(), now=WALL)
    assert plan is not None
    assert all("observedGeneration" not in c for c in plan.conditions)
    obj["status"] = {"loadBalancer": {"ingress": plan.ingress}, "conditions": plan.conditions}
    stored = parse_view(obj, lb_class="nodelb.io/lb", handle_classless=True)
    assert plan_status(stored, view.request, result, serving_ips=frozenset(), now=WALL) is None
