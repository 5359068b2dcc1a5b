"""Every fixed name and priority of the nodelb table, in one place.

docs/dataplane.md explains the layout; rules/render.py and rules/delta.py only use these names.
Per-count names (`ep4_3`, `be4_3`) and affinity unit names are built by the helpers below, so
the names are a pure function of the desired state and a delta can name what it deletes.
"""

from __future__ import annotations

from typing import Final, Literal

Family = Literal[4, 6]

TABLE_FAMILY: Final = "inet"
TABLE_NAME: Final = "nodelb"
TABLE: Final = f"{TABLE_FAMILY} {TABLE_NAME}"

LAYOUT: Final = 4
"""The layout version of the table's declarations and fixed rules; bump it on any change."""


def table_comment(mark: int) -> str:
    """Return the table's comment for masquerade mark `mark`: it records the layout and mark.

    A full sync rewrites a table in place only when it carries exactly this comment (every
    dispatch chain's content is then a function of its name, so existing ones are kept); a
    table of another layout or mark (an older nodelb declared the backend maps differently)
    is replaced as a whole. nft keeps the comment of a table that exists, so it changes only
    when the table is created.
    """
    return f"managed by nodelb; layout {LAYOUT}; mark {mark:#x}; do not edit"


PRIORITY_BASES: Final[dict[str, int]] = {
    "raw": -300,
    "mangle": -150,
    "dstnat": -100,
    "filter": 0,
    "security": 50,
    "srcnat": 100,
}
"""The numeric value of nft's symbolic chain priorities in the inet family."""

DEFAULT_MASQ_MARK: Final = 0x00002000
"""The meta mark bit that asks nat_postrouting to masquerade.

Not kube-proxy's 0x4000 (masquerade) or 0x8000 (drop): nodelb's marks must not trigger
another component's rules, and another component's marks must not trigger ours."""

TUNNEL_CT_MARK: Final = 0x00001000
"""The conntrack mark bit of a flow that arrived through the spread tunnel (`nlb-vx`): its
SYN-ACK gets its MSS clamped on the way back (the client's direction is the tunnelled one).
A ct mark bit, not a meta mark one; no other bit of the ct mark is touched."""

MAX_AFFINITY_TIMEOUT: Final = 86400
"""Kubernetes' upper bound for sessionAffinityConfig.clientIP.timeoutSeconds."""

# Base chains and their hooks/priorities.
NAT_PREROUTING: Final = "nat_prerouting"
NAT_OUTPUT: Final = "nat_output"
NAT_POSTROUTING: Final = "nat_postrouting"
FILTER_PREROUTING: Final = "filter_prerouting"
FILTER_INPUT: Final = "filter_input"
FILTER_FORWARD: Final = "filter_forward"
FILTER_OUTPUT: Final = "filter_output"

NAT_PRIORITY: Final = "dstnat - 10"  # ahead of kube-proxy's nat chains at dstnat (-100)
NAT_OUTPUT_PRIORITY: Final = "-110"  # the same; nft 1.0.6 accepts `dstnat` only in prerouting
FILTER_PRE_PRIORITY: Final = "dstnat - 20"  # source ranges and Local drops run before any DNAT
POSTROUTING_PRIORITY: Final = "srcnat"
FILTER_PRIORITY: Final = "filter - 10"  # reject and held-IP drop, after DNAT

# Regular chains with fixed content.
NAT_INTERNAL: Final = "nat_internal"  # traffic from this node or its pods: Cluster semantics
REJECT: Final = "reject_new"  # TCP reset / ICMP port unreachable

# Per-family maps and sets with fixed names: f"{base}{family}", e.g. "ext4", "noep6".
EXT: Final = "ext"  # verdict map, key daddr . l4proto . dport: external traffic
INT: Final = "int"  # verdict map, same key: overrides for internal traffic
NOEP: Final = "noep"  # set of frontends some path of which has no endpoints: reject
DROP: Final = "drop"  # set of Local frontends without local endpoints: drop external
SRFE: Final = "srfe"  # set of frontends restricted by loadBalancerSourceRanges
SROK: Final = "srok"  # interval set daddr . l4proto . dport . saddr: allowed sources
HELD: Final = "held"  # set of IPs this node holds
LOCAL: Final = "local"  # interval set of this node's pod CIDRs
HAIRPIN: Final = "hpi"  # set daddr . l4proto . dport . saddr: Local frontends' own local pods

# Dispatch chain variants, per family and endpoint count n.
DispatchKind = Literal["ep", "epl", "epc", "epi"]
DISPATCH_KINDS: Final[tuple[DispatchKind, ...]] = ("ep", "epl", "epc", "epi")
"""ep{f}_{n}: mark + DNAT by @be{f}_{n}; epl{f}_{n}: DNAT by @bl{f}_{n} without mark (Local,
external); epc{f}_{n}: mark + DNAT by @bc{f}_{n} (internal traffic with its own endpoints, of
a Cluster frontend); epi{f}_{n}: DNAT by @bi{f}_{n}, marked only when the source is one of the
frontend's own local endpoints (@hpi{f}: hairpin) or not a pod of this node (the node itself),
so a pod's address reaches the endpoint as kube-proxy keeps it (internal traffic of a Local
frontend).

Every dispatch chain reads a backend map of its own, and the two are created and deleted
together: nft 1.0.6 cannot add a rule that reads a backend map it loads from the kernel (the
map's `typeof ... : ip daddr . th dport` fails to re-evaluate: "conflicting protocols
specified: ip vs. th"), so a rule is only ever added in the batch that creates its map."""

BACKENDS: Final = "be"  # be{f}_{n}: daddr . l4proto . dport . index -> endpoint addr . port
LOCAL_BACKENDS: Final = "bl"  # bl{f}_{n}: the same for Local external paths (epl)
CLUSTER_BACKENDS: Final = "bc"  # bc{f}_{n}: the same for internal-traffic endpoint lists
INTERNAL_BACKENDS: Final = "bi"  # bi{f}_{n}: the same for Local frontends' internal paths (epi)
BACKEND_MAPS: Final = (BACKENDS, LOCAL_BACKENDS, CLUSTER_BACKENDS, INTERNAL_BACKENDS)

# Session-affinity units (one per frontend path that uses affinity).
AFF_SERVICE: Final = "afs"  # per-frontend chain: sticky lookups, then random choice
AFF_ENDPOINT: Final = "afe"  # per-endpoint chain: refresh the set, DNAT to one endpoint
AFF_SET: Final = "afa"  # per-endpoint set of client addresses, with timeout

KEY_TYPE: Final[dict[int, str]] = {
    4: "ipv4_addr . inet_proto . inet_service",
    6: "ipv6_addr . inet_proto . inet_service",
}
ADDR_TYPE: Final[dict[int, str]] = {4: "ipv4_addr", 6: "ipv6_addr"}
IP: Final[dict[int, str]] = {4: "ip", 6: "ip6"}
"""The nft payload protocol keyword for a family (`ip daddr`, `ip6 daddr`)."""


def named(base: str, family: int) -> str:
    """Return the per-family name of a fixed map or set, e.g. named(EXT, 4) == "ext4"."""
    return f"{base}{family}"


def dispatch_chain(kind: DispatchKind, family: int, n: int) -> str:
    """Return the name of the dispatch chain of `kind` for `n` endpoints, e.g. "ep4_3"."""
    return f"{kind}{family}_{n}"


def backend_map(kind: DispatchKind, family: int, n: int) -> str:
    """Return the backend map read by the dispatch chain (`be4_3`, `bl4_3` for epl, `bc4_3`
    for epc, `bi4_3` for epi)."""
    base = {
        "ep": BACKENDS,
        "epl": LOCAL_BACKENDS,
        "epc": CLUSTER_BACKENDS,
        "epi": INTERNAL_BACKENDS,
    }[kind]
    return f"{base}{family}_{n}"


def is_dispatch_object(name: str) -> bool:
    """Return True if `name` is a dispatch chain or a backend map (`ep4_3`, `bl6_1`)."""
    head, sep, n = name.partition("_")
    if not sep or not n.isdigit() or head[-1:] not in ("4", "6"):
        return False
    return head[:-1] in DISPATCH_KINDS or head[:-1] in BACKEND_MAPS
