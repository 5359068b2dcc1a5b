"""Ownership: eligibility, rendezvous ranking, priorities and VRID placement (agent/announce).

The table covers each eligibility rule and each sharing level with sentence-long case names;
the properties check what every node relies on: the plan does not depend on input order,
every node derives the same single preferred holder per instance, holders spread evenly,
adding or removing a node moves only the IPs that must move, VRIDs stay put when an IP comes
or goes, and VRIDs are shared only once a family has more IPs than its range holds.
"""

from __future__ import annotations

import ipaddress
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.announce.ownership import (
    RANK_SPACING,
    Group,
    Ineligible,
    IPUse,
    NodeState,
    OwnershipConfig,
    OwnershipReason,
    Plan,
    ServiceUse,
    SharingLevel,
    VridRange,
    bucket_of,
    bucket_rankings,
    family_of,
    instances_for,
    place,
    plan,
    priority_for_rank,
    rank_for_priority,
    rank_nodes,
    split_range,
    startup_delay_cs,
)
from agent.announce.vrrp.machine import master_down_interval
from agent.model.labels import LabelSelector, Requirement, SelectorOperator
from agent.model.net import IPAddress, IPFamily

R = OwnershipReason
V4 = ipaddress.IPv4Address("198.19.0.10")
V4B = ipaddress.IPv4Address("198.19.0.11")
V4C = ipaddress.IPv4Address("198.19.0.12")
V6 = ipaddress.IPv6Address("2001:db8::10")
LB_ONLY = LabelSelector(match_labels=frozenset({("nodelb.io/announce", "true")}))
ANNOUNCE = (("nodelb.io/announce", "true"),)


def node(name: str, *, ready: bool = True, labels: tuple[tuple[str, str], ...] = ()) -> NodeState:
    return NodeState(name=name, ready=ready, labels=labels)


def cluster(svc: str = "default/web") -> ServiceUse:
    return ServiceUse(service=svc, local=False)


def local(svc: str, *nodes: str) -> ServiceUse:
    return ServiceUse(service=svc, local=True, local_nodes=frozenset(nodes))


def use(ip: IPAddress, *services: ServiceUse) -> IPUse:
    return IPUse(ip=ip, services=services or (cluster(),))


@dataclass(frozen=True)
class Expect:
    reason: OwnershipReason
    eligible: frozenset[str]
    ineligible: frozenset[tuple[str, OwnershipReason]] = frozenset()


@dataclass(frozen=True)
class Case:
    nodes: tuple[NodeState, ...]
    ips: tuple[IPUse, ...]
    expect: dict[IPAddress, Expect]
    config: OwnershipConfig = field(default_factory=OwnershipConfig)
    ipv4_sharing: SharingLevel = SharingLevel.PER_BUCKET
    groups: int | None = None  # None: not checked


def names(*n: str) -> frozenset[str]:
    return frozenset(n)


def bad(*pairs: tuple[str, OwnershipReason]) -> frozenset[tuple[str, OwnershipReason]]:
    return frozenset(pairs)


TWELVE = tuple(ipaddress.IPv4Address("198.19.1.0") + i for i in range(12))


def same_bucket(count: int) -> list[IPAddress]:
    """Return `count` IPv4 addresses whose hashes put them in one bucket of the full range."""
    buckets, _ = split_range(VridRange())
    base = ipaddress.IPv4Address("198.19.3.0")
    home = bucket_of(base, buckets)
    found: list[IPAddress] = [base + i for i in range(4096) if bucket_of(base + i, buckets) == home]
    return found[:count]


BUCKETED = tuple(sorted(same_bucket(3)))


ONE_VRID = OwnershipConfig(ipv4_vrids=VridRange(7, 7), ipv6_vrids=VridRange(7, 7))

CASES = [
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=(use(V4),),
            expect={V4: Expect(R.ASSIGNED, names("a", "b"))},
        ),
        id="every Ready node is eligible for a Cluster-policy IP when no selector is configured",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b", ready=False)),
            ips=(use(V4),),
            expect={V4: Expect(R.ASSIGNED, names("a"), bad(("b", R.NOT_READY)))},
        ),
        id="a node that is not Ready is ineligible with NotReady",
    ),
    pytest.param(
        Case(
            nodes=(node("a", labels=ANNOUNCE), node("b")),
            ips=(use(V4),),
            config=OwnershipConfig(selector=LB_ONLY),
            expect={V4: Expect(R.ASSIGNED, names("a"), bad(("b", R.SELECTOR_MISMATCH)))},
        ),
        id="a node outside the configured label selector is ineligible with SelectorMismatch",
    ),
    pytest.param(
        Case(
            nodes=(node("a", labels=ANNOUNCE), node("b", ready=False)),
            ips=(use(V4, local("default/web", "a")),),
            config=OwnershipConfig(selector=LB_ONLY),
            expect={V4: Expect(R.ASSIGNED, names("a"), bad(("b", R.NOT_READY)))},
        ),
        id="a node failing several rules reports the first one, NotReady before the selector",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b"), node("c")),
            ips=(use(V4, local("default/web", "a", "c")),),
            expect={V4: Expect(R.ASSIGNED, names("a", "c"), bad(("b", R.NO_LOCAL_ENDPOINT)))},
        ),
        id="Local policy makes only the nodes with a local ready endpoint eligible",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b"), node("c")),
            ips=(use(V4, local("default/web", "a", "b"), local("default/api", "b", "c")),),
            expect={
                V4: Expect(
                    R.ASSIGNED,
                    names("b"),
                    bad(("a", R.NO_LOCAL_ENDPOINT), ("c", R.NO_LOCAL_ENDPOINT)),
                )
            },
        ),
        id="an IP shared by two Local Services needs a node with endpoints of both",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=(use(V4, cluster("default/web"), local("default/api", "b")),),
            expect={V4: Expect(R.ASSIGNED, names("b"), bad(("a", R.NO_LOCAL_ENDPOINT)))},
        ),
        id="an IP shared by a Cluster and a Local Service is held where the Local one has pods",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=(use(V4, local("default/web", "a"), local("default/api", "b")),),
            expect={
                V4: Expect(
                    R.NO_ELIGIBLE_NODES,
                    frozenset(),
                    bad(("a", R.NO_LOCAL_ENDPOINT), ("b", R.NO_LOCAL_ENDPOINT)),
                )
            },
            groups=0,
        ),
        id="Local Services sharing an IP with no node in common leave the IP unheld",
    ),
    pytest.param(
        Case(
            nodes=(node("a"),),
            ips=(use(V4, local("default/web")),),
            expect={V4: Expect(R.NO_ELIGIBLE_NODES, frozenset(), bad(("a", R.NO_LOCAL_ENDPOINT)))},
            groups=0,
        ),
        id="a Local Service without any ready endpoint is held nowhere",
    ),
    pytest.param(
        Case(
            nodes=(),
            ips=(use(V4), use(V6)),
            expect={
                V4: Expect(R.NO_ELIGIBLE_NODES, frozenset()),
                V6: Expect(R.NO_ELIGIBLE_NODES, frozenset()),
            },
            groups=0,
        ),
        id="with no nodes at all every IP is NoEligibleNodes and no instance exists",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=(use(V4), use(V6)),
            config=ONE_VRID,
            expect={
                V4: Expect(R.ASSIGNED, names("a", "b")),
                V6: Expect(R.ASSIGNED, names("a", "b")),
            },
            groups=2,
        ),
        id="IPv4 and IPv6 are separate VRID spaces so one VRID each serves one IP of each family",
    ),
    pytest.param(
        Case(
            nodes=(node("a"),),
            ips=(use(V4), use(V4B), use(V4C)),
            config=ONE_VRID,
            expect={
                V4: Expect(R.VRID_SHARED, names("a")),
                V4B: Expect(R.VRID_SHARED, names("a")),
                V4C: Expect(R.VRID_SHARED, names("a")),
            },
            groups=1,
        ),
        id="a range of one VRID is one bucket: every IP shares it with reason VRIDShared",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=tuple(use(ip) for ip in BUCKETED),
            config=OwnershipConfig(ipv4_max_addresses=2),
            expect={
                BUCKETED[0]: Expect(R.VRID_SHARED, names("a", "b")),
                BUCKETED[1]: Expect(R.VRID_SHARED, names("a", "b")),
                BUCKETED[2]: Expect(R.VRID_EXHAUSTED, names("a", "b")),
            },
            groups=1,
        ),
        id="a bucket carries what one advert can, in address order; the rest are not held",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=(use(V4, local("default/web", "a")), use(V4B, local("default/web", "a"))),
            config=OwnershipConfig(ipv4_vrids=VridRange(1, 2)),
            expect={
                V4: Expect(R.VRID_SHARED, names("a"), bad(("b", R.NO_LOCAL_ENDPOINT))),
                V4B: Expect(R.VRID_SHARED, names("a"), bad(("b", R.NO_LOCAL_ENDPOINT))),
            },
            groups=1,
        ),
        id="Local IPs of one eligible set and holder share one instance in the Local range",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b")),
            ips=(
                use(V4, local("default/web", "a")),
                use(V4B, local("default/api", "b")),
                use(V4C, local("default/web", "a")),
            ),
            config=OwnershipConfig(ipv4_vrids=VridRange(1, 2)),
            expect={
                V4: Expect(R.VRID_SHARED, names("a"), bad(("b", R.NO_LOCAL_ENDPOINT))),
                V4B: Expect(R.VRID_EXHAUSTED, names("b"), bad(("a", R.NO_LOCAL_ENDPOINT))),
                V4C: Expect(R.VRID_SHARED, names("a"), bad(("b", R.NO_LOCAL_ENDPOINT))),
            },
            ipv4_sharing=SharingLevel.PER_ELIGIBLE_SET,
            groups=1,
        ),
        id="more eligible sets than VRIDs: the set with the most IPs keeps the VRID, others wait",
    ),
    pytest.param(
        Case(
            nodes=(node("a"), node("b"), node("c")),
            ips=tuple(use(ip) for ip in TWELVE),
            config=OwnershipConfig(ipv4_vrids=VridRange(10, 11)),
            expect={ip: Expect(R.VRID_SHARED, names("a", "b", "c")) for ip in TWELVE},
            groups=1,
        ),
        id="a range of two VRIDs keeps one bucket for every Cluster-policy IP, one for Local",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_ownership_decisions(case: Case) -> None:
    result = plan(nodes=case.nodes, ips=case.ips, config=case.config)
    problems: list[str] = []
    for ip, want in case.expect.items():
        got = result.decision(ip)
        if got is None:
            problems.append(f"{ip}: no decision")
            continue
        if got.reason is not want.reason:
            problems.append(f"{ip}: reason {got.reason}, want {want.reason}")
        if frozenset(got.eligible) != want.eligible:
            problems.append(f"{ip}: eligible {sorted(got.eligible)}, want {sorted(want.eligible)}")
        ineligible = frozenset((i.node, i.reason) for i in got.ineligible)
        if ineligible != want.ineligible:
            problems.append(
                f"{ip}: ineligible {sorted(ineligible)}, want {sorted(want.ineligible)}"
            )
        held = want.reason not in (R.NO_ELIGIBLE_NODES, R.VRID_EXHAUSTED)
        if (got.vrid is not None) != held or (got.holder is not None) != held:
            problems.append(f"{ip}: vrid {got.vrid} holder {got.holder}, held should be {held}")
        if got.holder is not None and got.holder not in want.eligible:
            problems.append(f"{ip}: holder {got.holder} is not eligible")
        rng = case.config.vrids(got.family)
        if got.vrid is not None and not rng.first <= got.vrid <= rng.last:
            problems.append(f"{ip}: VRID {got.vrid} outside {rng.first}..{rng.last}")
    if result.ipv4_sharing is not case.ipv4_sharing:
        problems.append(f"IPv4 sharing {result.ipv4_sharing}, want {case.ipv4_sharing}")
    if case.groups is not None and len(result.groups) != case.groups:
        problems.append(f"{len(result.groups)} instances, want {case.groups}")
    assert not problems, "\n".join(problems)


def test_local_ips_grouped_by_eligible_set_report_which_share_across_holders() -> None:
    """A Local range of one VRID and Local IPs whose own winners differ: one instance per
    eligible set, VRIDSharedAcrossHolders for the IPs whose own winner is not its holder."""
    nodes = (node("a"), node("b"), node("c"))
    ips = [use(ip, local("default/web", "a", "b")) for ip in TWELVE]
    result = plan(nodes=nodes, ips=ips, config=OwnershipConfig(ipv4_vrids=VridRange(1, 2)))
    assert result.ipv4_sharing is SharingLevel.PER_ELIGIBLE_SET
    (group,) = result.groups
    assert group.vrid == 2  # the Local range
    for d in result.ips:
        own = rank_nodes(d.ip, ("a", "b"))[0]
        want = R.VRID_SHARED if own == group.ranking[0] else R.VRID_SHARED_ACROSS_HOLDERS
        assert d.reason is want, d
    assert {d.reason for d in result.ips} == {R.VRID_SHARED, R.VRID_SHARED_ACROSS_HOLDERS}


SELECTOR_CASES = [
    pytest.param(LabelSelector(), {}, True, id="the empty selector matches a node without labels"),
    pytest.param(
        LabelSelector(match_labels=frozenset({("zone", "a")})),
        {"zone": "b"},
        False,
        id="matchLabels needs the exact value",
    ),
    pytest.param(
        LabelSelector(
            match_expressions=frozenset(
                {Requirement("zone", SelectorOperator.IN, frozenset({"a", "b"}))}
            )
        ),
        {"zone": "b"},
        True,
        id="In matches any listed value",
    ),
    pytest.param(
        LabelSelector(
            match_expressions=frozenset(
                {Requirement("zone", SelectorOperator.IN, frozenset({"a"}))}
            )
        ),
        {},
        False,
        id="In does not match a node without the key",
    ),
    pytest.param(
        LabelSelector(
            match_expressions=frozenset(
                {Requirement("zone", SelectorOperator.NOT_IN, frozenset({"a"}))}
            )
        ),
        {},
        True,
        id="NotIn matches a node without the key, as Kubernetes does",
    ),
    pytest.param(
        LabelSelector(
            match_expressions=frozenset(
                {Requirement("zone", SelectorOperator.NOT_IN, frozenset({"a"}))}
            )
        ),
        {"zone": "a"},
        False,
        id="NotIn refuses a listed value",
    ),
    pytest.param(
        LabelSelector(match_expressions=frozenset({Requirement("lb", SelectorOperator.EXISTS)})),
        {"lb": ""},
        True,
        id="Exists matches an empty value",
    ),
    pytest.param(
        LabelSelector(
            match_expressions=frozenset({Requirement("lb", SelectorOperator.DOES_NOT_EXIST)})
        ),
        {"lb": "x"},
        False,
        id="DoesNotExist refuses a node carrying the key",
    ),
    pytest.param(
        LabelSelector(
            match_labels=frozenset({("zone", "a")}),
            match_expressions=frozenset({Requirement("lb", SelectorOperator.EXISTS)}),
        ),
        {"zone": "a"},
        False,
        id="matchLabels and matchExpressions must both hold",
    ),
]


@pytest.mark.parametrize(("selector", "labels", "matches"), SELECTOR_CASES)
def test_label_selector(selector: LabelSelector, labels: dict[str, str], matches: bool) -> None:
    assert selector.matches(labels) is matches


@pytest.mark.parametrize(
    ("rank", "priority"),
    [
        pytest.param(0, 254, id="the preferred holder advertises 254, never the owner's 255"),
        pytest.param(
            1, 253, id="the first backup advertises 253: crash failover as fast as before"
        ),
        pytest.param(2, 189, id="the second backup 64 below it"),
        pytest.param(3, 125, id="the third 64 below that"),
        pytest.param(4, 61, id="the fourth 64 below that"),
        pytest.param(5, 60, id="past the fourth, one step at a time"),
        pytest.param(64, 1, id="rank 64 reaches the lowest usable priority 1"),
        pytest.param(400, 1, id="ranks past 64 stay at 1 and never reach the resign value 0"),
    ],
)
def test_priority_for_rank(rank: int, priority: int) -> None:
    assert priority_for_rank(rank) == priority
    assert rank_for_priority(priority) == min(rank, 64)


@pytest.mark.parametrize("interval_cs", [10, 100])
def test_consecutive_backups_timers_are_a_quarter_interval_apart(interval_cs: int) -> None:
    # After the holder (rank 0) crashes, rank r+1 must hear rank r's first advert before its
    # own Master_Down_Timer fires: the gap is the margin against late timers.
    margin = interval_cs * 10_000 * RANK_SPACING // 256
    for rank in range(1, 4):
        nearer = master_down_interval(priority_for_rank(rank), interval_cs)
        further = master_down_interval(priority_for_rank(rank + 1), interval_cs)
        assert further - nearer >= margin - 1, (rank, further - nearer)
    # ... and the first backup is as quick as with the RFC's 254, 253, 252.
    assert master_down_interval(priority_for_rank(1), interval_cs) == master_down_interval(
        253, interval_cs
    )


def test_rank_for_priority_inverts_priority_for_rank_and_places_foreign_priorities() -> None:
    for rank in range(70):
        assert rank_for_priority(priority_for_rank(rank)) == min(rank, 64)
    # A priority nodelb never sends (a keepalived peer's 150) ranks with the one it outranks.
    assert rank_for_priority(150) == 3
    assert rank_for_priority(255) == 0


@pytest.mark.parametrize(
    ("rank", "delay"),
    [
        pytest.param(0, 0, id="the preferred holder waits the plain Master_Down_Interval"),
        pytest.param(1, 20, id="the first backup waits one interval more"),
        pytest.param(2, 40, id="the second backup two"),
        pytest.param(3, 60, id="the third three"),
        pytest.param(250, 60, id="ranks past the third wait no longer (bounded first election)"),
        pytest.param(400, 60, id="ranks sharing priority 1 too"),
    ],
)
def test_startup_delay_grows_by_one_interval_per_rank_up_to_three(rank: int, delay: int) -> None:
    assert startup_delay_cs(priority_for_rank(rank), 20) == delay


def test_negative_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        priority_for_rank(-1)


@pytest.mark.parametrize(
    ("first", "last"),
    [
        pytest.param(0, 10, id="VRID 0 is not a VRID"),
        pytest.param(1, 256, id="VRIDs stop at 255"),
        pytest.param(9, 8, id="an empty range is refused"),
    ],
)
def test_vrid_range_is_validated(first: int, last: int) -> None:
    with pytest.raises(ValueError, match="VRID range"):
        VridRange(first, last)


@pytest.mark.parametrize(
    ("v4", "v6"),
    [
        pytest.param(0, 90, id="an instance carries at least one address"),
        pytest.param(256, 90, id="an IPv4 advert counts at most 255 addresses"),
        pytest.param(255, 91, id="91 IPv6 addresses do not fit a 1500-byte frame"),
    ],
)
def test_addresses_per_instance_are_validated(v4: int, v6: int) -> None:
    with pytest.raises(ValueError, match="addresses per instance"):
        OwnershipConfig(ipv4_max_addresses=v4, ipv6_max_addresses=v6)


def test_duplicate_nodes_and_ips_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate node"):
        plan(nodes=[node("a"), node("a")], ips=[use(V4)], config=OwnershipConfig())
    with pytest.raises(ValueError, match="duplicate IPs"):
        plan(nodes=[node("a")], ips=[use(V4), use(V4)], config=OwnershipConfig())


def test_hashes_are_pinned_so_mixed_versions_agree() -> None:
    """Every node must compute the same ranking and VRID; a changed hash would split a cluster
    during a rolling upgrade, so the scheme's outputs are frozen here."""
    nodes = [node(f"node-{c}") for c in "abcde"]
    assert rank_nodes(V4, [n.name for n in nodes]) == (
        "node-c",
        "node-e",
        "node-a",
        "node-d",
        "node-b",
    )
    assert rank_nodes(V6, [n.name for n in nodes]) == (
        "node-e",
        "node-d",
        "node-a",
        "node-b",
        "node-c",
    )
    result = plan(nodes=nodes, ips=[use(V4), use(V6)], config=OwnershipConfig())
    # The buckets (a hash of the address) and their bounded-load rendezvous rankings.
    assert [(g.family, g.vrid, g.addresses, g.ranking) for g in result.groups] == [
        (IPFamily.IPV4, 106, (V4,), ("node-d", "node-e", "node-a", "node-c", "node-b")),
        (IPFamily.IPV6, 102, (V6,), ("node-d", "node-c", "node-a", "node-b", "node-e")),
    ]


def test_instances_for_gives_each_node_its_rank_priority() -> None:
    nodes = [node("node-a"), node("node-b"), node("node-c"), node("node-d", ready=False)]
    result = plan(nodes=nodes, ips=[use(V4), use(V6)], config=OwnershipConfig())
    (group4,) = [g for g in result.groups if g.family is IPFamily.IPV4]
    assert set(group4.ranking) == {"node-a", "node-b", "node-c"}
    for rank, name in enumerate(group4.ranking):
        (inst4,) = [i for i in instances_for(name, result) if i.family is IPFamily.IPV4]
        assert inst4.priority == (254, 253, 189)[rank]
        assert inst4.addresses == (V4,)
        assert inst4.vrid == result.decision(V4).vrid  # type: ignore[union-attr]
    assert [i.version for i in instances_for("node-a", result)] == [4, 6]
    assert instances_for("node-d", result) == ()
    assert instances_for("unknown", result) == ()


def test_holders_spread_evenly_over_ten_nodes() -> None:
    """1000 IPs over 10 nodes: each node holds 19 or 20 of the 191 buckets, and so about
    100 IPs (measured 86-113: the buckets' own sizes vary, about 5 ± 2.3 IPs each)."""
    nodes = [node(f"node-{i}") for i in range(10)]
    base = ipaddress.IPv4Address("198.19.0.0")
    result = plan(nodes=nodes, ips=[use(base + i) for i in range(1000)], config=OwnershipConfig())
    buckets, _ = split_range(VridRange())
    assert len(result.groups) <= buckets.size
    per_node = Counter(
        r[0] for r in bucket_rankings(frozenset(n.name for n in nodes), buckets).values()
    )
    assert set(per_node.values()) <= {19, 20}, per_node
    counts = Counter(d.holder for d in result.ips)
    assert set(counts) == {n.name for n in nodes}
    assert all(70 <= c <= 130 for c in counts.values()), counts


def test_growing_past_255_ips_moves_no_ip_that_stays() -> None:
    """200 -> 300 -> 1000 Cluster-policy IPs, as issue #18 grew them (crossing 255 used to
    regroup every IP): no IP already there changes VRID or holder."""
    nodes = [node(f"node-{c}") for c in "abc"]
    base = ipaddress.IPv4Address("198.18.64.0")
    prev: dict[IPAddress, tuple[int | None, str | None]] = {}
    for n in (200, 300, 1000, 300, 200):
        result = plan(nodes=nodes, ips=[use(base + i) for i in range(n)], config=OwnershipConfig())
        cur = {d.ip: (d.vrid, d.holder) for d in result.ips}
        assert all(d.reason is not R.VRID_EXHAUSTED for d in result.ips)
        moved = {ip: (was, cur[ip]) for ip, was in prev.items() if ip in cur and cur[ip] != was}
        assert not moved, moved
        prev = cur


# --- properties ---------------------------------------------------------------------------

NODE_NAMES = [f"node-{c}" for c in "abcdefgh"]
SELECTOR = LabelSelector(
    match_expressions=frozenset({Requirement("role", SelectorOperator.IN, frozenset({"lb"}))})
)


@dataclass(frozen=True)
class World:
    nodes: tuple[NodeState, ...]
    ips: tuple[IPUse, ...]
    config: OwnershipConfig


@st.composite
def vrid_ranges(draw: st.DrawFn, sizes: st.SearchStrategy[int]) -> VridRange:
    size = draw(sizes)
    first = draw(st.integers(1, 256 - size))
    return VridRange(first, first + size - 1)


@st.composite
def node_states(draw: st.DrawFn, name: str) -> NodeState:
    return NodeState(
        name=name,
        ready=draw(st.sampled_from([True, True, True, False])),
        labels=(("role", draw(st.sampled_from(["lb", "lb", "worker"]))),),
    )


@st.composite
def ip_uses(draw: st.DrawFn, ip: IPAddress, names: Sequence[str]) -> IPUse:
    count = draw(st.integers(0, 3))
    services = []
    for i in range(count):
        is_local = draw(st.booleans())
        nodes = draw(st.sets(st.sampled_from(names))) if is_local and names else set()
        services.append(ServiceUse(f"ns/svc-{i}", is_local, frozenset(nodes)))
    return IPUse(ip, tuple(services))


@st.composite
def worlds(
    draw: st.DrawFn,
    *,
    max_ips: int = 20,
    vrid_sizes: st.SearchStrategy[int] | None = None,
) -> World:
    if vrid_sizes is None:
        vrid_sizes = st.integers(1, 8)
    names = draw(st.lists(st.sampled_from(NODE_NAMES), unique=True, max_size=6))
    nodes = tuple(draw(node_states(n)) for n in names)
    v4 = draw(st.sets(st.integers(0, 2**17 - 1), max_size=max_ips))
    v6 = draw(st.sets(st.integers(0, 2**96 - 1), max_size=max_ips // 2))
    addrs: list[IPAddress] = [ipaddress.IPv4Address("198.18.0.0") + o for o in sorted(v4)]
    addrs += [ipaddress.IPv6Address("2001:db8::") + o for o in sorted(v6)]
    ips = tuple(draw(ip_uses(ip, names)) for ip in addrs)
    config = OwnershipConfig(
        selector=draw(st.none() | st.just(SELECTOR)),
        ipv4_vrids=draw(vrid_ranges(vrid_sizes)),
        ipv6_vrids=draw(vrid_ranges(vrid_sizes)),
        ipv4_max_addresses=draw(st.sampled_from([255, 255, 1, 2, 3])),
        ipv6_max_addresses=draw(st.sampled_from([90, 90, 1, 2, 3])),
    )
    return World(nodes, ips, config)


def plan_of(world: World) -> Plan:
    return plan(nodes=world.nodes, ips=world.ips, config=world.config)


def check_consistent(world: World, result: Plan) -> list[str]:
    """Return every way `result` breaks the invariants all nodes rely on."""
    problems: list[str] = []
    by_ip = {d.ip: d for d in result.ips}
    if set(by_ip) != {u.ip for u in world.ips}:
        problems.append("the decisions do not cover exactly the input IPs")
    seen: set[tuple[IPFamily, int]] = set()
    in_group: dict[IPAddress, int] = {}
    for g in result.groups:
        if (g.family, g.vrid) in seen:
            problems.append(f"{g.family} VRID {g.vrid} is used twice")
        seen.add((g.family, g.vrid))
        rng = world.config.vrids(g.family)
        if not rng.first <= g.vrid <= rng.last:
            problems.append(f"VRID {g.vrid} outside {rng}")
        for ip in g.addresses:
            in_group[ip] = in_group.get(ip, 0) + 1
            d = by_ip[ip]
            if len(g.addresses) > world.config.max_addresses(g.family):
                problems.append(f"VRID {g.vrid} carries {len(g.addresses)} addresses")
            if family_of(ip) is not g.family:
                problems.append(f"{ip} is in a {g.family} instance")
            # The safety invariant: whoever wins the instance may hold every address in it.
            if set(g.ranking) != set(d.eligible):
                problems.append(f"{ip}: instance nodes {g.ranking} != eligible {d.eligible}")
            if d.vrid != g.vrid or d.holder != g.ranking[0]:
                problems.append(f"{ip}: decision {d.vrid}/{d.holder} disagrees with its instance")
        # Every node's own view: exactly one node runs the instance at the top priority.
        tops = [
            n.name
            for n in world.nodes
            for i in instances_for(n.name, result)
            if i.family is g.family and i.vrid == g.vrid and i.priority == 254
        ]
        if tops != [g.ranking[0]]:
            problems.append(f"{g.family} VRID {g.vrid}: top-priority nodes {tops}")
    for d in result.ips:
        held = d.reason not in (R.NO_ELIGIBLE_NODES, R.VRID_EXHAUSTED)
        if in_group.get(d.ip, 0) != (1 if held else 0):
            problems.append(f"{d.ip} ({d.reason}) is in {in_group.get(d.ip, 0)} instances")
        if (d.reason is R.NO_ELIGIBLE_NODES) != (not d.eligible):
            problems.append(f"{d.ip}: reason {d.reason} with eligible {d.eligible}")
        if set(d.eligible) & {i.node for i in d.ineligible}:
            problems.append(f"{d.ip}: a node is both eligible and ineligible")
        if len(d.eligible) + len(d.ineligible) != len(world.nodes):
            problems.append(f"{d.ip}: not every node has a verdict")
    for n in world.nodes:
        for inst in instances_for(n.name, result):
            if not 1 <= inst.priority <= 254:
                problems.append(f"{n.name}: priority {inst.priority}")
    return problems


@settings(max_examples=100, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_plan_does_not_depend_on_input_order(world: World, rnd: random.Random) -> None:
    nodes, ips = list(world.nodes), list(world.ips)
    rnd.shuffle(nodes)
    rnd.shuffle(ips)
    shuffled = [replace(u, services=tuple(rnd.sample(u.services, len(u.services)))) for u in ips]
    assert plan(nodes=nodes, ips=shuffled, config=world.config) == plan_of(world)


@settings(max_examples=120, deadline=None)
@given(worlds())
def test_every_node_derives_one_master_per_instance_and_only_eligible_holders(
    world: World,
) -> None:
    problems = check_consistent(world, plan_of(world))
    assert not problems, "\n".join(problems)


@settings(max_examples=100, deadline=None)
@given(worlds(max_ips=300, vrid_sizes=st.integers(1, 255)))
def test_invariants_hold_at_every_sharing_level_with_many_ips(world: World) -> None:
    problems = check_consistent(world, plan_of(world))
    assert not problems, "\n".join(problems)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(200, 600),
    st.integers(0, 2**17 - 700),
)
def test_holders_spread_within_six_standard_deviations(m: int, n: int, offset: int) -> None:
    """A node holding k of the B buckets holds binomial(n, k/B) of n IPs (each address hashes
    to a bucket); 6 sd makes a false failure ~1e-9."""
    nodes = [node(f"node-{i}") for i in range(m)]
    base = ipaddress.IPv4Address("198.18.0.0") + offset
    result = plan(nodes=nodes, ips=[use(base + i) for i in range(n)], config=OwnershipConfig())
    counts = Counter(d.holder for d in result.ips)
    buckets, _ = split_range(VridRange())
    held = Counter(
        r[0] for r in bucket_rankings(frozenset(x.name for x in nodes), buckets).values()
    )
    assert max(held.values()) - min(held.values()) <= 1, held  # bounded load: balanced buckets
    mean = n / m
    p = max(held.values()) / buckets.size
    sd = (n * p * (1 - p)) ** 0.5
    assert len(counts) == m
    assert all(abs(c - mean) <= 6 * sd for c in counts.values()), (counts, mean, sd)


def holders(result: Plan) -> dict[IPAddress, str | None]:
    return {d.ip: d.holder for d in result.ips}


def vrid_of(result: Plan, ip: IPAddress) -> int | None:
    d = result.decision(ip)
    return None if d is None else d.vrid


def bucketed(world: World, result: Plan) -> set[IPAddress]:
    """Return the held IPs `result` put in a bucket (every eligible node may hold them)."""
    out = set()
    for d in result.ips:
        if d.vrid is None:
            continue
        buckets, _ = split_range(world.config.vrids(d.family))
        if buckets.first <= d.vrid <= buckets.last:
            out.add(d.ip)
    return out


@settings(max_examples=120, deadline=None)
@given(worlds(vrid_sizes=st.integers(3, 255)), st.sampled_from(NODE_NAMES), st.data())
def test_adding_a_node_moves_only_the_ips_it_wins(
    world: World, new: str, data: st.DataObject
) -> None:
    assume(new not in {n.name for n in world.nodes})
    added = data.draw(node_states(new))
    # The new node may also carry local endpoints of some Local Services.
    with_pods = data.draw(
        st.sets(st.sampled_from([u.ip for u in world.ips]) if world.ips else st.nothing())
    )
    ips = tuple(
        replace(
            u,
            services=tuple(
                replace(s, local_nodes=s.local_nodes | {new}) if u.ip in with_pods else s
                for s in u.services
            ),
        )
        for u in world.ips
    )
    before = plan(nodes=world.nodes, ips=ips, config=world.config)
    after = plan(nodes=(*world.nodes, added), ips=ips, config=world.config)
    # Grouping by eligible set alone gives up per-IP holders (documented). Otherwise a Local
    # IP's preferred holder is its own rendezvous winner, so only the newcomer can take it;
    # a bucket's holder is its rendezvous winner under a load bound, so a few buckets shift
    # between the others as the bound tightens, never more than the newcomer takes.
    levels = {before.ipv4_sharing, before.ipv6_sharing, after.ipv4_sharing, after.ipv6_sharing}
    assume(SharingLevel.PER_ELIGIBLE_SET not in levels)
    a, b = holders(before), holders(after)
    # Held before and after: an IP a full bucket or Local range turned away is not a move.
    moved = {ip: (a[ip], b[ip]) for ip in a if None not in (a[ip], b[ip]) and a[ip] != b[ip]}
    in_bucket = bucketed(world, before) & bucketed(world, after)
    assert all(to == new for ip, (_, to) in moved.items() if ip not in in_bucket), moved
    # Each family has its own buckets and its own load bound: the allowance is per family.
    for family in (4, 6):
        of_family = {ip: m for ip, m in moved.items() if ip.version == family}
        shifted = {vrid_of(after, ip) for ip, (_, to) in of_family.items() if to != new}
        taken = {vrid_of(after, ip) for ip, (_, to) in of_family.items() if to == new}
        assert len(shifted) <= max(1, len(taken)), (family, shifted, taken)


@settings(max_examples=120, deadline=None)
@given(worlds(vrid_sizes=st.integers(3, 255)), st.data())
def test_removing_a_node_moves_only_the_ips_it_held(world: World, data: st.DataObject) -> None:
    assume(world.nodes)
    gone = data.draw(st.sampled_from([n.name for n in world.nodes]))
    before = plan_of(world)
    after = plan(
        nodes=[n for n in world.nodes if n.name != gone], ips=world.ips, config=world.config
    )
    levels = {before.ipv4_sharing, before.ipv6_sharing, after.ipv4_sharing, after.ipv6_sharing}
    assume(SharingLevel.PER_ELIGIBLE_SET not in levels)
    a, b = holders(before), holders(after)
    moved = {ip: (a[ip], b[ip]) for ip in a if None not in (a[ip], b[ip]) and a[ip] != b[ip]}
    in_bucket = bucketed(world, before) & bucketed(world, after)
    assert all(frm == gone for ip, (frm, _) in moved.items() if ip not in in_bucket), moved
    # Buckets: the load bound loosens, so a few of the others' buckets may shift, never more
    # than the gone node held. Each family has its own buckets and bound: counted per family.
    for family in (4, 6):
        of_family = {ip: m for ip, m in moved.items() if ip.version == family}
        shifted = {vrid_of(after, ip) for ip, (frm, _) in of_family.items() if frm != gone}
        lost = {vrid_of(before, ip) for ip, (frm, _) in of_family.items() if frm == gone}
        assert len(shifted) <= max(1, len(lost)), (family, shifted, lost)


def run_of(vrid: int, taken: set[int], rng: VridRange) -> set[int]:
    """Return the cyclic run of consecutive taken VRIDs containing `vrid`."""
    run = {vrid}
    for step in (1, -1):
        v = vrid
        while True:
            v = rng.first + (v - rng.first + step) % rng.size
            if v not in taken or v in run:
                break
            run.add(v)
    return run


@settings(max_examples=120, deadline=None)
@given(
    st.sets(st.binary(min_size=1, max_size=6), max_size=40),
    st.binary(min_size=1, max_size=6),
    vrid_ranges(st.integers(1, 255)),
)
def test_placing_one_more_key_moves_only_a_chain_after_it(
    keys: set[bytes], new: bytes, rng: VridRange
) -> None:
    assume(new not in keys and len(keys) + 1 <= rng.size)
    before = place(keys, rng)
    after = place(keys | {new}, rng)
    assert place(sorted(keys, reverse=True), rng) == before  # a function of the set
    assert len(set(after.values())) == len(after)  # one VRID per key
    moved = {k for k in keys if before[k] != after[k]}
    assert all(k > new for k in moved), "a key sorting before the new one moved"
    run = run_of(after[new], set(after.values()), rng)
    assert all(after[k] in run for k in moved), "a displaced key left the new key's run"


def local_keys(world: World, result: Plan) -> set[tuple[IPFamily, bytes]]:
    """Return the keys of the instances in the Local ranges."""
    out = set()
    for g in result.groups:
        _, local_range = split_range(world.config.vrids(g.family))
        if local_range is not None and local_range.first <= g.vrid <= local_range.last:
            out.add((g.family, g.key))
    return out


def check_ip_step(world: World, before: Plan, after: Plan, changed: IPAddress) -> None:
    """Assert that a step adding or removing `changed` moved no IP it may not move (the
    property test_adding_and_removing_ips_never_moves_an_ip_that_stays states)."""
    stay = {d.ip: d for d in after.ips if d.vrid is not None}
    was = {d.ip: d for d in before.ips if d.vrid is not None and d.ip in stay}
    moved = {ip for ip, d in was.items() if (d.vrid, d.holder) != (stay[ip].vrid, stay[ip].holder)}
    in_buckets = bucketed(world, before) & bucketed(world, after)
    assert not moved & in_buckets, sorted(moved & in_buckets)
    if local_keys(world, before) == local_keys(world, after):
        # The one move left: along its own chunked class, behind the IP that came or went.
        # Two classes of a family never share a ranking (it starts with the class's holder
        # and holds its eligible set), so the same family and ranking mean the same class.
        home = group_of(before, changed) or group_of(after, changed)
        for stayer in moved:
            old, new = group_of(before, stayer), group_of(after, stayer)
            assert old is not None and new is not None
            assert old.ranking == new.ranking, (stayer, old, new)
            assert home is not None, (stayer, changed)
            assert (home.family, home.ranking) == (old.family, old.ranking), (stayer, home)
            assert int(changed) < int(stayer), (stayer, changed)


@settings(max_examples=100, deadline=None)
@given(worlds(max_ips=40, vrid_sizes=st.integers(1, 255)), st.data())
def test_adding_and_removing_ips_never_moves_an_ip_that_stays(
    world: World, data: st.DataObject
) -> None:
    """Random sequences of IPs added and removed (issue #18 item 3): an IP that is in the
    plan before and after a step, unchanged itself, keeps its VRID and holder always when
    every eligible node may hold it (a bucket). When the step leaves the set of Local
    instances as it was (a new Local instance may displace another in its range: probing),
    a Local IP keeps its holder and backups, and its VRID too unless its class is over the
    address cap and the IP added or removed is of that class and below it in address order.

    Why that exception: a class over the cap is cut into chunks in address order, so such an
    IP shifts the ones after it by one chunk, into another instance of the same class (same
    ranking, another VRID). No plan that depends on the IPs alone can avoid it while a class
    of n IPs takes ceil(n / cap) instances (docs/decisions.md, "A Local IP may shift one
    chunk ..."). The examples after this test write out the case hypothesis found.
    """
    names = [n.name for n in world.nodes]
    current = {u.ip: u for u in world.ips}
    before = plan(nodes=world.nodes, ips=current.values(), config=world.config)
    for _ in range(data.draw(st.integers(1, 12))):
        remove = data.draw(st.booleans())
        changed: IPAddress
        if current and remove:
            changed = data.draw(st.sampled_from(sorted(current, key=lambda a: (a.version, a))))
            del current[changed]
        else:
            v6 = data.draw(st.booleans())
            changed = (
                ipaddress.IPv6Address("2001:db8::") + data.draw(st.integers(0, 2**96 - 1))
                if v6
                else ipaddress.IPv4Address("198.18.0.0") + data.draw(st.integers(0, 2**17 - 1))
            )
            if changed in current:
                continue
            current[changed] = data.draw(ip_uses(changed, names))
        after = plan(nodes=world.nodes, ips=current.values(), config=world.config)
        check_ip_step(world, before, after, changed)
        before = after


@settings(max_examples=100, deadline=None)
@given(
    st.sets(st.integers(0, 63), min_size=3, max_size=16),
    st.lists(st.integers(0, 63), min_size=1, max_size=12),
    st.sets(st.sampled_from(NODE_NAMES[:4]), min_size=1),
    st.integers(1, 3),
    vrid_ranges(st.integers(1, 255)),
)
def test_ips_of_one_local_service_move_only_behind_the_ip_that_came_or_went(
    start: set[int], toggles: list[int], pods: set[str], cap: int, vrids: VridRange
) -> None:
    """One Local Service whose IPs come and go one at a time, one to three addresses per
    instance, so its classes are often past the cap: the property of
    test_adding_and_removing_ips_never_moves_an_ip_that_stays, whose random worlds reach a
    chunk shift in under one example in a hundred, here in about one in six (measured)."""
    nodes = tuple(node(n) for n in NODE_NAMES[:4])
    web = local("ns/web", *sorted(pods))
    base = ipaddress.IPv4Address("198.19.8.0")
    # check_ip_step reads only the config of its world.
    world = World(nodes, (), OwnershipConfig(ipv4_vrids=vrids, ipv4_max_addresses=cap))
    current = {base + o for o in start}
    before = plan(nodes=nodes, ips=[use(ip, web) for ip in current], config=world.config)
    for offset in toggles:
        changed = base + offset
        current ^= {changed}
        after = plan(nodes=nodes, ips=[use(ip, web) for ip in current], config=world.config)
        check_ip_step(world, before, after, changed)
        before = after


def group_of(result: Plan, ip: IPAddress) -> Group | None:
    """Return the instance carrying `ip` in `result`, or None when it is not held."""
    return next((g for g in result.groups if ip in g.addresses), None)


def test_an_ip_added_below_a_chunked_local_class_shifts_the_class_by_one_chunk() -> None:
    """The example hypothesis shrank test_adding_and_removing_ips_never_moves_an_ip_that_stays
    to (seed 190453130664853155993533780801767959494), written out.

    IPv4 VRIDs 1-8 are buckets 1-6 and the Local range 7-8, one address per instance. node-b
    is not Ready, so 198.18.5.3 and 198.18.44.193 may be held by node-c alone, 198.18.5.13 by
    node-c or node-e: three Local instances for two VRIDs, still three per eligible set, and
    the two whose keys sort first are kept, chunks 0 and 1 of the {node-c} class (5.3, 44.193).
    Adding 198.18.0.1, also node-c's alone, puts it first in that class: chunk 0 is now 0.1,
    chunk 1 is 5.3, and 44.193 falls into chunk 2, which is not kept. The Local instances
    (their keys, so their VRIDs) are the same before and after, yet 5.3 changes VRID.
    """
    lb = (("role", "lb"),)
    nodes = (
        node("node-a", labels=lb),
        node("node-b", ready=False, labels=lb),
        node("node-c", labels=lb),
        node("node-d", labels=lb),
        node("node-e", labels=lb),
        node("node-f", labels=(("role", "worker"),)),
    )
    v4 = ipaddress.IPv4Address
    everywhere = [v4("198.18.0.0") + i for i in (0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)]
    everywhere += [v4("198.18.48.84"), v4("198.19.0.1"), v4("198.19.28.103")]
    all_six = ServiceUse("ns/svc-1", True, frozenset(n.name for n in nodes))
    ips = [IPUse(ip, ()) for ip in everywhere] + [
        IPUse(v4("198.18.5.3"), (local("ns/svc-0", "node-b", "node-c"),)),
        IPUse(v4("198.18.5.13"), (local("ns/svc-0", "node-c", "node-e"),)),
        IPUse(v4("198.18.44.193"), (local("ns/svc-0", "node-b", "node-c"), all_six)),
    ]
    added = IPUse(v4("198.18.0.1"), (local("ns/svc-0", "node-c"),))
    config = OwnershipConfig(
        ipv4_vrids=VridRange(1, 8),
        ipv6_vrids=VridRange(1, 1),
        ipv4_max_addresses=1,
        ipv6_max_addresses=90,
    )
    world = World(nodes, tuple(ips), config)
    before = plan_of(world)
    after = plan(nodes=nodes, ips=[*ips, added], config=config)

    stayer, pushed = v4("198.18.5.3"), v4("198.18.44.193")
    assert before.ipv4_sharing is after.ipv4_sharing is SharingLevel.PER_ELIGIBLE_SET
    assert local_keys(world, before) == local_keys(world, after)
    assert before.decision(v4("198.18.5.13")).reason is R.VRID_EXHAUSTED  # type: ignore[union-attr]
    # Each IP of the class moved one chunk up: the new one took the stayer's instance, the
    # stayer the pushed one's, and the pushed one is no longer held.
    assert vrid_of(after, added.ip) == vrid_of(before, stayer)
    assert vrid_of(after, stayer) == vrid_of(before, pushed) != vrid_of(before, stayer)
    assert after.decision(pushed).reason is R.VRID_EXHAUSTED  # type: ignore[union-attr]
    # Same holder, and the same backups: it moved between two instances of its own class.
    was, now = group_of(before, stayer), group_of(after, stayer)
    assert was is not None and now is not None
    assert was.ranking == now.ranking == ("node-c",)


def test_an_ip_coming_and_going_below_others_of_its_class_moves_them_between_chunks() -> None:
    """The same shift without the Local range running out: at two addresses per instance,
    one Local class of .73, .75 and .76 (node-a or node-b may hold them, and node-a wins each
    by rendezvous) is cut into (.73 .75) (.76); adding .74, node-a's too, gives (.73 .74)
    (.75 .76), and removing it again gives back the first. Both steps keep the two instances,
    and .75 changes VRID each time, keeping its holder and backup."""
    nodes = (node("node-a"), node("node-b"), node("node-c"))
    pods = local("ns/web", "node-a", "node-b")
    base = ipaddress.IPv4Address("198.19.7.72")
    three = tuple(use(base + i, pods) for i in (1, 3, 4))
    config = OwnershipConfig(ipv4_max_addresses=2)
    world = World(nodes, three, config)
    before = plan_of(world)
    grown = plan(nodes=nodes, ips=(*three, use(base + 2, pods)), config=config)
    shrunk = plan(nodes=nodes, ips=three, config=config)

    assert local_keys(world, before) == local_keys(world, grown) == local_keys(world, shrunk)
    assert len(local_keys(world, before)) == 2
    assert all(d.reason is not R.VRID_EXHAUSTED for p in (before, grown) for d in p.ips)
    assert [g.addresses for g in sorted(grown.groups, key=lambda g: g.addresses)] == [
        (base + 1, base + 2),
        (base + 3, base + 4),
    ]
    assert vrid_of(grown, base + 3) == vrid_of(before, base + 4) != vrid_of(before, base + 3)
    assert vrid_of(shrunk, base + 3) == vrid_of(before, base + 3)
    assert vrid_of(grown, base + 1) == vrid_of(before, base + 1)  # below .2: stays
    rankings = {group_of(p, base + 3).ranking for p in (before, grown, shrunk)}  # type: ignore[union-attr]
    assert rankings == {("node-a", "node-b")}


@settings(max_examples=120, deadline=None)
@given(worlds(max_ips=300, vrid_sizes=st.integers(1, 255)))
def test_buckets_hold_every_ip_all_nodes_may_hold_and_the_local_range_the_rest(
    world: World,
) -> None:
    result = plan_of(world)
    local_ips = {u.ip for u in world.ips if any(svc.local for svc in u.services)}
    for family in IPFamily:
        buckets, local_range = split_range(world.config.vrids(family))
        most = world.config.max_addresses(family)
        groups = [g for g in result.groups if g.family is family]
        held = [d for d in result.ips if d.family is family and d.eligible]
        for d in held:
            if d.ip not in local_ips:
                if d.reason is not R.VRID_EXHAUSTED:
                    assert d.vrid == bucket_of(d.ip, buckets), d
                else:  # only a full bucket turns one away
                    mates = [x for x in held if x.vrid == bucket_of(d.ip, buckets)]
                    assert len(mates) == most, d
            elif d.vrid is not None:
                assert local_range is not None and local_range.first <= d.vrid <= local_range.last
            else:
                assert d.reason is R.VRID_EXHAUSTED
                assert (
                    local_range is None
                    or len([g for g in groups if local_range.first <= g.vrid <= local_range.last])
                    == local_range.size
                )
        for g in groups:
            assert len(g.addresses) <= most
            assert len(g.addresses) > 1 or result.decision(g.addresses[0]).reason is R.ASSIGNED  # type: ignore[union-attr]


def test_ineligible_lists_every_other_node_sorted() -> None:
    result = plan(
        nodes=[node("c", ready=False), node("a"), node("b", ready=False)],
        ips=[use(V4)],
        config=OwnershipConfig(),
    )
    d = result.decision(V4)
    assert d is not None
    assert d.ineligible == (Ineligible("b", R.NOT_READY), Ineligible("c", R.NOT_READY))
    assert d.eligible == ("a",)
    assert d.holder == "a"
