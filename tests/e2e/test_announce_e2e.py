"""The announcer end to end: agents elect a holder with VRRP, the client follows takeovers.

The lab cluster (3 nodes, 2 pods each, real apiserver, kube-proxy in nftables mode) runs every
agent with `announce` on and 200 ms adverts. LoadBalancer IPs come from the client's own
segment (198.18.0.x, 2001:db8::x), so nothing routes them: the client resolves them with ARP /
ND and reaches whichever node answers — the holder, by its gratuitous announcements. Real
traffic and real neighbour tables are the proof.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from agent.announce.ownership import IPUse, NodeState, OwnershipConfig, ServiceUse, plan
from agent.model.net import IPAddress
from lab import client, netns
from lab.cluster import LAB_ANNOUNCE, ClusterLab, frontend_keys, tcp_port
from lab.controllers import NAMESPACE, ControllerSet
from lab.requestloop import RequestLoop, failed, outage
from lab.topology import LabNode
from lab.vrrp_lab import holds, mac_of, neighbour_mac
from lab.wait import wait_until

pytestmark = pytest.mark.e2e

HTTP = tcp_port(80)
TAKEOVER = 20.0  # deadline for a takeover to be visible (Master_Down is under 1 s here)
CONVERGE = 60.0


@pytest.fixture(scope="module")
def cluster_agent_config() -> dict[str, Any]:
    return LAB_ANNOUNCE


def holders(cluster: ClusterLab, ip: IPAddress) -> list[LabNode]:
    """Return the live nodes holding `ip` (a crashed node's addresses reach nobody)."""
    return [n for n in cluster.nodes if n.name not in cluster.crashed and holds(n, ip)]


def the_holder(cluster: ClusterLab, ip: IPAddress, *, not_: str | None = None) -> LabNode:
    """Wait until exactly one node (other than `not_`) holds `ip`; return it."""

    def one() -> LabNode | None:
        found = holders(cluster, ip)
        if len(found) == 1 and found[0].name != not_:
            return found[0]
        return None

    found = wait_until(one, TAKEOVER, f"exactly one node other than {not_} to hold {ip}")
    assert found is not None
    return found


def nobody_holds(cluster: ClusterLab, ip: IPAddress) -> bool:
    return not holders(cluster, ip)


def entry_names(cluster: ClusterLab, ip: IPAddress, node: LabNode) -> bool:
    """Return True when the client's neighbour entry for `ip` carries `node`'s MAC."""
    return neighbour_mac(cluster.client_ns, ip) == mac_of(node)


def answered(cluster: ClusterLab, ip: IPAddress, count: int = 8) -> bool:
    results = client.tcp_requests(cluster.client_ns, ip, 80, count, timeout=1.0)
    return any(isinstance(r, client.Reply) for r in results)


def served(cluster: ClusterLab, ip: IPAddress, count: int = 8) -> bool:
    results = client.tcp_requests(cluster.client_ns, ip, 80, count, timeout=1.0)
    return all(isinstance(r, client.Reply) for r in results)


def ranking(cluster: ClusterLab, ip: IPAddress) -> tuple[str, ...]:
    """Return the ranking of `ip`'s instance with every node Ready (the plan the agents run
    until a dead node turns NotReady): its preferred holder first, then the backups."""
    nodes = [NodeState(n.name, ready=True) for n in cluster.nodes]
    use = IPUse(ip, (ServiceUse("default/web", local=False),))
    (group,) = plan(nodes=nodes, ips=[use], config=OwnershipConfig()).groups
    return group.ranking


def settled(cluster: ClusterLab, ip: IPAddress, *, without: str | None = None) -> bool:
    """Return True when only the preferred holder holds `ip` and the client's entry names it.

    Every node is eligible for a Cluster-policy IP, so the preferred holder is the first of
    its bucket's ranking over all nodes (but `without`, a node that is gone, whose backup
    takes over). Until it holds
    the IP the election is still moving: the first Master of a new instance is whichever
    node's timer fired first, and the preferred node preempts it when its own fires (later if
    its agent saw the Service later). A test that counts failed requests starts from here,
    so that it measures a settled holder."""
    preferred = next(n for n in ranking(cluster, ip) if n != without)
    found = holders(cluster, ip)
    return [n.name for n in found] == [preferred] and entry_names(cluster, ip, found[0])


@pytest.fixture
def web(cluster: ClusterLab) -> Iterator[tuple[IPAddress, IPAddress]]:
    """A Cluster-policy Service on 198.18.0.210 / 2001:db8::210 with a pod on every node,
    served, with each IP on its preferred holder and the client's entry naming it."""
    ips = (ipaddress.ip_address("198.18.0.210"), ipaddress.ip_address("2001:db8::210"))
    cluster.create_service("web", ports=[HTTP], lb_ip=[str(i) for i in ips])
    cluster.write_endpointslices("web", list(WEB_PODS))
    try:
        for ip in ips:
            the_holder(cluster, ip)
            wait_until(functools.partial(served, cluster, ip), CONVERGE, f"{ip} served")
            settle = functools.partial(settled, cluster, ip)
            wait_until(settle, CONVERGE, f"{ip} on its preferred holder, the client's entry too")
        yield ips
    finally:
        cluster.delete_service("web")
        for ip in ips:
            gone = functools.partial(nobody_holds, cluster, ip)
            wait_until(gone, CONVERGE, f"{ip} released")


def the_next_holder(cluster: ClusterLab, ip: IPAddress, old: LabNode) -> None:
    """Wait until the next node by rank alone holds `ip` and the client's entry names it.

    Waiting for any node but `old` is not enough: the two remaining backups' timers fire
    Skew_Time apart (under a millisecond here), so the lower one can hold the IP for a moment
    before the higher one takes it."""
    wait_until(
        functools.partial(settled, cluster, ip, without=old.name),
        TAKEOVER,
        f"{ip} on the next node after {old.name}, the client's entry too",
    )


WEB_PODS = ("pod-1-1", "pod-2-1", "pod-3-1")


def restart_stopped_agents(cluster: ClusterLab) -> None:
    """Start every stopped agent again, booting the crashed nodes first."""
    for node in cluster.nodes:
        if node.name in cluster.crashed:
            cluster.revive_node(node.name)
        elif node.name not in cluster.agent_pids:
            cluster.start_agent(node.name)


def drop_endpoints_of(cluster: ClusterLab, node: LabNode) -> None:
    """Take `node`'s pod out of web's endpoints, as the EndpointSlice controller does once a
    crashed node goes NotReady (the lab writes the slices itself, so the test does it): until
    then Cluster policy keeps sending a share of new connections to a pod nobody can reach."""
    cluster.write_endpointslices("web", [p for p in WEB_PODS if p != f"pod-{node.name[5:]}-1"])


def test_exactly_one_node_holds_each_ip_and_the_client_reaches_it_directly(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress]
) -> None:
    for ip in web:
        holder = the_holder(cluster, ip)
        assert settled(cluster, ip)  # the preferred holder, and the client's entry names it
        results = client.tcp_requests(cluster.client_ns, ip, 80, 24, timeout=1.0)
        failures = [r for r in results if not isinstance(r, client.Reply)]
        assert not failures, (
            f"{ip} held by {holder.name}: {len(failures)} of 24 requests failed: {results}; "
            f"holders now {[n.name for n in holders(cluster, ip)]}, client's entry "
            f"{neighbour_mac(cluster.client_ns, ip)}, "
            f"node MACs {[(n.name, mac_of(n)) for n in cluster.nodes]}"
        )
    events = wait_until(
        lambda: cluster.events_for("web", reason="IPAnnounced"), 30, "an IPAnnounced Event"
    )
    assert any("now announces 198.18.0.210" in e["message"] for e in events)
    # The holder reports the address as served (its rules are in place); its reporter writes
    # the Lease from its own thread, so the report may trail the takeover a little.
    coord = kclient.CoordinationV1Api(cluster.api)
    holder4 = the_holder(cluster, web[0])

    def reported() -> bool:
        lease = coord.read_namespaced_lease(f"nodelb-node-{holder4.name}", NAMESPACE)
        annotations = (lease.metadata.annotations or {}) if lease.metadata else {}
        return "198.18.0.210" in annotations.get("nodelb.io/serving-ips", "").split(",")

    wait_until(reported, 30, f"{holder4.name}'s report naming 198.18.0.210")
    code, body = cluster.agent_get(holder4.name, "/metrics")
    assert code == 200 and 'nodelb_vrrp_state{family="IPv4"' in body


def test_a_crash_of_the_holder_moves_the_ip_and_the_client_follows(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress], tmp_path: Path
) -> None:
    ip = web[0]
    old = the_holder(cluster, ip)
    # A 1 s timeout: the default 0.2 s is tight for client -> node -> pod on a loaded machine,
    # and the last request must be answered.
    loop = RequestLoop(cluster.client_ns, ip, 80, timeout=1.0, log=tmp_path / "requests.jsonl")
    loop.start()
    try:
        crashed_at = time.monotonic()
        cluster.crash_node(old.name)
        drop_endpoints_of(cluster, old)
        the_next_holder(cluster, ip, old)
        # A crash, not a handover: nothing on the dead node removed the address (a resigning
        # speaker removes it once the next holder advertises).
        assert holds(old, ip)
        # Served, and past the loop's 1 s timeout after the crash: the request in flight then
        # (its SYN went to the dead node) has failed, and one sent since has been answered.
        wait_until(
            lambda: time.monotonic() - crashed_at > 1.5 and served(cluster, ip),
            10,
            "service to resume",
        )
    finally:
        requests = loop.stop()
        restart_stopped_agents(cluster)
    assert requests and requests[-1].ok
    gap = outage(requests)
    print(f"crash outage: {gap * 1000:.0f} ms over {len(requests)} requests")
    assert gap < 5.0


def test_sigterm_hands_over_without_a_failed_request(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress], tmp_path: Path
) -> None:
    ip = web[0]
    old = the_holder(cluster, ip)
    loop = RequestLoop(cluster.client_ns, ip, 80, timeout=1.0, log=tmp_path / "requests.jsonl")
    loop.start()
    try:
        pid = cluster.agent_pids[old.name]
        os.kill(pid, signal.SIGTERM)
        the_next_holder(cluster, ip, old)
        wait_until(lambda: served(cluster, ip), 10, "service after the handover")
    finally:
        requests = loop.stop()
        cluster.stop_agent(old.name)  # reaps the exited process
        restart_stopped_agents(cluster)
    assert len(requests) > 10
    assert failed(requests) == 0, [r for r in requests if not r.ok][:5]


def test_local_policy_moves_the_ip_when_the_holders_last_local_endpoint_goes(
    cluster: ClusterLab,
) -> None:
    ip = ipaddress.ip_address("198.18.0.211")
    cluster.create_service("loc", ports=[HTTP], lb_ip=[str(ip)], policy="Local")
    try:
        cluster.write_endpointslices("loc", ["pod-1-1", "pod-2-1"])
        first = the_holder(cluster, ip)
        assert first.name in ("node-1", "node-2")
        other = "node-2" if first.name == "node-1" else "node-1"
        remaining = "pod-2-1" if other == "node-2" else "pod-1-1"
        cluster.write_endpointslices("loc", [remaining])
        moved = the_holder(cluster, ip, not_=first.name)
        assert moved.name == other
        wait_until(lambda: served(cluster, ip), CONVERGE, f"{ip} served by {other}")
    finally:
        cluster.delete_service("loc")


def test_failover_works_with_the_apiserver_stopped(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress]
) -> None:
    ip = web[0]
    old = the_holder(cluster, ip)
    cluster.stop_controlplane()
    try:
        cluster.crash_node(old.name)
        new = the_holder(cluster, ip, not_=old.name)
        # Without the API nobody takes the dead node's pod out of the endpoints, so a share
        # of new connections still goes there: answered, not every request served.
        wait_until(
            lambda: answered(cluster, ip), 10, f"{ip} answered by {new.name} without the API"
        )
        assert entry_names(cluster, ip, new)
    finally:
        cluster.start_controlplane()
        restart_stopped_agents(cluster)


def test_serving_turns_true_once_a_node_holds_the_allocated_ip(
    cluster: ClusterLab, tmp_path: Path
) -> None:
    cs = ControllerSet(cluster.lab, cluster.controlplane, tmp_path)
    cs.write_config({"pools": [{"name": "lab", "addresses": ["198.18.0.220-198.18.0.229"]}]})
    cs.start("ctl")
    try:
        cluster.create_service("alloc", ports=[HTTP], lb_ip=None)
        cluster.write_endpointslices("alloc", ["pod-1-1", "pod-2-1"])

        def serving() -> bool:
            conds = cluster.read_service("alloc").get("status", {}).get("conditions") or []
            return any(c["type"] == "LoadBalancerServing" and c["status"] == "True" for c in conds)

        wait_until(serving, CONVERGE, "alloc Serving=True")
        ingress = cluster.read_service("alloc")["status"]["loadBalancer"]["ingress"]
        ip = ipaddress.ip_address(ingress[0]["ip"])
        assert ip in ipaddress.ip_network("198.18.0.220/30") or str(ip) <= "198.18.0.229"
        the_holder(cluster, ip)
        # Traffic first: the client has no neighbour entry for a new address until it sends.
        wait_until(functools.partial(served, cluster, ip), CONVERGE, f"{ip} served")
        wait_until(functools.partial(settled, cluster, ip), CONVERGE, f"{ip} settled")
        assert served(cluster, ip)
        code, page = cs.scrape("ctl")
        assert code == 200, page
        assert metric(page, "nodelb_allocations_total", pool="lab") >= 1
        assert metric(page, "nodelb_controller_leader") == 1
        assert metric(page, "nodelb_pool_addresses_in_use", pool="lab") >= 1
    finally:
        cluster.delete_service("alloc")
        try:
            # ctl holds alloc with its cleanup finalizer: stop it only once it has let alloc
            # go, or alloc stays (being deleted, still served) for the rest of the module.
            wait_until(lambda: gone(cluster, "alloc"), CONVERGE, "ctl to let alloc go")
        finally:
            cs.stop_all()


def gone(cluster: ClusterLab, name: str) -> bool:
    """Return True once Service `name` no longer exists (its deletion completed)."""
    try:
        cluster.read_service(name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def metric(text: str, name: str, **labels: str) -> float:
    """Return the sum of the samples `name` with these labels in a Prometheus text page."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def agent_metric(cluster: ClusterLab, node: str, name: str, **labels: str) -> float:
    code, body = cluster.agent_get(node, "/metrics")
    assert code == 200
    return metric(body, name, **labels)


def test_agent_metrics_move_with_syncs_refusals_tampering_and_takeovers(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress]
) -> None:
    node = "node-1"
    syncs = agent_metric(cluster, node, "nodelb_sync_duration_seconds_count")
    ip = ipaddress.ip_address("198.18.0.212")
    cluster.create_service("m", ports=[HTTP], lb_ip=[str(ip)])
    try:
        cluster.write_endpointslices("m", ["pod-1-1", "pod-2-1"])
        cluster.wait_rules(str(ip), 80)
        assert agent_metric(cluster, node, "nodelb_sync_duration_seconds_count") > syncs

        # A refused externalIP (the lab allows none) is counted.
        refused = agent_metric(cluster, node, "nodelb_external_ips_refused_total")
        cluster.create_service("ext", ports=[HTTP], lb_ip=None, external_ips=["198.18.0.160"])
        wait_until(
            lambda: agent_metric(cluster, node, "nodelb_external_ips_refused_total") > refused,
            CONVERGE,
            "the refused externalIP counted",
        )

        # An element removed behind the agent's back is a foreign change: counted, and the
        # table is rewritten from the agent's mirror without waiting for a drift check.
        foreign = agent_metric(cluster, node, "nodelb_nft_foreign_changes_total", object="element")
        repairs = agent_metric(cluster, node, "nodelb_nft_tamper_repairs_total", result="ok")
        keys = frontend_keys(cluster.nodelb_table(node))
        holder_map = next(name for name, ks in keys.items() if (ip, 6, 80) in ks)
        node_ns = cluster.lab.node(node).ns
        netns.run(
            node_ns,
            [
                "nft",
                "delete",
                "element",
                "inet",
                "nodelb",
                holder_map,
                "{",
                f"{ip} . tcp . 80",
                "}",
            ],
        )
        wait_until(
            lambda: (
                agent_metric(cluster, node, "nodelb_nft_foreign_changes_total", object="element")
                > foreign
                and agent_metric(cluster, node, "nodelb_nft_tamper_repairs_total", result="ok")
                > repairs
            ),
            CONVERGE,
            "the foreign change counted and repaired",
        )
        wait_until(lambda: cluster.has_rule(node, str(ip), 80), CONVERGE, "the element back")
        cluster.delete_service("m")
        wait_until(lambda: not cluster.has_rule(node, str(ip), 80), CONVERGE, "the rule removed")
    finally:
        for name in ("m", "ext"):
            with contextlib.suppress(ApiException):
                cluster.delete_service(name)

    # A takeover is counted on the node that took over.
    old = the_holder(cluster, web[0])
    cluster.crash_node(old.name)
    try:
        new = the_holder(cluster, web[0], not_=old.name)
        wait_until(
            lambda: (
                agent_metric(cluster, new.name, "nodelb_vrrp_takeovers_total", family="IPv4") >= 1
            ),
            CONVERGE,
            f"the takeover counted on {new.name}",
        )
        assert agent_metric(cluster, new.name, "nodelb_gratuitous_sent_total", family="IPv4") >= 1
    finally:
        restart_stopped_agents(cluster)


def test_a_healed_partition_leaves_exactly_one_holder(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress]
) -> None:
    ip = web[0]
    cut = the_holder(cluster, ip)
    cluster.lab.unplug(cut)
    try:
        # Each side elects its own: the cut-off node keeps the IP, the others take it too.
        wait_until(lambda: len(holders(cluster, ip)) == 2, TAKEOVER, "a holder on each side")
        # The client's side answers (not every request: the cut-off node's pod is unreachable
        # from there, and Cluster policy spreads over every pod).
        wait_until(lambda: answered(cluster, ip), CONVERGE, "the client's side to answer")
    finally:
        cluster.lab.plug(cut)
    wait_until(lambda: len(holders(cluster, ip)) == 1, TAKEOVER, "one holder after the heal")
    # It stays one: several Master_Down intervals of adverts later there is still one holder.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert len(holders(cluster, ip)) == 1
    # Every request is answered again. The client's neighbour entry may still name the node
    # that stepped down (when its Master heard the winner's advert before the winner heard
    # its own, the winner had nothing to answer): that node's rules still forward, and the
    # entry moves when the client re-resolves, or at the winner's next periodic refresh
    # (announce.gratuitous.refreshSeconds).
    wait_until(lambda: served(cluster, ip), CONVERGE, "service after the heal")


def test_ping_and_requests_resume_after_a_crash(
    cluster: ClusterLab, web: tuple[IPAddress, IPAddress], tmp_path: Path
) -> None:
    ip = web[1]  # IPv6 this time: unsolicited NA moves the client
    old = the_holder(cluster, ip)
    ping = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            cluster.client_ns,
            "ping",
            "-6",
            "-n",
            "-i",
            "0.05",
            "-W",
            "0.5",
            "-w",
            "6",
            str(ip),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    loop = RequestLoop(cluster.client_ns, ip, 80, timeout=1.0, log=tmp_path / "requests.jsonl")
    loop.start()
    try:
        cluster.crash_node(old.name)
        drop_endpoints_of(cluster, old)
        the_holder(cluster, ip, not_=old.name)
        wait_until(lambda: served(cluster, ip), 10, "requests answered again")
        out, _ = ping.communicate(timeout=30)
    finally:
        requests = loop.stop()
        if ping.poll() is None:
            netns.stop(ping)  # type: ignore[arg-type]
        restart_stopped_agents(cluster)
    replied = [int(m) for m in re.findall(r"icmp_seq=(\d+)", out)]
    sent = int(re.search(r"(\d+) packets transmitted", out).group(1))  # type: ignore[union-attr]
    assert replied, out
    # Echo replies come back after the takeover, up to the end of the run.
    assert max(replied) >= sent - 5, out[-400:]
    assert requests[-1].ok
    print(f"IPv6 crash outage: {outage(requests) * 1000:.0f} ms; ping {len(replied)}/{sent}")
