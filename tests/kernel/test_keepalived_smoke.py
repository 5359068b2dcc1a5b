"""keepalived (the reference VRRP peer) in two lab nodes: election, crash failover, ARP follow.

keepalived runs inside each node namespace via `ip netns exec` (never its own --namespace
option), in the foreground, VRRP subsystem only, with every pid file and its config in a
per-node directory, and without respawning children, so `kill -9` of the VRRP process is a
crash that stays a crash. The lab tears every keepalived process down with the namespaces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

from agent.lab import client, netns
from agent.lab.client import Reply
from agent.lab.topology import Lab, LabSpec, Node
from agent.lab.wait import wait_until
from agent.model import IPAddress

pytestmark = pytest.mark.kernel

KEEPALIVED = "/usr/sbin/keepalived"
VIP4 = IPv4Address("198.18.0.200")
VIP6 = IPv6Address("2001:db8::200")
VRID = 51
ADVERT_INT = 0.1  # seconds; VRRPv3 carries centiseconds and keepalived 2.2.7 accepts this
NODE_PORT = 8080
TIMEOUT = 30.0  # generous: the machine is busy; nothing here asserts a duration

CONFIG = """\
global_defs {{
    router_id {router_id}
    vrrp_version 3
    vrrp_garp_master_repeat 3
    vrrp_garp_master_refresh 0
}}
vrrp_instance VI_4 {{
    state BACKUP
    interface eth0
    virtual_router_id {vrid}
    priority {priority}
    advert_int {advert_int}
    virtual_ipaddress {{
        {vip4}/32 dev eth0
    }}
}}
vrrp_instance VI_6 {{
    state BACKUP
    interface eth0
    virtual_router_id {vrid}
    priority {priority}
    advert_int {advert_int}
    virtual_ipaddress {{
        {vip6}/128 dev eth0
    }}
}}
"""


@dataclass(frozen=True, slots=True)
class Keepalived:
    """One keepalived run: its node, parent process and the VRRP child's pid file."""

    node: Node
    proc: subprocess.Popen[bytes]
    vrrp_pidfile: Path

    def vrrp_pid(self) -> int:
        return int(self.vrrp_pidfile.read_text().split()[0])


def start_keepalived(lab: Lab, node: Node, priority: int, workdir: Path) -> Keepalived:
    d = workdir / f"keepalived-{node.name}"
    d.mkdir(parents=True)
    conf = d / "keepalived.conf"
    conf.write_text(
        CONFIG.format(
            router_id=node.name,
            vrid=VRID,
            priority=priority,
            advert_int=ADVERT_INT,
            vip4=VIP4,
            vip6=VIP6,
        )
    )
    check = netns.run(node.ns, [KEEPALIVED, "--config-test", "-f", str(conf)], check=False)
    assert check.returncode == 0, f"keepalived rejects its config: {check.stderr}"
    argv = [
        KEEPALIVED,
        "--dont-fork",
        "--log-console",
        "--log-detail",
        "--no-syslog",
        "--vrrp",
        "--dont-respawn",
        "-f", str(conf),
        "-p", str(d / "keepalived.pid"),
        "-r", str(d / "vrrp.pid"),
        "-c", str(d / "checkers.pid"),
        "-b", str(d / "bfd.pid"),
    ]  # fmt: skip
    proc = lab.spawn(node.ns, argv, log_name=f"keepalived-{node.name}")
    ka = Keepalived(node=node, proc=proc, vrrp_pidfile=d / "vrrp.pid")
    wait_until(
        lambda: proc.poll() is None and ka.vrrp_pid() > 0,
        TIMEOUT,
        f"keepalived's VRRP process on {node.name}",
    )
    return ka


def holds(node: Node, vip: IPAddress) -> bool:
    family = "-4" if vip.version == 4 else "-6"
    out = netns.run(node.ns, ["ip", "-j", family, "addr", "show", "dev", node.ifname]).stdout
    return any(a["local"] == str(vip) for link in json.loads(out) for a in link["addr_info"])


def mac(node: Node) -> str:
    out = netns.run(node.ns, ["ip", "-j", "link", "show", "dev", node.ifname]).stdout
    return str(json.loads(out)[0]["address"])


def neighbor_mac(ns: str, ip: IPAddress) -> str | None:
    out = netns.run(ns, ["ip", "-j", "neigh", "show", str(ip)]).stdout
    entries = [e for e in json.loads(out or "[]") if "lladdr" in e]
    return str(entries[0]["lladdr"]) if entries else None


def answering_node(ns: str, vip: IPAddress) -> str | None:
    result = client.tcp_request(ns, vip, NODE_PORT, timeout=2.0)
    return result.pod if isinstance(result, Reply) else None


def expect_holder(client_ns: str, vip: IPAddress, *, holder: Node, other: Node | None) -> None:
    """Wait until `holder` has the VIP (and `other`, if given, has not) and answers on it."""
    wait_until(
        lambda: holds(holder, vip) and (other is None or not holds(other, vip)),
        TIMEOUT,
        f"{vip} on {holder.name}" + ("" if other is None else f" and not on {other.name}"),
    )
    wait_until(
        lambda: answering_node(client_ns, vip) == holder.name,
        TIMEOUT,
        f"{holder.name} answering the client on {vip}",
    )


def expect_neighbor(client_ns: str, vip: IPAddress, holder: Node) -> None:
    """Wait until `holder` has the VIP and the client's neighbour entry names its MAC."""
    wait_until(lambda: holds(holder, vip), TIMEOUT, f"{vip} on {holder.name}")
    wait_until(
        lambda: neighbor_mac(client_ns, vip) == mac(holder),
        TIMEOUT,
        f"the client's neighbour entry for {vip} to point at {holder.name}",
    )


@pytest.mark.skipif(not os.access(KEEPALIVED, os.X_OK), reason="keepalived is not installed")
def test_keepalived_vip_moves_to_the_backup_when_the_master_is_killed(
    make_lab: Callable[[LabSpec], Lab], tmp_path: Path
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    client_ns = lab.client.ns
    node1, node2 = lab.node("node-1"), lab.node("node-2")
    # A server in each node namespace names the node that answers on the VIP.
    lab.start_servers([node1, node2], tcp_port=NODE_PORT, udp_port=NODE_PORT + 1)

    master = start_keepalived(lab, node1, priority=150, workdir=tmp_path)
    backup = start_keepalived(lab, node2, priority=100, workdir=tmp_path)

    for vip in (VIP4, VIP6):
        expect_holder(client_ns, vip, holder=node1, other=node2)
        assert neighbor_mac(client_ns, vip) == mac(node1)

    # Crash the master: SIGKILL its VRRP process (no priority-0 resignation is sent), then
    # the parent. The VIPs stay configured on node-1, as after a real crash.
    os.kill(master.vrrp_pid(), signal.SIGKILL)
    if master.proc.poll() is None:
        os.kill(master.proc.pid, signal.SIGKILL)
    master.proc.wait(timeout=TIMEOUT)
    assert backup.proc.poll() is None
    assert holds(node1, VIP4) and holds(node1, VIP6)  # nobody removed them

    for vip in (VIP4, VIP6):
        # The takeover's gratuitous ARP / unsolicited NA moves the client's neighbour entry
        # from node-1's MAC to node-2's (node-1 still has the VIP configured: only the
        # neighbour entry can send the client's traffic to node-2), and the traffic with it.
        expect_neighbor(client_ns, vip, node2)
        expect_holder(client_ns, vip, holder=node2, other=None)
    assert "Entering MASTER STATE" in lab.log_of(backup.proc)
