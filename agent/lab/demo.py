"""`make demo` / `nodelb lab demo`: the lab cluster serving LoadBalancer IPs, shown with traffic.

Builds the persistent lab (real kube-apiserver and etcd, 3 nodes with 2 pods each, kube-proxy
in nftables mode and a nodelb agent on every node, a client), creates three Services as a
user would (Cluster, Local, PreferSameNode), writes their EndpointSlices and status as the
EndpointSlice controller and the allocator would, and sends real requests from the client.
Until the announcer lands, the client routes each LoadBalancer IP via node-1, standing in
for the router or the ARP answer that will carry it there.
"""

from __future__ import annotations

import ipaddress
import sys
from collections import Counter
from dataclasses import dataclass
from typing import TextIO

from agent.lab import session
from agent.lab.binaries import binary
from agent.lab.client import Reply, tcp_requests
from agent.lab.cluster import ClusterLab, Hints, tcp_port


@dataclass(frozen=True, slots=True)
class DemoService:
    name: str
    ip: str
    policy: str
    hints: Hints | None
    says: str


SERVICES = (
    DemoService("web", "198.18.0.200", "Cluster", None, "spread over every pod, source NATed"),
    DemoService(
        "web-local", "198.18.0.201", "Local", None, "node-1's pods only, client source kept"
    ),
    DemoService("web-near", "198.18.0.202", "Cluster", "node", "PreferSameNode: node-1's pods"),
)
REQUESTS = 12
ENTRY_NODE = "node-1"


def _create(cluster: ClusterLab) -> None:
    pods = [p.name for p in cluster.lab.pods]
    for svc in SERVICES:
        cluster.create_service(
            svc.name,
            ports=[tcp_port(80)],
            lb_ip=svc.ip,
            policy=svc.policy,
            traffic_distribution="PreferSameNode" if svc.hints == "node" else None,
        )
        cluster.write_endpointslices(svc.name, pods, hints=svc.hints, families=(4,))
        cluster.route_lb_via(svc.ip, ENTRY_NODE)
    for svc in SERVICES:
        cluster.wait_rules(svc.ip, 80)


def _show(cluster: ClusterLab, out: TextIO) -> None:
    client = cluster.client_ns
    print(
        f"\n{'service':<10} {'LB IP':<14} {'policy':<18} {'pods that answered':<48} source seen",
        file=out,
    )
    for svc in SERVICES:
        results = tcp_requests(client, ipaddress.ip_address(svc.ip), 80, REQUESTS, timeout=3.0)
        replies = [r for r in results if isinstance(r, Reply)]
        pods = Counter(r.pod for r in replies)
        sources = sorted({str(r.client_ip) for r in replies})
        policy = svc.policy + (" +SameNode" if svc.hints == "node" else "")
        answered = ", ".join(f"{p}×{n}" for p, n in sorted(pods.items())) or "none"
        failed = len(results) - len(replies)
        print(
            f"{svc.name:<10} {svc.ip:<14} {policy:<18} {answered:<48} {', '.join(sources)}"
            + (f"  ({failed} failed)" if failed else ""),
            file=out,
        )
        print(f"{'':<10} {'':<14} {'':<18} expected: {svc.says}", file=out)


def run(out: TextIO = sys.stdout) -> int:
    """Bring the lab up (replacing a previous one), run the demo, leave the lab running."""
    if session.is_up():
        print("removing the previous lab ...", file=out)
        session.down()
    print(
        "building the lab: apiserver, 3 nodes × 2 pods, kube-proxy and nodelb on each node,"
        " a client",
        file=out,
    )
    cluster = session.up(nodes=3, pods_per_node=2)
    _create(cluster)
    print(
        f"\nthe client sends {REQUESTS} TCP requests to each LoadBalancer IP,"
        f" entering via {ENTRY_NODE}:",
        file=out,
    )
    _show(cluster, out)
    state = session.status()
    p = session.PREFIX
    kubectl = f"{binary('kubectl')} --kubeconfig {state['kubeconfig']}"
    print(
        f"""
The lab stays up. Poke around (as root):
  ip netns list | grep {p}                                  # every namespace of the lab
  ip netns exec {p}-node-1 nft list table inet nodelb       # nodelb's rules on node-1
  ip netns exec {p}-client socat -t2 - TCP:198.18.0.200:80 </dev/null   # one request
  ip netns exec {p}-cp {kubectl} get svc,endpointslices
  .venv/bin/nodelb lab status --json                        # namespaces, addresses, PIDs
Tear it down:
  .venv/bin/nodelb lab down""",
        file=out,
    )
    return 0
