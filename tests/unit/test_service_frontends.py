"""Services + EndpointSlices -> this node's frontends, problems and the assembled state."""

from __future__ import annotations

import ipaddress
from typing import Any

from agent.model.desired_state import Endpoint
from agent.model.endpoint_slice import parse_slice
from agent.model.net import Protocol
from agent.model.service import Service, parse_service
from agent.node.assembly import assemble
from agent.node.service_frontends import (
    NodeView,
    PolicyView,
    ProblemReason,
    ServiceResult,
    service_frontends,
)

ip = ipaddress.ip_address
NODE = NodeView(name="node-1", zone="zone-a")
POLICY = PolicyView(
    lb_class="nodelb.io/lb",
    handle_classless=True,
    external_ip_cidrs=(ipaddress.ip_network("198.18.0.0/24"),),
    pool_networks=(ipaddress.ip_network("198.18.0.192/26"),),
)


def make_service(name: str = "web", created: str = "2026-01-01T00:00:00Z", **spec: Any) -> Service:
    status = spec.pop("status", {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}})
    raw_spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
    }
    raw_spec.update(spec)
    svc = parse_service(
        {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": f"uid-{name}",
                "creationTimestamp": created,
            },
            "spec": raw_spec,
            "status": status,
        }
    )
    assert isinstance(svc, Service)
    return svc


def make_slice(*endpoints: tuple[str, str, bool], port_name: str = "http", port: int = 8080) -> Any:
    return parse_slice(
        {
            "metadata": {
                "namespace": "ns",
                "name": f"web-{port_name}",
                "labels": {"kubernetes.io/service-name": "web"},
            },
            "addressType": "IPv4",
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": [addr], "nodeName": node, "conditions": {"ready": ready}}
                for addr, node, ready in endpoints
            ],
        }
    )


SLICE = make_slice(("198.19.1.10", "node-1", True), ("198.19.2.10", "node-2", True))


def test_cluster_policy_lb_ip_gets_every_ready_endpoint_on_both_paths() -> None:
    result = service_frontends(make_service(), [SLICE], node=NODE, policy=POLICY, allocated_to={})
    (fe,) = result.frontends
    assert (fe.key.ip, fe.key.protocol, fe.key.port) == (ip("198.18.0.200"), Protocol.TCP, 80)
    both = (Endpoint(ip("198.19.1.10"), 8080), Endpoint(ip("198.19.2.10"), 8080))
    assert fe.endpoints == both
    assert fe.cluster_endpoints == both
    assert not fe.local_only
    assert result.lb_ips == (ip("198.18.0.200"),)
    assert result.problems == ()


def test_local_policy_uses_local_endpoints_outside_and_cluster_ones_inside() -> None:
    svc = make_service(externalTrafficPolicy="Local")
    (fe,) = service_frontends(svc, [SLICE], node=NODE, policy=POLICY, allocated_to={}).frontends
    assert fe.local_only
    assert fe.endpoints == (Endpoint(ip("198.19.1.10"), 8080),)
    assert len(fe.cluster_endpoints) == 2


def test_local_policy_on_a_node_without_local_endpoints_gets_an_empty_list_to_drop() -> None:
    svc = make_service(externalTrafficPolicy="Local")
    other = NodeView(name="node-3", zone=None)
    (fe,) = service_frontends(svc, [SLICE], node=other, policy=POLICY, allocated_to={}).frontends
    assert fe.endpoints == ()
    assert len(fe.cluster_endpoints) == 2


def test_a_service_of_another_class_gets_nothing() -> None:
    svc = make_service(loadBalancerClass="other.io/lb")
    result = service_frontends(svc, [SLICE], node=NODE, policy=POLICY, allocated_to={})
    assert result.frontends == ()
    assert result.lb_ips == ()


def test_allowed_external_ips_are_served_but_never_held() -> None:
    svc = make_service(type="ClusterIP", externalIPs=["198.18.0.50"], status={})
    result = service_frontends(svc, [SLICE], node=NODE, policy=POLICY, allocated_to={})
    assert [fe.key.ip for fe in result.frontends] == [ip("198.18.0.50")]
    assert result.lb_ips == ()


def test_refused_external_ips_become_problems_and_lb_ips_stay_served() -> None:
    svc = make_service(externalIPs=["203.0.113.9"])
    result = service_frontends(svc, [SLICE], node=NODE, policy=POLICY, allocated_to={})
    assert [fe.key.ip for fe in result.frontends] == [ip("198.18.0.200")]
    assert [p.reason for p in result.problems] == [ProblemReason.EXTERNAL_IP_REFUSED]
    assert "203.0.113.9" in result.problems[0].message


def test_source_ranges_apply_to_lb_ips_only() -> None:
    svc = make_service(
        loadBalancerSourceRanges=["198.18.0.100/32", "2001:db8::/64"],
        externalIPs=["198.18.0.50"],
    )
    result = service_frontends(svc, [SLICE], node=NODE, policy=POLICY, allocated_to={})
    by_ip = {fe.key.ip: fe.source_ranges for fe in result.frontends}
    assert by_ip == {
        ip("198.18.0.200"): (
            ipaddress.ip_network("198.18.0.100/32"),
            ipaddress.ip_network("2001:db8::/64"),
        ),
        ip("198.18.0.50"): (),
    }


def test_a_service_port_no_slice_names_is_reported_and_rejects() -> None:
    svc = make_service(ports=[{"name": "https", "port": 443}])
    result = service_frontends(svc, [SLICE], node=NODE, policy=POLICY, allocated_to={})
    assert [p.reason for p in result.problems] == [ProblemReason.PORT_MISMATCH]
    (fe,) = result.frontends
    assert fe.endpoints == () and fe.cluster_endpoints == ()


def test_invalid_service_is_only_a_problem() -> None:
    raw = parse_service(
        {"metadata": {"namespace": "ns", "name": "bad"}, "spec": {"ports": [{"port": 0}]}}
    )
    result = service_frontends(raw, [], node=NODE, policy=POLICY, allocated_to={})
    assert result.frontends == ()
    assert [p.reason for p in result.problems] == [ProblemReason.INVALID_SERVICE]


def test_assemble_gives_a_contested_frontend_to_the_older_service() -> None:
    old = service_frontends(
        make_service("old", "2026-01-01T00:00:00Z"),
        [SLICE],
        node=NODE,
        policy=POLICY,
        allocated_to={},
    )
    new = service_frontends(
        make_service("new", "2026-02-01T00:00:00Z"),
        [SLICE],
        node=NODE,
        policy=POLICY,
        allocated_to={},
    )
    assembly = assemble([new, old], held_ips=frozenset({ip("198.18.0.200")}), local_cidrs=())
    (fe,) = assembly.desired.frontends.values()
    assert fe.service == "ns/old"
    assert list(assembly.conflicts) == ["ns/new"]
    assert assembly.conflicts["ns/new"][0].reason is ProblemReason.FRONTEND_CONFLICT
    assert assembly.desired.held_ips == frozenset({ip("198.18.0.200")})


def test_assemble_holds_only_ips_that_have_frontends() -> None:
    empty = ServiceResult(key="ns/x", created="", uid="x")
    assembly = assemble([empty], held_ips=frozenset({ip("198.18.0.201")}), local_cidrs=())
    assert assembly.desired.held_ips == frozenset()
    assert assembly.desired.frontends == {}
