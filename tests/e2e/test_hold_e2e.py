"""What an agent may hold, end to end (issue #18 item 1): a status naming the control plane.

The lab cluster (3 nodes, real apiserver on 198.18.0.2, kube-proxy in nftables mode, agents
announcing with 200 ms adverts) runs no controller, so nothing corrects a status a test
writes. Before agent/node/holdable.py, a Service whose `status.loadBalancer.ingress` named
198.18.0.2 made node-1 take that address within 0.7 s, and the client and every node lost the
API server for good. Real connections to the API server's port are the proof that it did not.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import sys
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from lab import client, netns
from lab.cluster import LAB_ANNOUNCE, ClusterLab, tcp_port
from lab.controlplane import API_PORT
from lab.topology import CONTROLPLANE4
from lab.vrrp_lab import holds
from lab.wait import wait_until

pytestmark = pytest.mark.e2e

CONVERGE = 60.0
GOOD = ipaddress.ip_address("198.18.0.220")  # in the lab's pool
WATCH_ROUNDS = 6  # rounds of connections after every agent refused the address
CONNECT = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.0)\n"
    "s.close()\n"
)


@pytest.fixture(scope="module")
def cluster_agent_config() -> dict[str, Any]:
    return LAB_ANNOUNCE


def reaches_apiserver(ns: str) -> bool:
    """Return True when a TCP connection from namespace `ns` to the API server's port opens."""
    proc = netns.run(
        ns, [sys.executable, "-c", CONNECT, str(CONTROLPLANE4), str(API_PORT)], check=False
    )
    return proc.returncode == 0


def metric(cluster: ClusterLab, node: str, name: str) -> float:
    code, body = cluster.agent_get(node, "/metrics")
    assert code == 200
    return sum(
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == name
    )


def refusals_from_every_node(cluster: ClusterLab, name: str) -> list[dict[str, Any]]:
    events = cluster.events_for(name, reason="LoadBalancerIPRefused")
    hosts = {e["source"].get("host") for e in events}
    return events if hosts >= {n.name for n in cluster.nodes} else []


def test_a_status_naming_the_api_server_leaves_the_control_plane_reachable(
    cluster: ClusterLab,
) -> None:
    namespaces = [cluster.client_ns, *(n.ns for n in cluster.nodes)]
    for ns in namespaces:
        assert reaches_apiserver(ns), f"{ns} cannot reach the API server before the test"
    before = {n.name: metric(cluster, n.name, "nodelb_lb_ips_refused_total") for n in cluster.nodes}
    # Port 6443 too: a frontend for it would DNAT every node's own API traffic to the pods.
    cluster.create_service(
        "grab",
        ports=[tcp_port(80), tcp_port(API_PORT, "api")],
        lb_ip=[str(CONTROLPLANE4), str(GOOD)],
    )
    try:
        cluster.write_endpointslices("grab", ["pod-1-1", "pod-2-1", "pod-3-1"])
        events = wait_until(
            functools.partial(refusals_from_every_node, cluster, "grab"),
            CONVERGE,
            "a LoadBalancerIPRefused Warning from every agent",
        )
        for event in events:
            assert event["type"] == "Warning"
            assert str(CONTROLPLANE4) in event["message"] and "API server" in event["message"]
        for node in cluster.nodes:
            assert metric(cluster, node.name, "nodelb_lb_ips_refused_total") > before[node.name]
        # The Service's pool address is still served: one bad address takes nothing else down.
        wait_until(lambda: any(holds(n, GOOD) for n in cluster.nodes), CONVERGE, f"{GOOD} held")
        wait_until(
            lambda: all(
                isinstance(r, client.Reply)
                for r in client.tcp_requests(cluster.client_ns, GOOD, 80, 3, timeout=1.0)
            ),
            CONVERGE,
            f"{GOOD} served",
        )
        # Every agent has judged the Service: for several Master_Down intervals (under a second
        # here) nobody takes the address, nothing DNATs it, and everybody reaches the API.
        for _ in range(WATCH_ROUNDS):
            assert [n.name for n in cluster.nodes if holds(n, CONTROLPLANE4)] == []
            for node in cluster.nodes:
                assert not cluster.has_rule(node.name, str(CONTROLPLANE4), API_PORT)
                assert not cluster.has_rule(node.name, str(CONTROLPLANE4), 80)
            unreachable = [ns for ns in namespaces if not reaches_apiserver(ns)]
            assert unreachable == [], f"lost the API server: {unreachable}"
    finally:
        with contextlib.suppress(ApiException):
            cluster.delete_service("grab")
