"""Pool configuration: parsing, validation errors that name the pool and field, pool queries."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.model.labels import LabelSelector
from agent.model.pools import (
    AddressPool,
    Forbidden,
    PoolError,
    PoolSet,
    parse_pools,
)

NONE = Forbidden()
CLUSTER = Forbidden(
    node_addresses=(ipaddress.ip_address("198.18.0.10"), ipaddress.ip_address("2001:db8::10")),
    pod_cidrs=(ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10::/56")),
    service_cidrs=(ipaddress.ip_network("10.96.0.0/12"),),
)


def pool(name: str = "p", *addresses: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "addresses": list(addresses), **extra}


@dataclass(frozen=True)
class BadCase:
    raw: Any
    error_contains: tuple[str, ...]
    forbidden: Forbidden = NONE


BAD = [
    pytest.param(
        BadCase({"name": "p"}, ("pools: expected a list",)),
        id="a mapping where the list of pools belongs is refused",
    ),
    pytest.param(
        BadCase([pool("web", "198.18.0.0/33")], ("pools[0] (web).addresses[0]", "198.18.0.0/33")),
        id="a CIDR with a prefix too long names the pool and the address index",
    ),
    pytest.param(
        BadCase([pool("web", "198.18.0.1/24")], ("pools[0] (web).addresses[0]", "host bits")),
        id="a CIDR with host bits set is refused rather than silently widened",
    ),
    pytest.param(
        BadCase([pool("web", "198.18.0.9-198.18.0.1")], ("must not exceed",)),
        id="a range whose first address is above its last is refused",
    ),
    pytest.param(
        BadCase([pool("web", "198.18.0.1-2001:db8::1")], ("one IP family",)),
        id="a range mixing IPv4 and IPv6 ends is refused",
    ),
    pytest.param(
        BadCase([pool("web")], ("pools[0] (web).addresses", "at least one")),
        id="a pool with an empty address list is refused",
    ),
    pytest.param(
        BadCase([{"name": "web"}], ("pools[0] (web).addresses", "at least one")),
        id="a pool with no addresses key at all is refused",
    ),
    pytest.param(
        BadCase([{"addresses": ["198.18.0.0/30"]}], ("pools[0].name",)),
        id="a pool without a name is refused by index",
    ),
    pytest.param(
        BadCase([pool("a", "198.18.0.0/30"), pool("a", "198.18.1.0/30")], ("pools[1].name", "'a'")),
        id="two pools with the same name are refused",
    ),
    pytest.param(
        BadCase(
            [pool("a", "198.18.0.0/24"), pool("b", "198.18.0.128/25")],
            ("pools[1] (b)", "overlaps", "pools[0] (a)"),
        ),
        id="two pools overlapping each other are refused naming both",
    ),
    pytest.param(
        BadCase(
            [pool("a", "198.18.0.0/24", "198.18.0.10-198.18.0.20")],
            ("pools[0] (a).addresses", "overlaps"),
        ),
        id="a pool overlapping itself is refused",
    ),
    pytest.param(
        BadCase(
            [pool("a", "2001:db8::/120"), pool("b", "2001:db8::80-2001:db8::90")],
            ("pools[1] (b)", "overlaps"),
        ),
        id="IPv6 pools overlapping each other are refused",
    ),
    pytest.param(
        BadCase([pool("lo", "127.0.0.0/30")], ("pools[0] (lo).addresses[0]", "loopback")),
        id="an IPv4 loopback range is refused",
    ),
    pytest.param(
        BadCase([pool("z", "0.0.0.0/30")], ("unspecified",)),
        id="the IPv4 unspecified block is refused",
    ),
    pytest.param(
        BadCase([pool("m", "224.0.0.0/24")], ("multicast",)),
        id="an IPv4 multicast range is refused",
    ),
    pytest.param(
        BadCase([pool("l", "169.254.1.0/24")], ("link-local",)),
        id="an IPv4 link-local range is refused",
    ),
    pytest.param(
        BadCase([pool("l6", "fe80::/64")], ("link-local",)),
        id="an IPv6 link-local range is refused",
    ),
    pytest.param(
        BadCase([pool("m6", "ff02::/120")], ("multicast",)),
        id="an IPv6 multicast range is refused",
    ),
    pytest.param(
        BadCase([pool("u6", "::-::3")], ("unspecified",)),
        id="a range starting at the IPv6 unspecified address is refused",
    ),
    pytest.param(
        BadCase([pool("lo6", "::1/128")], ("loopback",)),
        id="the IPv6 loopback address is refused",
    ),
    pytest.param(
        BadCase(
            [pool("n", "198.18.0.0/28")], ("pools[0] (n)", "node address 198.18.0.10"), CLUSTER
        ),
        id="a pool containing a node address is refused",
    ),
    pytest.param(
        BadCase([pool("n", "2001:db8::/64")], ("node address 2001:db8::10",), CLUSTER),
        id="an IPv6 pool containing a node address is refused",
    ),
    pytest.param(
        BadCase([pool("pods", "10.244.3.0/24")], ("pod CIDR 10.244.0.0/16",), CLUSTER),
        id="a pool inside the pod CIDR is refused",
    ),
    pytest.param(
        BadCase([pool("pods6", "fd00:10::/48")], ("pod CIDR fd00:10::/56",), CLUSTER),
        id="a pool containing an IPv6 pod CIDR is refused",
    ),
    pytest.param(
        BadCase([pool("svc", "10.96.0.0/24")], ("service CIDR 10.96.0.0/12",), CLUSTER),
        id="a pool inside the service CIDR is refused",
    ),
    pytest.param(
        BadCase([pool("b", "198.18.0.0/32", avoidBuggyIPs=True)], ("no usable address",)),
        id="a pool whose only address is a .0 avoided as buggy is empty and refused",
    ),
    pytest.param(
        BadCase(
            [
                pool(
                    "s",
                    "198.18.0.0/30",
                    serviceSelector={"matchExpressions": [{"key": "a", "operator": "NotIn"}]},
                )
            ],
            ("pools[0] (s).serviceSelector.matchExpressions[0].values", "NotIn needs"),
        ),
        id="a selector requirement the API server would refuse",
    ),
    pytest.param(
        BadCase([pool("s", "198.18.0.0/30", autoAssign="no")], ("pools[0] (s).autoAssign",)),
        id="a non-boolean autoAssign is refused",
    ),
    pytest.param(
        BadCase([pool("s", "198.18.0.0/30", colour="red")], ("unknown keys colour",)),
        id="an unknown pool key is refused",
    ),
    pytest.param(
        BadCase([pool("s", "198.18.0.0/30", namespaces="prod")], ("pools[0] (s).namespaces",)),
        id="namespaces given as a string instead of a list is refused",
    ),
]


@pytest.mark.parametrize("case", BAD)
def test_invalid_pools_are_refused_with_an_error_naming_pool_and_field(case: BadCase) -> None:
    with pytest.raises(PoolError) as info:
        parse_pools(case.raw, forbidden=case.forbidden)
    missing = [s for s in case.error_contains if s not in str(info.value)]
    assert not missing, f"{info.value!s} lacks {missing}"


def test_unset_pools_are_none_and_an_empty_list_is_an_empty_pool_set() -> None:
    assert parse_pools(None, forbidden=NONE) is None
    empty = parse_pools([], forbidden=NONE)
    assert empty == PoolSet(pools=())
    assert empty is not None and empty.pool_for(ipaddress.ip_address("198.18.0.1")) is None


@dataclass(frozen=True)
class SizeCase:
    addresses: tuple[str, ...]
    avoid_buggy: bool
    size: int
    size_v4: int
    size_v6: int
    first_v4: str | None = None


SIZES = [
    pytest.param(
        SizeCase(("198.18.0.0/24",), False, 256, 256, 0, "198.18.0.0"),
        id="a /24 holds 256 addresses starting at .0",
    ),
    pytest.param(
        SizeCase(("198.18.0.0/24",), True, 254, 254, 0, "198.18.0.1"),
        id="avoiding buggy addresses drops .0 and .255 from a /24",
    ),
    pytest.param(
        SizeCase(("198.18.0.0/23",), True, 508, 508, 0, "198.18.0.1"),
        id="avoiding buggy addresses drops two per /24 of a /23",
    ),
    pytest.param(
        SizeCase(("198.18.0.250-198.18.1.5",), True, 10, 10, 0, "198.18.0.250"),
        id="a range across a /24 boundary loses its .255 and .0",
    ),
    pytest.param(
        SizeCase(("198.18.0.10-198.18.0.20", "2001:db8::/126"), False, 14, 11, 3, "198.18.0.10"),
        id="a dual-stack pool counts both families, without the IPv6 Subnet-Router anycast",
    ),
    pytest.param(
        SizeCase(("2001:db8::/120",), True, 255, 0, 255),
        id="IPv6 addresses are never avoided as buggy, only the anycast one is",
    ),
]


@pytest.mark.parametrize("case", SIZES)
def test_pool_size_and_first_address(case: SizeCase) -> None:
    pools = parse_pools(
        [pool("p", *case.addresses, avoidBuggyIPs=case.avoid_buggy)], forbidden=NONE
    )
    assert pools is not None
    (p,) = pools.pools
    assert (p.size(), p.size(4), p.size(6)) == (case.size, case.size_v4, case.size_v6)
    assert sum(1 for _ in p.addresses(4)) == case.size_v4
    first = next(p.addresses(4), None)
    assert (str(first) if first else None) == case.first_v4


def test_parsed_pool_keeps_options_and_sorts_networks_by_family() -> None:
    pools = parse_pools(
        [
            pool(
                "dmz",
                "2001:db8:1::/120",
                "198.18.5.0/24",
                autoAssign=False,
                avoidBuggyIPs=True,
                namespaces=["web"],
                namespaceSelector={"matchLabels": {"tier": "edge"}},
                serviceSelector={"matchLabels": {"app": "www"}},
            )
        ],
        forbidden=CLUSTER,
    )
    assert pools is not None
    assert pools.pools == (
        AddressPool(
            name="dmz",
            networks=(
                ipaddress.ip_network("198.18.5.0/24"),
                ipaddress.ip_network("2001:db8:1::/120"),
            ),
            auto_assign=False,
            avoid_buggy_ips=True,
            block_starts=frozenset({ipaddress.ip_address("2001:db8:1::")}),
            namespaces=("web",),
            namespace_selector=LabelSelector(frozenset({("tier", "edge")})),
            service_selector=LabelSelector(frozenset({("app", "www")})),
        ),
    )


@dataclass(frozen=True)
class AdmitCase:
    namespaces: tuple[str, ...]
    ns_selector: dict[str, str] | None
    svc_selector: dict[str, str] | None
    namespace: str
    ns_labels: dict[str, str] = field(default_factory=dict)
    svc_labels: dict[str, str] = field(default_factory=dict)
    admitted: bool = True


ADMITS = [
    pytest.param(AdmitCase((), None, None, "any"), id="an unrestricted pool admits every Service"),
    pytest.param(
        AdmitCase(("web",), None, None, "db", admitted=False),
        id="a namespace list excludes other namespaces",
    ),
    pytest.param(
        AdmitCase(("web", "db"), None, None, "db"), id="a namespace list admits a listed namespace"
    ),
    pytest.param(
        AdmitCase((), {"tier": "edge"}, None, "web", ns_labels={"tier": "edge", "x": "y"}),
        id="a namespace selector admits a namespace carrying its labels",
    ),
    pytest.param(
        AdmitCase((), {"tier": "edge"}, None, "web", ns_labels={"tier": "core"}, admitted=False),
        id="a namespace selector refuses a namespace with another label value",
    ),
    pytest.param(
        AdmitCase((), None, {"app": "www"}, "web", svc_labels={}, admitted=False),
        id="a Service selector refuses an unlabelled Service",
    ),
    pytest.param(
        AdmitCase(
            ("web",), {"tier": "edge"}, {"app": "www"}, "web", {"tier": "edge"}, {"app": "www"}
        ),
        id="all restrictions together admit a Service meeting each of them",
    ),
]


@pytest.mark.parametrize("case", ADMITS)
def test_pool_restrictions_decide_which_services_it_admits(case: AdmitCase) -> None:
    p = AddressPool(
        name="p",
        networks=(ipaddress.ip_network("198.18.0.0/30"),),
        namespaces=case.namespaces,
        namespace_selector=LabelSelector(frozenset(case.ns_selector.items()))
        if case.ns_selector is not None
        else None,
        service_selector=LabelSelector(frozenset(case.svc_selector.items()))
        if case.svc_selector is not None
        else None,
    )
    got = p.admits(
        namespace=case.namespace, namespace_labels=case.ns_labels, service_labels=case.svc_labels
    )
    assert got is case.admitted


def test_pool_for_respects_avoided_addresses_and_names_the_owning_pool() -> None:
    pools = parse_pools(
        [pool("a", "198.18.0.0/24", avoidBuggyIPs=True), pool("b", "2001:db8::/120")],
        forbidden=NONE,
    )
    assert pools is not None
    found = {
        s: (p.name if (p := pools.pool_for(ipaddress.ip_address(s))) else None)
        for s in ("198.18.0.0", "198.18.0.1", "198.18.0.255", "2001:db8::ff", "198.18.1.1")
    }
    assert found == {
        "198.18.0.0": None,
        "198.18.0.1": "a",
        "198.18.0.255": None,
        "2001:db8::ff": "b",
        "198.18.1.1": None,
    }
    assert pools.networks() == (
        ipaddress.ip_network("198.18.0.0/24"),
        ipaddress.ip_network("2001:db8::/120"),
    )


# -- the IPv6 Subnet-Router anycast address (RFC 4291 §2.6.1) -------------------------------


@dataclass(frozen=True)
class AnycastCase:
    addresses: tuple[str, ...]
    size_v6: int
    first_v6: str
    avoided: tuple[str, ...] = ()  # inside the blocks, never handed out
    usable: tuple[str, ...] = ()  # handed out although they end a block or start a piece
    allow: bool = False


ANYCAST = [
    pytest.param(
        AnycastCase(("2001:db8:0:10::/64",), 2**64 - 1, "2001:db8:0:10::1", ("2001:db8:0:10::",)),
        id="a /64 never hands out its zero interface identifier (main handed it out first)",
    ),
    pytest.param(
        AnycastCase(
            ("2001:db8:1::/48",),
            2**80 - 2**16,
            "2001:db8:1::1",
            ("2001:db8:1::", "2001:db8:1:5::", "2001:db8:1:ffff::"),
            ("2001:db8:1:5::1", "2001:db8:1:4:ffff:ffff:ffff:ffff"),
        ),
        id="a /48 avoids the anycast address of each of its 65536 /64s",
    ),
    pytest.param(
        AnycastCase(
            ("2001:db8:64:72::100/120",), 255, "2001:db8:64:72::101", ("2001:db8:64:72::100",)
        ),
        id="a /120 avoids its first address: the block may be the link's prefix",
    ),
    pytest.param(
        AnycastCase(("2001:db8::6/127",), 1, "2001:db8::7", ("2001:db8::6",)),
        id="a /127 avoids its first address",
    ),
    pytest.param(
        AnycastCase(("2001:db8::7/128",), 1, "2001:db8::7"),
        id="a /128 is one host, not a subnet: it is usable",
    ),
    pytest.param(
        AnycastCase(
            ("2001:db8::5-2001:db8::20",),
            28,
            "2001:db8::5",
            usable=("2001:db8::8", "2001:db8::10", "2001:db8::20"),
        ),
        id="a range's summarised pieces are not subnets: their first addresses are usable",
    ),
    pytest.param(
        AnycastCase(("2001:db8:2::-2001:db8:2::3",), 3, "2001:db8:2::1", ("2001:db8:2::",)),
        id="a range starting at a zero interface identifier avoids it",
    ),
    pytest.param(
        AnycastCase(("2001:db8:0:10::/64",), 2**64, "2001:db8:0:10::", allow=True),
        id="allowSubnetRouterAnycast hands it out",
    ),
    pytest.param(
        AnycastCase(("2001:db8:64:72::100/120",), 256, "2001:db8:64:72::100", allow=True),
        id="allowSubnetRouterAnycast hands out a block's first address too",
    ),
]


@pytest.mark.parametrize("case", ANYCAST)
def test_ipv6_pools_avoid_the_subnet_router_anycast_address(case: AnycastCase) -> None:
    extra = {"allowSubnetRouterAnycast": True} if case.allow else {}
    pools = parse_pools([pool("v6", *case.addresses, **extra)], forbidden=NONE)
    assert pools is not None
    (p,) = pools.pools
    assert p.size(6) == case.size_v6
    assert str(next(p.addresses(6))) == case.first_v6
    inside = [a for a in case.avoided if p.contains(ipaddress.ip_address(a))]
    assert not inside, f"{inside} may be handed out"
    missing = [a for a in case.usable if not p.contains(ipaddress.ip_address(a))]
    assert not missing, f"{missing} are avoided"
    if p.size(6) < 1000:
        assert sum(1 for _ in p.addresses(6)) == p.size(6)


def test_a_pool_whose_only_address_is_an_anycast_one_is_refused() -> None:
    with pytest.raises(PoolError, match="Subnet-Router anycast"):
        parse_pools([pool("v6", "2001:db8:9::/128")], forbidden=NONE)


def test_ipv4_pools_are_untouched_by_the_anycast_rule() -> None:
    pools = parse_pools([pool("v4", "198.18.0.0/24")], forbidden=NONE)
    assert pools is not None
    assert pools.pools[0].size(4) == 256 and pools.pools[0].contains(
        ipaddress.ip_address("198.18.0.0")
    )
