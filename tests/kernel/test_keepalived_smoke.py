"""keepalived (the reference VRRP peer) in two lab nodes: election, crash failover, ARP follow.

keepalived runs inside each node namespace via `ip netns exec` (never its own --namespace
option), in the foreground, VRRP subsystem only, with every pid file and its config in a
per-node directory, and without respawning children, so `kill -9` of the VRRP process is a
crash that stays a crash. The lab tears every keepalived process down with the namespaces.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

from agent.model.net import IPAddress
from lab import client
from lab.client import Reply
from lab.keepalived import KEEPALIVED, Keepalived, config_text, start_keepalived
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import holds, mac_of, neighbour_mac
from lab.wait import wait_until

pytestmark = pytest.mark.kernel

VIP4 = IPv4Address("198.18.0.200")
VIP6 = IPv6Address("2001:db8::200")
VRID = 51
ADVERT_INT = 0.1  # seconds; VRRPv3 carries centiseconds and keepalived 2.2.7 accepts this
NODE_PORT = 8080
TIMEOUT = 30.0  # generous: the machine is busy; nothing here asserts a duration


def start_peer(lab: Lab, node: LabNode, priority: int, workdir: Path) -> Keepalived:
    """Start keepalived on `node` holding VIP4 and VIP6 on VRID at `priority`."""
    config = config_text(
        router_id=node.name,
        vrid=VRID,
        priority=priority,
        advert_int=ADVERT_INT,
        vips=(VIP4, VIP6),
    )
    return start_keepalived(lab, node, config=config, workdir=workdir)


def answering_node(ns: str, vip: IPAddress) -> str | None:
    result = client.tcp_request(ns, vip, NODE_PORT, timeout=2.0)
    return result.pod if isinstance(result, Reply) else None


def expect_holder(
    client_ns: str, vip: IPAddress, *, holder: LabNode, other: LabNode | None
) -> None:
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


def expect_neighbor(client_ns: str, vip: IPAddress, holder: LabNode) -> None:
    """Wait until `holder` has the VIP and the client's neighbour entry names its MAC."""
    wait_until(lambda: holds(holder, vip), TIMEOUT, f"{vip} on {holder.name}")
    wait_until(
        lambda: neighbour_mac(client_ns, vip) == mac_of(holder),
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

    master = start_peer(lab, node1, priority=150, workdir=tmp_path)
    backup = start_peer(lab, node2, priority=100, workdir=tmp_path)

    for vip in (VIP4, VIP6):
        expect_holder(client_ns, vip, holder=node1, other=node2)
        assert neighbour_mac(client_ns, vip) == mac_of(node1)

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
