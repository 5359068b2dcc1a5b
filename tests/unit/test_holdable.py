"""Which ingress IPs an agent may serve and hold (agent/node/holdable.py), and how the node core
applies it (agent/node/cluster_state.py): a status naming the API server, a Node, a pod or a
service address, or an address outside every pool, is refused with a problem, never held."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from agent.config import AgentConfig, Pool
from agent.kube.store import EventType
from agent.model.endpoint_slice import parse_slice
from agent.model.node import parse_node
from agent.node.cache import new_stores
from agent.node.cluster_state import Changes, ClusterState, Dirty
from agent.node.holdable import (
    HoldPolicy,
    RefusedReason,
    Reserved,
    check_ingress,
    reserved_from,
)
from agent.node.service_frontends import ProblemReason

IP = ipaddress.ip_address
NET = ipaddress.ip_network
POOL4 = NET("198.18.72.0/24")
POOL6 = NET("2001:db8:64:72::/120")
EXTERNAL = NET("198.18.80.0/24")
APISERVER = IP("198.18.0.2")
NODE1 = IP("198.18.0.11")
RESERVED = Reserved(
    node_addresses=frozenset({NODE1, IP("198.18.72.9")}),
    control_plane=frozenset({APISERVER, IP("198.18.72.10")}),
    pod_networks=(NET("198.19.0.0/16"), NET("198.18.72.128/25")),
    service_networks=(NET("198.18.128.0/20"), NET("198.18.72.64/28")),
)
POLICY = HoldPolicy(allowed=(POOL4, POOL6, EXTERNAL), reserved=RESERVED)


@dataclass(frozen=True, slots=True)
class Case:
    ip: str
    refused: RefusedReason | None


CASES = [
    pytest.param(Case("198.18.72.5", None), id="a pool address is held"),
    pytest.param(Case("2001:db8:64:72::5", None), id="an IPv6 pool address is held"),
    pytest.param(Case("198.18.80.7", None), id="an address in an allowed externalIP block is held"),
    pytest.param(
        Case("198.18.0.2", RefusedReason.CONTROL_PLANE),
        id="the API server's address is refused (the lab's reproduction)",
    ),
    pytest.param(
        Case("198.18.72.10", RefusedReason.CONTROL_PLANE),
        id="an API server address inside a pool is refused as the API server's",
    ),
    pytest.param(Case("198.18.0.11", RefusedReason.NODE_ADDRESS), id="a Node's address is refused"),
    pytest.param(
        Case("198.18.72.9", RefusedReason.NODE_ADDRESS),
        id="a Node's address inside a pool is refused as the Node's",
    ),
    pytest.param(
        Case("198.19.4.4", RefusedReason.POD_NETWORK), id="an address in a pod network is refused"
    ),
    pytest.param(
        Case("198.18.72.200", RefusedReason.POD_NETWORK),
        id="a pool address inside a pod network is refused",
    ),
    pytest.param(
        Case("198.18.128.1", RefusedReason.SERVICE_NETWORK),
        id="an address in the service network (a ClusterIP) is refused",
    ),
    pytest.param(
        Case("198.18.72.66", RefusedReason.SERVICE_NETWORK),
        id="a pool address inside the service network is refused",
    ),
    pytest.param(
        Case("198.18.99.1", RefusedReason.OUTSIDE_POOLS),
        id="an address outside every pool and allowed block is refused",
    ),
    pytest.param(
        Case("2001:db8:65::1", RefusedReason.OUTSIDE_POOLS),
        id="an IPv6 address outside every pool is refused",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_an_ingress_ip_is_held_only_inside_a_pool_and_never_a_seen_address(case: Case) -> None:
    verdict = check_ingress([IP(case.ip)], POLICY)
    if case.refused is None:
        assert verdict.accepted == (IP(case.ip),)
        assert verdict.refused == ()
    else:
        assert verdict.accepted == ()
        assert [(r.ip, r.reason) for r in verdict.refused] == [(IP(case.ip), case.refused)]
        assert case.ip in verdict.refused[0].message


def test_with_no_pool_nothing_is_held() -> None:
    verdict = check_ingress([IP("198.18.72.5")], HoldPolicy(allowed=()))
    assert verdict.accepted == ()
    assert verdict.refused[0].reason is RefusedReason.OUTSIDE_POOLS


def test_each_ingress_ip_is_judged_on_its_own_and_the_order_is_kept() -> None:
    ips = [IP("198.18.72.7"), APISERVER, IP("2001:db8:64:72::1")]
    verdict = check_ingress(ips, POLICY)
    assert verdict.accepted == (IP("198.18.72.7"), IP("2001:db8:64:72::1"))
    assert [r.ip for r in verdict.refused] == [APISERVER]


def raw_node(name: str, address: str, pod_cidr: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"podCIDRs": [pod_cidr]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def api_slice(*addresses: str) -> dict[str, Any]:
    """The EndpointSlice the API server writes for default/kubernetes."""
    return {
        "metadata": {
            "namespace": "default",
            "name": "kubernetes",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": False}} for a in addresses],
    }


def test_what_the_agent_can_see_is_taken() -> None:
    reserved = reserved_from(
        nodes=[
            parse_node(raw_node("node-2", "198.18.0.12", "198.19.2.0/24")),
            parse_node(raw_node("node-1", "198.18.0.11", "198.19.1.0/24")),
        ],
        api_slices=[parse_slice(api_slice("198.18.0.2"))],
        api_addresses=(IP("198.18.0.100"),),
        local_cidrs=(NET("198.19.1.0/24"),),
        service_cidrs=(NET("198.18.128.0/20"),),
    )
    assert reserved.node_addresses == {IP("198.18.0.11"), IP("198.18.0.12")}
    # A not-ready API server is still the API server; the client's own address is one too.
    assert reserved.control_plane == {APISERVER, IP("198.18.0.100")}
    assert reserved.pod_networks == (NET("198.19.1.0/24"), NET("198.19.2.0/24"))
    assert reserved.service_networks == (NET("198.18.128.0/20"),)


# --- the node core ----------------------------------------------------------------------------


def lb_service(name: str, *ips: str, namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"u-{name}"},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 443}], **spec},
        "status": {"loadBalancer": {"ingress": [{"ip": ip} for ip in ips]}},
    }


class Node1:
    """node-1's ClusterState, announcing, with one pool and the lab's service network."""

    def __init__(self, **cfg: Any) -> None:
        config = AgentConfig(
            node_name="node-1",
            pools=(Pool("default", (POOL4,)),),
            service_cidrs=(NET("198.18.128.0/20"),),
            **cfg,
        )
        self.state = ClusterState(config, announcing=True, api_addresses=(IP("198.18.0.100"),))
        self.services, self.slices, self.nodes = new_stores()

    def apply(self, **raws: list[dict[str, Any]]) -> Dirty:
        changes: dict[str, Any] = {}
        for kind, store in (
            ("services", self.services),
            ("slices", self.slices),
            ("nodes", self.nodes),
        ):
            if kind in raws:
                changes[kind] = [
                    c for raw in raws[kind] if (c := store.apply(EventType.MODIFIED, raw))
                ]
        return self.state.apply(Changes(**changes))


def refused_problems(outcome: Any, key: str) -> list[str]:
    return [
        p.message for p in outcome.problems.get(key, ()) if p.reason is ProblemReason.LB_IP_REFUSED
    ]


def test_a_status_naming_the_api_server_is_neither_served_nor_held_and_is_reported() -> None:
    node1 = Node1()
    node1.apply(
        nodes=[raw_node("node-1", "198.18.0.11", "198.19.1.0/24")],
        slices=[api_slice("198.18.0.2")],
    )
    dirty = node1.apply(services=[lb_service("grab", "198.18.0.2", "198.18.72.4")])
    out = node1.state.recompute(dirty, held_ips=frozenset({APISERVER, IP("198.18.72.4")}))
    assert {fe.ip for fe in out.desired.frontends} == {IP("198.18.72.4")}
    assert out.desired.held_ips == {IP("198.18.72.4")}
    assert out.ownership is not None
    assert {u.ip for u in out.ownership.ips} == {IP("198.18.72.4")}
    messages = refused_problems(out, "ns/grab")
    assert len(messages) == 1 and "198.18.0.2" in messages[0] and "API server" in messages[0]
    assert [r.service for r in out.reports if r.problem.reason is ProblemReason.LB_IP_REFUSED] == [
        "ns/grab"
    ]


@pytest.mark.parametrize(
    ("ip", "word"),
    [
        pytest.param("198.18.0.11", "Node", id="a Node's address"),
        pytest.param("198.18.0.100", "API server", id="the address the agent's client talks to"),
        pytest.param("198.19.1.7", "pod network", id="a pod address"),
        pytest.param("198.18.128.10", "service network", id="a ClusterIP"),
        pytest.param("203.0.113.9", "no configured pool", id="an address outside the pools"),
    ],
)
def test_every_seen_address_is_refused_by_the_node_core(ip: str, word: str) -> None:
    node1 = Node1()
    node1.apply(nodes=[raw_node("node-1", "198.18.0.11", "198.19.1.0/24")])
    dirty = node1.apply(services=[lb_service("grab", ip)])
    out = node1.state.recompute(dirty, held_ips=frozenset({IP(ip)}))
    assert out.desired.frontends == {}
    assert out.desired.held_ips == frozenset()
    assert out.ownership is not None and out.ownership.ips == frozenset()
    messages = refused_problems(out, "ns/grab")
    assert len(messages) == 1 and word in messages[0]


def test_a_service_of_another_class_is_not_judged() -> None:
    node1 = Node1()
    dirty = node1.apply(services=[lb_service("theirs", "198.18.0.2", loadBalancerClass="x.io/lb")])
    out = node1.state.recompute(dirty)
    assert out.problems == {}


def test_a_node_taking_an_address_refuses_it_from_then_on() -> None:
    node1 = Node1()
    dirty = node1.apply(services=[lb_service("web", "198.18.72.4")])
    out = node1.state.recompute(dirty, held_ips=frozenset({IP("198.18.72.4")}))
    assert {fe.ip for fe in out.desired.frontends} == {IP("198.18.72.4")}
    # A new Node appears with that address: every Service is judged again.
    dirty = node1.apply(nodes=[raw_node("node-9", "198.18.72.4", "198.19.9.0/24")])
    assert dirty.everything
    out = node1.state.recompute(dirty, held_ips=frozenset({IP("198.18.72.4")}))
    assert out.desired.frontends == {}
    assert out.desired.held_ips == frozenset()
    assert refused_problems(out, "ns/web")
    # The same Node again (a status heartbeat) does not recompute everything.
    assert not node1.apply(nodes=[raw_node("node-9", "198.18.72.4", "198.19.9.0/24")]).everything


def test_the_api_servers_moving_is_seen_through_default_kubernetes() -> None:
    node1 = Node1()
    dirty = node1.apply(services=[lb_service("web", "198.18.72.4")])
    node1.state.recompute(dirty)
    dirty = node1.apply(slices=[api_slice("198.18.72.4")])
    assert dirty.everything
    out = node1.state.recompute(dirty, held_ips=frozenset({IP("198.18.72.4")}))
    assert out.desired.frontends == {}
    assert "API server" in refused_problems(out, "ns/web")[0]
