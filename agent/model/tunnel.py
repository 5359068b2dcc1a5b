"""The eTP=Local spread tunnel's fixed values and per-node addressing (pure).

Every node has one VXLAN device, `IFNAME`, whose MAC and IPv6 next-hop address are functions
of the node's segment IPv4 address, so every agent computes its peers' without any new report
(docs/decisions.md, 2026-12-05: why VXLAN, and why these values).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address

from agent.model.desired_state import FrontendKey


class LocalTraffic(enum.StrEnum):
    """How an externalTrafficPolicy=Local Service's traffic is served (`localTraffic`).

    SPREAD: the holder spreads new flows over every node with ready local endpoints, through
    the tunnel. HOLDER: only the holder's own local endpoints serve (the behaviour before
    issue #15)."""

    SPREAD = "spread"
    HOLDER = "holder"


DEFAULT_LOCAL_TRAFFIC = LocalTraffic.HOLDER
"""HOLDER until the agent programs the tunnel and the spread table itself (issue #15: the
pieces exist, the node loop does not run them yet); then SPREAD, as the issue asks."""

LOCAL_TRAFFIC_ANNOTATION = "nodelb.io/local-traffic"

IFNAME = "nlb-vx"
VXLAN_PORT = 4789
VNI = 0x4E4C42
OVERHEAD = 50
"""Bytes VXLAN adds over IPv4: outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14."""

MSS4 = 1500 - OVERHEAD - 40
MSS6 = 1500 - OVERHEAD - 60
"""The TCP MSS a tunnelled flow's SYN-ACK is clamped to, for a 1500-byte underlay."""

BUCKETS = 61
"""Buckets per spread frontend: a prime (Maglev's permutations need one). 61 keeps each
frontend at most 60 map elements and every node's share within one bucket (1.6 %) of its
weight."""

HASH_SEED = 0x4E4C4201
"""The jhash seed of the bucket choice. Fixed, so every holder picks the same bucket."""

_LINK_LOCAL = int(IPv6Address("fe80::4e4c:0:0:0"))


def vtep_mac(node: IPv4Address) -> str:
    """Return the MAC of the tunnel device of the node whose segment address is `node`.

    02:6e (locally administered, unicast) followed by the four octets of the address."""
    return "02:6e:" + ":".join(f"{b:02x}" for b in node.packed)


def hop6(node: IPv4Address) -> IPv6Address:
    """Return the link-local address IPv6 flows are sent to, on the tunnel, to reach `node`.

    No node needs an IPv6 segment address: the sender's permanent neighbour entry maps this
    address to `vtep_mac(node)`, which the FDB maps to `node`."""
    return IPv6Address(_LINK_LOCAL | int(node))


@dataclass(frozen=True, slots=True)
class SpreadState:
    """What the spread table of one node must express (rules/spread.py renders it).

    `device` is the segment interface the holder receives client traffic on, `node` this
    node's segment IPv4 address, `peers` the other nodes' (the only VXLAN sources accepted).
    `buckets` maps every spread frontend to (bucket, serving node) for each bucket another node
    serves; the buckets this node serves are absent (its own Local path takes them).
    """

    device: str
    node: IPv4Address
    peers: frozenset[IPv4Address] = frozenset()
    buckets: Mapping[FrontendKey, tuple[tuple[int, IPv4Address], ...]] = field(default_factory=dict)


def check_peer(node: IPv4Address) -> None:
    """Raise ValueError unless `node` can be a tunnel endpoint (a unicast IPv4 address)."""
    if node.is_multicast or node.is_unspecified or node == ipaddress.IPv4Address(0xFFFFFFFF):
        raise ValueError(f"{node} cannot be a tunnel endpoint")
