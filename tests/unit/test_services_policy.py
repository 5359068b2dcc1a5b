"""Parsing Services at the boundary, the class filter and the externalIP allow-list."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from agent.model.node import parse_node
from agent.model.service import InvalidService, Service, parse_service
from agent.model.service_class import ClassVerdict, classify, is_ours
from agent.node.external_ips import ExternalIPReason, check_external_ips


def raw_service(**spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {})
    base: dict[str, Any] = {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80}]}
    base.update(spec)
    return {
        "metadata": {"namespace": "ns", "name": "web", "uid": "u1"},
        "spec": base,
        "status": status,
    }


def service(**spec: Any) -> Service:
    parsed = parse_service(raw_service(**spec))
    assert isinstance(parsed, Service), parsed
    return parsed


@dataclass(frozen=True)
class BadCase:
    spec: dict[str, Any]
    reason_contains: str


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            BadCase({"externalIPs": ["198.18.0.300"]}, "spec.externalIPs[0]"),
            id="an externalIP that is not an address names the field",
        ),
        pytest.param(
            BadCase({"ports": [{"port": 70000}]}, "spec.ports[0].port"),
            id="a port above 65535 is refused",
        ),
        pytest.param(
            BadCase({"ports": [{"port": 80, "protocol": "ICMP"}]}, "unknown protocol"),
            id="an unknown protocol is refused",
        ),
        pytest.param(
            BadCase({"status": {"loadBalancer": {"ingress": [{"ip": "nope"}]}}}, "ingress[0]"),
            id="a malformed status ingress IP is refused",
        ),
        pytest.param(
            BadCase(
                {
                    "sessionAffinity": "ClientIP",
                    "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
                },
                "timeoutSeconds",
            ),
            id="an affinity timeout of zero is refused",
        ),
        pytest.param(
            BadCase({"loadBalancerSourceRanges": ["10.0.0.0/33"]}, "loadBalancerSourceRanges[0]"),
            id="a source range that is not a CIDR is refused",
        ),
    ],
)
def test_malformed_service_is_invalid_with_a_reason_naming_the_field(case: BadCase) -> None:
    parsed = parse_service(raw_service(**case.spec))
    assert isinstance(parsed, InvalidService)
    assert parsed.key == "ns/web"
    assert case.reason_contains in parsed.reason


def test_valid_service_fields_are_parsed_into_typed_values() -> None:
    svc = service(
        externalTrafficPolicy="Local",
        sessionAffinity="ClientIP",
        externalIPs=["198.18.0.210", "2001:db8::210"],
        loadBalancerSourceRanges=[" 198.18.0.0/24", "2001:db8::/64"],
        ports=[{"name": "dns", "port": 53, "protocol": "UDP"}],
        status={"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}, {"hostname": "x"}]}},
    )
    assert svc.local_policy
    assert svc.affinity_timeout == 10800
    assert svc.external_ips == (
        ipaddress.ip_address("198.18.0.210"),
        ipaddress.ip_address("2001:db8::210"),
    )
    assert svc.ingress_ips == (ipaddress.ip_address("198.18.0.200"),)
    assert [str(r) for r in svc.source_ranges] == ["198.18.0.0/24", "2001:db8::/64"]
    assert [(p.name, p.protocol.value, p.port) for p in svc.ports] == [("dns", "udp", 53)]


@dataclass(frozen=True)
class ClassCase:
    type: str
    lb_class: str | None
    handle_classless: bool
    expected: ClassVerdict


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ClassCase("LoadBalancer", "nodelb.io/lb", False, ClassVerdict.OURS),
            id="our class is ours",
        ),
        pytest.param(
            ClassCase("LoadBalancer", None, True, ClassVerdict.OURS_BY_DEFAULT),
            id="a class-less LoadBalancer is ours by default",
        ),
        pytest.param(
            ClassCase("LoadBalancer", None, False, ClassVerdict.CLASSLESS_NOT_HANDLED),
            id="a class-less LoadBalancer is not ours when that setting is off",
        ),
        pytest.param(
            ClassCase("LoadBalancer", "other.io/lb", True, ClassVerdict.OTHER_CLASS),
            id="another class is never ours",
        ),
        pytest.param(
            ClassCase("ClusterIP", "nodelb.io/lb", True, ClassVerdict.NOT_LOAD_BALANCER),
            id="a ClusterIP Service is not a LoadBalancer",
        ),
    ],
)
def test_class_filter(case: ClassCase) -> None:
    spec: dict[str, Any] = {"type": case.type}
    if case.lb_class:
        spec["loadBalancerClass"] = case.lb_class
    verdict = classify(
        service(**spec), lb_class="nodelb.io/lb", handle_classless=case.handle_classless
    )
    assert verdict is case.expected
    assert is_ours(verdict) == (case.expected in (ClassVerdict.OURS, ClassVerdict.OURS_BY_DEFAULT))


ALLOWED = [ipaddress.ip_network("198.18.0.0/24"), ipaddress.ip_network("2001:db8::/64")]
POOLS = [ipaddress.ip_network("198.18.0.192/26")]


@dataclass(frozen=True)
class ExtCase:
    ips: tuple[str, ...]
    allocated: dict[str, str]
    accepted: tuple[str, ...]
    refused: dict[str, ExternalIPReason]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ExtCase(("198.18.0.10", "2001:db8::10"), {}, ("198.18.0.10", "2001:db8::10"), {}),
            id="addresses inside the allow-list and outside pools are accepted",
        ),
        pytest.param(
            ExtCase(
                ("198.18.0.10", "198.18.5.1"),
                {},
                (),
                {"198.18.5.1": ExternalIPReason.OUTSIDE_ALLOW_LIST},
            ),
            id="one address outside the allow-list refuses the whole Service",
        ),
        pytest.param(
            ExtCase(
                ("198.18.0.200",),
                {"198.18.0.200": "other/svc"},
                (),
                {"198.18.0.200": ExternalIPReason.IN_POOL_NOT_ALLOCATED},
            ),
            id="a pool address allocated to another Service is refused (CVE-2020-8554)",
        ),
        pytest.param(
            ExtCase(
                ("198.18.0.201",),
                {},
                (),
                {"198.18.0.201": ExternalIPReason.IN_POOL_NOT_ALLOCATED},
            ),
            id="an unallocated pool address is refused",
        ),
        pytest.param(
            ExtCase(("198.18.0.200",), {"198.18.0.200": "ns/web"}, ("198.18.0.200",), {}),
            id="a pool address allocated to this same Service is accepted",
        ),
        pytest.param(
            ExtCase(("::ffff:1",), {}, (), {"::ffff:1": ExternalIPReason.OUTSIDE_ALLOW_LIST}),
            id="an IPv6 address is never matched against IPv4 CIDRs",
        ),
    ],
)
def test_external_ip_allow_list(case: ExtCase) -> None:
    svc = service(type="ClusterIP", externalIPs=list(case.ips))
    verdict = check_external_ips(
        svc,
        allowed=ALLOWED,
        pools=POOLS,
        allocated_to={ipaddress.ip_address(k): v for k, v in case.allocated.items()},
    )
    assert tuple(map(str, verdict.accepted)) == case.accepted
    assert {str(r.ip): r.reason for r in verdict.refused} == case.refused
    assert all(str(r.ip) in r.message for r in verdict.refused)


def test_empty_allow_list_refuses_every_external_ip() -> None:
    svc = service(externalIPs=["198.18.0.10"])
    verdict = check_external_ips(svc, allowed=[], pools=[], allocated_to={})
    assert verdict.accepted == ()
    assert [r.reason for r in verdict.refused] == [ExternalIPReason.OUTSIDE_ALLOW_LIST]


def test_node_zone_readiness_and_addresses() -> None:
    node = parse_node(
        {
            "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDRs": ["198.19.1.0/24", "2001:db8:1:1::/64", "junk"]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [
                    {"type": "InternalIP", "address": "198.18.0.11"},
                    {"type": "Hostname", "address": "node-1"},
                    {"type": "InternalIP", "address": "bogus"},
                ],
            },
        }
    )
    assert (node.name, node.zone, node.ready) == ("node-1", "zone-a", True)
    assert node.addresses == (ipaddress.ip_address("198.18.0.11"),)
    assert [str(c) for c in node.pod_cidrs] == ["198.19.1.0/24", "2001:db8:1:1::/64"]
    assert not parse_node({"metadata": {"name": "n2"}, "status": {}}).ready
