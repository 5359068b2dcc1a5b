"""This node's SpreadState from every Service's result and the cluster's Nodes (pure).

The pieces the holder's `netdev nodelb` table needs (rules/spread.py): which peers may send
VXLAN to this node, and for every spread frontend the next hop of each bucket another node
serves. The node loop does not call this yet (issue #15: the tunnel and the table are applied
by the kernel tests; the loop's wiring is the next step).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address

from agent.model.desired_state import Frontend, FrontendKey
from agent.model.node import Node
from agent.model.tunnel import SpreadState
from agent.node.service_frontends import ServiceResult


def segment_ip4(node: Node) -> IPv4Address | None:
    """Return the Node's first IPv4 address (its tunnel endpoint), None when it has none."""
    for addr in node.addresses:
        if isinstance(addr, ipaddress.IPv4Address):
            return addr
    return None


def spread_state(
    results: Iterable[ServiceResult],
    *,
    frontends: Mapping[FrontendKey, Frontend],
    nodes: Iterable[Node],
    me: str,
    device: str,
) -> SpreadState | None:
    """Return the spread table of node `me`, None when `me` has no IPv4 address.

    `frontends` are the assembled ones (DesiredState.frontends): a result's spread entry counts
    only for a frontend that Service owns (a conflict's loser spreads nothing). A bucket whose
    node has no IPv4 address is left out, so the holder serves it with its own endpoints.
    """
    addrs = {n.name: ip for n in nodes if (ip := segment_ip4(n)) is not None}
    mine = addrs.get(me)
    if mine is None:
        return None
    buckets: dict[FrontendKey, tuple[tuple[int, IPv4Address], ...]] = {}
    for result in results:
        for key, peers in result.spread:
            owner = frontends.get(key)
            if owner is None or owner.service != result.key:
                continue
            hops = tuple((b, addrs[name]) for b, name in peers if name in addrs)
            if hops:
                buckets[key] = hops
    peer_ips = frozenset(ip for name, ip in addrs.items() if name != me and ip != mine)
    return SpreadState(device=device, node=mine, peers=peer_ips, buckets=buckets)
