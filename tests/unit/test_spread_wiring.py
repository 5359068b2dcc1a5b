"""Which frontends a node spreads, and to which next hops (service_frontends + spread_state)."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections import Counter
from typing import Any

import pytest

from agent.model.endpoint_slice import parse_slice
from agent.model.node import Node
from agent.model.service import Service, parse_service
from agent.model.tunnel import LOCAL_TRAFFIC_ANNOTATION, LocalTraffic
from agent.node.assembly import assemble
from agent.node.service_frontends import (
    NodeView,
    PolicyView,
    ProblemReason,
    ServiceResult,
    service_frontends,
)
from agent.node.spread import BUCKETS, bucket_table
from agent.node.spread_state import spread_state

ip = ipaddress.ip_address
POLICY = PolicyView(
    lb_class="nodelb.io/lb",
    handle_classless=True,
    external_ip_cidrs=(ipaddress.ip_network("198.18.0.0/24"),),
    pool_networks=(ipaddress.ip_network("198.18.0.192/26"),),
    local_traffic=LocalTraffic.SPREAD,
)
NODES = tuple(
    Node(name=f"node-{k}", zone=None, ready=True, addresses=(ip(f"198.18.0.{10 + k}"),), labels=())
    for k in (1, 2, 3)
)


def service(
    name: str = "web", *, local: bool = True, mode: str | None = None, **extra: Any
) -> Service:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": f"uid-{name}"}
    meta["creationTimestamp"] = extra.pop("created", "2026-01-01T00:00:00Z")
    if mode is not None:
        meta["annotations"] = {LOCAL_TRAFFIC_ANNOTATION: mode}
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "externalTrafficPolicy": "Local" if local else "Cluster",
    }
    spec.update(extra)
    svc = parse_service(
        {
            "metadata": meta,
            "spec": spec,
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}},
        }
    )
    assert isinstance(svc, Service)
    return svc


def slice_raw(*endpoints: tuple[str, str, bool]) -> dict[str, Any]:
    """Return a raw EndpointSlice of Service ns/local with (address, node, ready) endpoints."""
    return {
        "metadata": {
            "namespace": "ns",
            "name": "local-1",
            "labels": {"kubernetes.io/service-name": "local"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [a], "nodeName": n, "conditions": {"ready": r}} for a, n, r in endpoints
        ],
    }


def slices(*endpoints: tuple[str, str, bool]) -> list[Any]:
    return [parse_slice(slice_raw(*endpoints))]


EPS = slices(
    ("198.19.1.10", "node-1", True),
    ("198.19.2.10", "node-2", True),
    ("198.19.2.11", "node-2", True),
    ("198.19.3.10", "node-3", False),  # not ready: node-3 gets no flows
)


def result(svc: Service, node: str = "node-1", policy: PolicyView = POLICY) -> ServiceResult:
    return service_frontends(
        svc, EPS, node=NodeView(name=node, zone=None), policy=policy, allocated_to={}
    )


def test_a_spread_local_service_sends_other_nodes_their_weighted_buckets() -> None:
    (entry,) = result(service()).spread
    key, peers = entry
    assert (key.ip, key.port) == (ip("198.18.0.200"), 80)
    owners = Counter(name for _, name in peers)
    assert set(owners) == {"node-2"}, "only node-2 (two ready) besides node-1 (one ready)"
    expected = Counter(bucket_table({"node-1": 1, "node-2": 2}))
    assert owners["node-2"] == expected["node-2"]
    assert BUCKETS - owners["node-2"] == expected["node-1"]


@pytest.mark.parametrize(
    ("svc", "policy"),
    [
        pytest.param(service(local=False), POLICY, id="a Cluster Service is never spread"),
        pytest.param(service(mode="holder"), POLICY, id="the annotation keeps one Service home"),
        pytest.param(
            service(),
            dataclasses.replace(POLICY, local_traffic=LocalTraffic.HOLDER),
            id="the cluster's holder mode spreads nothing",
        ),
    ],
)
def test_nothing_is_spread_when_the_service_is_not_a_spread_local_one(
    svc: Service, policy: PolicyView
) -> None:
    assert result(svc, policy=policy).spread == ()


def test_a_misspelt_annotation_is_reported_and_the_cluster_choice_applies() -> None:
    r = result(service(mode="everywhere"))
    assert [p.reason for p in r.problems] == [ProblemReason.LOCAL_TRAFFIC_INVALID]
    assert "everywhere" in r.problems[0].message
    assert r.spread, "the cluster's spread still applies"


def test_spread_state_maps_buckets_to_next_hops_and_accepts_every_other_node() -> None:
    r = result(service())
    desired = assemble([r], held_ips=None, local_cidrs=()).desired
    state = spread_state([r], frontends=desired.frontends, nodes=NODES, me="node-1", device="eth0")
    assert state is not None
    assert state.node == ip("198.18.0.11")
    assert state.peers == {ip("198.18.0.12"), ip("198.18.0.13")}
    ((key, hops),) = state.buckets.items()
    assert key == r.spread[0][0]
    assert {h for _, h in hops} == {ip("198.18.0.12")}
    assert [b for b, _ in hops] == [b for b, _ in r.spread[0][1]]


def test_spread_state_drops_buckets_of_nodes_without_ipv4_and_of_conflict_losers() -> None:
    r = result(service())
    desired = assemble([r], held_ips=None, local_cidrs=()).desired
    v6_only = (NODES[0], dataclasses.replace(NODES[1], addresses=(ip("2001:db8::12"),)))
    state = spread_state([r], frontends=desired.frontends, nodes=v6_only, me="node-1", device="d")
    assert state is not None and state.buckets == {}
    loser = dataclasses.replace(r, key="ns/other")
    state = spread_state([loser], frontends=desired.frontends, nodes=NODES, me="node-1", device="d")
    assert state is not None and state.buckets == {}
    assert (
        spread_state([r], frontends=desired.frontends, nodes=v6_only[1:], me="node-2", device="d")
        is None
    )
