"""SpreadState -> the nft text of the `netdev nodelb` table, the holder's spreading (pure).

Why a netdev table on the segment device, and not the inet table: a held LoadBalancer IP is a
local address of the holder, and the `local` routing rule (priority 0) comes before any
fwmark rule, so a marked packet would be delivered to the holder instead of routed into the
tunnel; and nft 1.0.6 has `dup` only in ip/ip6 tables. In netdev ingress, `fwd ip to ADDR
device nlb-vx` sends the packet, unchanged, to a neighbour on the tunnel, before routing and
conntrack see it. The table exists only while spreading is configured.

The ingress chain, in order:
1. VXLAN to this node from a source that is not a known peer is dropped (a host on the segment
   must not inject packets through the tunnel);
2. fragments are never spread (only the first one carries ports): the holder serves them;
3. a packet whose daddr . l4proto . dport . bucket is in `spr4`/`spr6` goes to that bucket's
   node; every other packet continues (the holder's own Local path, as without spreading).
   IPv6 takes two steps through the packet mark: nft 1.0.6 runs out of registers ("BUG:
   register reg_low 16 invalid") for a 16-byte address key, a hash of a 16-byte address and
   a 16-byte next hop in one expression. The bucket is written as MARK_BASE + bucket, only
   into a packet without a mark, and a packet that is not forwarded leaves with its mark
   reset to 0 (a packet that arrives marked is never spread: the holder serves it).
Bucket = jhash of the client address and port, mod BUCKETS, fixed seed (agent/node/spread.py).
"""

from __future__ import annotations

from agent.model import tunnel as T
from agent.model.desired_state import FrontendKey

TABLE = "netdev nodelb"
CHAIN = "spread"
PEERS = "vtep4"
MAPS = {4: "spr4", 6: "spr6"}

MARK_BASE = 0x4E4C0000
"""IPv6 only: the bucket travels in the packet mark, as MARK_BASE + bucket (see above)."""

_KEY4 = (
    "ip daddr . meta l4proto . th dport . "
    f"jhash ip saddr . th sport mod {T.BUCKETS} seed {T.HASH_SEED:#x}"
)
_HASH6 = f"jhash ip6 saddr . th sport mod {T.BUCKETS} seed {T.HASH_SEED:#x} offset {MARK_BASE:#x}"


def _elements(state: T.SpreadState, fam: int) -> list[str]:
    out: list[str] = []
    for key in sorted(state.buckets, key=_order):
        if key.ip.version != fam:
            continue
        for bucket, node in state.buckets[key]:
            if not 0 <= bucket < T.BUCKETS:
                raise ValueError(f"bucket {bucket} of {key.ip} is outside 0..{T.BUCKETS - 1}")
            head = f"{key.ip} . {key.protocol.value} . {key.port}"
            if fam == 4:
                out.append(f"{head} . {bucket} : {node}")
            else:
                out.append(f"{head} . {MARK_BASE + bucket} : {T.hop6(node)}")
    return out


def _order(key: FrontendKey) -> tuple[int, int, str, int]:
    return (key.ip.version, int(key.ip), key.protocol.value, key.port)


def render_spread(state: T.SpreadState) -> str:
    """Return the nft script that makes the `netdev nodelb` table express exactly `state`.

    One batch: the table, maps and chain are added if absent, then flushed and refilled, so
    packets see the old content or the new. Raises ValueError for a bucket out of range or a
    peer that cannot be a tunnel endpoint."""
    for peer in state.peers:
        T.check_peer(peer)
    dev = state.device
    lines = [
        f"add table {TABLE}",
        f"add set {TABLE} {PEERS} {{ type ipv4_addr; }}",
        f"add map {TABLE} spr4 {{ typeof ip daddr . meta l4proto . th dport . "
        f"numgen random mod 1 : ip daddr; }}",
        f"add map {TABLE} spr6 {{ typeof ip6 daddr . meta l4proto . th dport . meta mark : "
        "ip6 daddr; }",
        f'add chain {TABLE} {CHAIN} {{ type filter hook ingress device "{dev}" priority 0; }}',
        f"flush chain {TABLE} {CHAIN}",
        f"flush set {TABLE} {PEERS}",
        f"flush map {TABLE} spr4",
        f"flush map {TABLE} spr6",
        f"add rule {TABLE} {CHAIN} ip daddr {state.node} udp dport {T.VXLAN_PORT} "
        f"ip saddr != @{PEERS} drop",
        f"add rule {TABLE} {CHAIN} ip frag-off & 0x3fff != 0 return",
        f'add rule {TABLE} {CHAIN} fwd ip to {_KEY4} map @spr4 device "{T.IFNAME}"',
        f"add rule {TABLE} {CHAIN} exthdr frag exists return",
        f"add rule {TABLE} {CHAIN} meta protocol ip6 meta mark 0 meta mark set {_HASH6} "
        "fwd ip6 to ip6 daddr . meta l4proto . th dport . meta mark map @spr6 "
        f'device "{T.IFNAME}"',
        f"add rule {TABLE} {CHAIN} meta mark & 0xffffff00 == {MARK_BASE:#x} meta mark set 0",
    ]
    if state.peers:
        peers = ", ".join(str(p) for p in sorted(state.peers))
        lines.append(f"add element {TABLE} {PEERS} {{ {peers} }}")
    for fam in (4, 6):
        elems = _elements(state, fam)
        if elems:
            lines.append(f"add element {TABLE} {MAPS[fam]} {{ {', '.join(elems)} }}")
    return "\n".join(lines) + "\n"


def render_spread_cleanup() -> str:
    """Return the nft script that removes the `netdev nodelb` table (no error if absent)."""
    return f"add table {TABLE}\ndelete table {TABLE}\n"
