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
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from lab import client, netns
from lab.cluster import LAB_ANNOUNCE, ClusterLab, tcp_port
from lab.controlplane import API_PORT
from lab.topology import CONTROLPLANE4, LabNode
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


def blackhole(ns: str, *, on: bool) -> None:
    """Add (or remove) a blackhole route to the API server inside node namespace `ns`."""
    verb = "add" if on else "del"
    netns.run(ns, ["ip", "-4", "route", verb, "blackhole", f"{CONTROLPLANE4}/32"], check=on)


def gauge(cluster: ClusterLab, node: str) -> float:
    return metric(cluster, node, "nodelb_api_cut_off")


def test_an_agent_cut_off_from_the_api_says_so_keeps_what_it_holds_and_takes_nothing_new(
    cluster: ClusterLab,
) -> None:
    kept, fresh = ipaddress.ip_address("198.18.0.221"), ipaddress.ip_address("198.18.0.222")
    cluster.create_service("kept", ports=[tcp_port(80)], lb_ip=[str(kept)])
    blackholed: str | None = None
    try:
        cluster.write_endpointslices("kept", ["pod-1-1", "pod-2-1", "pod-3-1"])
        found = wait_until(
            lambda: next((n for n in cluster.nodes if holds(n, kept)), None),
            CONVERGE,
            f"{kept} held",
        )
        assert found is not None
        cut: LabNode = found
        said = cluster.agent_log(cut.name).count("cut off from the API server")
        blackhole(cut.ns, on=True)
        blackholed = cut.ns
        started = time.monotonic()
        wait_until(
            lambda: cluster.agent_log(cut.name).count("cut off from the API server") > said,
            CONVERGE,
            f"{cut.name} logging that it is cut off",
        )
        print(f"cut off logged after {time.monotonic() - started:.1f}s")
        assert gauge(cluster, cut.name) == 1.0
        # A Service created meanwhile: the cut-off node cannot learn it and takes nothing;
        # the others elect a holder among themselves (it does not advertise for it).
        cluster.create_service("fresh", ports=[tcp_port(80)], lb_ip=[str(fresh)])
        cluster.write_endpointslices("fresh", ["pod-1-1", "pod-2-1", "pod-3-1"])
        wait_until(
            lambda: [n.name for n in cluster.nodes if holds(n, fresh)] not in ([], [cut.name]),
            CONVERGE,
            f"{fresh} held by a node that can reach the API",
        )
        for _ in range(WATCH_ROUNDS):
            assert holds(cut, kept), f"{cut.name} let go of {kept} while cut off"
            assert not holds(cut, fresh), f"{cut.name} took {fresh} while cut off"
            results = client.tcp_requests(cluster.client_ns, kept, 80, 2, timeout=1.0)
            assert all(isinstance(r, client.Reply) for r in results), results
        blackhole(cut.ns, on=False)
        blackholed = None
        wait_until(lambda: gauge(cluster, cut.name) == 0.0, CONVERGE, f"{cut.name} back in touch")
        assert "the API server answers again" in cluster.agent_log(cut.name)
    finally:
        if blackholed is not None:
            blackhole(blackholed, on=False)
        for name in ("kept", "fresh"):
            with contextlib.suppress(ApiException):
                cluster.delete_service(name)
