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
import json
import sys
import time
from typing import Any

import pytest
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from agent.model.net import IPAddress
from lab import client, netns
from lab.cluster import LAB_ANNOUNCE, NODELB_NAMESPACE, ClusterLab, tcp_port
from lab.controlplane import API_PORT
from lab.topology import CONTROLPLANE4, LabNode
from lab.vrrp_lab import holds, link_local, mac_of, neighbour_mac
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


def holder_of(cluster: ClusterLab, ip: IPAddress) -> LabNode | None:
    """Return the node holding `ip` once it is the only one and ranks first for it.

    A new IP's first Master is whichever agent saw the Service first; the first-ranked node
    (priority 254) preempts it a moment later. Taking the first holder seen made the attack
    test blame the attack for that preemption.
    """
    holding = [n for n in cluster.nodes if holds(n, ip)]
    if len(holding) != 1:
        return None
    code, body = cluster.agent_get(holding[0].name, "/status")
    ranks = [i["priority"] for i in json.loads(body)["vrrp"] if str(ip) in i["addresses"]]
    return holding[0] if code == 200 and ranks == [254] else None


def vrid_of(cluster: ClusterLab, node: str, ip: IPAddress) -> int:
    code, body = cluster.agent_get(node, "/status")
    assert code == 200
    for inst in json.loads(body)["vrrp"]:
        if str(ip) in inst["addresses"]:
            return int(inst["vrid"])
    raise AssertionError(f"{node} runs no instance for {ip}")


def dropped(cluster: ClusterLab, node: str, family: int, reason: str) -> float:
    code, body = cluster.agent_get(node, "/metrics")
    assert code == 200
    return sum(
        s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
        if s.name == "nodelb_vrrp_adverts_dropped_total"
        and s.labels.get("family") == f"IPv{family}"
        and s.labels.get("reason") == reason
    )


def forge(cluster: ClusterLab, family: int, src: IPAddress, vrid: int, vip: IPAddress) -> None:
    """Send priority-255 adverts for `vrid` from the client, with source address `src`."""
    argv = [sys.executable, "-m", "lab.vrrp_lab", "forge", family, src, vrid, 255, 255, 20]
    netns.run(cluster.client_ns, [*map(str, argv), "rfc5798", str(vip)])


def test_forged_adverts_and_a_forged_report_leave_the_holder_holding(cluster: ClusterLab) -> None:
    """Issue #18 item 6 with real agents: every node publishes its MAC; a Lease forged to lend
    the client's link-local address to node-2 is ignored, so the client's IPv6 adverts are
    not a peer's; IPv4 adverts forged from a non-holder's address carry the client's MAC and
    are dropped. The holders keep holding and fresh clients are served."""
    ips = (ipaddress.ip_address("198.18.0.224"), ipaddress.ip_address("2001:db8::224"))
    cluster.create_service("guarded", ports=[tcp_port(80)], lb_ip=[str(i) for i in ips])
    leases = kclient.CoordinationV1Api(cluster.api)
    forged_name = "nodelb-node-intruder"
    try:
        cluster.write_endpointslices("guarded", ["pod-1-1", "pod-2-1", "pod-3-1"])
        holders: dict[IPAddress, LabNode] = {}
        for ip in ips:
            found = wait_until(functools.partial(holder_of, cluster, ip), CONVERGE, f"{ip} held")
            assert found is not None
            holders[ip] = found
        for node in cluster.nodes:
            report = leases.read_namespaced_lease(f"nodelb-node-{node.name}", NODELB_NAMESPACE)
            assert report.metadata is not None
            annotations = report.metadata.annotations or {}
            assert annotations.get("nodelb.io/vrrp-mac") == mac_of(node), node.name

        assert cluster.lab.client is not None
        client_ll = link_local(cluster.lab.client)
        victim6 = next(n for n in cluster.nodes if n.name != holders[ips[1]].name)
        body: Any = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": forged_name,
                "labels": {"nodelb.io/report": "node"},
                "annotations": {
                    "nodelb.io/vrrp-sources": f"{victim6.ip4},{client_ll}",
                    "nodelb.io/vrrp-mac": mac_of(victim6),
                },
            },
            "spec": {"holderIdentity": victim6.name, "leaseDurationSeconds": 3600},
        }
        leases.create_namespaced_lease(NODELB_NAMESPACE, body)
        v4, v6 = ips
        other4 = next(n for n in cluster.nodes if n.name != holders[v4].name)
        vrid4 = vrid_of(cluster, holders[v4].name, v4)
        vrid6 = vrid_of(cluster, holders[v6].name, v6)
        before = {
            "v4": dropped(cluster, holders[v4].name, 4, "wrong_mac"),
            "v6": dropped(cluster, holders[v6].name, 6, "unknown_source"),
        }
        for _ in range(3):
            forge(cluster, 6, client_ll, vrid6, v6)
            forge(cluster, 4, other4.ip4, vrid4, v4)
            for ip, holder in holders.items():
                assert holds(holder, ip), f"{holder.name} let go of {ip} under the attack"
        wait_until(
            lambda: (
                dropped(cluster, holders[v4].name, 4, "wrong_mac") >= before["v4"] + 60
                and dropped(cluster, holders[v6].name, 6, "unknown_source") >= before["v6"] + 60
            ),
            CONVERGE,
            "the forged adverts counted as dropped on the holders",
        )
        for ip, holder in holders.items():
            assert [n.name for n in cluster.nodes if holds(n, ip)] == [holder.name]
            netns.run(cluster.client_ns, ["ip", "neigh", "flush", "to", str(ip)], check=False)
            results = client.tcp_requests(cluster.client_ns, ip, 80, 3, timeout=1.0)
            assert all(isinstance(r, client.Reply) for r in results), (ip, results)
            assert neighbour_mac(cluster.client_ns, ip) == mac_of(holder)
    finally:
        with contextlib.suppress(ApiException):
            leases.delete_namespaced_lease(forged_name, NODELB_NAMESPACE)
        with contextlib.suppress(ApiException):
            cluster.delete_service("guarded")
