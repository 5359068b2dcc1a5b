"""Which nodes may hold each LoadBalancer IP, who is preferred, and the VRRP instances (pure).

Every agent computes `plan(...)` from the same cluster state (Nodes, the Services using each
IP, their local endpoints) and gets the same answer whatever order the input arrives in, so
the VRRP priorities the nodes advertise agree without any coordination. docs/ownership.md
describes the scheme for operators; this docstring is the contract.

**Eligibility.** A node may hold an IP when all of these hold, checked in this order (the
first that fails is the node's reason):

1. it is Ready (`NOT_READY`);
2. it matches the configured node label selector, if any (`SELECTOR_MISMATCH`);
3. for *every* Service using the IP with externalTrafficPolicy=Local, it has a local ready
   endpoint of that Service (`NO_LOCAL_ENDPOINT`). A node without one would drop that
   Service's traffic (docs/DESIGN: "must not hold the IP"), so for an IP shared by several
   Local Services only nodes serving all of them qualify; when no node does, nobody holds
   the IP. Cluster-policy Services put no endpoint condition on the holder.

An IP with no eligible node gets no VRID and no holder (`NO_ELIGIBLE_NODES`).

**Ranking.** Nodes are ranked by rendezvous (highest-random-weight) hashing: weight =
blake2b("nodelb-hrw", key, node name), highest first, ties (vanishingly rare with 64-bit
weights) by name, where the key is the IP (`rank_nodes`) or an instance's key
(`rank_by_key`); which key ranks an instance is said under VRIDs below. Rank 0 is the
*preferred holder*. Rank r advertises VRRP priority
`priority_for_rank(r)`: 254, 253, then 64 apart (189, 125, 61), then down by one (floor 1), so
that consecutive backups' timers are a quarter interval apart. 255 is RFC 5798's address
owner (§5.2.4) and never used; a node that is not eligible for an instance does not run it.

**VRIDs and buckets.** IPv4 and IPv6 VRIDs are separate spaces on the wire, so each family is
planned alone within its configured range of V VRIDs, split in two (`split_range`): the
first three quarters are *buckets*, the last quarter the *Local range*.

- An IP no Local Service uses (every eligible node may hold it) goes to the bucket its
  address hashes to (`bucket_of`: blake2b of the address alone, mod the buckets). A bucket
  is one VRRP instance, and its ranking is the bucket's, not any IP's: the rendezvous order
  of the eligible nodes for the bucket, with holders bounded to floor or ceil of buckets /
  nodes each (`bucket_rankings`). Rank 0 is the preferred holder of every IP in it.
- An IP a Local Service uses goes to the Local range: one instance per (eligible set, the
  IP's own rendezvous winner), `PER_BUCKET`, ranked holder first and then by the key's
  rendezvous order; when those do not fit, one per eligible set (`PER_ELIGIBLE_SET`, spread
  lost); when even those do not, the instances with the most IPs (then by key) are kept and
  the others' IPs are not held (`VRID_EXHAUSTED`). Instances never mix eligible sets: the
  winner of an instance must be allowed to hold every address in it. Local keys are placed
  in key order at blake2b(key) mod the Local range, or the next free VRID (`place`).

Why buckets: a VRID then depends on the IP's address alone, and a holder on the node set and
the bucket alone, so adding or removing IPs never moves an IP that stays (no regrouping when
a count crosses V, no probing chain): issue #18 saw the 256th IP move a fixed Service's IP to
another VRID, two nodes hold it for 0.6 s and a long-lived connection break. A node joining
or leaving moves the buckets it wins or held, and a few others the load bound shifts.

One advert lists all of its instance's addresses and must fit a 1500-byte frame, so an
instance carries at most 255 IPv4 or 90 IPv6 addresses (configurable lower). A bucket over
that keeps the lowest addresses and the rest are `VRID_EXHAUSTED`; a Local group over it is
cut, in address order, into chunks that are instances of their own, sharing the group's
ranking: an IP joining or leaving it below others shifts them one chunk (another VRID, same
holder and backups), which no cut made from the IPs alone avoids. A family holds at most
(3V/4) × 255 IPv4 or × 90 IPv6 addresses in buckets.

An IP alone in its instance has reason `ASSIGNED`; one sharing with others `VRID_SHARED`,
or `VRID_SHARED_ACROSS_HOLDERS` when the instance's preferred holder is not the IP's own
rendezvous winner (only at `PER_ELIGIBLE_SET`).

Nothing here does I/O.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.model.labels import LabelSelector
from agent.model.net import IPAddress, IPFamily

# One advert lists every address of its instance and must fit a 1500-byte frame unfragmented:
# IPv4 is bounded by the 8-bit count (20 + 8 + 4 × 255 < 1500), IPv6 by the frame
# (40 + 8 + 16 × 90 = 1488).
MAX_ADDRESSES_IPV4 = 255
MAX_ADDRESSES_IPV6 = 90
MAX_PRIORITY = 254  # 255 means "address owner" (RFC 5798 §5.2.4); nodelb never owns an IP
MIN_PRIORITY = 1  # 0 means "resigning" (§5.2.4)
# The priorities of the first ranks (see priority_for_rank): the first backup sits just below
# the holder, so a crash fails over as fast as the RFC allows; each rank after it is
# RANK_SPACING below the one before, so its Skew_Time, and with it both its Master_Down and
# its takeover after a resignation, is RANK_SPACING / 256 of an interval later (25 ms at
# 10 cs, 250 ms at 1 s): well above the timer lateness the speaker reports, so the next
# backup hears the new Master before its own timer fires.
RANK_SPACING = 64
SPACED_PRIORITIES = (254, 253, 189, 125, 61)
STAGGERED_RANKS = 3  # ranks past this wait no longer at Startup (see startup_delay_cs)
VRID_MIN, VRID_MAX = 1, 255  # §5.2.3


class OwnershipReason(enum.StrEnum):
    """Why a node may not hold an IP, or what became of an IP (values are Event reasons)."""

    ELIGIBLE = "Eligible"
    NOT_READY = "NotReady"
    SELECTOR_MISMATCH = "SelectorMismatch"
    NO_LOCAL_ENDPOINT = "NoLocalEndpoint"
    ASSIGNED = "Assigned"
    VRID_SHARED = "VRIDShared"
    VRID_SHARED_ACROSS_HOLDERS = "VRIDSharedAcrossHolders"
    NO_ELIGIBLE_NODES = "NoEligibleNodes"
    VRID_EXHAUSTED = "VRIDExhausted"


class SharingLevel(enum.StrEnum):
    """How a family's IPs are grouped into VRRP instances (see the module docstring)."""

    PER_BUCKET = "PerBucket"  # Local-only IPs per (eligible set, holder): the usual level
    PER_ELIGIBLE_SET = "PerEligibleSet"  # Local-only IPs per eligible set: the range was short


@dataclass(frozen=True, slots=True)
class VridRange:
    """The VRIDs one family may use, `first..last` inclusive, within 1..255."""

    first: int = VRID_MIN
    last: int = VRID_MAX

    def __post_init__(self) -> None:
        if not VRID_MIN <= self.first <= self.last <= VRID_MAX:
            raise ValueError(
                f"VRID range {self.first}..{self.last} must lie within "
                f"{VRID_MIN}..{VRID_MAX} with first <= last"
            )

    @property
    def size(self) -> int:
        """Return how many VRIDs the range holds."""
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class OwnershipConfig:
    """The configuration ownership depends on; `selector` None means every node.

    `ipv4_max_addresses` / `ipv6_max_addresses` cap the addresses one instance carries
    (1..the defaults, which are what one advert can carry in a 1500-byte frame).
    """

    selector: LabelSelector | None = None
    ipv4_vrids: VridRange = VridRange()
    ipv6_vrids: VridRange = VridRange()
    ipv4_max_addresses: int = MAX_ADDRESSES_IPV4
    ipv6_max_addresses: int = MAX_ADDRESSES_IPV6

    def __post_init__(self) -> None:
        if not 1 <= self.ipv4_max_addresses <= MAX_ADDRESSES_IPV4:
            raise ValueError(
                f"IPv4 addresses per instance must be 1..{MAX_ADDRESSES_IPV4}, "
                f"got {self.ipv4_max_addresses}"
            )
        if not 1 <= self.ipv6_max_addresses <= MAX_ADDRESSES_IPV6:
            raise ValueError(
                f"IPv6 addresses per instance must be 1..{MAX_ADDRESSES_IPV6}, "
                f"got {self.ipv6_max_addresses}"
            )

    def vrids(self, family: IPFamily) -> VridRange:
        """Return the VRID range of `family`."""
        return self.ipv4_vrids if family is IPFamily.IPV4 else self.ipv6_vrids

    def max_addresses(self, family: IPFamily) -> int:
        """Return how many addresses one instance of `family` may carry."""
        return self.ipv4_max_addresses if family is IPFamily.IPV4 else self.ipv6_max_addresses


@dataclass(frozen=True, slots=True)
class NodeState:
    """What ownership needs to know about a Node: its name, readiness and labels."""

    name: str
    ready: bool
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ServiceUse:
    """One Service using an IP.

    `local_nodes` are the nodes with a local ready endpoint of the Service; it is only read
    when `local` (externalTrafficPolicy=Local).
    """

    service: str  # "namespace/name"
    local: bool
    local_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class IPUse:
    """A LoadBalancer IP and the Services using it (several when shared by a sharing key).

    The hash is computed once: the agent keeps one IPUse per IP across plans and rebuilds
    only those whose Services changed, and an input's frozenset of them must not re-hash
    every Service of every IP (10k at 10k Services) each time it is built.
    """

    ip: IPAddress
    services: tuple[ServiceUse, ...]
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.ip, self.services)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def family(self) -> IPFamily:
        """Return the IP's family."""
        return family_of(self.ip)


@dataclass(frozen=True, slots=True)
class Ineligible:
    """A node that may not hold an IP, and the first rule it fails."""

    node: str
    reason: OwnershipReason


@dataclass(frozen=True, slots=True)
class IPDecision:
    """What became of one IP.

    `vrid` and `holder` (the preferred holder, rank 0 of the instance) are None exactly when
    the reason is NO_ELIGIBLE_NODES or VRID_EXHAUSTED. `eligible` is sorted by name (empty for
    NO_ELIGIBLE_NODES); `ineligible` lists every other node, sorted by name.
    """

    ip: IPAddress
    family: IPFamily
    reason: OwnershipReason
    vrid: int | None
    holder: str | None
    eligible: tuple[str, ...]
    ineligible: tuple[Ineligible, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """One VRRP instance: its VRID, the addresses it carries and its ranked nodes.

    `ranking` holds exactly the nodes that run the instance, preferred holder first; the node
    at index r advertises `priority_for_rank(r)`. `addresses` are sorted.
    """

    family: IPFamily
    vrid: int
    addresses: tuple[IPAddress, ...]
    ranking: tuple[str, ...]
    key: bytes  # the placement key; equal keys in two plans mean "the same instance"


@dataclass(frozen=True, slots=True)
class Plan:
    """Every IP's decision and every VRRP instance, for all nodes alike.

    `ips` is sorted by (family, address); `groups` by (family, VRID).
    """

    ips: tuple[IPDecision, ...]
    groups: tuple[Group, ...]
    ipv4_sharing: SharingLevel
    ipv6_sharing: SharingLevel

    def decision(self, ip: IPAddress) -> IPDecision | None:
        """Return the decision for `ip`, or None when it was not part of the input."""
        for d in self.ips:
            if d.ip == ip:
                return d
        return None

    def sharing(self, family: IPFamily) -> SharingLevel:
        """Return the sharing level `family` ended up at."""
        return self.ipv4_sharing if family is IPFamily.IPV4 else self.ipv6_sharing


@dataclass(frozen=True, slots=True)
class Instance:
    """One VRRP instance a node must run: VRID, family, its own priority and the addresses."""

    vrid: int
    family: IPFamily
    priority: int
    addresses: tuple[IPAddress, ...]

    @property
    def version(self) -> int:
        """Return the IP version, 4 or 6 (the speaker's InstanceConfig spells families so)."""
        return 4 if self.family is IPFamily.IPV4 else 6


def family_of(ip: IPAddress) -> IPFamily:
    """Return the IP family of an address."""
    return IPFamily.IPV4 if ip.version == 4 else IPFamily.IPV6


def priority_for_rank(rank: int) -> int:
    """Return the VRRP priority of rank `rank` (0 = preferred holder).

    Ranks 0-4 get SPACED_PRIORITIES (254, 253, 189, 125, 61): after the holder crashes, the
    first backup's Master_Down_Interval is the RFC's shortest but one, and the second
    backup's is 64/256 of an interval longer, so it hears the new Master's first advert long
    before it would take over itself. RFC 5798's plain 254, 253, 252 put two backups
    interval/256 apart (0.4 ms at 10 cs), and both took over after a crash. Ranks past 4 go
    down by one from 60 (only reached after five nodes have failed); past 64 they all get 1,
    and VRRP orders them by primary address.
    """
    if rank < 0:
        raise ValueError(f"rank {rank} is negative")
    if rank < len(SPACED_PRIORITIES):
        return SPACED_PRIORITIES[rank]
    return max(SPACED_PRIORITIES[-1] - 1 - (rank - len(SPACED_PRIORITIES)), MIN_PRIORITY)


def rank_for_priority(priority: int) -> int:
    """Return the lowest rank that advertises `priority` (the inverse of priority_for_rank).

    A priority between two spaced ones (never advertised by nodelb, say a keepalived peer's)
    gets the rank of the spaced priority just below it, the rank it outranks.
    """
    for rank, spaced in enumerate(SPACED_PRIORITIES):
        if priority >= spaced:
            return rank
    return len(SPACED_PRIORITIES) + max(0, SPACED_PRIORITIES[-1] - 1 - priority)


def startup_delay_cs(priority: int, advert_interval_cs: int) -> int:
    """Return how much longer than Master_Down_Interval a new instance waits before its first
    takeover: one advert interval per rank below the preferred holder, at most
    STAGGERED_RANKS intervals.

    Why: Skew_Time separates two ranks by only interval/256 (4 ms at 1 s), while agents see
    a new Service tens to hundreds of ms apart. Without the stagger the first Master of a new
    IP is whichever node's agent was quickest, and the preferred holder preempts it a moment
    later: a second gratuitous burst, a second IPAnnounced Event, the address briefly on two
    nodes. With it, the preferred holder wins the first election unless it starts the
    instance more than one interval after the next rank. When it is not running at all, the
    IP comes up one interval later. Only the first Master_Down_Timer is longer: failover
    timing is unchanged.
    """
    rank = rank_for_priority(priority)
    return max(0, min(rank, STAGGERED_RANKS)) * advert_interval_cs


_HRW = hashlib.blake2b(b"nodelb-hrw\0", digest_size=8)
_VRID = hashlib.blake2b(b"nodelb-vrid\0", digest_size=8)


def weight(ip: IPAddress, node: str) -> int:
    """Return the rendezvous weight of `node` for `ip` (stable across processes and hosts)."""
    h = _HRW.copy()
    h.update(ip.packed)
    h.update(b"\0")
    h.update(node.encode())
    return int.from_bytes(h.digest(), "big")


def rank_nodes(ip: IPAddress, nodes: Iterable[str]) -> tuple[str, ...]:
    """Return `nodes` ordered by rendezvous weight for `ip`, highest first (ties by name)."""
    return tuple(sorted(nodes, key=lambda n: (-weight(ip, n), n)))


def _top(ip: IPAddress, nodes: Iterable[str]) -> str:
    return min(nodes, key=lambda n: (-weight(ip, n), n))


def _home(key: bytes, size: int) -> int:
    h = _VRID.copy()
    h.update(key)
    return int.from_bytes(h.digest(), "big") % size


def place(keys: Iterable[bytes], vrids: VridRange) -> dict[bytes, int]:
    """Return a VRID for each key: its hashed home in the range, else the next free one.

    Keys are placed in sorted order with cyclic linear probing, so the answer depends only on
    the set of keys. More keys than VRIDs is a caller error (ValueError).
    """
    ordered = sorted(set(keys))
    if len(ordered) > vrids.size:
        raise ValueError(f"{len(ordered)} instances do not fit {vrids.size} VRIDs")
    taken: set[int] = set()
    out: dict[bytes, int] = {}
    for key in ordered:
        slot = _home(key, vrids.size)
        while slot in taken:
            slot = (slot + 1) % vrids.size
        taken.add(slot)
        out[key] = vrids.first + slot
    return out


def _ip_sort_key(ip: IPAddress) -> tuple[int, int]:
    return ip.version, int(ip)


def _set_bytes(eligible: frozenset[str]) -> bytes:
    # Node names are DNS subdomains, so "\0" cannot occur inside one.
    return b"\0".join(n.encode() for n in sorted(eligible))


def node_base_reason(node: NodeState, *, selector: LabelSelector | None) -> OwnershipReason:
    """Return ELIGIBLE, or the first IP-independent rule `node` fails (readiness, selector)."""
    if not node.ready:
        return OwnershipReason.NOT_READY
    if selector is not None and not selector.matches(dict(node.labels)):
        return OwnershipReason.SELECTOR_MISMATCH
    return OwnershipReason.ELIGIBLE


def node_reason(node: NodeState, use: IPUse, *, selector: LabelSelector | None) -> OwnershipReason:
    """Return ELIGIBLE, or the first eligibility rule `node` fails for `use`'s IP."""
    base = node_base_reason(node, selector=selector)
    if base is not OwnershipReason.ELIGIBLE:
        return base
    return _local_reason(node.name, use)


def _local_reason(name: str, use: IPUse) -> OwnershipReason:
    if any(s.local and name not in s.local_nodes for s in use.services):
        return OwnershipReason.NO_LOCAL_ENDPOINT
    return OwnershipReason.ELIGIBLE


@dataclass(frozen=True, slots=True)
class _Candidate:
    ip: IPAddress
    eligible: frozenset[str]
    ineligible: tuple[Ineligible, ...]
    local: bool  # a Service using it has externalTrafficPolicy Local


@dataclass(frozen=True, slots=True)
class _Draft:
    key: bytes
    addresses: tuple[IPAddress, ...]  # sorted
    eligible: frozenset[str]
    ranking: tuple[str, ...]


def split_range(vrids: VridRange) -> tuple[VridRange, VridRange | None]:
    """Return (the bucket range, the Local range) a family's VRIDs are split into.

    The bucket range, the first three quarters (all but one VRID of a range of two or three;
    all of a single VRID), carries the IPs every eligible node may hold, each at the bucket
    its address hashes to; the Local range (None when empty) carries the instances of IPs only
    some nodes may hold.
    """
    local = vrids.size // 4 if vrids.size >= 4 else min(1, vrids.size - 1)
    if local == 0:
        return vrids, None
    return VridRange(vrids.first, vrids.last - local), VridRange(vrids.last - local + 1, vrids.last)


def bucket_of(ip: IPAddress, buckets: VridRange) -> int:
    """Return the VRID of `ip`'s bucket: a hash of the address alone, so no other IP and no
    node can ever change it."""
    return buckets.first + _home(b"ip\0" + ip.packed, buckets.size)


def rank_by_key(key: bytes, nodes: Iterable[str]) -> tuple[str, ...]:
    """Return `nodes` ordered by rendezvous weight for an instance key, highest first."""

    def w(node: str) -> int:
        h = _HRW.copy()
        h.update(b"key\0" + key + b"\0")
        h.update(node.encode())
        return int.from_bytes(h.digest(), "big")

    return tuple(sorted(nodes, key=lambda n: (-w(n), n)))


def preferred_holder(ip: IPAddress, nodes: Iterable[str], vrids: VridRange = VridRange()) -> str:
    """Return the preferred holder of an IP every one of `nodes` may hold (a Cluster-policy
    IP with `nodes` the eligible ones): its bucket's rank 0."""
    buckets, _ = split_range(vrids)
    return bucket_rankings(frozenset(nodes), buckets)[bucket_of(ip, buckets)][0]


def _bucket_key(vrid: int) -> bytes:
    return b"bucket\0" + vrid.to_bytes(1, "big")


@functools.lru_cache(maxsize=16)
def bucket_rankings(nodes: frozenset[str], buckets: VridRange) -> dict[int, tuple[str, ...]]:
    """Return every bucket's ranking over `nodes`: its holder, then the others by rendezvous.

    Holders by rendezvous with bounded load: buckets in VRID order each go to the first node
    in their rendezvous order that still has room, a node's room being floor(buckets /
    nodes), plus one for the first (buckets mod nodes) nodes to reach it; so every node
    holds the same number of buckets, give or take one (plain rendezvous over 191 buckets
    gave three nodes 81, 59 and 51). The answer depends on the node set and the range only,
    never on the IPs. The returned dict is shared: do not change it.
    """
    if not nodes:
        return {}
    floor, extra = divmod(buckets.size, len(nodes))
    load: dict[str, int] = dict.fromkeys(nodes, 0)
    out: dict[int, tuple[str, ...]] = {}
    for vrid in range(buckets.first, buckets.last + 1):
        order = rank_by_key(_bucket_key(vrid), nodes)
        holder = next(n for n in order if load[n] < floor or (load[n] == floor and extra > 0))
        if load[holder] == floor:
            extra -= 1
        load[holder] += 1
        out[vrid] = (holder, *(n for n in order if n != holder))
    return out


def _bucket_drafts(
    candidates: list[_Candidate], base: frozenset[str], buckets: VridRange, max_addresses: int
) -> tuple[dict[int, _Draft], list[IPAddress]]:
    """Return the bucket instances by VRID, and the IPs a full bucket cannot carry.

    A bucket's ranking (`bucket_rankings`) depends on the eligible nodes and the bucket, not
    on any of its IPs, so adding or removing an IP never changes another IP's VRID or holder.
    """
    members: dict[int, list[IPAddress]] = {}
    for c in candidates:
        members.setdefault(bucket_of(c.ip, buckets), []).append(c.ip)
    rankings = bucket_rankings(base, buckets) if members else {}
    drafts: dict[int, _Draft] = {}
    overflow: list[IPAddress] = []
    for vrid, ips in members.items():
        ips.sort(key=_ip_sort_key)
        overflow += ips[max_addresses:]
        drafts[vrid] = _Draft(_bucket_key(vrid), tuple(ips[:max_addresses]), base, rankings[vrid])
    return drafts, overflow


def _local_drafts(
    candidates: list[_Candidate], level: SharingLevel, max_addresses: int
) -> list[_Draft]:
    """Return the instances of the IPs only some nodes may hold, at `level`.

    PER_BUCKET: one per (eligible set, the IP's own rendezvous winner); its backups follow the
    key's rendezvous order. PER_ELIGIBLE_SET: one per eligible set. A group over
    `max_addresses` is cut into chunks in address order, each an instance of its own.
    """
    groups: dict[bytes, list[_Candidate]] = {}
    for c in candidates:
        if level is SharingLevel.PER_BUCKET:
            holder = _top(c.ip, c.eligible)
            key = b"holder\0" + holder.encode() + b"\0\0" + _set_bytes(c.eligible)
        else:
            key = b"set\0" + _set_bytes(c.eligible)
        groups.setdefault(key, []).append(c)
    drafts: list[_Draft] = []
    for key, group in groups.items():
        eligible = group[0].eligible
        addresses = sorted((c.ip for c in group), key=_ip_sort_key)
        if level is SharingLevel.PER_BUCKET:
            holder = _top(addresses[0], eligible)
            ranking = (holder, *rank_by_key(key, eligible - {holder}))
        else:
            ranking = rank_by_key(key, eligible)
        for n, start in enumerate(range(0, len(addresses), max_addresses)):
            drafts.append(
                _Draft(
                    key=key if n == 0 else key + b"\0\0chunk" + n.to_bytes(2, "big"),
                    addresses=tuple(addresses[start : start + max_addresses]),
                    eligible=eligible,
                    ranking=ranking,
                )
            )
    return drafts


def _plan_family(
    family: IPFamily,
    candidates: list[_Candidate],
    vrids: VridRange,
    max_addresses: int,
    base: frozenset[str],
) -> tuple[SharingLevel, list[Group], dict[IPAddress, OwnershipReason]]:
    """Return the sharing level, the instances and each IP's reason for one family.

    `base` is every node that passes the IP-independent rules, the eligible set of every IP
    no Local Service uses: those go to their address's bucket; the others to the Local
    range, even when their pods happen to be on every node, so that which range an IP is in
    depends on its own Services alone, never on the nodes.
    """
    buckets, local_range = split_range(vrids)
    everywhere = [c for c in candidates if not c.local]
    local = [c for c in candidates if c.local]
    reasons: dict[IPAddress, OwnershipReason] = {}
    by_vrid, overflow = _bucket_drafts(everywhere, base, buckets, max_addresses)
    for ip in overflow:
        reasons[ip] = OwnershipReason.VRID_EXHAUSTED
    level = SharingLevel.PER_BUCKET
    local_drafts: list[_Draft] = []
    if local:
        size = 0 if local_range is None else local_range.size
        local_drafts = _local_drafts(local, level, max_addresses)
        if len(local_drafts) > size:
            level = SharingLevel.PER_ELIGIBLE_SET
            local_drafts = _local_drafts(local, level, max_addresses)
        if len(local_drafts) > size:
            local_drafts.sort(key=lambda d: (-len(d.addresses), d.key))
            for dropped in local_drafts[size:]:
                for ip in dropped.addresses:
                    reasons[ip] = OwnershipReason.VRID_EXHAUSTED
            local_drafts = local_drafts[:size]
        if local_range is not None:
            placed = place((d.key for d in local_drafts), local_range)
            by_vrid.update((placed[d.key], d) for d in local_drafts)
    groups: list[Group] = []
    for vrid, d in by_vrid.items():
        groups.append(Group(family, vrid, d.addresses, d.ranking, d.key))
        for ip in d.addresses:
            if len(d.addresses) == 1:
                reasons[ip] = OwnershipReason.ASSIGNED
            elif d.key.startswith(b"set\0") and _top(ip, d.eligible) != d.ranking[0]:
                reasons[ip] = OwnershipReason.VRID_SHARED_ACROSS_HOLDERS
            else:
                reasons[ip] = OwnershipReason.VRID_SHARED
    return level, groups, reasons


def plan(
    *,
    nodes: Iterable[NodeState],
    ips: Iterable[IPUse],
    config: OwnershipConfig,
) -> Plan:
    """Return the ownership plan: each IP's eligible nodes, holder and VRID, and the instances.

    The result depends only on the *sets* given (input order never matters). Node names and
    IPs must be unique (ValueError otherwise): the caller builds one record per Node and one
    per IP, merging the Services that share an IP into that IP's record.
    """
    node_list = sorted(nodes, key=lambda n: n.name)
    names = [n.name for n in node_list]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate node names in {names}")
    use_list = sorted(ips, key=lambda u: _ip_sort_key(u.ip))
    addrs = [u.ip for u in use_list]
    if len(set(addrs)) != len(addrs):
        raise ValueError("duplicate IPs in the ownership input")

    # Readiness and the selector do not depend on the IP: decide them once per node.
    base = [(n.name, node_base_reason(n, selector=config.selector)) for n in node_list]
    by_family: dict[IPFamily, list[_Candidate]] = {IPFamily.IPV4: [], IPFamily.IPV6: []}
    no_holder: list[_Candidate] = []
    for use in use_list:
        eligible: set[str] = set()
        ineligible: list[Ineligible] = []
        for name, base_reason in base:
            reason = base_reason
            if reason is OwnershipReason.ELIGIBLE:
                reason = _local_reason(name, use)
            if reason is OwnershipReason.ELIGIBLE:
                eligible.add(name)
            else:
                ineligible.append(Ineligible(name, reason))
        is_local = any(s.local for s in use.services)
        cand = _Candidate(use.ip, frozenset(eligible), tuple(ineligible), is_local)
        (by_family[use.family] if eligible else no_holder).append(cand)

    decisions: list[IPDecision] = [
        IPDecision(
            c.ip, family_of(c.ip), OwnershipReason.NO_ELIGIBLE_NODES, None, None, (), c.ineligible
        )
        for c in no_holder
    ]
    groups: list[Group] = []
    levels: dict[IPFamily, SharingLevel] = {}
    everyone = frozenset(name for name, r in base if r is OwnershipReason.ELIGIBLE)
    for family, candidates in by_family.items():
        level, fam_groups, reasons = _plan_family(
            family, candidates, config.vrids(family), config.max_addresses(family), everyone
        )
        levels[family] = level
        groups.extend(fam_groups)
        group_of = {ip: g for g in fam_groups for ip in g.addresses}
        for c in candidates:
            g = group_of.get(c.ip)
            decisions.append(
                IPDecision(
                    ip=c.ip,
                    family=family,
                    reason=reasons[c.ip],
                    vrid=None if g is None else g.vrid,
                    holder=None if g is None else g.ranking[0],
                    eligible=tuple(sorted(c.eligible)),
                    ineligible=c.ineligible,
                )
            )
    return Plan(
        ips=tuple(sorted(decisions, key=lambda d: _ip_sort_key(d.ip))),
        groups=tuple(sorted(groups, key=lambda g: (g.family != IPFamily.IPV4, g.vrid))),
        ipv4_sharing=levels[IPFamily.IPV4],
        ipv6_sharing=levels[IPFamily.IPV6],
    )


def instances_for(node_name: str, plan: Plan) -> tuple[Instance, ...]:
    """Return the VRRP instances `node_name` must run, by (family, VRID).

    Empty when the node is eligible for no IP (it runs nothing and holds nothing).
    """
    return tuple(
        Instance(
            vrid=g.vrid,
            family=g.family,
            priority=priority_for_rank(g.ranking.index(node_name)),
            addresses=g.addresses,
        )
        for g in plan.groups
        if node_name in g.ranking
    )
