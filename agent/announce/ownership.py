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

**Ranking.** The eligible nodes of an IP are ranked by rendezvous (highest-random-weight)
hashing: weight = blake2b("nodelb-hrw", IP bytes, node name), highest first, ties (vanishingly
rare with 64-bit weights) by name. Rank 0 is the *preferred holder*. Adding a node moves only
the IPs it now wins; removing one moves only the IPs it held (at `PER_IP` and `PER_HOLDER`,
where every IP stays on its own winner). Rank r advertises VRRP priority
`priority_for_rank(r)`: 254, 253, then 64 apart (189, 125, 61), then down by one (floor 1), so
that consecutive backups' timers are a quarter interval apart. 255 is RFC 5798's address
owner (§5.2.4) and never used; a node that is not eligible for an instance does not run it.

**VRIDs and sharing.** IPv4 and IPv6 VRIDs are separate spaces on the wire, so each family is
planned alone within its configured range of V VRIDs. IPs that share a VRID share one master,
so only IPs whose holder is correct for all of them are grouped, at the first level that fits:

- `PER_IP` (at most V IPs with eligible nodes): one instance per IP.
- `PER_HOLDER` (more IPs than VRIDs): one instance per (eligible set, preferred holder). Every
  IP keeps its own preferred holder; only backups past rank 0 follow the group's first IP.
- `PER_ELIGIBLE_SET` (more such classes than VRIDs): one instance per eligible set, ranked
  like its first IP. Spread across holders is lost; correctness is not.
- Still more instances than VRIDs: the V instances with the most IPs (then by key) are
  kept; the IPs of the others are not held (`VRID_EXHAUSTED`). Merging two eligible sets
  could hand an IP to a node that must not hold it, so this is a hard limit: at most V
  distinct eligible sets per family (V = 255 with the full range).

One advert lists all of its instance's addresses and must fit a 1500-byte frame, so an
instance carries at most 255 IPv4 or 90 IPv6 addresses (configurable lower); a larger group
is cut, in address order, into chunks that are instances of their own and count against V.
So a family holds at most V × 255 IPv4 or V × 90 IPv6 addresses.

An IP alone in its instance has reason `ASSIGNED`; one sharing with others `VRID_SHARED`,
or `VRID_SHARED_ACROSS_HOLDERS` when the instance's preferred holder is not the IP's own
rendezvous winner (only at `PER_ELIGIBLE_SET`).

**Stable VRIDs.** Each instance has a key (the IP at `PER_IP`, its eligible set and holder at
`PER_HOLDER`, its eligible set at `PER_ELIGIBLE_SET`). Instances are placed in key order,
each at blake2b(key) mod V or, when taken, the next free VRID (cyclic linear probing). Adding
an instance never moves one whose key sorts before it; those after it move only along one
chain of displacements inside the run of consecutive taken VRIDs it lands in (none when its
home VRID is free, the common case below half load). Changing the sharing level regroups the
family; preferred holders do not change when going from `PER_IP` to `PER_HOLDER`.

Nothing here does I/O.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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

    PER_IP = "PerIP"
    PER_HOLDER = "PerHolder"
    PER_ELIGIBLE_SET = "PerEligibleSet"


class SelectorOperator(enum.StrEnum):
    """A label selector requirement's operator, spelled as in Kubernetes' LabelSelector."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions entry; `values` is used by In and NotIn only."""

    key: str
    operator: SelectorOperator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Return whether `labels` satisfy this requirement (Kubernetes semantics)."""
        value = labels.get(self.key)
        if self.operator is SelectorOperator.IN:
            return value is not None and value in self.values
        if self.operator is SelectorOperator.NOT_IN:
            return value is None or value not in self.values
        if self.operator is SelectorOperator.EXISTS:
            return value is not None
        return value is None


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A node label selector: every matchLabels pair and every requirement must hold.

    Kubernetes LabelSelector semantics, matchExpressions included, because the common use,
    keeping control-plane nodes out (`node-role.kubernetes.io/control-plane` DoesNotExist),
    needs them (the allocator's pool selectors are matchLabels only). An empty selector
    matches every node, as an empty LabelSelector does.
    """

    match_labels: frozenset[tuple[str, str]] = frozenset()
    match_expressions: frozenset[Requirement] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Return whether a node with `labels` is selected."""
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


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

    selector: NodeSelector | None = None
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


def node_base_reason(node: NodeState, *, selector: NodeSelector | None) -> OwnershipReason:
    """Return ELIGIBLE, or the first IP-independent rule `node` fails (readiness, selector)."""
    if not node.ready:
        return OwnershipReason.NOT_READY
    if selector is not None and not selector.matches(dict(node.labels)):
        return OwnershipReason.SELECTOR_MISMATCH
    return OwnershipReason.ELIGIBLE


def node_reason(node: NodeState, use: IPUse, *, selector: NodeSelector | None) -> OwnershipReason:
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


@dataclass(frozen=True, slots=True)
class _Draft:
    key: bytes
    addresses: tuple[IPAddress, ...]  # sorted; the first one anchors the ranking
    eligible: frozenset[str]


def _drafts(
    candidates: list[_Candidate], level: SharingLevel, max_addresses: int
) -> tuple[list[_Draft], int]:
    """Return the instances of one family at `level`, and how many there are.

    A group with more than `max_addresses` IPs is cut, in address order, into chunks; the
    first chunk keeps the group's key, so it keeps its VRID when the group grows.
    """
    buckets: dict[bytes, list[_Candidate]] = {}
    for c in candidates:
        if level is SharingLevel.PER_IP:
            key = b"ip\0" + c.ip.packed
        elif level is SharingLevel.PER_HOLDER:
            key = b"holder\0" + _top(c.ip, c.eligible).encode() + b"\0\0" + _set_bytes(c.eligible)
        else:
            key = b"set\0" + _set_bytes(c.eligible)
        buckets.setdefault(key, []).append(c)
    drafts: list[_Draft] = []
    for key, members in buckets.items():
        addresses = sorted((c.ip for c in members), key=_ip_sort_key)
        for n, start in enumerate(range(0, len(addresses), max_addresses)):
            drafts.append(
                _Draft(
                    key=key if n == 0 else key + b"\0\0chunk" + n.to_bytes(2, "big"),
                    addresses=tuple(addresses[start : start + max_addresses]),
                    eligible=members[0].eligible,
                )
            )
    return drafts, len(drafts)


def _plan_family(
    family: IPFamily, candidates: list[_Candidate], vrids: VridRange, max_addresses: int
) -> tuple[SharingLevel, list[Group], dict[IPAddress, OwnershipReason]]:
    """Return the sharing level, the instances and each IP's reason for one family."""
    level = SharingLevel.PER_IP
    drafts, count = _drafts(candidates, level, max_addresses)
    for next_level in (SharingLevel.PER_HOLDER, SharingLevel.PER_ELIGIBLE_SET):
        if count <= vrids.size:
            break
        level = next_level
        drafts, count = _drafts(candidates, level, max_addresses)
    reasons: dict[IPAddress, OwnershipReason] = {}
    if count > vrids.size:
        # Only PER_ELIGIBLE_SET gets here: keep the instances serving the most IPs.
        drafts.sort(key=lambda d: (-len(d.addresses), d.key))
        for dropped in drafts[vrids.size :]:
            for ip in dropped.addresses:
                reasons[ip] = OwnershipReason.VRID_EXHAUSTED
        drafts = drafts[: vrids.size]
    placed = place((d.key for d in drafts), vrids)
    groups: list[Group] = []
    for d in drafts:
        ranking = rank_nodes(d.addresses[0], d.eligible)
        groups.append(
            Group(
                family=family,
                vrid=placed[d.key],
                addresses=d.addresses,
                ranking=ranking,
                key=d.key,
            )
        )
        for ip in d.addresses:
            if len(d.addresses) == 1:
                reasons[ip] = OwnershipReason.ASSIGNED
            elif level is SharingLevel.PER_ELIGIBLE_SET and _top(ip, d.eligible) != ranking[0]:
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
        cand = _Candidate(use.ip, frozenset(eligible), tuple(ineligible))
        (by_family[use.family] if eligible else no_holder).append(cand)

    decisions: list[IPDecision] = [
        IPDecision(
            c.ip, family_of(c.ip), OwnershipReason.NO_ELIGIBLE_NODES, None, None, (), c.ineligible
        )
        for c in no_holder
    ]
    groups: list[Group] = []
    levels: dict[IPFamily, SharingLevel] = {}
    for family, candidates in by_family.items():
        level, fam_groups, reasons = _plan_family(
            family, candidates, config.vrids(family), config.max_addresses(family)
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
