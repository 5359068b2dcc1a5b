"""What a Service's addresses can serve: the silent cases (FQDN-only slices, slices without
ports, a family with no endpoint, a port no slice serves, source ranges of the other family
only) become problems with reasons, and the conditions and Events that follow from them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from agent.controller.allocator import AllocationReason, AllocationResult, FamilyOutcome
from agent.controller.conditions import ConditionReason, ConditionType, service_conditions
from agent.controller.request import FamilyPolicy, ProtocolPort, ServiceRequest
from agent.controller.servability import (
    Servability,
    SliceSummary,
    Unservable,
    servability,
    summarize_slice,
)
from agent.controller.service_status import parse_view, serving_events
from agent.model.net import IPAddress, IPFamily, IPNetwork, Protocol
from agent.model.service import ServicePort

U = Unservable
V4 = ipaddress.ip_address("198.18.0.1")
V6 = ipaddress.ip_address("2001:db8::1")
HTTP = ServicePort("http", Protocol.TCP, 80)
DNS = ServicePort("dns", Protocol.UDP, 53)
NET4 = ipaddress.ip_network("198.18.100.0/24")
NET6 = ipaddress.ip_network("2001:db8:100::/48")


def sl(kind: str, *ports: tuple[str, Protocol], endpoints: bool = True) -> SliceSummary:
    return SliceSummary("ns/web", kind, frozenset(ports), endpoints)


HTTP_PORT = ("http", Protocol.TCP)
DNS_PORT = ("dns", Protocol.UDP)


@dataclass(frozen=True)
class Case:
    ips: tuple[IPAddress, ...]
    slices: tuple[SliceSummary, ...]
    expected: tuple[Unservable, ...]
    nothing_served: bool
    ports: tuple[ServicePort, ...] = (HTTP,)
    ranges: tuple[IPNetwork, ...] = ()


CASES = [
    pytest.param(
        Case((V4,), (sl("IPv4", HTTP_PORT),), (), False),
        id="IPv4 endpoints serving the port: nothing wrong",
    ),
    pytest.param(
        Case((V4,), (), (), False),
        id="no slice at all (not created yet): nothing to say, kube-proxy rejects too",
    ),
    pytest.param(
        Case((V4,), (sl("IPv4", HTTP_PORT, endpoints=False),), (), False),
        id="slices without any endpoint (scaled to zero): nothing to say",
    ),
    pytest.param(
        Case((V4,), (sl("FQDN", HTTP_PORT), sl("FQDN", HTTP_PORT)), (U.FQDN_ONLY,), True),
        id="every slice with endpoints is FQDN: nothing served",
    ),
    pytest.param(
        Case((V4,), (sl("FQDN", HTTP_PORT), sl("IPv4", HTTP_PORT)), (), False),
        id="an FQDN slice next to a usable IPv4 one: served, the FQDN one ignored",
    ),
    pytest.param(
        Case((V4,), (sl("IPv4"),), (U.SLICES_WITHOUT_PORTS,), True),
        id="IPv4 slice with endpoints and no ports: nothing served",
    ),
    pytest.param(
        Case((V4,), (sl("IPv4"), sl("IPv4", HTTP_PORT)), (), False),
        id="one portless slice next to one with the port: served",
    ),
    pytest.param(
        Case((V4,), (sl("IPv4", ("web", Protocol.TCP)),), (U.PORT_WITHOUT_ENDPOINTS,), True),
        id="the only port is named differently in the slices: nothing served",
    ),
    pytest.param(
        Case((V4,), (sl("IPv4", ("http", Protocol.UDP)),), (U.PORT_WITHOUT_ENDPOINTS,), True),
        id="the slice's port has the name but another protocol: nothing served",
    ),
    pytest.param(
        Case(
            (V4,), (sl("IPv4", HTTP_PORT),), (U.PORT_WITHOUT_ENDPOINTS,), False, ports=(HTTP, DNS)
        ),
        id="one of two ports has no slice port: degraded, the other serves",
    ),
    pytest.param(
        Case((V4, V6), (sl("IPv4", HTTP_PORT),), (U.NO_ENDPOINTS_OF_FAMILY,), False),
        id="dual-stack Service with IPv4 endpoints only: the IPv6 address serves nothing",
    ),
    pytest.param(
        Case((V6,), (sl("IPv4", HTTP_PORT),), (U.NO_ENDPOINTS_OF_FAMILY,), True),
        id="IPv6 address, endpoints IPv4 only: nothing served",
    ),
    pytest.param(
        Case(
            (V4,), (sl("IPv4", HTTP_PORT),), (U.SOURCE_RANGES_OTHER_FAMILY,), True, ranges=(NET6,)
        ),
        id="IPv4 Service whose only source range is IPv6: every connection dropped",
    ),
    pytest.param(
        Case((V4,), (sl("IPv4", HTTP_PORT),), (), False, ranges=(NET4, NET6)),
        id="ranges of both families on an IPv4 Service: served",
    ),
    pytest.param(
        Case(
            (V4, V6),
            (sl("IPv4", HTTP_PORT), sl("IPv6", HTTP_PORT)),
            (U.SOURCE_RANGES_OTHER_FAMILY,),
            False,
            ranges=(NET6,),
        ),
        id="dual-stack with IPv6 ranges only: the IPv4 address drops all, IPv6 serves",
    ),
    pytest.param(
        Case(
            (V4,),
            (sl("FQDN", HTTP_PORT),),
            (U.SOURCE_RANGES_OTHER_FAMILY, U.FQDN_ONLY),
            True,
            ranges=(NET6,),
        ),
        id="both an IPv6-only range list and FQDN slices: both reported",
    ),
    pytest.param(
        Case((), (sl("FQDN", HTTP_PORT),), (), False),
        id="no address allocated yet: nothing to judge",
    ),
    pytest.param(
        Case((V4,), (sl("FQDN"),), (), False, ports=()),
        id="a Service without ports: nothing to judge",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_servability(case: Case) -> None:
    got = servability(ips=case.ips, ports=case.ports, source_ranges=case.ranges, slices=case.slices)
    assert tuple(p.reason for p in got.problems) == case.expected
    assert got.nothing_served is case.nothing_served


def raw_slice(**overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "web-abc",
            "namespace": "ns",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": [{"addresses": ["198.18.1.1"], "conditions": {"ready": False}}],
    }
    obj.update(overrides)
    return obj


def test_a_slice_summary_keeps_the_service_family_ports_and_whether_endpoints_exist() -> None:
    assert summarize_slice(raw_slice()) == SliceSummary(
        "ns/web", "IPv4", frozenset({HTTP_PORT}), True
    )


def test_a_slice_summary_never_raises_and_ignores_what_kube_proxy_ignores() -> None:
    odd = raw_slice(
        ports=[{"name": "x", "protocol": "TCP"}, {"protocol": "BOGUS", "port": 1}, "junk"],
        endpoints=[{"addresses": []}, 7],
    )
    assert summarize_slice(odd) == SliceSummary("ns/web", "IPv4", frozenset(), False)
    assert summarize_slice({"metadata": "nonsense", "ports": 5}).service == ""
    unnamed = raw_slice(ports=[{"port": 53, "protocol": "UDP"}])
    assert summarize_slice(unnamed).ports == frozenset({("", Protocol.UDP)})


def test_readiness_does_not_change_a_summary() -> None:
    ready = raw_slice(endpoints=[{"addresses": ["198.18.1.1"], "conditions": {"ready": True}}])
    assert summarize_slice(ready) == summarize_slice(raw_slice())


# -- the conditions and Events that follow ---------------------------------------------------


def request(**kw: Any) -> ServiceRequest:
    kw.setdefault("ports", frozenset({ProtocolPort(Protocol.TCP, 80)}))
    return ServiceRequest(key="ns/web", uid="u", created="2026-01-01T00:00:00Z", **kw)


def allocated(*addresses: IPAddress, missing: tuple[IPFamily, ...] = ()) -> AllocationResult:
    families = tuple(
        FamilyOutcome(IPFamily.of(a), AllocationReason.ALLOCATED, a, "default", "ok")
        for a in addresses
    ) + tuple(
        FamilyOutcome(f, AllocationReason.NO_POOL_FOR_FAMILY, None, None, "none") for f in missing
    )
    return AllocationResult(
        "ns/web", AllocationReason.ALLOCATED, addresses, "allocated", families=families
    )


def triple(servable: Servability, *ips: IPAddress, held: bool = True) -> list[tuple[Any, ...]]:
    got = service_conditions(
        request=request(),
        allocation=allocated(*ips),
        serving_ips=frozenset(ips) if held else frozenset(),
        servable=servable,
    )
    return [(c.type, c.status, c.reason) for c in got]


FQDN_ONLY = servability(ips=(V4,), ports=(HTTP,), source_ranges=(), slices=(sl("FQDN", HTTP_PORT),))
V6_DEAD = servability(
    ips=(V4, V6), ports=(HTTP,), source_ranges=(), slices=(sl("IPv4", HTTP_PORT),)
)
ONE_PORT_DEAD = servability(
    ips=(V4,), ports=(HTTP, DNS), source_ranges=(), slices=(sl("IPv4", HTTP_PORT),)
)


def test_nothing_served_is_serving_false_unsupported_even_when_held() -> None:
    assert triple(FQDN_ONLY, V4) == [
        (ConditionType.SERVING, False, ConditionReason.UNSUPPORTED),
        (ConditionType.PROVISIONING, False, ConditionReason.COMPLETE),
        (ConditionType.DEGRADED, False, ConditionReason.NOT_DEGRADED),
    ]


def test_nothing_served_and_not_held_yet_is_still_provisioning() -> None:
    assert triple(FQDN_ONLY, V4, held=False)[1] == (
        ConditionType.PROVISIONING,
        True,
        ConditionReason.PROVISIONING,
    )


def test_a_dead_family_serves_the_rest_degraded_ip_families() -> None:
    assert triple(V6_DEAD, V4, V6) == [
        (ConditionType.SERVING, True, ConditionReason.SERVING),
        (ConditionType.PROVISIONING, False, ConditionReason.COMPLETE),
        (ConditionType.DEGRADED, True, ConditionReason.IP_FAMILIES_NOT_SUPPORTED),
    ]


def test_a_dead_port_is_degraded_ports() -> None:
    assert triple(ONE_PORT_DEAD, V4)[2] == (
        ConditionType.DEGRADED,
        True,
        ConditionReason.PORTS_NOT_SUPPORTED,
    )


def test_servability_problems_never_refuse_a_required_feature() -> None:
    got = service_conditions(
        request=request(required_features=("Ports", "IPFamilies")),
        allocation=allocated(V4),
        serving_ips=frozenset({V4}),
        servable=FQDN_ONLY,
    )
    serving = got[0]
    assert (serving.status, serving.reason) == (False, ConditionReason.UNSUPPORTED)
    assert "can serve nothing" in serving.message


def view() -> Any:
    return parse_view(
        {"metadata": {"namespace": "ns", "name": "web", "uid": "u1"}, "spec": {}},
        lb_class="nodelb.io/lb",
        handle_classless=True,
    )


def test_each_problem_is_a_warning_event_and_a_missing_family_one_too() -> None:
    events = serving_events(view(), allocated(V4, missing=(IPFamily.IPV6,)), FQDN_ONLY)
    assert [(e.type, e.reason) for e in events] == [
        ("Warning", "FQDNEndpointsNotSupported"),
        ("Warning", "IPFamilyNotAllocated"),
    ]
    assert "IPv6" in events[1].message


def test_no_events_before_an_allocation() -> None:
    failed = AllocationResult("ns/web", AllocationReason.POOL_EXHAUSTED, (), "full")
    assert serving_events(view(), failed, FQDN_ONLY) == ()


def test_dual_stack_request_conditions_with_missing_family_still_degraded() -> None:
    got = service_conditions(
        request=request(
            ip_families=(IPFamily.IPV4, IPFamily.IPV6),
            family_policy=FamilyPolicy.PREFER_DUAL_STACK,
        ),
        allocation=allocated(V4, missing=(IPFamily.IPV6,)),
        serving_ips=frozenset({V4}),
    )
    assert (got[2].status, got[2].reason) == (True, ConditionReason.IP_FAMILIES_NOT_SUPPORTED)


def test_service_request_carries_port_names_and_source_ranges() -> None:
    raw = {
        "metadata": {"namespace": "ns", "name": "web", "uid": "u1"},
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
            "loadBalancerSourceRanges": ["2001:db8:100::/48"],
        },
    }
    parsed = parse_view(raw, lb_class="nodelb.io/lb", handle_classless=True).request
    assert parsed is not None
    assert parsed.named_ports == (HTTP,)
    assert parsed.source_ranges == (NET6,)
