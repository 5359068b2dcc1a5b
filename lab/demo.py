"""`make demo` / `nodelb lab demo`: the lab cluster serving LoadBalancer IPs, and a failover.

Builds the persistent lab (real kube-apiserver and etcd, 3 nodes with 2 pods each, kube-proxy
in nftables mode and a nodelb agent with its VRRP announcer on every node, a client), runs the
allocation controller, creates three Services as a user would (Cluster, Local,
PreferSameNode), writes their EndpointSlices as the EndpointSlice controller would, and sends
real requests from the client. The LoadBalancer IPs lie on the client's own segment: the
client finds them by ARP, answered by whichever node won the VRRP election. Then the holder
of the first IP is killed (`kill -9` of its agent) while the client keeps sending requests:
another node takes over, announces the IP with gratuitous ARP, and service resumes.
"""

from __future__ import annotations

import ipaddress
import sys
from collections import Counter
from dataclasses import dataclass
from typing import TextIO

from agent.model.net import IPAddress
from lab import session
from lab.binaries import binary
from lab.client import Reply, tcp_requests
from lab.cluster import LAB_ANNOUNCE, ClusterLab, Hints, tcp_port
from lab.controllers import ControllerSet
from lab.requestloop import RequestLoop, failed, outage
from lab.topology import LabNode
from lab.vrrp_lab import holds, mac_of, neighbour_mac
from lab.wait import wait_until


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
        "web-local", "198.18.0.201", "Local", None, "the holder's pods only, client source kept"
    ),
    DemoService("web-near", "198.18.0.202", "Cluster", "node", "PreferSameNode: the holder's pods"),
)
REQUESTS = 12
POOL = "198.18.0.200-198.18.0.230"


def _holder(cluster: ClusterLab, ip: IPAddress, *, not_: str | None = None) -> LabNode:
    """Wait until exactly one node (other than `not_`) holds `ip` and the client knows it."""

    def settled() -> LabNode | None:
        found = [n for n in cluster.nodes if holds(n, ip)]
        if len(found) != 1 or found[0].name == not_:
            return None
        return found[0] if neighbour_mac(cluster.client_ns, ip) == mac_of(found[0]) else None

    def probe_and_check() -> LabNode | None:
        tcp_requests(cluster.client_ns, ip, 80, 1, timeout=0.5)  # makes the client resolve
        return settled()

    node = wait_until(probe_and_check, 60, f"one holder of {ip}", interval=0.2)
    assert node is not None
    return node


def _create(cluster: ClusterLab) -> None:
    pods = [p.name for p in cluster.lab.pods]
    for svc in SERVICES:
        cluster.create_service(
            svc.name,
            ports=[tcp_port(80)],
            lb_ip=None,  # the controller allocates; the Services ask for their address
            policy=svc.policy,
            traffic_distribution="PreferSameNode" if svc.hints == "node" else None,
            annotations={"nodelb.io/load-balancer-ips": svc.ip},
        )
        cluster.write_endpointslices(svc.name, pods, hints=svc.hints, families=(4,))
    for svc in SERVICES:
        cluster.wait_rules(svc.ip, 80)
        _holder(cluster, ipaddress.ip_address(svc.ip))


def _show(cluster: ClusterLab, out: TextIO) -> None:
    client = cluster.client_ns
    print(
        f"\n{'service':<10} {'LB IP':<14} {'holder':<7} {'policy':<18} "
        f"{'pods that answered':<48} source seen",
        file=out,
    )
    for svc in SERVICES:
        results = tcp_requests(client, ipaddress.ip_address(svc.ip), 80, REQUESTS, timeout=3.0)
        replies = [r for r in results if isinstance(r, Reply)]
        pods = Counter(r.pod for r in replies)
        sources = sorted({str(r.client_ip) for r in replies})
        policy = svc.policy + (" +SameNode" if svc.hints == "node" else "")
        answered = ", ".join(f"{p}×{n}" for p, n in sorted(pods.items())) or "none"
        lost = len(results) - len(replies)
        holder = _holder(cluster, ipaddress.ip_address(svc.ip)).name
        print(
            f"{svc.name:<10} {svc.ip:<14} {holder:<7} {policy:<18} {answered:<48} "
            f"{', '.join(sources)}" + (f"  ({lost} failed)" if lost else ""),
            file=out,
        )
        print(f"{'':<10} {'':<14} {'':<7} {'':<18} expected: {svc.says}", file=out)


def _failover(cluster: ClusterLab, out: TextIO) -> int:
    """Kill the holder of the first IP while the client sends requests; report the outage."""
    ip = ipaddress.ip_address(SERVICES[0].ip)
    old = _holder(cluster, ip)
    print(
        f"\nfailover: the client requests {ip} every 20 ms; kill -9 of nodelb on {old.name}"
        f" (the holder, MAC {mac_of(old)}) ...",
        file=out,
    )
    loop = RequestLoop(cluster.client_ns, ip, 80, interval=0.02, timeout=0.2)
    loop.start()
    try:
        cluster.kill_agent(old.name)
        new = _holder(cluster, ip, not_=old.name)
        tcp_requests(cluster.client_ns, ip, 80, 5, timeout=1.0)
    finally:
        requests = loop.stop()
    gap = outage(requests)
    ok = bool(requests) and requests[-1].ok
    print(
        f"  {new.name} took over: the client's neighbour entry for {ip} is now {mac_of(new)};"
        f"\n  {len(requests)} requests, {failed(requests)} failed, longest outage"
        f" {gap * 1000:.0f} ms; the last request was {'answered' if ok else 'NOT answered'}",
        file=out,
    )
    print(f"  restarting nodelb on {old.name} (it takes its preferred IPs back) ...", file=out)
    cluster.start_agent(old.name)
    return 0 if ok else 1


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
    cluster = session.up(nodes=3, pods_per_node=2, agent_config=LAB_ANNOUNCE)
    controllers = ControllerSet(cluster.lab, cluster.controlplane, cluster.workdir)
    controllers.write_config({"pools": [{"name": "demo", "addresses": [POOL]}]})
    controllers.start("controller")
    _create(cluster)
    print(
        f"\nthe client sends {REQUESTS} TCP requests to each LoadBalancer IP; it reaches the"
        " IP's VRRP holder by ARP:",
        file=out,
    )
    _show(cluster, out)
    code = _failover(cluster, out)
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
    return code
