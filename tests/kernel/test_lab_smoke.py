"""Smoke tests of the namespace lab: routing through nodes, isolation from root, teardown."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest

from agent.model.net import IPAddress, Protocol
from lab import client, netns
from lab.client import Failure, Outcome, Reply
from lab.topology import (
    LAB_SPACE4,
    LAB_SPACE6,
    OUTSIDE_GW4,
    OUTSIDE_GW6,
    SEGMENT4,
    Host,
    Lab,
    LabError,
    LabSpec,
)
from tests import rootns

pytestmark = pytest.mark.kernel

TCP_PORT = 8080
UDP_PORT = 8081
FAMILIES = [pytest.param(4, id="IPv4"), pytest.param(6, id="IPv6")]


def addr(host: Host, family: int) -> IPAddress:
    return host.ip4 if family == 4 else host.ip6


def ip_json(ns: str, *args: str) -> Any:
    return json.loads(netns.run(ns, ["ip", "-j", *args]).stdout or "[]")


def expect_reply(result: client.Result, *, pod: str, client_ip: IPAddress, what: str) -> None:
    assert isinstance(result, Reply), f"{what}: got {result}"
    assert (result.pod, result.client_ip) == (pod, client_ip), f"{what}: got {result}"


def test_address_plan_matches_the_documented_one(tmp_path: Path) -> None:
    lab = Lab(LabSpec(nodes=3, pods_per_node=2), tmp_path)  # constructing does no work
    assert not lab.namespaces
    assert [(n.name, n.zone, str(n.ip4), str(n.ip6)) for n in lab.nodes] == [
        ("node-1", "zone-a", "198.18.0.11", "2001:db8::11"),
        ("node-2", "zone-b", "198.18.0.12", "2001:db8::12"),
        ("node-3", "zone-a", "198.18.0.13", "2001:db8::13"),
    ]
    node3 = lab.node("node-3")
    assert (str(node3.pod_cidr4), str(node3.pod_cidr6)) == ("198.19.3.0/24", "2001:db8:1:3::/64")
    assert [(p.name, str(p.ip4), str(p.ip6)) for p in lab.pods_on("node-3")] == [
        ("pod-3-1", "198.19.3.11", "2001:db8:1:3::11"),
        ("pod-3-2", "198.19.3.12", "2001:db8:1:3::12"),
    ]
    assert lab.client is not None and lab.controlplane is not None
    assert (lab.client.ip4, lab.client.ip6) == (
        IPv4Address("198.18.0.100"),
        IPv6Address("2001:db8::100"),
    )
    assert (lab.controlplane.ip4, lab.controlplane.ip6) == (
        IPv4Address("198.18.0.2"),
        IPv6Address("2001:db8::2"),
    )
    assert all(len(h.ns.rsplit("-", 2)[0]) == 9 for h in lab.nodes)  # nlb + 6 hex
    doc = lab.to_json()
    assert doc["nodes"][1]["zone"] == "zone-b" and doc["pods"][0]["node"] == "node-1"
    assert doc["up"] is False


@pytest.mark.parametrize("family", FAMILIES)
def test_client_reaches_a_pod_on_each_node_through_that_node(lab: Lab, family: int) -> None:
    assert lab.client is not None
    lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT)
    me = addr(lab.client, family)
    probes = [
        client.Probe(proto, addr(pod, family), port, timeout=5.0)
        for pod in lab.pods
        for proto, port in ((Protocol.TCP, TCP_PORT), (Protocol.UDP, UDP_PORT))
    ]
    results = client.run_probes(lab.client.ns, probes)
    for probe, result in zip(probes, results, strict=True):
        pod = next(p for p in lab.pods if addr(p, family) == probe.ip)
        expect_reply(result, pod=pod.name, client_ip=me, what=f"{probe.protocol} to {pod.name}")
        # ... and the route the client uses goes through the pod's own node.
        route = ip_json(lab.client.ns, "route", "get", str(probe.ip))[0]
        assert ip_address(route["gateway"]) == addr(lab.node(pod.node), family)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_outside_client_reaches_pods_only_through_the_router(
    make_lab: Callable[[LabSpec], Lab], family: int
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=1, with_client=False, with_router=True))
    assert lab.outside is not None and lab.router is not None
    assert lab.outside.ip4 not in SEGMENT4 and lab.outside.ip4 not in ip_network("198.19.0.0/17")
    lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT)
    me = addr(lab.outside, family)
    probes = [
        client.Probe(Protocol.TCP, addr(pod, family), TCP_PORT, timeout=5.0) for pod in lab.pods
    ]
    for pod, result in zip(lab.pods, client.run_probes(lab.outside.ns, probes), strict=True):
        expect_reply(result, pod=pod.name, client_ip=me, what=f"outside to {pod.name}")
        route = ip_json(lab.outside.ns, "route", "get", str(addr(pod, family)))[0]
        assert ip_address(route["gateway"]) == (OUTSIDE_GW4 if family == 4 else OUTSIDE_GW6)
    # Unplugged from the segment, the router carries nothing: there is no other way in.
    lab.unplug(lab.router)
    cut = client.Probe(Protocol.TCP, addr(lab.pods[0], family), TCP_PORT, timeout=1.0)
    result = client.run_probes(lab.outside.ns, [cut])[0]
    assert result.outcome is not client.Outcome.OK, result


@pytest.mark.parametrize("family", FAMILIES)
def test_pods_on_a_node_become_unreachable_when_that_node_stops_forwarding(
    lab: Lab, family: int
) -> None:
    assert lab.client is not None
    lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT)
    key = "net.ipv4.ip_forward" if family == 4 else "net.ipv6.conf.all.forwarding"
    netns.run(lab.node("node-1").ns, ["sysctl", "-q", "-w", f"{key}=0"])
    results = {
        pod.name: client.tcp_request(lab.client.ns, addr(pod, family), TCP_PORT, timeout=1.0)
        for pod in lab.pods
    }
    for pod in lab.pods_on("node-1"):
        assert isinstance(results[pod.name], Failure), f"{pod.name} answered: {results}"
    for pod in lab.pods_on("node-2"):
        expect_reply(
            results[pod.name],
            pod=pod.name,
            client_ip=addr(lab.client, family),
            what=f"TCP to {pod.name} while node-1 does not forward",
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_pods_reach_pods_on_other_nodes_and_see_the_source_pod_address(
    lab: Lab, family: int
) -> None:
    lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT)
    pairs = [(a, b) for a in lab.pods for b in lab.pods if a.node != b.node]
    assert len(pairs) == 8
    for src, dst in pairs:
        results = client.run_probes(
            src.ns,
            [
                client.Probe(Protocol.TCP, addr(dst, family), TCP_PORT, timeout=5.0),
                client.Probe(Protocol.UDP, addr(dst, family), UDP_PORT, timeout=5.0),
            ],
        )
        for result in results:
            expect_reply(
                result, pod=dst.name, client_ip=addr(src, family), what=f"{src.name} -> {dst.name}"
            )


@dataclass(frozen=True, slots=True)
class OutcomeCase:
    protocol: Protocol
    source: str  # "client" or "pod": where the request starts
    target: str  # "pod-closed-port", "absent-on-segment" or "unrouted"
    family: int
    expected: Outcome


OUTCOME_CASES = [
    pytest.param(
        OutcomeCase(Protocol.TCP, "client", "pod-closed-port", 4, Outcome.REFUSED),
        id="a TCP connection to a closed pod port is refused (reset)",
    ),
    pytest.param(
        OutcomeCase(Protocol.UDP, "client", "pod-closed-port", 6, Outcome.REFUSED),
        id="a UDP datagram to a closed pod port is refused (ICMPv6 port unreachable)",
    ),
    pytest.param(
        OutcomeCase(Protocol.TCP, "client", "absent-on-segment", 4, Outcome.TIMEOUT),
        id="TCP to an address nobody holds on the segment times out",
    ),
    pytest.param(
        OutcomeCase(Protocol.UDP, "client", "absent-on-segment", 6, Outcome.TIMEOUT),
        id="UDP to an address nobody holds on the segment times out",
    ),
    pytest.param(
        OutcomeCase(Protocol.TCP, "client", "unrouted", 4, Outcome.UNREACHABLE),
        id="TCP from the client to an address it has no route for is unreachable (local)",
    ),
    pytest.param(
        OutcomeCase(Protocol.TCP, "pod", "unrouted", 4, Outcome.UNREACHABLE),
        id="TCP from a pod to an address its node cannot route is unreachable (ICMP)",
    ),
    pytest.param(
        OutcomeCase(Protocol.UDP, "pod", "unrouted", 4, Outcome.UNREACHABLE),
        id="UDP from a pod to an address its node cannot route is unreachable (ICMP)",
    ),
    pytest.param(
        OutcomeCase(Protocol.UDP, "pod", "unrouted", 6, Outcome.UNREACHABLE),
        id="UDP from a pod to an address its node cannot route is unreachable (ICMPv6)",
    ),
]


@pytest.mark.parametrize("case", OUTCOME_CASES)
def test_request_failures_are_classified(lab: Lab, case: OutcomeCase) -> None:
    assert lab.client is not None
    lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT)
    pod = lab.pods[0]
    targets: dict[str, tuple[IPAddress, int]] = {
        "pod-closed-port": (addr(pod, case.family), TCP_PORT + 100),
        "absent-on-segment": (
            ip_address("198.18.0.77" if case.family == 4 else "2001:db8::77"),
            TCP_PORT,
        ),
        "unrouted": (ip_address("198.19.200.1" if case.family == 4 else "2001:db8:1:200::1"), 80),
    }
    ip, port = targets[case.target]
    ns = lab.client.ns if case.source == "client" else pod.ns
    [result] = client.run_probes(ns, [client.Probe(case.protocol, ip, port, timeout=1.5)])
    assert isinstance(result, Failure) and result.outcome is case.expected, result


def test_sctp_is_served_only_where_the_kernel_supports_it(lab: Lab) -> None:
    assert lab.client is not None
    lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT, sctp_port=8082)
    pod = lab.pods[0]
    result = client.sctp_request(lab.client.ns, pod.ip4, 8082, timeout=5.0)
    if lab.sctp_served():
        expect_reply(result, pod=pod.name, client_ip=lab.client.ip4, what="SCTP")
    else:
        assert isinstance(result, Failure) and "EPROTONOSUPPORT" in result.detail, result
    # TCP keeps working either way.
    expect_reply(
        client.tcp_request(lab.client.ns, pod.ip4, TCP_PORT),
        pod=pod.name,
        client_ip=lab.client.ip4,
        what="TCP next to SCTP",
    )


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(LabSpec(), id="the default lab"),
        pytest.param(LabSpec(with_router=True), id="with a router and an outside client"),
    ],
)
def test_lab_has_no_default_route_no_foreign_address_and_no_link_to_root(
    make_lab: Callable[[LabSpec], Lab], spec: LabSpec
) -> None:
    before = rootns.take()
    lab = make_lab(spec)
    after = rootns.take()
    assert after.links == before.links, "links appeared or vanished in the root namespace"
    assert after.addresses == before.addresses and after.routes == before.routes
    allowed: list[IPv4Network | IPv6Network] = [LAB_SPACE4, LAB_SPACE6, ip_network("fe80::/64")]
    for ns in lab.namespaces:
        names = {e["nsid"]: e["name"] for e in ip_json(ns, "netns", "list-id")}
        for link in ip_json(ns, "link", "show"):
            if "link_netnsid" in link:
                peer_ns = names.get(link["link_netnsid"])
                assert peer_ns in lab.namespaces, f"{ns}: {link['ifname']} peers into {peer_ns}"
        for fam in ("-4", "-6"):
            for route in ip_json(ns, fam, "route", "show", "table", "all"):
                assert route["dst"] != "default", f"{ns}: default route {route}"
                if route.get("table", "main") == "main":
                    dst = ip_network(route["dst"])
                    assert any(
                        dst.network_address in a and dst.prefixlen >= a.prefixlen for a in allowed
                    ), f"{ns}: route outside the lab space {route}"
        for link in ip_json(ns, "addr", "show"):
            for a in link.get("addr_info", []):
                ip = ip_address(a["local"])
                if not (ip.is_loopback or ip.is_link_local):
                    assert any(ip in net for net in allowed), (
                        f"{ns}: address {ip} outside the lab space"
                    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_teardown_removes_namespaces_and_processes_even_when_the_body_raises(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    lab = Lab(LabSpec(), tmp_path)
    with pytest.raises(RuntimeError, match="boom"), lab:
        lab.start_pod_servers()
        assert lab.client is not None
        sleeper = lab.spawn(lab.client.ns, ["sleep", "600"], log_name="sleeper")
        pids = [p.pid for p in lab.processes]
        namespaces = lab.namespaces
        assert len(pids) == 5 and all(_alive(p) for p in pids)
        assert all(netns.exists(ns) for ns in namespaces) and len(namespaces) == 9
        # A process the lab did not track, started inside a lab namespace, goes too.
        untracked = netns.run(lab.pods[0].ns, ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"])
        pids.append(int(untracked.stdout))
        assert sleeper.poll() is None
        raise RuntimeError("boom")
    assert not [ns for ns in namespaces if netns.exists(ns)]
    assert not [p for p in pids if _alive(p) and not _is_zombie(p)]
    assert lab.namespaces == [] and lab.processes == []
    lab.down()  # idempotent


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_failed_up_removes_what_it_built(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    lab = Lab(LabSpec(), tmp_path)
    blocker = f"{lab.prefix}-node-2"  # make building node-2 fail half way
    netns.create(blocker)
    try:
        with pytest.raises(LabError, match="already exists"):
            lab.up()
        leftovers = [
            p.name for p in netns.NETNS_DIR.iterdir() if p.name.startswith(f"{lab.prefix}-")
        ]
        assert leftovers == [blocker]
        assert lab.namespaces == []
    finally:
        netns.delete(blocker)


def test_sigkilled_process_does_not_stop_teardown(make_lab: Callable[[LabSpec], Lab]) -> None:
    lab = make_lab(LabSpec(nodes=1, pods_per_node=1, with_controlplane=False))
    assert lab.client is not None
    proc = lab.spawn(lab.client.ns, ["sleep", "600"], log_name="victim")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    lab.down()
    assert lab.namespaces == [] and not netns.exists(lab.switch_ns)
