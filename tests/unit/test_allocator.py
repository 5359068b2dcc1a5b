"""The allocator: choosing addresses, sharing, dual-stack, release order, restart, Event limits."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.backoff import Backoff
from agent.controller.allocator import (
    AllocationReason,
    Allocator,
    PoolUsage,
    allocation_order,
    freed_addresses,
    latest_releases,
    rebuild,
)
from agent.controller.exhaustion import ExhaustionLimiter
from agent.controller.request import FamilyPolicy, ProtocolPort, ServiceRequest, request_from_raw
from agent.model.net import IPAddress, IPFamily, Protocol
from agent.model.pools import Forbidden, PoolSet, parse_pools
from agent.model.service import InvalidService, ServicePort

R = AllocationReason
V4 = (IPFamily.IPV4,)
V6 = (IPFamily.IPV6,)
DUAL = (IPFamily.IPV4, IPFamily.IPV6)


def make_pools(raw: list[dict[str, Any]]) -> PoolSet:
    pools = parse_pools(raw, forbidden=Forbidden())
    assert pools is not None
    return pools


POOLS = make_pools(
    [
        {"name": "default", "addresses": ["198.18.0.0/30", "2001:db8::/126"]},
        {"name": "manual", "addresses": ["198.18.1.0/30"], "autoAssign": False},
        {"name": "team", "addresses": ["198.18.2.0/30"], "namespaces": ["team"]},
    ]
)

_SEQ = {"n": 0}


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def ips(*texts: str) -> tuple[IPAddress, ...]:
    return tuple(ip(t) for t in texts)


def tcp(*ports: int) -> frozenset[ProtocolPort]:
    return frozenset(ProtocolPort(Protocol.TCP, p) for p in ports)


def req(name: str, created: int = 0, **kw: Any) -> ServiceRequest:
    """Return a request for ns/<name>; `created` orders Services (seconds past midnight)."""
    kw.setdefault("ports", tcp(80))
    ns = kw.pop("namespace", "ns")
    return ServiceRequest(
        key=f"{ns}/{name}", uid=f"uid-{name}", created=f"2026-01-01T00:{created:02d}:00Z", **kw
    )


@dataclass(frozen=True)
class AllocCase:
    request: ServiceRequest
    reason: AllocationReason
    ips: tuple[str, ...]
    setup: tuple[ServiceRequest, ...] = ()
    message_contains: str = ""
    missing: tuple[IPFamily, ...] = ()


CASES = [
    pytest.param(
        AllocCase(req("a"), R.ALLOCATED, ("198.18.0.0",), message_contains="pool default"),
        id="a plain IPv4 Service gets the lowest address of the autoAssign pool",
    ),
    pytest.param(
        AllocCase(req("b"), R.ALLOCATED, ("198.18.0.1",), setup=(req("a"),)),
        id="a second Service gets the next address",
    ),
    pytest.param(
        AllocCase(req("a", requested_ips=ips("198.18.1.2")), R.ALLOCATED, ("198.18.1.2",)),
        id="a specific address is honoured in a pool that does not auto-assign",
    ),
    pytest.param(
        AllocCase(
            req("a", requested_ips=ips("203.0.113.7")),
            R.REQUESTED_IP_NOT_IN_POOL,
            (),
            message_contains="203.0.113.7",
        ),
        id="a specific address outside every pool is refused",
    ),
    pytest.param(
        AllocCase(
            req("b", requested_ips=ips("198.18.0.0")),
            R.REQUESTED_IP_IN_USE,
            (),
            setup=(req("a"),),
            message_contains="ns/a",
        ),
        id="a specific address held by a Service that does not share is in use",
    ),
    pytest.param(
        AllocCase(req("a", pool="nope"), R.UNKNOWN_POOL, (), message_contains="nope"),
        id="a pool annotation naming no pool is refused",
    ),
    pytest.param(
        AllocCase(req("a", pool="manual"), R.ALLOCATED, ("198.18.1.0",)),
        id="a pool annotation draws from a pool that does not auto-assign",
    ),
    pytest.param(
        AllocCase(
            req("a", pool="manual", requested_ips=ips("198.18.0.2")),
            R.REQUESTED_IP_NOT_IN_POOL,
            (),
            message_contains="pool manual",
        ),
        id="a specific address outside the named pool is refused",
    ),
    pytest.param(
        AllocCase(req("a", namespace="team"), R.ALLOCATED, ("198.18.2.0",)),
        id="a restricted pool admitting the Service is preferred to an unrestricted one",
    ),
    pytest.param(
        AllocCase(req("a", pool="team"), R.POOL_NOT_ALLOWED, (), message_contains="team"),
        id="a named pool that does not admit the Service's namespace is refused",
    ),
    pytest.param(
        AllocCase(
            req("a", requested_ips=ips("198.18.2.1")),
            R.POOL_NOT_ALLOWED,
            (),
        ),
        id="a specific address in a pool that does not admit the Service is refused",
    ),
    pytest.param(
        AllocCase(req("a", ip_families=V6), R.ALLOCATED, ("2001:db8::1",)),
        id="an IPv6 Service gets an IPv6 address",
    ),
    pytest.param(
        AllocCase(
            req("a", ip_families=DUAL, family_policy=FamilyPolicy.REQUIRE_DUAL_STACK),
            R.ALLOCATED,
            ("198.18.0.0", "2001:db8::1"),
        ),
        id="RequireDualStack gets one address per family, primary first",
    ),
    pytest.param(
        AllocCase(
            req("a", ip_families=(IPFamily.IPV6, IPFamily.IPV4)),
            R.ALLOCATED,
            ("2001:db8::1",),
        ),
        id="SingleStack with two listed families allocates the primary family only",
    ),
    pytest.param(
        AllocCase(
            req("a", ip_families=V6, pool="manual"),
            R.NO_POOL_FOR_FAMILY,
            (),
            message_contains="IPv6",
        ),
        id="an IPv6 Service whose pool has no IPv6 addresses gets no pool for its family",
    ),
    pytest.param(
        AllocCase(
            req(
                "a",
                ip_families=DUAL,
                family_policy=FamilyPolicy.PREFER_DUAL_STACK,
                pool="manual",
            ),
            R.ALLOCATED,
            ("198.18.1.0",),
            missing=V6,
        ),
        id="PreferDualStack keeps the family it could get and reports the missing one",
    ),
    pytest.param(
        AllocCase(
            req(
                "a",
                ip_families=DUAL,
                family_policy=FamilyPolicy.REQUIRE_DUAL_STACK,
                pool="manual",
            ),
            R.NO_POOL_FOR_FAMILY,
            (),
            message_contains="all or nothing",
        ),
        id="RequireDualStack with one family unavailable holds nothing",
    ),
    pytest.param(
        AllocCase(
            req(
                "a",
                ip_families=DUAL,
                family_policy=FamilyPolicy.PREFER_DUAL_STACK,
                pool="manual",
                required_features=("IPFamilies",),
            ),
            R.NO_POOL_FOR_FAMILY,
            (),
        ),
        id="PreferDualStack with IPFamilies required is all or nothing",
    ),
    pytest.param(
        AllocCase(
            req("e", 9),
            R.POOL_EXHAUSTED,
            (),
            setup=tuple(req(n, i) for i, n in enumerate("abcd")),
            message_contains="pool default",
        ),
        id="a full pool answers pool exhausted",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="k", ports=tcp(443)),
            R.ALLOCATED,
            ("198.18.0.0",),
            setup=(req("a", share_key="k", ports=tcp(80)),),
        ),
        id="a Service with the same sharing key and other ports joins the shared address",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="k", ports=frozenset({ProtocolPort(Protocol.UDP, 53)})),
            R.ALLOCATED,
            ("198.18.0.0",),
            setup=(req("a", share_key="k", ports=frozenset({ProtocolPort(Protocol.TCP, 53)})),),
        ),
        id="TCP/53 and UDP/53 do not collide and share an address",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="k", ports=tcp(80)),
            R.ALLOCATED,
            ("198.18.0.1",),
            setup=(req("a", share_key="k", ports=tcp(80)),),
        ),
        id="a colliding port under the same key moves an automatic request to a new address",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="k", ports=tcp(80), requested_ips=ips("198.18.0.0")),
            R.SHARE_KEY_CONFLICT,
            (),
            setup=(req("a", share_key="k", ports=tcp(80, 81)),),
            message_contains="TCP/80",
        ),
        id="a colliding port on a specifically requested shared address is a conflict",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="other", ports=tcp(443), requested_ips=ips("198.18.0.0")),
            R.SHARE_KEY_CONFLICT,
            (),
            setup=(req("a", share_key="k"),),
            message_contains="'k'",
        ),
        id="a different sharing key on a requested address is a conflict",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="k", ports=tcp(443), requested_ips=ips("198.18.0.0")),
            R.REQUESTED_IP_IN_USE,
            (),
            setup=(req("a"),),
        ),
        id="an address held by a Service without a sharing key cannot be shared",
    ),
    pytest.param(
        AllocCase(
            req(
                "b",
                share_key="k",
                ports=tcp(443),
                local_policy=True,
                selector=(("app", "x"),),
                requested_ips=ips("198.18.0.0"),
            ),
            R.SHARE_KEY_CONFLICT,
            (),
            setup=(req("a", share_key="k"),),
            message_contains="externalTrafficPolicy",
        ),
        id="Local and Cluster Services may not share an address",
    ),
    pytest.param(
        AllocCase(
            req(
                "b",
                share_key="k",
                ports=tcp(443),
                local_policy=True,
                selector=(("app", "y"),),
                requested_ips=ips("198.18.0.0"),
            ),
            R.SHARE_KEY_CONFLICT,
            (),
            setup=(req("a", share_key="k", local_policy=True, selector=(("app", "x"),)),),
        ),
        id="Local Services with different pod selectors may not share an address",
    ),
    pytest.param(
        AllocCase(
            req("b", share_key="k", ports=tcp(443), local_policy=True, selector=(("app", "x"),)),
            R.ALLOCATED,
            ("198.18.0.0",),
            setup=(req("a", share_key="k", local_policy=True, selector=(("app", "x"),)),),
        ),
        id="Local Services with the same pod selector share an address",
    ),
    pytest.param(
        AllocCase(
            req("a", annotation_error="nodelb.io/load-balancer-ips: 'x' is not an IP address"),
            R.INVALID_ANNOTATION,
            (),
            message_contains="'x'",
        ),
        id="an invalid annotation is reported and nothing is allocated",
    ),
    pytest.param(
        AllocCase(req("a", ours=False), R.NOT_OURS, ()),
        id="a Service that is not ours gets nothing",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_allocate(case: AllocCase) -> None:
    alloc = Allocator(POOLS)
    for s in case.setup:
        assert alloc.allocate(s, now=0.0).allocated, s
    got = alloc.allocate(case.request, now=1.0)
    assert (got.reason, got.ips) == (case.reason, ips(*case.ips)), got.message
    assert case.message_contains in got.message
    assert got.missing_families == case.missing
    assert alloc.ips_of(case.request.key) == tuple(sorted(got.ips, key=lambda a: a.version))


def test_allocating_an_unchanged_service_again_moves_nothing() -> None:
    alloc = Allocator(POOLS)
    a = req("a", ip_families=DUAL, family_policy=FamilyPolicy.REQUIRE_DUAL_STACK)
    first = alloc.allocate(a, now=0.0)
    again = alloc.allocate(a, now=5.0)
    assert first.reason is R.ALLOCATED
    assert (again.reason, again.ips, again.released) == (R.ALREADY_ALLOCATED, first.ips, ())


def test_changing_the_requested_address_releases_the_old_one_with_its_time() -> None:
    alloc = Allocator(POOLS)
    alloc.allocate(req("a"), now=0.0)
    moved = alloc.allocate(req("a", requested_ips=ips("198.18.0.3")), now=7.0)
    assert (moved.reason, moved.ips, moved.released) == (
        R.ALLOCATED,
        ips("198.18.0.3"),
        ips("198.18.0.0"),
    )
    assert alloc.release_times() == {ip("198.18.0.0"): 7.0}


def test_a_service_that_stops_being_ours_releases_its_addresses() -> None:
    alloc = Allocator(POOLS)
    alloc.allocate(req("a"), now=0.0)
    gone = alloc.allocate(req("a", ours=False), now=3.0)
    assert (gone.reason, gone.released, gone.warning) == (R.NOT_OURS, ips("198.18.0.0"), False)
    assert alloc.ips_of("ns/a") == ()
    assert alloc.release_times() == {ip("198.18.0.0"): 3.0}


def test_a_shared_address_is_released_only_when_its_last_holder_goes() -> None:
    alloc = Allocator(POOLS)
    alloc.allocate(req("a", share_key="k", ports=tcp(80)), now=0.0)
    alloc.allocate(req("b", share_key="k", ports=tcp(443)), now=0.0)
    alloc.release("ns/a", now=1.0)
    assert alloc.holders_of(ip("198.18.0.0")) == ("ns/b",)
    assert alloc.release_times() == {}
    alloc.release("ns/b", now=2.0)
    assert alloc.release_times() == {ip("198.18.0.0"): 2.0}


def test_released_addresses_are_handed_out_last_and_oldest_release_first() -> None:
    alloc = Allocator(POOLS)
    for i, name in enumerate("abc"):
        alloc.allocate(req(name, i), now=0.0)  # .0 .1 .2
    alloc.release("ns/b", now=10.0)  # .1
    alloc.release("ns/a", now=20.0)  # .0
    order = [alloc.allocate(req(n, 10 + i), now=30.0).ips for i, n in enumerate("xyz")]
    # .3 was never used: it goes first; then .1 (released at 10) before .0 (released at 20).
    assert order == [ips("198.18.0.3"), ips("198.18.0.1"), ips("198.18.0.0")]
    assert alloc.release_times() == {}


def test_release_times_carried_into_a_rebuild_keep_the_reuse_order() -> None:
    old = Allocator(POOLS)
    for i, name in enumerate("abcd"):
        old.allocate(req(name, i), now=0.0)
    old.release("ns/d", now=5.0)  # .3
    old.release("ns/c", now=9.0)  # .2
    status = [req(n, i, current_ips=old.ips_of(f"ns/{n}")) for i, n in enumerate("ab")]
    new, _, _ = rebuild(POOLS, status, now=10.0, released=old.release_times())
    assert new.allocate(req("x", 9), now=11.0).ips == ips("198.18.0.3")
    forgetful, _, _ = rebuild(POOLS, status, now=10.0)
    assert forgetful.allocate(req("x", 9), now=11.0).ips == ips("198.18.0.2")


def test_an_address_picked_for_a_failed_all_or_nothing_request_stays_available() -> None:
    pools = make_pools([{"name": "dual", "addresses": ["198.18.3.0/31", "2001:db8:3::5/128"]}])
    alloc = Allocator(pools)
    assert alloc.allocate(req("v6", 0, ip_families=V6), now=0.0).ips == ips("2001:db8:3::5")
    both = req("both", 1, ip_families=DUAL, family_policy=FamilyPolicy.REQUIRE_DUAL_STACK)
    failed = alloc.allocate(both, now=1.0)
    assert (failed.reason, failed.ips, alloc.release_times()) == (R.POOL_EXHAUSTED, (), {})
    got = [alloc.allocate(req(n, 2 + i), now=2.0).ips for i, n in enumerate("ab")]
    assert got == [ips("198.18.3.0"), ips("198.18.3.1")]


def test_a_released_address_picked_for_a_failed_all_or_nothing_request_keeps_its_time() -> None:
    pools = make_pools(
        [{"name": "dual", "addresses": ["198.18.3.0/32", "2001:db8:3::4-2001:db8:3::5"]}]
    )
    alloc = Allocator(pools)
    alloc.allocate(req("v4", 0), now=0.0)  # the only IPv4 address
    alloc.allocate(req("a", 1, ip_families=V6), now=0.0)  # 2001:db8:3::4
    alloc.release("ns/a", now=5.0)
    alloc.allocate(req("b", 2, ip_families=V6), now=6.0)  # 2001:db8:3::5, the fresh one
    both = req("both", 3, ip_families=DUAL, family_policy=FamilyPolicy.REQUIRE_DUAL_STACK)
    assert alloc.allocate(both, now=7.0).reason is R.POOL_EXHAUSTED
    assert alloc.release_times() == {ip("2001:db8:3::4"): 5.0}
    assert alloc.allocate(req("c", 4, ip_families=V6), now=8.0).ips == ips("2001:db8:3::4")


def test_ports_changed_to_collide_with_a_sharing_partner_move_the_newer_service() -> None:
    alloc = Allocator(POOLS)
    alloc.allocate(req("a", 1, share_key="k", ports=tcp(80)), now=0.0)
    alloc.allocate(req("b", 2, share_key="k", ports=tcp(443)), now=0.0)
    moved = alloc.allocate(req("b", 2, share_key="k", ports=tcp(80)), now=1.0)
    assert (moved.reason, moved.ips, moved.released) == (
        R.ALLOCATED,
        ips("198.18.0.1"),
        ips("198.18.0.0"),
    )
    assert alloc.holders_of(ip("198.18.0.0")) == ("ns/a",)
    assert alloc.release_times() == {}  # still held by ns/a: not released


def test_usage_counts_each_pool_and_a_shared_address_once() -> None:
    alloc = Allocator(POOLS)
    alloc.allocate(req("a", share_key="k", ports=tcp(80)), now=0.0)
    alloc.allocate(req("b", share_key="k", ports=tcp(443)), now=0.0)
    alloc.allocate(req("c", ip_families=V6), now=0.0)
    alloc.allocate(req("d", pool="manual"), now=0.0)
    assert alloc.usage() == (
        PoolUsage("default", 7, 2),  # 2001:db8::, the Subnet-Router anycast, is not counted
        PoolUsage("manual", 4, 1),
        PoolUsage("team", 4, 0),
    )


def test_allocation_order_is_creation_time_then_uid() -> None:
    younger = req("young", 5)
    tie_b = replace(req("tb", 1), uid="b")
    tie_a = replace(req("ta", 1), uid="a")
    assert [r.key for r in allocation_order([younger, tie_b, tie_a])] == [
        "ns/ta",
        "ns/tb",
        "ns/young",
    ]


@dataclass(frozen=True)
class RecordCase:
    services: tuple[ServiceRequest, ...]
    problems: tuple[tuple[str, str, AllocationReason, str | None], ...]  # svc, ip, reason, kept
    kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


RECORDS = [
    pytest.param(
        RecordCase(
            (
                req("young", 5, current_ips=ips("198.18.0.1")),
                req("old", 1, current_ips=ips("198.18.0.1")),
            ),
            (("ns/young", "198.18.0.1", R.DUPLICATE_ADDRESS, "ns/old"),),
            {"ns/old": ("198.18.0.1",), "ns/young": ()},
        ),
        id="of two Services claiming one address the older keeps it whatever the input order",
    ),
    pytest.param(
        RecordCase(
            (
                replace(req("b", 1, current_ips=ips("198.18.0.1")), uid="2"),
                replace(req("a", 1, current_ips=ips("198.18.0.1")), uid="1"),
            ),
            (("ns/b", "198.18.0.1", R.DUPLICATE_ADDRESS, "ns/a"),),
            {"ns/a": ("198.18.0.1",)},
        ),
        id="with equal creation times the lower UID keeps a duplicated address",
    ),
    pytest.param(
        RecordCase(
            (req("a", current_ips=ips("203.0.113.1")),),
            (("ns/a", "203.0.113.1", R.OUTSIDE_POOLS, None),),
            {"ns/a": ()},
        ),
        id="an address outside every pool is reported for reallocation",
    ),
    pytest.param(
        RecordCase(
            (req("a", ip_families=V6, current_ips=ips("2001:db8::")),),
            (("ns/a", "2001:db8::", R.OUTSIDE_POOLS, None),),
            {"ns/a": ()},
        ),
        id="a Subnet-Router anycast address handed out before is reported for reallocation",
    ),
    pytest.param(
        RecordCase(
            (req("a", current_ips=ips("198.18.0.1", "198.18.0.2")),),
            (("ns/a", "198.18.0.2", R.WRONG_FAMILY, None),),
            {"ns/a": ("198.18.0.1",)},
        ),
        id="a second address of one family is given up",
    ),
    pytest.param(
        RecordCase(
            (req("a", current_ips=ips("2001:db8::1")),),
            (("ns/a", "2001:db8::1", R.WRONG_FAMILY, None),),
            {"ns/a": ()},
        ),
        id="an address of a family the Service does not ask for is given up",
    ),
    pytest.param(
        RecordCase(
            (
                req("a", 1, share_key="k", ports=tcp(80), current_ips=ips("198.18.0.1")),
                req("b", 2, share_key="k", ports=tcp(443), current_ips=ips("198.18.0.1")),
            ),
            (),
            {"ns/a": ("198.18.0.1",), "ns/b": ("198.18.0.1",)},
        ),
        id="a legitimately shared address is adopted for every holder",
    ),
    pytest.param(
        RecordCase(
            (
                req("a", 1, share_key="k", ports=tcp(80), current_ips=ips("198.18.0.1")),
                req("b", 2, share_key="k", ports=tcp(80), current_ips=ips("198.18.0.1")),
            ),
            (("ns/b", "198.18.0.1", R.DUPLICATE_ADDRESS, "ns/a"),),
            {"ns/a": ("198.18.0.1",)},
        ),
        id="a shared address with colliding ports stays with the older Service",
    ),
    pytest.param(
        RecordCase((req("a", ours=False, current_ips=ips("198.18.0.1")),), (), {"ns/a": ()}),
        id="Services that are not ours are not recorded",
    ),
]


@pytest.mark.parametrize("case", RECORDS)
def test_record_existing(case: RecordCase) -> None:
    alloc = Allocator(POOLS)
    problems = alloc.record_existing(case.services)
    got = tuple((p.service, str(p.ip), p.reason, p.kept_by) for p in problems)
    assert got == case.problems, [p.message for p in problems]
    for svc, held in case.kept.items():
        assert alloc.ips_of(svc) == ips(*held), svc


def test_after_a_restart_the_loser_of_a_duplicate_gets_a_new_address_and_the_owner_keeps() -> None:
    services = [
        req("old", 1, current_ips=ips("198.18.0.1")),
        req("young", 2, current_ips=ips("198.18.0.1")),
        req("new", 3),
    ]
    _, problems, results = rebuild(POOLS, services, now=0.0)
    assert [p.service for p in problems] == ["ns/young"]
    by = {r.service: (r.reason, r.ips) for r in results}
    assert by == {
        "ns/old": (R.ALREADY_ALLOCATED, ips("198.18.0.1")),
        "ns/young": (R.ALLOCATED, ips("198.18.0.0")),
        "ns/new": (R.ALLOCATED, ips("198.18.0.2")),
    }


def test_request_from_raw_reads_families_annotations_and_class() -> None:
    obj: dict[str, Any] = {
        "metadata": {
            "namespace": "web",
            "name": "www",
            "uid": "u1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "www"},
            "annotations": {
                "nodelb.io/ip-pool": "default",
                "nodelb.io/load-balancer-ips": "198.18.0.2, 2001:db8::2",
                "nodelb.io/allow-shared-ip": "k",
                "nodelb.io/required-features": "IPFamilies, Ports",
            },
        },
        "spec": {
            "type": "LoadBalancer",
            "ipFamilies": ["IPv6", "IPv4"],
            "ipFamilyPolicy": "RequireDualStack",
            "externalTrafficPolicy": "Local",
            "selector": {"app": "www"},
            "sessionAffinity": "ClientIP",
            "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.2"}]}},
    }
    got = request_from_raw(obj, lb_class="nodelb.io/lb", handle_classless=True)
    assert got == ServiceRequest(
        key="web/www",
        uid="u1",
        created="2026-01-01T00:00:00Z",
        ours=True,
        ip_families=(IPFamily.IPV6, IPFamily.IPV4),
        family_policy=FamilyPolicy.REQUIRE_DUAL_STACK,
        ports=frozenset({ProtocolPort(Protocol.TCP, 80), ProtocolPort(Protocol.UDP, 53)}),
        local_policy=True,
        selector=(("app", "www"),),
        labels=(("app", "www"),),
        pool="default",
        requested_ips=ips("198.18.0.2", "2001:db8::2"),
        share_key="k",
        session_affinity=True,
        required_features=("IPFamilies", "Ports"),
        current_ips=ips("198.18.0.2"),
        named_ports=(
            ServicePort("", Protocol.TCP, 80),
            ServicePort("", Protocol.UDP, 53),
        ),
    )
    other = request_from_raw(
        {**obj, "spec": {**obj["spec"], "loadBalancerClass": "example.com/lb"}},
        lb_class="nodelb.io/lb",
        handle_classless=True,
    )
    assert isinstance(other, ServiceRequest) and other.ours is False


@dataclass(frozen=True)
class AnnotationCase:
    annotations: dict[str, str]
    spec: dict[str, Any]
    error_contains: str | None
    requested: tuple[str, ...] = ()


ANNOTATIONS = [
    pytest.param(
        AnnotationCase({}, {"loadBalancerIP": "198.18.0.3"}, None, ("198.18.0.3",)),
        id="the deprecated spec.loadBalancerIP is a one-address request",
    ),
    pytest.param(
        AnnotationCase(
            {"nodelb.io/load-balancer-ips": "198.18.0.3"},
            {"loadBalancerIP": "198.18.0.3"},
            None,
            ("198.18.0.3",),
        ),
        id="the annotation and spec.loadBalancerIP agreeing is fine",
    ),
    pytest.param(
        AnnotationCase(
            {"nodelb.io/load-balancer-ips": "198.18.0.3"},
            {"loadBalancerIP": "198.18.0.4"},
            "ask for different addresses",
        ),
        id="the annotation and spec.loadBalancerIP disagreeing is invalid",
    ),
    pytest.param(
        AnnotationCase({"nodelb.io/load-balancer-ips": "198.18.0.3,198.18.0.4"}, {}, "one address"),
        id="two addresses of one family are invalid",
    ),
    pytest.param(
        AnnotationCase({"nodelb.io/load-balancer-ips": "nope"}, {}, "'nope'"),
        id="an annotation that is not an address is invalid and names the value",
    ),
    pytest.param(
        AnnotationCase({"nodelb.io/load-balancer-ips": "2001:db8::3"}, {}, "ipFamilies"),
        id="a requested address of a family the Service does not have is invalid",
    ),
    pytest.param(
        AnnotationCase(
            {"nodelb.io/required-features": "Ports, Teleport"}, {}, "does not know Teleport"
        ),
        id="an unknown required feature is refused, since nodelb cannot promise it",
    ),
    pytest.param(
        AnnotationCase({}, {"ipFamilyPolicy": "Sometimes"}, "ipFamilyPolicy"),
        id="an unknown ipFamilyPolicy is invalid",
    ),
]


@pytest.mark.parametrize("case", ANNOTATIONS)
def test_request_annotations(case: AnnotationCase) -> None:
    obj = {
        "metadata": {"namespace": "ns", "name": "s", "uid": "u", "annotations": case.annotations},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4"], "ports": [{"port": 80}]}
        | case.spec,
    }
    got = request_from_raw(obj, lb_class="nodelb.io/lb", handle_classless=True)
    assert not isinstance(got, InvalidService)
    if case.error_contains is None:
        assert got.annotation_error is None
    else:
        assert got.annotation_error is not None and case.error_contains in got.annotation_error
    assert got.requested_ips == ips(*case.requested)


# -- PoolExhausted Events ------------------------------------------------------------------


def test_pool_exhausted_events_are_rate_limited_and_retries_back_off() -> None:
    limiter = ExhaustionLimiter(backoff=Backoff(initial=5.0, factor=2.0, maximum=20.0))
    timeline = []
    for now in (0.0, 1.0, 4.9, 5.0, 6.0, 15.0, 35.0, 40.0, 55.0, 75.0):
        d = limiter.exhausted(service="ns/a", pool="default", now=now)
        timeline.append((now, d.emit_event, d.retry_at))
    assert timeline == [
        (0.0, True, 5.0),  # first failure: report at once, retry in 5 s
        (1.0, False, 5.0),  # resyncs before the retry change nothing
        (4.9, False, 5.0),
        (5.0, True, 15.0),  # retry due: next window is 10 s
        (6.0, False, 15.0),
        (15.0, True, 35.0),  # 20 s (the maximum)
        (35.0, True, 55.0),  # capped at 20 s
        (40.0, False, 55.0),
        (55.0, True, 75.0),
        (75.0, True, 95.0),
    ]
    assert sum(e for _, e, _ in timeline) == 6  # ten calls, six Events


def test_pool_exhausted_state_is_per_service_and_pool_and_forgotten_on_success() -> None:
    limiter = ExhaustionLimiter()
    assert limiter.exhausted(service="ns/a", pool="p", now=0.0).emit_event
    assert limiter.exhausted(service="ns/a", pool="q", now=1.0).emit_event  # another pool
    assert limiter.exhausted(service="ns/b", pool="p", now=1.0).emit_event  # another Service
    assert not limiter.exhausted(service="ns/a", pool="p", now=2.0).emit_event
    assert limiter.due(now=5.0) == ["ns/a"]
    assert limiter.due(now=6.0) == ["ns/a", "ns/b"]
    assert limiter.next_retry() == 5.0
    limiter.forget(service="ns/a")
    assert limiter.waiting() == 1
    again = limiter.exhausted(service="ns/a", pool="p", now=3.0)
    assert (again.emit_event, again.failures, again.retry_at) == (True, 1, 8.0)


# -- properties ----------------------------------------------------------------------------

PROP_POOLS = make_pools(
    [
        {"name": "small", "addresses": ["198.18.0.0/30", "2001:db8::/127"]},
        {"name": "tiny", "addresses": ["198.18.1.0/31"], "autoAssign": False},
    ]
)
NAMES = [f"s{i}" for i in range(8)]


@st.composite
def requests(draw: st.DrawFn) -> ServiceRequest:
    name = draw(st.sampled_from(NAMES))
    families = draw(st.sampled_from([V4, V6, DUAL, (IPFamily.IPV6, IPFamily.IPV4)]))
    policy = draw(st.sampled_from(list(FamilyPolicy)))
    ports = frozenset(
        draw(
            st.sets(
                st.builds(
                    ProtocolPort,
                    st.sampled_from([Protocol.TCP, Protocol.UDP]),
                    st.sampled_from([53, 80, 443]),
                ),
                min_size=1,
                max_size=2,
            )
        )
    )
    requested = draw(
        st.sampled_from(
            [(), ips("198.18.0.1"), ips("198.18.1.0"), ips("2001:db8::1"), ips("203.0.113.1")]
        )
    )
    if (
        requested
        and IPFamily.of(requested[0])
        not in families[: 1 if policy is FamilyPolicy.SINGLE_STACK else 2]
    ):
        requested = ()
    return ServiceRequest(
        key=f"ns/{name}",
        uid=name,
        created=f"2026-01-01T00:00:0{NAMES.index(name)}Z",
        ours=draw(st.sampled_from([True, True, True, False])),
        ip_families=families,
        family_policy=policy,
        ports=ports,
        local_policy=draw(st.booleans()),
        selector=draw(st.sampled_from([(), (("app", "a"),)])),
        pool=draw(st.sampled_from([None, None, "small", "tiny"])),
        requested_ips=requested,
        share_key=draw(st.sampled_from([None, "k", "k", "j"])),
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), requests()),
        st.tuples(st.just("release"), st.sampled_from(NAMES)),
    ),
    max_size=25,
)


def check_exclusive(alloc: Allocator, latest: Mapping[str, ServiceRequest]) -> None:
    """No address is held twice unless every holder shares one key with disjoint ports."""
    for address, holders in alloc.allocations().items():
        assert PROP_POOLS.pool_for(address) is not None, address
        if len(holders) < 2:
            continue
        reqs = [latest[h] for h in holders]
        keys = {r.share_key for r in reqs}
        assert len(keys) == 1 and None not in keys, (address, holders)
        assert len({r.backend_key for r in reqs}) == 1, (address, holders)
        seen: set[ProtocolPort] = set()
        for r in reqs:
            assert not (seen & r.ports), (address, holders)
            seen |= r.ports


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_no_address_is_held_twice_and_a_restart_moves_nothing(
    ops: list[tuple[str, Any]],
) -> None:
    alloc = Allocator(PROP_POOLS)
    latest: dict[str, ServiceRequest] = {}
    for t, (op, arg) in enumerate(ops):
        if op == "allocate":
            assert isinstance(arg, ServiceRequest)
            latest[arg.key] = arg
            result = alloc.allocate(arg, now=float(t))
            assert alloc.ips_of(arg.key) == tuple(sorted(result.ips, key=lambda a: a.version))
            for outcome in result.families:
                if outcome.reason is R.POOL_EXHAUSTED:  # truly full: every address is held
                    for name in (outcome.pool or "").split(", "):
                        pool = PROP_POOLS.get(name)
                        assert pool is not None
                        free = [
                            a
                            for a in pool.addresses(outcome.family.version)
                            if not alloc.holders_of(a)
                        ]
                        assert free == [], (name, free)
        else:
            alloc.release(f"ns/{arg}", now=float(t))
            latest.pop(f"ns/{arg}", None)
        check_exclusive(alloc, latest)
    # One resync pass in order reaches a fixed point; a restart from status must reproduce it.
    for r in allocation_order(latest.values()):
        alloc.allocate(r, now=100.0)
    check_exclusive(alloc, latest)
    before = {k: alloc.ips_of(k) for k in latest}
    status = [replace(r, current_ips=before[r.key]) for r in latest.values()]
    rebuilt, problems, results = rebuild(PROP_POOLS, status, now=200.0)
    assert problems == []
    assert {k: rebuilt.ips_of(k) for k in latest} == before
    for res in results:
        if before[res.service]:
            assert res.reason is R.ALREADY_ALLOCATED, res


def test_an_ipv6_pool_never_hands_out_a_subnet_router_anycast_address() -> None:
    """A /120 at the start of a /64 and one mid-/64: 2 x 255 allocations, then refills."""
    pools = make_pools(
        [
            {"name": "wide", "addresses": ["2001:db8:0:10::/120"]},
            {"name": "link", "addresses": ["2001:db8:0:20::100/120"]},
        ]
    )
    alloc = Allocator(pools)
    got: list[IPAddress] = []
    for i in range(2 * 255):
        result = alloc.allocate(req(f"s{i}", ip_families=V6), now=float(i))
        assert result.allocated, result.message
        got.extend(result.ips)
    assert got[0] == ip("2001:db8:0:10::1")  # not 2001:db8:0:10::, as main handed out first
    assert got[255] == ip("2001:db8:0:20::101")
    full = alloc.allocate(req("one-more", ip_families=V6), now=600.0)
    assert full.reason is R.POOL_EXHAUSTED
    for i in range(0, 2 * 255, 7):
        alloc.release(f"ns/s{i}", now=700.0 + i)
    refilled = [alloc.allocate(req(f"r{i}", ip_families=V6), now=2000.0).ips for i in range(80)]
    handed = set(got) | {a for r in refilled for a in r}
    assert ip("2001:db8:0:10::") not in handed and ip("2001:db8:0:20::100") not in handed
    assert (
        alloc.allocate(
            req("asks", ip_families=V6, requested_ips=ips("2001:db8:0:10::")), now=3000.0
        ).reason
        is R.REQUESTED_IP_NOT_IN_POOL
    )


def test_freed_addresses_are_what_status_stopped_naming() -> None:
    two = req("a", ip_families=DUAL, current_ips=ips("198.18.0.1", "2001:db8::1"))
    one = req("a", ip_families=DUAL, current_ips=ips("198.18.0.1"))
    assert freed_addresses(two, one) == set(ips("2001:db8::1"))
    assert freed_addresses(two, None) == set(ips("198.18.0.1", "2001:db8::1"))  # deleted
    assert freed_addresses(None, two) == set()  # created
    assert freed_addresses(one, two) == set()  # gained an address


def test_latest_releases_keeps_the_latest_time_per_address() -> None:
    assert latest_releases(
        {ip("198.18.0.1"): 5.0, ip("198.18.0.2"): 9.0},
        {ip("198.18.0.1"): 7.0, ip("198.18.0.2"): 1.0, ip("198.18.0.3"): 2.0},
    ) == {ip("198.18.0.1"): 7.0, ip("198.18.0.2"): 9.0, ip("198.18.0.3"): 2.0}
