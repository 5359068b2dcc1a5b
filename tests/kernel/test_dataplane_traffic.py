"""The applier in the lab with real traffic: what the client received and what the pod saw.

One lab (2 nodes x 2 pods, a client) serves the whole module. Every test programs a node's
`inet nodelb` table exactly as the agent does: a `Dataplane` over `NetnsNftRunner(node.ns)`,
with conntrack cleanup through `ToolConntrackRunner(netns=node.ns)`, starting with a full sync
of the test's own state (which replaces whatever an earlier test left) and going on with
deltas. The announcer does not exist yet, so the client reaches an LB IP through a /32 (/128)
route added inside the client namespace via the node under test; each test uses LB IPs of its
own from 198.18.0.200-250 / 2001:db8::200-250, so conntrack entries never cross tests.

Nothing is programmed in the root namespace: nft runs in a worker thread that entered the
node's namespace, and every `ip` / `conntrack` / probe command runs under `ip netns exec`.
Waits poll a condition against a deadline; nothing asserts on timings.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent import netns as agent_netns
from agent.dataplane.applier import Dataplane, SyncMode, SyncOutcome, SyncResult
from agent.dataplane.conntrack import ToolConntrackRunner
from agent.dataplane.libnft import NetnsNftRunner
from agent.dataplane.monitor import TableMonitor
from agent.dataplane.netlink import NetlinkElementSender
from agent.dataplane.tamper import TamperGuard
from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import IPAddress, IPNetwork, Protocol
from lab import netns
from lab.client import Failure, Outcome, Probe, Reply, Result, run_probes
from lab.topology import Host, Lab, LabNode, LabSpec, Pod, gateway_addresses
from lab.wait import GiveUp, wait_until
from rules import layout as L
from rules.readback import expected, from_json

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("conntrack") is None,
        reason="needs root, nft and conntrack",
    ),
]

TCP_PORT = 8080  # pod servers (lab.servers) listen here ...
UDP_PORT = 8081
SCTP_PORT = 8082  # ... and here only where the kernel has SCTP
REPLY_TIMEOUT = 5.0  # a request that must be answered: generous, the machine is shared
DROP_TIMEOUT = 1.5  # a request that must be dropped costs this much
WAIT = 30.0  # deadline for conditions that should hold within a moment


def v4(text: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(text)


def v6(text: str) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(text)


# -- the lab -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Yield one running lab for the module (2 nodes x 2 pods, client, pod servers)."""
    lab = Lab(
        LabSpec(nodes=2, pods_per_node=2, with_controlplane=False),
        tmp_path_factory.mktemp("dptraffic"),
    )
    try:
        lab.up()
        lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT, sctp_port=SCTP_PORT)
        yield lab
    finally:
        lab.down()


def client_of(lab: Lab) -> Host:
    assert lab.client is not None
    return lab.client


class Planes:
    """Makes Dataplanes for lab nodes, as the agent builds them, and closes their runners."""

    def __init__(self) -> None:
        self.runners: list[NetnsNftRunner] = []

    def runner(self, node: LabNode) -> NetnsNftRunner:
        """Return a fresh NftRunner bound to `node`'s namespace."""
        r = NetnsNftRunner(node.ns)
        self.runners.append(r)
        return r

    def make(self, node: LabNode, *, conntrack: bool = True) -> Dataplane:
        """Return a new Dataplane for `node` (with conntrack cleanup unless told otherwise)."""
        ct = ToolConntrackRunner(netns=node.ns) if conntrack else None
        return Dataplane(self.runner(node), conntrack=ct)

    @property
    def last_runner(self) -> NetnsNftRunner:
        """Return the runner of the Dataplane made last."""
        return self.runners[-1]

    def close(self) -> None:
        for r in self.runners:
            r.close()


@pytest.fixture
def planes() -> Iterator[Planes]:
    p = Planes()
    try:
        yield p
    finally:
        p.close()


@contextlib.contextmanager
def routes(lab: Lab, node: LabNode, *ips: IPAddress) -> Iterator[None]:
    """Route `ips` from the client via `node` (standing in for the announcer), then remove."""
    ns = client_of(lab).ns
    added: list[list[str]] = []
    try:
        for addr in ips:
            if isinstance(addr, ipaddress.IPv4Address):
                spec = ["-4", "route", "replace", f"{addr}/32", "via", str(node.ip4)]
            else:
                spec = ["-6", "route", "replace", f"{addr}/128", "via", str(node.ip6)]
            netns.run(ns, ["ip", *spec])
            added.append(spec)
        yield
    finally:
        for spec in added:
            netns.run(ns, ["ip", spec[0], "route", "del", spec[3]], check=False)


@contextlib.contextmanager
def address(ns: str, iface: str, addr: IPAddress) -> Iterator[None]:
    """Add `addr` as a host address on `iface` inside lab namespace `ns`, then remove it."""
    plen = 32 if isinstance(addr, ipaddress.IPv4Address) else 128
    extra = [] if plen == 32 else ["nodad"]
    netns.run(ns, ["ip", "addr", "add", f"{addr}/{plen}", "dev", iface, *extra])
    try:
        yield
    finally:
        netns.run(ns, ["ip", "addr", "del", f"{addr}/{plen}", "dev", iface], check=False)


# -- desired state -------------------------------------------------------------------------


def ep(pod: Pod, port: int, family: int = 4) -> Endpoint:
    return Endpoint(pod.ip4 if family == 4 else pod.ip6, port)


def eps(pods: Iterable[Pod], port: int, family: int = 4) -> tuple[Endpoint, ...]:
    return tuple(ep(p, port, family) for p in pods)


def frontend(
    addr: IPAddress,
    protocol: Protocol,
    port: int,
    endpoints: tuple[Endpoint, ...],
    *,
    cluster: tuple[Endpoint, ...] | None = None,
    local_only: bool = False,
    ranges: Sequence[str] = (),
    affinity: int | None = None,
) -> Frontend:
    """Return a Frontend; `cluster` defaults to `endpoints` (externalTrafficPolicy=Cluster)."""
    nets: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(r) for r in ranges)
    return Frontend(
        service=f"test/{addr}-{protocol}-{port}",
        key=FrontendKey(addr, protocol, port),
        endpoints=endpoints,
        cluster_endpoints=endpoints if cluster is None else cluster,
        local_only=local_only,
        source_ranges=nets,
        affinity_timeout=affinity,
    )


def desired(node: LabNode, *frontends: Frontend, held: Iterable[IPAddress] = ()) -> DesiredState:
    """Return `node`'s DesiredState: the frontends, held IPs, and its own pod CIDRs as local."""
    return DesiredState(
        frontends={f.key: f for f in frontends},
        held_ips=frozenset(held),
        local_cidrs=(node.pod_cidr4, node.pod_cidr6),
    )


def applied(result: SyncResult, mode: SyncMode) -> SyncResult:
    """Return `result` after asserting the kernel accepted a sync of the expected mode."""
    assert result.outcome is SyncOutcome.APPLIED, result
    assert result.mode is mode, result
    return result


# -- probing -------------------------------------------------------------------------------


def probe(
    ns: str,
    protocol: Protocol,
    ip: IPAddress,
    port: int,
    *,
    count: int = 1,
    timeout: float = REPLY_TIMEOUT,
    source: IPAddress | None = None,
    source_port: int | None = None,
) -> list[Result]:
    """Return the results of `count` sequential requests from `ns` (one probe process)."""
    one = Probe(protocol, ip, port, timeout=timeout, source=source, source_port=source_port)
    return run_probes(ns, [one] * count)


def answered(results: Sequence[Result]) -> list[Reply]:
    """Return the replies after asserting that every request was answered."""
    failed = [r for r in results if not isinstance(r, Reply)]
    assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:5]}"
    return [r for r in results if isinstance(r, Reply)]


def outcomes(results: Sequence[Result]) -> list[Outcome]:
    return [r.outcome for r in results]


def pods_of(replies: Iterable[Reply]) -> set[str]:
    return {r.pod for r in replies}


def names(pods: Iterable[Pod]) -> set[str]:
    return {p.name for p in pods}


def masquerade_source(lab: Lab, node: LabNode, pod: Pod, family: int = 4) -> IPAddress:
    """Return the address `node` masquerades to when it forwards to `pod`.

    That is its pod bridge's address for its own pods, else its segment address (the route to
    other nodes' pod CIDRs leaves through the segment).
    """
    if pod.node == node.name:
        gw4, gw6 = gateway_addresses(lab.nodes.index(node) + 1)
        return gw4 if family == 4 else gw6
    return node.ip4 if family == 4 else node.ip6


def assert_masqueraded(lab: Lab, node: LabNode, replies: Iterable[Reply], family: int = 4) -> None:
    """Assert every pod saw `node`'s address (never the client's) as the source."""
    wrong = [
        r for r in replies if r.client_ip != masquerade_source(lab, node, lab.pod(r.pod), family)
    ]
    assert not wrong, f"not masqueraded to {node.name}'s address: {wrong[:5]}"


def table_json(runner: NetnsNftRunner) -> list[dict[str, Any]]:
    """Return the `nft -j list table inet nodelb` items of `runner`'s namespace."""
    listed = runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME)
    assert listed is not None, "the nodelb table is missing"
    items: list[dict[str, Any]] = listed["nftables"]
    return items


def elements(runner: NetnsNftRunner, name: str) -> list[Any]:
    """Return the elements of map or set `name` in the nodelb table, as nft -j lists them."""
    for item in table_json(runner):
        for kind in ("map", "set"):
            obj = item.get(kind)
            if isinstance(obj, dict) and obj.get("name") == name:
                elem: list[Any] = obj.get("elem", [])
                return elem
    raise AssertionError(f"no map or set {name} in the nodelb table")


def affinity_clients(runner: NetnsNftRunner) -> set[str]:
    """Return every client address held by any session-affinity set (expired ones vanish)."""
    found: set[str] = set()
    for item in table_json(runner):
        obj = item.get("set")
        if not isinstance(obj, dict) or not str(obj.get("name", "")).startswith(L.AFF_SET):
            continue
        for e in obj.get("elem", []):
            val = e["elem"]["val"] if isinstance(e, dict) and "elem" in e else e
            found.add(str(val))
    return found


# -- 1, 2: Cluster and Local ---------------------------------------------------------------


def test_cluster_spreads_over_every_endpoint_and_masquerades(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.200")
    fe = frontend(lb, Protocol.TCP, 80, eps(tlab.pods, TCP_PORT))
    dp = planes.make(node)
    applied(dp.sync(desired(node, fe), full=True), SyncMode.FULL)
    with routes(tlab, node, lb):
        replies = answered(probe(client_of(tlab).ns, Protocol.TCP, lb, 80, count=64))
    assert pods_of(replies) == names(tlab.pods)
    assert all(r.client_ip != client_of(tlab).ip4 for r in replies)
    assert_masqueraded(tlab, node, replies)


def test_local_keeps_the_client_address_and_uses_only_local_endpoints(
    tlab: Lab, planes: Planes
) -> None:
    node = tlab.nodes[0]
    local = tlab.pods_on(node.name)
    lb = v4("198.18.0.201")
    fe = frontend(
        lb,
        Protocol.TCP,
        80,
        eps(local, TCP_PORT),
        cluster=eps(tlab.pods, TCP_PORT),
        local_only=True,
    )
    dp = planes.make(node)
    applied(dp.sync(desired(node, fe), full=True), SyncMode.FULL)
    with routes(tlab, node, lb):
        tcp = answered(probe(client_of(tlab).ns, Protocol.TCP, lb, 80, count=30))
    assert pods_of(tcp) == names(local)
    assert {r.client_ip for r in tcp} == {client_of(tlab).ip4}


# -- 3, 4: no local endpoints, no endpoints at all -----------------------------------------


def test_local_without_local_endpoints_drops_external_but_serves_internal(
    tlab: Lab, planes: Planes
) -> None:
    node, other = tlab.nodes[0], tlab.nodes[1]
    remote = tlab.pods_on(other.name)
    lb = v4("198.18.0.202")
    fe_tcp = frontend(lb, Protocol.TCP, 80, (), cluster=eps(remote, TCP_PORT), local_only=True)
    fe_udp = frontend(lb, Protocol.UDP, 53, (), cluster=eps(remote, UDP_PORT), local_only=True)
    dp = planes.make(node)
    applied(dp.sync(desired(node, fe_tcp, fe_udp), full=True), SyncMode.FULL)
    client = client_of(tlab).ns
    with routes(tlab, node, lb):
        dropped = probe(client, Protocol.TCP, lb, 80, count=2, timeout=DROP_TIMEOUT)
        dropped += probe(client, Protocol.UDP, lb, 53, count=2, timeout=DROP_TIMEOUT)
    assert outcomes(dropped) == [Outcome.TIMEOUT] * 4, dropped

    # Traffic from a pod on this node and from the node itself is served by the cluster
    # endpoints, here all on the other node.
    pod = tlab.pods_on(node.name)[0]
    from_pod = answered(probe(pod.ns, Protocol.TCP, lb, 80, count=8))
    from_pod += answered(probe(pod.ns, Protocol.UDP, lb, 53, count=8))
    from_node = answered(probe(node.ns, Protocol.TCP, lb, 80, count=8))
    from_node += answered(probe(node.ns, Protocol.UDP, lb, 53, count=8))
    assert pods_of(from_pod) <= names(remote) and pods_of(from_node) <= names(remote)
    # The pod's connection keeps its address, as kube-proxy keeps it for eTP=Local (upstream
    # e2e "ExternalTrafficPolicy: Local ... should work from pods"); the node's is masqueraded.
    assert {r.client_ip for r in from_pod} == {pod.ip4}
    assert {r.client_ip for r in from_node} == {node.ip4}


def test_pods_keep_their_address_to_a_local_frontend_and_are_masqueraded_to_a_cluster_one(
    tlab: Lab, planes: Planes
) -> None:
    """A pod that is no endpoint reaches a Local frontend's cluster endpoints (on its own node
    and the other) with its own address, IPv4 and IPv6, TCP and UDP; to a Cluster frontend
    with the same endpoints it is masqueraded, as kube-proxy does for eTP=Cluster."""
    node, other = tlab.nodes[0], tlab.nodes[1]
    client, endpoint = tlab.pods_on(node.name)
    serving = [endpoint, *tlab.pods_on(other.name)]
    lb4, lb6 = v4("198.18.0.215"), v6("2001:db8::215")
    fes = [
        frontend(
            lb,
            proto,
            port,
            eps([endpoint], target, fam),
            cluster=eps(serving, target, fam),
            local_only=True,
        )
        for lb, fam in ((lb4, 4), (lb6, 6))
        for proto, port, target in ((Protocol.TCP, 80, TCP_PORT), (Protocol.UDP, 53, UDP_PORT))
    ]
    fes += [
        frontend(lb4, Protocol.TCP, 81, eps(serving, TCP_PORT)),
        frontend(lb6, Protocol.TCP, 81, eps(serving, TCP_PORT, 6)),
    ]
    dp = planes.make(node)
    applied(dp.sync(desired(node, *fes), full=True), SyncMode.FULL)

    local4 = answered(probe(client.ns, Protocol.TCP, lb4, 80, count=30))
    local4 += answered(probe(client.ns, Protocol.UDP, lb4, 53, count=12))
    local6 = answered(probe(client.ns, Protocol.TCP, lb6, 80, count=12))
    local6 += answered(probe(client.ns, Protocol.UDP, lb6, 53, count=12))
    # Every cluster endpoint served (30 TCP tries miss one of three with p < 1e-4), the one
    # beside the client included: its reply is bridged, and br_netfilter (on by default in
    # a namespace) lets conntrack undo the DNAT, as on a kube-proxy node.
    assert pods_of(local4) == names(serving)
    assert pods_of(local6) <= names(serving)
    assert {r.client_ip for r in local4} == {client.ip4}
    assert {r.client_ip for r in local6} == {client.ip6}

    cluster4 = answered(probe(client.ns, Protocol.TCP, lb4, 81, count=24))
    cluster6 = answered(probe(client.ns, Protocol.TCP, lb6, 81, count=12))
    assert pods_of(cluster4) == names(serving)
    assert_masqueraded(tlab, node, cluster4)
    assert_masqueraded(tlab, node, cluster6, family=6)


def test_a_local_endpoint_reaching_itself_and_the_node_are_masqueraded(
    tlab: Lab, planes: Planes
) -> None:
    """Hairpin: a Local frontend's own endpoint connecting to it is masqueraded (a pod drops a
    packet from its own address), also on the affinity path and also when another endpoint
    serves it (the over-approximation of docs/dataplane.md); so is the node, which holds the
    LB IP and sends from it. A pod that is no endpoint keeps its address on the affinity path."""
    node, other = tlab.nodes[0], tlab.nodes[1]
    bystander, endpoint = tlab.pods_on(node.name)
    remote = tlab.pods_on(other.name)
    lb4, lb6 = v4("198.18.0.216"), v6("2001:db8::216")

    def local(lb: IPAddress, port: int, cluster: list[Pod], **kw: Any) -> Frontend:
        fam = lb.version
        return frontend(
            lb,
            Protocol.TCP,
            port,
            eps([endpoint], TCP_PORT, fam),
            cluster=eps(cluster, TCP_PORT, fam),
            local_only=True,
            **kw,
        )

    fes = [
        local(lb4, 80, [endpoint]),  # the only endpoint: every connection is a hairpin
        local(lb4, 81, [endpoint, *remote]),
        local(lb4, 82, [endpoint], affinity=60),
        local(lb6, 80, [endpoint]),
    ]
    dp = planes.make(node)
    applied(dp.sync(desired(node, *fes, held=[lb4]), full=True), SyncMode.FULL)
    with address(node.ns, node.ifname, lb4):
        hairpin = answered(probe(endpoint.ns, Protocol.TCP, lb4, 80, count=8))
        hairpin += answered(probe(endpoint.ns, Protocol.TCP, lb4, 82, count=8))
        hairpin6 = answered(probe(endpoint.ns, Protocol.TCP, lb6, 80, count=8))
        assert pods_of(hairpin + hairpin6) == {endpoint.name}
        assert_masqueraded(tlab, node, hairpin)
        assert_masqueraded(tlab, node, hairpin6, family=6)

        spread = answered(probe(endpoint.ns, Protocol.TCP, lb4, 81, count=24))
        assert pods_of(spread) - {endpoint.name}, "no other endpoint served (p < 1e-11)"
        assert_masqueraded(tlab, node, spread)

        sticky = answered(probe(bystander.ns, Protocol.TCP, lb4, 82, count=4))
        assert {r.client_ip for r in sticky} == {bystander.ip4}

        # Sent from the held LB IP itself: unmasqueraded, the endpoints would see 198.18.0.216.
        from_node = answered(probe(node.ns, Protocol.TCP, lb4, 81, count=24))
        assert pods_of(from_node) - {endpoint.name}, "no remote endpoint served (p < 1e-11)"
        assert_masqueraded(tlab, node, from_node)


def test_no_endpoints_rejects_tcp_with_reset_and_udp_with_port_unreachable(
    tlab: Lab, planes: Planes
) -> None:
    node = tlab.nodes[0]
    lb4, lb6 = v4("198.18.0.203"), v6("2001:db8::203")
    fes = [frontend(ip, proto, 80, ()) for ip in (lb4, lb6) for proto in Protocol]
    dp = planes.make(node)
    applied(dp.sync(desired(node, *fes, held=[lb4, lb6]), full=True), SyncMode.FULL)
    pod = tlab.pods_on(node.name)[0]
    got: dict[tuple[str, str, str], Result] = {}
    # The node holds the IPs, as the announcer will make it: the client's requests end in
    # filter_input. A pod's requests are forwarded (filter_forward), as to an IP held elsewhere.
    with (
        routes(tlab, node, lb4, lb6),
        address(node.ns, node.ifname, lb4),
        address(node.ns, node.ifname, lb6),
    ):
        for host in (client_of(tlab), pod):
            for ip in (lb4, lb6):
                for proto in (Protocol.TCP, Protocol.UDP):
                    got[(host.name, str(ip), str(proto))] = probe(host.ns, proto, ip, 80)[0]
    assert {k: r.outcome for k, r in got.items()} == dict.fromkeys(got, Outcome.REFUSED), got


# -- 5: source ranges ----------------------------------------------------------------------


def test_source_ranges_admit_listed_sources_and_drop_others(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    client = client_of(tlab)
    second = v4("198.18.0.101")  # the client's second address, inside the lab space
    lb = v4("198.18.0.204")
    pods = tlab.pods
    dp = planes.make(node)

    def allow(src: IPAddress) -> DesiredState:
        return desired(
            node, frontend(lb, Protocol.TCP, 80, eps(pods, TCP_PORT), ranges=[f"{src}/32"])
        )

    def attempt(src: IPAddress) -> Result:
        return probe(client.ns, Protocol.TCP, lb, 80, source=src, timeout=DROP_TIMEOUT)[0]

    applied(dp.sync(allow(client.ip4), full=True), SyncMode.FULL)
    with routes(tlab, node, lb), address(client.ns, client.ifname, second):
        ok, blocked = attempt(client.ip4), attempt(second)
        assert isinstance(ok, Reply), ok
        assert ok.client_ip == masquerade_source(tlab, node, tlab.pod(ok.pod))
        assert blocked.outcome is Outcome.TIMEOUT, blocked
        # A delta moves the permission to the other source.
        applied(dp.sync(allow(second)), SyncMode.PARTIAL)
        ok, blocked = attempt(second), attempt(client.ip4)
        assert isinstance(ok, Reply), ok
        assert blocked.outcome is Outcome.TIMEOUT, blocked


# -- 6: session affinity -------------------------------------------------------------------


def test_client_ip_affinity_sticks_then_expires(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.205")
    timeout = 3
    sticky = frontend(lb, Protocol.TCP, 80, eps(tlab.pods, TCP_PORT), affinity=timeout)
    plain = frontend(lb, Protocol.TCP, 81, eps(tlab.pods, TCP_PORT))
    dp = planes.make(node)
    runner = planes.last_runner
    applied(dp.sync(desired(node, sticky, plain), full=True), SyncMode.FULL)
    client = client_of(tlab)
    with routes(tlab, node, lb):
        # Without affinity the same client spreads at once.
        assert len(pods_of(answered(probe(client.ns, Protocol.TCP, lb, 81, count=12)))) > 1
        first = answered(probe(client.ns, Protocol.TCP, lb, 80, count=12))
        assert len(pods_of(first)) == 1, [r.pod for r in first]
        assert_masqueraded(tlab, node, first)
        assert str(client.ip4) in affinity_clients(runner)

        seen = pods_of(first)

        def another_pod_after_expiry() -> bool:
            # Let the entry idle out (probing would refresh it), then open one connection.
            wait_until(
                lambda: str(client.ip4) not in affinity_clients(runner),
                WAIT,
                "the affinity entry to expire",
                interval=0.2,
            )
            reply = probe(client.ns, Protocol.TCP, lb, 80)[0]
            if not isinstance(reply, Reply):
                raise GiveUp(f"request after expiry failed: {reply}")
            seen.add(reply.pod)
            return len(seen) > 1

        wait_until(another_pod_after_expiry, 90.0, "a different pod after the affinity expired")
        assert seen <= names(tlab.pods)


# -- 7: UDP and SCTP -----------------------------------------------------------------------


def test_udp_spreads_and_replies(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.206")
    dp = planes.make(node)
    applied(
        dp.sync(desired(node, frontend(lb, Protocol.UDP, 53, eps(tlab.pods, UDP_PORT))), full=True),
        SyncMode.FULL,
    )
    with routes(tlab, node, lb):
        replies = answered(probe(client_of(tlab).ns, Protocol.UDP, lb, 53, count=48))
    assert pods_of(replies) == names(tlab.pods)
    assert_masqueraded(tlab, node, replies)


def test_sctp_frontend_is_programmed_and_serves_where_the_kernel_has_sctp(
    tlab: Lab, planes: Planes
) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.207")
    fe = frontend(lb, Protocol.SCTP, 9000, eps(tlab.pods, SCTP_PORT))
    dp = planes.make(node)
    runner = planes.last_runner
    applied(dp.sync(desired(node, fe), full=True), SyncMode.FULL)
    ext = elements(runner, L.named(L.EXT, 4))
    keys = [e[0]["concat"] for e in ext]
    assert [str(lb), "sctp", 9000] in keys, ext
    backends = elements(runner, f"{L.BACKENDS}4_{len(tlab.pods)}")
    assert len(backends) == len(tlab.pods), backends

    with routes(tlab, node, lb):
        result = probe(client_of(tlab).ns, Protocol.SCTP, lb, 9000)[0]
        if not tlab.sctp_served():
            assert isinstance(result, Failure), result
            assert errno.errorcode[errno.EPROTONOSUPPORT] in result.detail, result
            pytest.skip(
                "SCTP traffic not testable: this kernel has no SCTP (socket(AF_INET, "
                f"SOCK_STREAM, IPPROTO_SCTP) -> {result.detail}); the sctp frontend element "
                "is programmed (checked above)"
            )
        replies = answered(probe(client_of(tlab).ns, Protocol.SCTP, lb, 9000, count=24))
    assert pods_of(replies) <= names(tlab.pods) and len(pods_of(replies)) > 1
    assert_masqueraded(tlab, node, replies)


# -- 8: IPv6 -------------------------------------------------------------------------------


def test_ipv6_frontends_with_ipv6_endpoints(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    local = tlab.pods_on(node.name)
    lb = v6("2001:db8::208")
    fes = [
        frontend(lb, Protocol.TCP, 80, eps(tlab.pods, TCP_PORT, 6)),
        frontend(lb, Protocol.UDP, 53, eps(tlab.pods, UDP_PORT, 6)),
        frontend(
            lb,
            Protocol.TCP,
            81,
            eps(local, TCP_PORT, 6),
            cluster=eps(tlab.pods, TCP_PORT, 6),
            local_only=True,
        ),
    ]
    dp = planes.make(node)
    applied(dp.sync(desired(node, *fes), full=True), SyncMode.FULL)
    client = client_of(tlab)
    with routes(tlab, node, lb):
        tcp = answered(probe(client.ns, Protocol.TCP, lb, 80, count=40))
        udp = answered(probe(client.ns, Protocol.UDP, lb, 53, count=40))
        loc = answered(probe(client.ns, Protocol.TCP, lb, 81, count=12))
    assert pods_of(tcp) == names(tlab.pods)
    assert pods_of(udp) == names(tlab.pods)
    assert_masqueraded(tlab, node, tcp + udp, family=6)
    assert pods_of(loc) <= names(local)
    assert {r.client_ip for r in loc} == {client.ip6}


# -- 9: a removed endpoint's UDP flow moves ------------------------------------------------


def test_removed_endpoint_udp_flow_moves_only_with_conntrack_cleanup(
    tlab: Lab, planes: Planes
) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.209")
    pods = [tlab.pods[0], tlab.pods[2], tlab.pods[3]]
    ns = client_of(tlab).ns

    def flow(sport: int, count: int = 3) -> set[str]:
        """Return the pods that answered `count` datagrams sent from the fixed port `sport`."""
        return pods_of(answered(probe(ns, Protocol.UDP, lb, 53, count=count, source_port=sport)))

    def state_without(gone: str | None) -> DesiredState:
        keep = [p for p in pods if p.name != gone]
        return desired(node, frontend(lb, Protocol.UDP, 53, eps(keep, UDP_PORT)))

    with routes(tlab, node, lb):
        # Without conntrack cleanup the pinned flow keeps going to the removed endpoint.
        blind = planes.make(node, conntrack=False)
        applied(blind.sync(state_without(None), full=True), SyncMode.FULL)
        pinned = flow(40101)
        assert len(pinned) == 1, pinned
        (gone,) = pinned
        applied(blind.sync(state_without(gone)), SyncMode.PARTIAL)
        assert flow(40101, count=5) == {gone}, "the stale entry should still pin the flow"
        fresh = pods_of(answered(probe(ns, Protocol.UDP, lb, 53, count=12)))
        assert gone not in fresh, "new flows must not reach the removed endpoint"

        # The agent's Dataplane deletes the stale entry, so the same 5-tuple moves.
        dp = planes.make(node)
        applied(dp.sync(state_without(None), full=True), SyncMode.FULL)
        pinned = flow(40102)
        assert len(pinned) == 1, pinned
        (gone,) = pinned
        result = applied(dp.sync(state_without(gone)), SyncMode.PARTIAL)
        assert result.conntrack_deleted >= 1, result

        moved: set[str] = set()

        def answered_elsewhere() -> bool:
            moved.update(flow(40102, count=1))
            return bool(moved - {gone})

        wait_until(answered_elsewhere, WAIT, f"the flow from port 40102 to leave {gone}")
        after = flow(40102, count=5)
        assert len(after) == 1 and gone not in after, after
        assert after <= names(pods)


# -- 10: held IP ---------------------------------------------------------------------------


def test_held_ip_drops_undeclared_ports_and_answers_ping(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.211")
    fe = frontend(lb, Protocol.TCP, 80, eps(tlab.pods, TCP_PORT))
    dp = planes.make(node)
    applied(dp.sync(desired(node, fe, held=[lb]), full=True), SyncMode.FULL)
    client = client_of(tlab).ns
    # The announcer will put the IP on the node's interface; here the test does it.
    with routes(tlab, node, lb), address(node.ns, node.ifname, lb):
        reply = answered(probe(client, Protocol.TCP, lb, 80))[0]
        assert reply.pod in names(tlab.pods)
        undeclared = probe(client, Protocol.TCP, lb, 81, timeout=DROP_TIMEOUT)
        undeclared += probe(client, Protocol.UDP, lb, 81, timeout=DROP_TIMEOUT)
        undeclared += probe(client, Protocol.UDP, lb, 80, timeout=DROP_TIMEOUT)
        assert outcomes(undeclared) == [Outcome.TIMEOUT] * 3, undeclared

        def ping() -> bool:
            cmd = ["ping", "-c", "1", "-W", "2", str(lb)]
            return netns.run(client, cmd, check=False).returncode == 0

        wait_until(ping, WAIT, f"{lb} to answer ping", interval=0.2)


# -- 11: two frontends on one IP -----------------------------------------------------------


def test_two_frontends_on_one_ip_reach_their_own_targets(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.212")
    web = [tlab.pods[0], tlab.pods[2]]
    dns = [tlab.pods[1], tlab.pods[3]]
    fes = [
        frontend(lb, Protocol.TCP, 80, eps(web, TCP_PORT)),
        frontend(lb, Protocol.UDP, 53, eps(dns, UDP_PORT)),
    ]
    dp = planes.make(node)
    applied(dp.sync(desired(node, *fes), full=True), SyncMode.FULL)
    client = client_of(tlab).ns
    with routes(tlab, node, lb):
        tcp = answered(probe(client, Protocol.TCP, lb, 80, count=20))
        udp = answered(probe(client, Protocol.UDP, lb, 53, count=20))
    assert pods_of(tcp) == names(web)
    assert pods_of(udp) == names(dns)


# -- 12: coexistence with a kube-proxy-like table ------------------------------------------

OTHER_TABLE = "inet kubeproxylike"


def nft_cli(ns: str, *args: str, stdin: str | None = None) -> str:
    """Return the output of the nft command line inside lab namespace `ns`."""
    return netns.run(ns, ["nft", *args], input=stdin).stdout


def test_coexists_with_a_kube_proxy_like_table(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[1]
    ours, theirs = tlab.pods_on(node.name)
    lb = v4("198.18.0.213")
    other = (
        f"add table {OTHER_TABLE}\n"
        f"add chain {OTHER_TABLE} services "
        "{ type nat hook prerouting priority dstnat ; policy accept ; }\n"
        f"add rule {OTHER_TABLE} services ip daddr {lb} tcp dport 80 counter\n"
        f"add rule {OTHER_TABLE} services ip daddr {lb} tcp dport 80 "
        f"dnat ip to {theirs.ip4}:{TCP_PORT}\n"
    )
    nft_cli(node.ns, "-f", "-", stdin=other)

    def listing() -> str:
        return nft_cli(node.ns, "-s", "list", "table", *OTHER_TABLE.split())

    before = listing()
    client = client_of(tlab).ns
    dp = planes.make(node)
    try:
        with routes(tlab, node, lb):
            # Before nodelb, the kube-proxy-like table serves the IP.
            assert pods_of(answered(probe(client, Protocol.TCP, lb, 80, count=4))) == {theirs.name}
            one = frontend(lb, Protocol.TCP, 80, eps([ours], TCP_PORT))
            applied(dp.sync(desired(node, one), full=True), SyncMode.FULL)
            assert listing() == before
            assert pods_of(answered(probe(client, Protocol.TCP, lb, 80, count=12))) == {ours.name}

            extra = frontend(lb, Protocol.UDP, 53, eps([ours, theirs], UDP_PORT))
            applied(dp.sync(desired(node, one, extra)), SyncMode.PARTIAL)
            assert listing() == before
            applied(dp.sync(desired(node, one)), SyncMode.PARTIAL)
            assert listing() == before
            assert pods_of(answered(probe(client, Protocol.TCP, lb, 80, count=12))) == {ours.name}

            dp.cleanup()
            assert planes.last_runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME) is None
            assert listing() == before
            assert pods_of(answered(probe(client, Protocol.TCP, lb, 80, count=8))) == {theirs.name}
            # Its counter did count: the table is the same one, only its state moved.
            assert "packets 0 " not in nft_cli(node.ns, "list", "table", *OTHER_TABLE.split())
    finally:
        netns.run(node.ns, ["nft", "delete", "table", *OTHER_TABLE.split()], check=False)
        dp.cleanup()


# -- 13: takeover by a restarted agent -----------------------------------------------------

_LOOP = r"""
import json, os, socket, sys
ip, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while not os.path.exists(stop):
    try:
        with socket.create_connection((ip, port), timeout=5) as s:
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        out = {"line": data.decode()} if data else {"error": "closed without an answer"}
    except OSError as e:
        out = {"error": repr(e)}
    print(json.dumps(out), flush=True)
"""


TAKEOVER_SYNCS = 10


def loop_results(log: str) -> list[dict[str, str]]:
    """Return the complete JSON lines the probe loop has written so far."""
    out: list[dict[str, str]] = []
    for line in log.splitlines(keepends=True):
        if line.endswith("\n") and line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_restarted_agent_takes_over_without_a_gap(tlab: Lab, planes: Planes) -> None:
    node = tlab.nodes[0]
    lb = v4("198.18.0.214")
    want = desired(node, frontend(lb, Protocol.TCP, 80, eps(tlab.pods, TCP_PORT)))
    old = planes.make(node)
    applied(old.sync(want, full=True), SyncMode.FULL)
    stop = Path(tlab.workdir) / "takeover.stop"
    stop.unlink(missing_ok=True)
    client = client_of(tlab)
    with routes(tlab, node, lb):
        proc = tlab.spawn(
            client.ns,
            [sys.executable, "-I", "-c", _LOOP, str(lb), "80", str(stop)],
            log_name="takeover-loop",
        )
        try:

            def results_beyond(n: int) -> Callable[[], bool]:
                def check() -> bool:
                    if proc.poll() is not None:
                        raise GiveUp(f"probe loop exited: {tlab.log_of(proc)}")
                    return len(loop_results(tlab.log_of(proc))) >= n

                return check

            wait_until(results_beyond(20), WAIT, "20 probes before the takeover")
            new = planes.make(node)  # the restarted agent: no mirror, so a full sync
            assert new.next_full
            # Its first sync, then more full resyncs, each with probes on both sides of it.
            for _ in range(TAKEOVER_SYNCS):
                seen = len(loop_results(tlab.log_of(proc)))
                applied(new.sync(want, full=True), SyncMode.FULL)
                wait_until(results_beyond(seen + 10), WAIT, "10 probes after a full sync")
            stop.touch()
            wait_until(lambda: proc.poll() is not None, WAIT, "the probe loop to stop")
        finally:
            stop.touch()
            tlab.stop(proc)
    # The log is gone once the lab forgets the process; read it from the file.
    results = loop_results((Path(tlab.workdir) / "logs" / "takeover-loop.log").read_text())
    failed = [r for r in results if "line" not in r]
    assert not failed, f"{len(failed)} of {len(results)} probes failed: {failed[:5]}"
    assert len(results) >= 20 + 10 * TAKEOVER_SYNCS
    assert {r["line"].split()[0] for r in results} <= names(tlab.pods)


# -- 14: tamper repair -----------------------------------------------------------------------


def _dispatch_dnat_handle(node: LabNode, chain: str) -> str:
    """Return the handle of the DNAT rule in dispatch chain `chain` (nft -a)."""
    out = netns.run(node.ns, ["nft", "-a", "list", "chain", "inet", "nodelb", chain]).stdout
    for line in out.splitlines():
        if "dnat" in line and "# handle" in line:
            return line.rsplit("# handle", 1)[1].strip()
    raise AssertionError(f"no dnat rule in {chain}: {out}")


TAMPERING: dict[str, Callable[[LabNode, str], list[list[str]]]] = {
    "table": lambda node, lb: [["delete", "table", "inet", "nodelb"]],
    "rule": lambda node, lb: [
        ["insert", "rule", "inet", "nodelb", L.FILTER_PREROUTING, "ip", "daddr", lb, "drop"]
    ],
    "rule-replaced": lambda node, lb: [
        [
            "replace",
            "rule",
            "inet",
            "nodelb",
            "ep4_2",
            "handle",
            _dispatch_dnat_handle(node, "ep4_2"),
            "drop",
        ]
    ],
    "element-map-flushed": lambda node, lb: [["flush", "map", "inet", "nodelb", "ext4"]],
    "element": lambda node, lb: [
        ["delete", "element", "inet", "nodelb", "ext4", "{", lb, ".", "tcp", ".", "8080", "}"]
    ],
}


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param("table", id="the table deleted"),
        pytest.param("rule", id="a foreign drop rule inserted"),
        pytest.param("rule-replaced", id="a dispatch rule replaced in place by a drop"),
        pytest.param("element-map-flushed", id="the external verdict map flushed"),
        pytest.param("element", id="the frontend's verdict element deleted"),
    ],
)
def test_a_foreign_change_is_repaired_from_the_mirror_with_traffic_back(
    tlab: Lab, planes: Planes, tamper: str
) -> None:
    """Someone else's `nft` on the nodelb table: the guard sees the foreign generation and
    rewrites the table from the mirror, without waiting for a drift check (none runs here)."""

    node = tlab.nodes[0]
    lb = v4("198.18.0.240")
    want = desired(node, frontend(lb, Protocol.TCP, TCP_PORT, eps(tlab.pods[:2], TCP_PORT)))
    sender = NetlinkElementSender.in_namespace(node.ns)
    dp = Dataplane(planes.runner(node), elements=sender)
    stop = threading.Event()
    guard = TamperGuard(dp, monitor=lambda: agent_netns.call_in(node.ns, TableMonitor.open))
    thread = threading.Thread(target=guard.run, args=(stop,), daemon=True)
    label = {"object": tamper.partition("-")[0]}
    before = REGISTRY.get_sample_value("nodelb_nft_foreign_changes_total", label) or 0.0
    try:
        applied(dp.sync(want, full=True), SyncMode.FULL)
        thread.start()
        assert guard.ready.wait(WAIT), "the guard could not subscribe"
        with routes(tlab, node, lb):
            answered(probe(client_of(tlab).ns, Protocol.TCP, lb, TCP_PORT, count=3))
            for argv in TAMPERING[tamper](node, str(lb)):
                netns.run(node.ns, ["nft", *argv])
            tampered = time.monotonic()
            wait_until(lambda: guard.repairs >= 1, WAIT, "the guard repairs the table")
            wait_until(
                lambda: (
                    not expected(want).differences(
                        from_json(planes.last_runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME))
                    )
                ),
                WAIT,
                "the table is the mirror's again",
            )
            answered(probe(client_of(tlab).ns, Protocol.TCP, lb, TCP_PORT, count=3))
            # Reported, not asserted (timings belong to benchmarks): docs/dataplane.md.
            print(f"{tamper}: repaired and answering {time.monotonic() - tampered:.3f} s after")
        after = REGISTRY.get_sample_value("nodelb_nft_foreign_changes_total", label) or 0.0
        assert after > before, f"no foreign {label['object']} change counted"
        assert guard.foreign >= 1 and guard.checks == 0
    finally:
        stop.set()
        thread.join(timeout=10)
        sender.close()


def test_the_agents_own_syncs_are_never_taken_for_tampering(tlab: Lab, planes: Planes) -> None:
    """Full and partial syncs, over libnftables and netlink, from this process: the guard sees
    every batch touch the table and repairs none."""

    node = tlab.nodes[0]
    lb = v4("198.18.0.241")
    states = [
        desired(node, frontend(lb, Protocol.TCP, TCP_PORT, eps(tlab.pods[: n + 1], TCP_PORT)))
        for n in range(3)
    ]
    sender = NetlinkElementSender.in_namespace(node.ns)
    dp = Dataplane(planes.runner(node), elements=sender)
    stop = threading.Event()
    guard = TamperGuard(dp, monitor=lambda: agent_netns.call_in(node.ns, TableMonitor.open))
    thread = threading.Thread(target=guard.run, args=(stop,), daemon=True)
    try:
        thread.start()
        assert guard.ready.wait(WAIT), "the guard could not subscribe"
        applied(dp.sync(states[0], full=True), SyncMode.FULL)
        for s in (*states[1:], states[0], states[2]):
            assert dp.sync(s).ok
        dp.request_full()
        assert dp.sync(states[1]).ok
        wait_until(lambda: guard.seen >= 6, WAIT, "the guard sees every sync's batch")
        assert (guard.foreign, guard.repairs, guard.checks) == (0, 0, 0)
    finally:
        stop.set()
        thread.join(timeout=10)
        sender.close()
