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

DEFAULT_MASQ_MARK: Final = 0x00002000
"""The meta mark bit that asks nat_postrouting to masquerade.

Not kube-proxy's 0x4000 (masquerade) or 0x8000 (drop): nodelb's marks must not trigger
another component's rules, and another component's marks must not trigger ours."""

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

# Dispatch chain variants, per family and endpoint count n.
DispatchKind = Literal["ep", "epl", "epc"]
DISPATCH_KINDS: Final[tuple[DispatchKind, ...]] = ("ep", "epl", "epc")
"""ep{f}_{n}: mark + DNAT by @be{f}_{n}; epl{f}_{n}: DNAT by @be{f}_{n} without mark (Local,
external); epc{f}_{n}: mark + DNAT by @bc{f}_{n} (internal traffic with its own endpoints)."""

BACKENDS: Final = "be"  # be{f}_{n}: daddr . l4proto . dport . index -> endpoint addr . port
CLUSTER_BACKENDS: Final = "bc"  # bc{f}_{n}: the same for internal-traffic endpoint lists

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
    """Return the backend map read by the dispatch chain (`be4_3`, or `bc4_3` for epc)."""
    base = CLUSTER_BACKENDS if kind == "epc" else BACKENDS
    return f"{base}{family}_{n}"
