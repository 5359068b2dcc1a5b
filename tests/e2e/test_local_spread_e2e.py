"""eTP=Local spread with the agents doing everything: a real kube-apiserver, kube-proxy in
nftables mode, a nodelb agent per node, and a Service annotated `nodelb.io/local-traffic:
spread` (the cluster's default stays `holder`). Whichever node the client's route enters by,
requests reach the pods of every node with endpoints, and every pod sees the client.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest

from agent.model.tunnel import IFNAME, LOCAL_TRAFFIC_ANNOTATION
from lab import client, netns
from lab.client import Reply
from lab.cluster import ClusterLab, tcp_port
from lab.topology import CLIENT4, CLIENT6
from lab.wait import wait_until

pytestmark = pytest.mark.e2e

CONVERGE = 60.0
HTTP = tcp_port(80)


@pytest.fixture
def cleanup(cluster: ClusterLab) -> Iterator[list[tuple[str, Sequence[str]]]]:
    created: list[tuple[str, Sequence[str]]] = []
    yield created
    for name, ips in created:
        for ip in ips:
            cluster.unroute_lb(ip)
        cluster.delete_service(name)


def pods_answering(
    cluster: ClusterLab, ip: str, via: str, count: int
) -> tuple[Counter[str], set[str], int]:
    """Return (answers by pod, client addresses seen, failures) of `count` requests via `via`."""
    cluster.route_lb_via(ip, via)
    results = client.tcp_requests(
        cluster.client_ns, ipaddress.ip_address(ip), 80, count, timeout=2.0
    )
    replies = [r for r in results if isinstance(r, Reply)]
    return (
        Counter(r.pod for r in replies),
        {str(r.client_ip) for r in replies},
        len(results) - len(replies),
    )


def test_agents_spread_an_annotated_local_service_over_every_node_with_endpoints(
    cluster: ClusterLab, cleanup: list[tuple[str, Sequence[str]]]
) -> None:
    ips = ["198.18.0.230", "2001:db8::230"]
    pods = ["pod-1-1", "pod-2-1", "pod-2-2"]
    cleanup.append(("spread", ips))
    cluster.create_service(
        "spread",
        ports=(HTTP,),
        lb_ip=ips,
        policy="Local",
        annotations={LOCAL_TRAFFIC_ANNOTATION: "spread"},
    )
    cluster.write_endpointslices("spread", pods)
    for ip in ips:
        cluster.wait_rules(ip, 80, with_endpoints=True)
    # node-3 has no endpoint: in holder mode it drops (test_agent_e2e); spread, it forwards.
    for via in ("node-1", "node-3"):
        for ip, source in zip(ips, (CLIENT4, CLIENT6), strict=True):

            def every_node_serves(ip: str = ip, via: str = via) -> bool:
                seen, _, failed = pods_answering(cluster, ip, via, 12)
                return failed == 0 and {p.split("-")[1] for p in seen} == {"1", "2"}

            wait_until(
                every_node_serves,
                CONVERGE,
                f"{ip} via {via} spread to node-1 and node-2",
                interval=0.5,
            )
            seen, sources, failed = pods_answering(cluster, ip, via, 120)
            assert failed == 0, f"{failed} of 120 requests failed"
            assert set(seen) == set(pods), dict(seen)
            assert sources == {str(source)}, sources
            # Weighted by local endpoints: node-2 has two of the three.
            node2 = (seen["pod-2-1"] + seen["pod-2-2"]) / 120
            assert 0.5 <= node2 <= 0.85, dict(seen)
    for node in cluster.nodes:
        assert IFNAME in netns.run(node.ns, ["ip", "-o", "link"]).stdout, node.name
