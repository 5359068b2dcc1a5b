"""nodelb agents in a lab cluster (real kube-apiserver, real kube-proxy in nftables mode),
proven with real traffic from the client: which pod answered, and which source it saw.

kube-proxy also serves IPv4 LoadBalancer IPs (ipMode VIP) and externalIPs of these
single-stack IPv4 Services; nodelb's DNAT runs first (priority dstnat - 10), so IPv4 traffic
checks the two together. The IPv6 ingress IPs are served by nodelb alone (kube-proxy ignores
an IPv6 ingress IP on an IPv4-only Service), so every IPv6 check is nodelb's own. Each test
uses its own Service names and IPs, and removes them (and the client's routes) at the end.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from agent.model.net import IPAddress
from agent.node.status_document import parse_status
from agent.status_command import render_table
from lab import client
from lab.client import Failure, Outcome, Reply
from lab.cluster import ClusterLab, SvcPort, tcp_port
from lab.topology import CLIENT4, CLIENT6, gateway_addresses, node_addresses
from lab.wait import wait_until

pytestmark = pytest.mark.e2e

OTHER_CLASS = "example.com/other-lb"
ALLOWED_EXTERNAL = ["198.18.0.195", "2001:db8::1c5"]  # in the allow-list, outside the pool
OUTSIDE_EXTERNAL = ["198.18.0.160", "2001:db8::160"]  # outside the allow-list
BATCH = 24  # requests per batch (converge adds 16 per expected pod)
CONVERGE = 60.0  # deadline for agents to reflect an API change in traffic
PROBE_TIMEOUT = 2.0
DROP_TIMEOUT = 0.5
SIGTERM_DEADLINE = 20.0  # the agent joins its threads with 5 s timeouts each
HTTP = tcp_port(80)
CLIENT_SOURCES: tuple[IPAddress, IPAddress] = (CLIENT4, CLIENT6)


@pytest.fixture(scope="module")
def cluster_agent_config() -> dict[str, Any]:
    """Allow externalIPs in 198.18.0.192/26 and 2001:db8::1c0 - ::3ff (overlapping the
    pools .200-.250 and ::200-::250)."""
    return {"externalIPCIDRs": ["198.18.0.192/26", "2001:db8::1c0/122", "2001:db8::200/119"]}


@dataclass(frozen=True, slots=True)
class Seen:
    """What a batch of requests got: answers by pod, client addresses seen, failures."""

    pods: Counter[str]
    sources: frozenset[IPAddress]
    failures: tuple[Failure, ...]

    @property
    def pod_set(self) -> set[str]:
        return set(self.pods)


def probe(
    cluster: ClusterLab,
    ip: str,
    *,
    via: str,
    count: int = BATCH,
    port: int = 80,
    timeout: float = PROBE_TIMEOUT,
) -> Seen:
    """Route `ip` from the client via node `via`; return what `count` TCP requests got."""
    cluster.route_lb_via(ip, via)
    results = client.tcp_requests(
        cluster.client_ns, ipaddress.ip_address(ip), port, count, timeout=timeout
    )
    replies = [r for r in results if isinstance(r, Reply)]
    return Seen(
        pods=Counter(r.pod for r in replies),
        sources=frozenset(r.client_ip for r in replies),
        failures=tuple(r for r in results if isinstance(r, Failure)),
    )


def converge(cluster: ClusterLab, ip: str, *, via: str, pods: set[str]) -> Seen:
    """Wait until a small batch through `via` is answered in full, only by `pods`; return
    a fresh, larger batch taken afterwards, for the caller to assert on."""

    def settled() -> bool:
        seen = probe(cluster, ip, via=via, count=8)
        return not seen.failures and seen.pod_set <= pods

    wait_until(settled, CONVERGE, f"{ip} via {via} to be served by {sorted(pods)}", interval=0.2)
    # Enough requests that each of the pods answers at least once (miss chance < 1e-7).
    return probe(cluster, ip, via=via, count=BATCH + 16 * len(pods))


def assert_served(seen: Seen, pods: set[str], sources: set[IPAddress]) -> None:
    """Every request answered, by exactly `pods` (each at least once), seeing `sources`."""
    assert not seen.failures, f"failed requests: {seen.failures}"
    assert seen.pod_set == pods, f"answered by {dict(seen.pods)}, expected {sorted(pods)}"
    assert seen.sources == sources, f"pods saw {sorted(map(str, seen.sources))}"


def pods_on(cluster: ClusterLab, *nodes: str) -> set[str]:
    return {p.name for n in nodes for p in cluster.lab.pods_on(n)}


def masq(node_k: int, *, local: bool, family: int = 4) -> IPAddress:
    """Return the source a pod sees for masqueraded traffic entering node k: the node's
    pod-bridge address for its own pods, its segment address for pods on other nodes."""
    pair = gateway_addresses(node_k) if local else node_addresses(node_k)
    return pair[0] if family == 4 else pair[1]


@pytest.fixture
def cleanup(cluster: ClusterLab) -> Iterator[list[tuple[str, Sequence[str]]]]:
    """Collect (service, ips) to delete and unroute after the test, pass or fail."""
    created: list[tuple[str, Sequence[str]]] = []
    yield created
    errors: list[Exception] = []
    for name, ips in created:
        for ip in ips:
            cluster.unroute_lb(ip)
        try:
            cluster.delete_service(name)
        except Exception as exc:  # keep cleaning up; report the first failure at the end
            errors.append(exc)
    if errors:
        raise errors[0]


def serve(
    cluster: ClusterLab,
    cleanup: list[tuple[str, Sequence[str]]],
    name: str,
    ips: Sequence[str],
    pods: Sequence[str],
    *,
    hints: Any = None,
    ports: Sequence[SvcPort] = (HTTP,),
    **kwargs: Any,
) -> None:
    """Create Service `name` with LoadBalancer `ips`, write its slices, and wait until every
    node's rules have them (out of `noep`: a node that had not seen the slices yet would
    refuse the first requests)."""
    cleanup.append((name, ips))
    cluster.create_service(name, ports=ports, lb_ip=list(ips), **kwargs)
    cluster.write_endpointslices(name, pods, hints=hints)
    for ip in ips:
        cluster.wait_rules(ip, ports[0].port, protocol=ports[0].protocol, with_endpoints=bool(pods))


def wait_event(
    cluster: ClusterLab, service: str, reason: str, *, naming: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Wait until every node's agent has posted a Warning Event `reason` about `service`,
    and, for each string in `naming`, some Event names it (an agent posts one Event per
    refused address, one after another, after the sync that decided it); return the Events."""
    every_node = {n.name for n in cluster.nodes}

    def from_every_node() -> list[dict[str, Any]]:
        events = cluster.events_for(service, reason=reason)
        if not {e["source"]["host"] for e in events} >= every_node:
            return []
        named = all(any(s in e["message"] for e in events) for s in naming)
        return events if named else []

    events = wait_until(
        from_every_node, CONVERGE, f"{reason} Events on {service} from every node", interval=0.2
    )
    uid = cluster.read_service(service)["metadata"]["uid"]
    for event in events:
        assert event["type"] == "Warning"
        assert event["involvedObject"]["uid"] == uid
    return events


def test_prefer_same_node_keeps_traffic_on_the_entry_node_then_falls_back(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    ips = ["198.18.0.201", "2001:db8::201"]
    every_pod = sorted(p.name for p in cluster.lab.pods)
    serve(
        cluster,
        cleanup,
        "same-node",
        ips,
        every_pod,
        hints="node",
        traffic_distribution="PreferSameNode",
    )
    for fam, ip in zip((4, 6), ips, strict=True):
        seen = converge(cluster, ip, via="node-1", pods=pods_on(cluster, "node-1"))
        assert_served(seen, pods_on(cluster, "node-1"), {masq(1, local=True, family=fam)})

    # The controller drops node-1's pods and recomputes the hints: forNodes no longer names
    # node-1, so node-1 falls back to its zone's endpoints (the forZones hints, KEP-3015).
    rest = sorted(set(every_pod) - pods_on(cluster, "node-1"))
    cluster.write_endpointslices("same-node", rest, hints="node")
    for fam, ip in zip((4, 6), ips, strict=True):
        seen = converge(cluster, ip, via="node-1", pods=pods_on(cluster, "node-3"))
        assert_served(seen, pods_on(cluster, "node-3"), {masq(1, local=False, family=fam)})
    # node-2 still has its own pods, and keeps its traffic.
    seen = converge(cluster, ips[0], via="node-2", pods=pods_on(cluster, "node-2"))
    assert_served(seen, pods_on(cluster, "node-2"), {masq(2, local=True)})


def test_prefer_same_zone_keeps_traffic_in_the_entry_nodes_zone(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    ips = ["198.18.0.202", "2001:db8::202"]
    serve(
        cluster,
        cleanup,
        "same-zone",
        ips,
        sorted(p.name for p in cluster.lab.pods),
        hints="zone",
        traffic_distribution="PreferSameZone",
    )
    zone_a = pods_on(cluster, "node-1", "node-3")
    for fam, ip in zip((4, 6), ips, strict=True):
        seen = converge(cluster, ip, via="node-1", pods=zone_a)
        # node-1's own pods see its bridge address, node-3's pods its segment address.
        assert_served(
            seen,
            zone_a,
            {masq(1, local=True, family=fam), masq(1, local=False, family=fam)},
        )
    seen = converge(cluster, ips[1], via="node-2", pods=pods_on(cluster, "node-2"))
    assert_served(seen, pods_on(cluster, "node-2"), {masq(2, local=True, family=6)})


def test_local_policy_preserves_the_client_source_and_stays_on_the_entry_node(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    ips = ["198.18.0.203", "2001:db8::203"]
    serve(cluster, cleanup, "local", ips, ["pod-1-1", "pod-2-1"], policy="Local")
    for via, pod in (("node-1", "pod-1-1"), ("node-2", "pod-2-1")):
        for ip, source in zip(ips, CLIENT_SOURCES, strict=True):
            seen = converge(cluster, ip, via=via, pods={pod})
            assert_served(seen, {pod}, {source})
    # node-3 has no local endpoint: external traffic entering it is dropped, not forwarded.
    for ip in ips:
        seen = probe(cluster, ip, via="node-3", count=2, timeout=DROP_TIMEOUT)
        assert not seen.pods, f"node-3 forwarded Local traffic to {dict(seen.pods)}"
        assert {f.outcome for f in seen.failures} == {Outcome.TIMEOUT}


def test_status_reports_frontends_with_their_endpoint_counts(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    """`GET /status` (what `nodelb status` reads) parses and names what the node programmed."""
    serve(cluster, cleanup, "stat", ["198.18.0.204"], ["pod-1-1", "pod-2-1", "pod-2-2"])

    def endpoints_programmed() -> Any:
        code, body = cluster.agent_get("node-2", "/status")
        assert code == 200
        status = parse_status(json.loads(body))
        mine = [f for f in status.frontends if f.service == "default/stat"]
        counts = [(str(f.ip), f.port, f.endpoints, f.local_endpoints) for f in mine]
        # The frontend may first be programmed before its slice arrives (no endpoints yet).
        return status if counts == [("198.18.0.204", 80, 3, 2)] else None

    status = wait_until(endpoints_programmed, CONVERGE, "/status to show the 3 endpoints")
    assert status.node == "node-2"
    assert status.last_sync.result.value == "ok"
    assert "default/stat" in render_table(status)


def test_external_ips_are_served_only_when_allowed(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    # Allowed: inside externalIPCIDRs and outside every pool.
    cleanup.append(("ext-allowed", ALLOWED_EXTERNAL))
    cluster.create_service("ext-allowed", ports=[HTTP], lb_ip=None, external_ips=ALLOWED_EXTERNAL)
    cluster.write_endpointslices("ext-allowed", ["pod-2-1", "pod-3-1"])
    for fam, ip in zip((4, 6), ALLOWED_EXTERNAL, strict=True):
        cluster.wait_rules(ip, 80)
        seen = converge(cluster, ip, via="node-1", pods={"pod-2-1", "pod-3-1"})
        assert_served(seen, {"pod-2-1", "pod-3-1"}, {masq(1, local=False, family=fam)})

    # Refused: outside the allow-list. No rule anywhere, a Warning Event per address, and no
    # answer (checked on IPv6, which kube-proxy does not serve for this IPv4 Service; on
    # IPv4 kube-proxy serves every externalIP, which is its business, not nodelb's).
    cleanup.append(("ext-outside", OUTSIDE_EXTERNAL))
    cluster.create_service("ext-outside", ports=[HTTP], lb_ip=None, external_ips=OUTSIDE_EXTERNAL)
    cluster.write_endpointslices("ext-outside", ["pod-1-1"])
    wait_event(cluster, "ext-outside", "ExternalIPRefused", naming=OUTSIDE_EXTERNAL)
    for ip in OUTSIDE_EXTERNAL:
        for node in cluster.nodes:
            assert not cluster.has_rule(node.name, ip, 80), f"{node.name} programmed {ip}"
    seen = probe(cluster, OUTSIDE_EXTERNAL[1], via="node-1", count=2, timeout=DROP_TIMEOUT)
    assert not seen.pods, f"refused {OUTSIDE_EXTERNAL[1]} answered by {dict(seen.pods)}"

    # Refused: a pool address allocated to another Service (CVE-2020-8554). nodelb keeps
    # serving the owner; the hijacking Service's pod never answers on that IP.
    victim_ips = ["198.18.0.210", "2001:db8::210"]
    serve(cluster, cleanup, "ext-victim", victim_ips, ["pod-1-2"])
    cleanup.append(("ext-hijack", victim_ips))
    cluster.create_service("ext-hijack", ports=[HTTP], lb_ip=None, external_ips=victim_ips)
    cluster.write_endpointslices("ext-hijack", ["pod-3-2"])
    events = wait_event(cluster, "ext-hijack", "ExternalIPRefused")
    assert all("default/ext-victim" in e["message"] for e in events), events
    for fam, ip in zip((4, 6), victim_ips, strict=True):
        seen = probe(cluster, ip, via="node-2")
        assert_served(seen, {"pod-1-2"}, {masq(2, local=False, family=fam)})


def test_services_of_another_class_are_left_alone(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    other = ["198.18.0.204", "2001:db8::204"]
    cleanup.append(("other-class", other))
    cluster.create_service("other-class", ports=[HTTP], lb_ip=other, lb_class=OTHER_CLASS)
    cluster.write_endpointslices("other-class", ["pod-1-1"])
    # A barrier: a Service of ours created afterwards. Services reach each agent through one
    # ordered watch, so once its rules are everywhere the other-class one has been seen too.
    serve(cluster, cleanup, "other-barrier", ["198.18.0.205"], ["pod-1-1"])
    for node in cluster.nodes:
        for ip in other:
            assert not cluster.has_rule(node.name, ip, 80), f"{node.name} programmed {ip}"
    assert cluster.events_for("other-class") == []
    # nodelb alone serves IPv6 ingress here (see the module docstring): nothing answers.
    seen = probe(cluster, other[1], via="node-1", count=2, timeout=DROP_TIMEOUT)
    assert not seen.pods


def test_a_malformed_service_gets_a_warning_and_others_keep_being_served(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    good = ["198.18.0.206", "2001:db8::206"]
    serve(cluster, cleanup, "healthy", good, ["pod-2-2"])
    # The API accepts slices whose port names match none of the Service's: nodelb refuses.
    bad = ["198.18.0.207"]
    cleanup.append(("bad-ports", bad))
    cluster.create_service("bad-ports", ports=[HTTP], lb_ip=bad)
    cluster.write_endpointslices(
        "bad-ports", ["pod-1-1"], ports=[SvcPort(name="web", port=80, target_port=8080)]
    )
    events = wait_event(cluster, "bad-ports", "EndpointPortMismatch")
    assert all("'http'" in e["message"] for e in events), events
    seen = probe(cluster, bad[0], via="node-1", count=2, timeout=DROP_TIMEOUT)
    assert not seen.pods, f"the mismatched port was served by {dict(seen.pods)}"
    # The other Service is still served, and still follows changes.
    for ip in good:
        assert_served(
            probe(cluster, ip, via="node-1"),
            {"pod-2-2"},
            {masq(1, local=False, family=ipaddress.ip_address(ip).version)},
        )
    cluster.write_endpointslices("healthy", ["pod-3-1"])
    seen = converge(cluster, good[1], via="node-1", pods={"pod-3-1"})
    assert_served(seen, {"pod-3-1"}, {masq(1, local=False, family=6)})


def test_agents_catch_up_after_an_apiserver_restart(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    ips = ["198.18.0.208", "2001:db8::208"]
    trio = ["pod-1-1", "pod-2-1", "pod-3-1"]
    serve(cluster, cleanup, "restart", ips, trio)
    doomed = ["198.18.0.209"]
    serve(cluster, cleanup, "restart-doomed", doomed, ["pod-1-1"])
    for node in cluster.nodes:
        converge(cluster, ips[1], via=node.name, pods=set(trio))
    pids = cluster.agent_pids

    cluster.stop_controlplane()
    try:
        # Without the API the tables stay: traffic is still served.
        seen = probe(cluster, ips[1], via="node-2")
        assert not seen.failures and seen.pods, f"while the API was down: {seen}"
        assert seen.pod_set <= set(trio)
    finally:
        cluster.start_controlplane()

    cluster.write_endpointslices("restart", ["pod-1-1", "pod-3-1"])
    cluster.delete_service("restart-doomed")
    for node in cluster.nodes:  # every agent, not only one, must drop pod-2-1
        for ip in ips:
            seen = converge(cluster, ip, via=node.name, pods={"pod-1-1", "pod-3-1"})
            assert not seen.failures
            assert seen.pod_set == {"pod-1-1", "pod-3-1"}, f"via {node.name}: {dict(seen.pods)}"
    removed = cluster.lab.pod("pod-2-1")
    for node in cluster.nodes:  # and no table keeps it as a backend (no stale endpoint)
        table = json.dumps(cluster.nodelb_table(node.name))
        assert f'"{removed.ip4}"' not in table and f'"{removed.ip6}"' not in table, node.name
    cluster.wait_rules(doomed[0], 80, expect_present=False)
    assert cluster.agent_pids == pids, "an agent restarted instead of reconnecting"
    for node in cluster.nodes:
        assert cluster.agent_get(node.name, "/readyz")[0] == 200


def test_a_restarted_agent_takes_over_its_table(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    ips = ["198.18.0.211", "2001:db8::211"]
    serve(cluster, cleanup, "takeover", ips, ["pod-1-1", "pod-2-1"])
    converge(cluster, ips[1], via="node-1", pods={"pod-1-1", "pod-2-1"})
    cluster.stop_agent("node-1")
    try:
        # The table outlives its agent: traffic entering node-1 is still served.
        seen = probe(cluster, ips[1], via="node-1")
        assert not seen.failures and seen.pod_set <= {"pod-1-1", "pod-2-1"}, seen
        # A change made while node-1 has no agent reaches the other nodes...
        cluster.write_endpointslices("takeover", ["pod-2-1"])
        converge(cluster, ips[1], via="node-3", pods={"pod-2-1"})
    finally:
        cluster.start_agent("node-1")
    # ...and node-1's new agent applies it when it takes the table over.
    for fam, ip in zip((4, 6), ips, strict=True):
        seen = converge(cluster, ip, via="node-1", pods={"pod-2-1"})
        assert_served(seen, {"pod-2-1"}, {masq(1, local=False, family=fam)})


def test_an_agent_exits_on_sigterm(cluster: ClusterLab) -> None:
    pid = cluster.agent_pids["node-3"]
    os.killpg(pid, signal.SIGTERM)
    try:
        wait_until(
            lambda: "node-3" not in cluster.agent_pids, SIGTERM_DEADLINE, "node-3's agent to exit"
        )
    finally:
        cluster.restart_agent("node-3")
