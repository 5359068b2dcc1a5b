"""LoadBalancer address pools: the configuration model and its validation (pure).

A pool is a named set of address blocks (CIDRs or "first-last" ranges, IPv4 and IPv6 mixed),
with optional restrictions on which Services may draw from it:

- ``namespaces``: a list of namespace names (empty: any namespace);
- ``namespaceSelector`` / ``serviceSelector``: label selectors, **matchLabels only**
  (``matchExpressions`` is refused with an error rather than silently ignored);
- ``autoAssign`` (default true): false means the pool only serves Services that name it
  (``nodelb.io/ip-pool``) or ask for one of its addresses;
- ``avoidBuggyIPs`` (default false): skip IPv4 addresses ending in .0 or .255, which some CPE
  firmwares drop as broadcast (IPv6 has no broadcast: the option does not apply to it);
- ``allowSubnetRouterAnycast`` (default false): IPv6 pools never hand out a Subnet-Router
  anycast address (RFC 4291 §2.6.1: a subnet prefix with an all-zero interface identifier,
  which every router on the link answers for) unless this is true. Which addresses those are
  is `is_subnet_router_anycast`: every address whose 64-bit interface identifier is zero,
  and the first address of each IPv6 CIDR block of a pool longer than /64 (and shorter than
  /128), since such a block may be the link's own prefix.

`parse_pools` validates once, with errors naming the pool and the field: malformed blocks,
empty pools, pools overlapping one another (or themselves), and pools overlapping the
addresses the cluster already uses (node addresses, pod CIDRs, service CIDRs, passed in as
`Forbidden`) or special-purpose ranges (unspecified, loopback, multicast, link-local,
broadcast, IPv4-mapped IPv6).
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.config_values import (
    ConfigError,
    boolean,
    describe,
    mapping,
    string_list,
    wrong,
)
from agent.model.labels import LabelSelector, parse_label_selector
from agent.model.net import IPAddress, IPNetwork


class PoolError(ConfigError):
    """The pool configuration is invalid; the message names the pool and the field."""


@dataclass(frozen=True, slots=True)
class Forbidden:
    """Addresses a pool must not overlap: what the cluster already uses for nodes and pods."""

    node_addresses: tuple[IPAddress, ...] = ()
    pod_cidrs: tuple[IPNetwork, ...] = ()
    service_cidrs: tuple[IPNetwork, ...] = ()


def is_buggy(ip: IPAddress) -> bool:
    """Return True for IPv4 addresses ending in .0 or .255 (confuse some CPE firmwares)."""
    return ip.version == 4 and int(ip) & 0xFF in (0, 255)


_IID = (1 << 64) - 1  # the interface identifier: the low 64 bits of an IPv6 unicast address


def is_subnet_router_anycast(ip: IPAddress, block_starts: frozenset[IPAddress]) -> bool:
    """Return True when `ip` is (or may be) a Subnet-Router anycast address (RFC 4291 §2.6.1).

    That is an IPv6 address whose 64-bit interface identifier is all zeros (the anycast
    address of its /64), or one of `block_starts`: the first addresses of a pool's CIDR
    blocks longer than /64, each of which may be the prefix of its link. IPv4 has none.
    """
    return ip.version == 6 and (int(ip) & _IID == 0 or ip in block_starts)


def anycast_block_start(net: IPNetwork) -> IPAddress | None:
    """Return the first address of an IPv6 CIDR block longer than /64 and shorter than /128.

    None otherwise: a /64 or shorter has its anycast addresses at zero interface identifiers
    already, a /128 is one host, not a subnet, and IPv4 has no anycast address.
    """
    if net.version == 6 and 64 < net.prefixlen < 128:
        return net.network_address
    return None


@dataclass(frozen=True, slots=True)
class AddressPool:
    """One validated pool; `networks` are disjoint and sorted by family, then address."""

    name: str
    networks: tuple[IPNetwork, ...]
    auto_assign: bool = True
    avoid_buggy_ips: bool = False
    allow_subnet_router_anycast: bool = False
    # The first addresses of the pool's IPv6 CIDR blocks longer than /64 (anycast_block_start).
    block_starts: frozenset[IPAddress] = frozenset()
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None
    service_selector: LabelSelector | None = None

    @property
    def restricted(self) -> bool:
        """Return True when the pool limits which Services may use it."""
        return bool(self.namespaces) or bool(self.namespace_selector or self.service_selector)

    def families(self) -> frozenset[int]:
        """Return the IP versions (4, 6) this pool has addresses for."""
        return frozenset(n.version for n in self.networks)

    def avoids(self, ip: IPAddress) -> bool:
        """Return True when the pool never hands `ip` out (avoided .0/.255, IPv6 anycast)."""
        if self.avoid_buggy_ips and is_buggy(ip):
            return True
        return not self.allow_subnet_router_anycast and is_subnet_router_anycast(
            ip, self.block_starts
        )

    def contains(self, ip: IPAddress) -> bool:
        """Return True when `ip` is an address this pool may hand out."""
        if self.avoids(ip):
            return False
        return any(ip.version == n.version and ip in n for n in self.networks)

    def size(self, version: int | None = None) -> int:
        """Return how many usable addresses the pool holds (of one IP version if given)."""
        total = 0
        for net in self.networks:
            if version is not None and net.version != version:
                continue
            total += net.num_addresses
            if self.avoid_buggy_ips and net.version == 4:
                total -= _buggy_count(net)
            if net.version == 6 and not self.allow_subnet_router_anycast:
                total -= _anycast_count(net, self.block_starts)
        return total

    def addresses(self, version: int, *, start: int = 0) -> Iterator[IPAddress]:
        """Yield the usable addresses of one IP version from `start` up (lazily: v6 is huge)."""
        for net in self.networks:
            if net.version != version:
                continue
            first, last = int(net.network_address), int(net.broadcast_address)
            for value in range(max(first, start), last + 1):
                ip: IPAddress = (
                    ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)
                )
                if not self.avoids(ip):
                    yield ip

    def admits(
        self,
        *,
        namespace: str,
        namespace_labels: Mapping[str, str],
        service_labels: Mapping[str, str],
    ) -> bool:
        """Return True when the pool's namespace and Service restrictions allow this Service."""
        if self.namespaces and namespace not in self.namespaces:
            return False
        if self.namespace_selector and not self.namespace_selector.matches(namespace_labels):
            return False
        return not (self.service_selector and not self.service_selector.matches(service_labels))


def _buggy_count(net: IPNetwork) -> int:
    """Return how many .0/.255 addresses an IPv4 network holds (networks are aligned)."""
    first, last = int(net.network_address), int(net.broadcast_address)
    if last - first + 1 >= 256:
        return (last - first + 1) // 256 * 2  # one .0 and one .255 per /24
    return sum(1 for v in {first, last} if v & 0xFF in (0, 255))


def _anycast_count(net: IPNetwork, block_starts: frozenset[IPAddress]) -> int:
    """Return how many Subnet-Router anycast addresses an IPv6 network holds."""
    if net.prefixlen <= 64:
        return 1 << (64 - net.prefixlen)  # one per /64: its zero interface identifier
    first = net.network_address
    # Longer than /64: only the first address can have a zero interface identifier.
    return 1 if (int(first) & _IID == 0 or first in block_starts) else 0


@dataclass(frozen=True, slots=True)
class PoolSet:
    """All configured pools, in configuration order. Empty means "allocate nothing"."""

    pools: tuple[AddressPool, ...] = ()

    def get(self, name: str) -> AddressPool | None:
        """Return the pool called `name`, or None."""
        return next((p for p in self.pools if p.name == name), None)

    def pool_for(self, ip: IPAddress) -> AddressPool | None:
        """Return the pool that may hand out `ip`, or None when no pool does."""
        return next((p for p in self.pools if p.contains(ip)), None)

    def networks(self) -> tuple[IPNetwork, ...]:
        """Return every network of every pool (for the externalIP CVE-2020-8554 check)."""
        return tuple(n for p in self.pools for n in p.networks)


_SPECIAL: tuple[tuple[IPNetwork, str], ...] = (
    (ipaddress.ip_network("0.0.0.0/8"), "unspecified ('this network')"),
    (ipaddress.ip_network("127.0.0.0/8"), "loopback"),
    (ipaddress.ip_network("169.254.0.0/16"), "link-local"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("255.255.255.255/32"), "limited broadcast"),
    (ipaddress.ip_network("::/128"), "unspecified"),
    (ipaddress.ip_network("::1/128"), "loopback"),
    (ipaddress.ip_network("::ffff:0:0/96"), "IPv4-mapped"),
    (ipaddress.ip_network("fe80::/10"), "link-local"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
)

_POOL_KEYS = {
    "name",
    "addresses",
    "autoAssign",
    "avoidBuggyIPs",
    "allowSubnetRouterAnycast",
    "namespaces",
    "namespaceSelector",
    "serviceSelector",
}


def parse_block(text: str, where: str) -> tuple[IPNetwork, ...]:
    """Return the networks covering a CIDR ("198.18.0.0/24") or a range ("a-b")."""
    try:
        if "-" in text:
            first_s, last_s = (p.strip() for p in text.split("-", 1))
            first, last = ipaddress.ip_address(first_s), ipaddress.ip_address(last_s)
            if first.version != last.version:
                raise ValueError("the two ends of a range must be of one IP family")
            if int(first) > int(last):
                raise ValueError("the first address of a range must not exceed the last")
            return tuple(ipaddress.summarize_address_range(first, last))
        return (ipaddress.ip_network(text.strip(), strict=True),)
    except ValueError as exc:
        raise PoolError(f"{where}: {text!r} is not a CIDR or an address range ({exc})") from None


def _selector(raw: Mapping[str, Any], key: str, where: str) -> LabelSelector | None:
    if raw.get(key) is None:
        return None
    return parse_label_selector(raw[key], where)


def _parse_one(i: int, item: Any, forbidden: Forbidden) -> AddressPool:
    item = mapping(item, f"pools[{i}]")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PoolError(f"pools[{i}].name: expected a non-empty name, got {describe(name)}")
    return parse_pool(item, name=name, where=f"pools[{i}] ({name})", forbidden=forbidden)


def parse_pool(
    item: Mapping[str, Any], *, name: str, where: str, forbidden: Forbidden
) -> AddressPool:
    """Return one validated pool from its keys (a `pools:` entry, or a pool object's spec).

    `where` prefixes every error ("pools[0] (main)", "LoadBalancerIPPool main: spec"), so the
    message names the object and the field. Raises PoolError, or ConfigError for a value of
    the wrong type.
    """
    unknown = set(item) - _POOL_KEYS
    if unknown:
        raise PoolError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    blocks = item.get("addresses")
    if blocks is None or blocks == []:
        raise PoolError(f"{where}.addresses: a pool needs at least one CIDR or range")
    if not isinstance(blocks, list):
        raise wrong(f"{where}.addresses", "a list of CIDRs or ranges", blocks)
    located: list[tuple[IPNetwork, str]] = []
    starts: set[IPAddress] = set()
    for j, block in enumerate(blocks):
        block_where = f"{where}.addresses[{j}]"
        if not isinstance(block, str):
            raise wrong(block_where, "a string (a CIDR or a range)", block)
        nets = parse_block(block, block_where)
        located.extend((net, block_where) for net in nets)
        if "-" not in block:  # a CIDR may be a link's prefix; a range's pieces are not
            starts.update(a for a in map(anycast_block_start, nets) if a is not None)
    for net, block_where in located:
        _check_usable(net, block_where, forbidden)
    _check_disjoint(located)
    pool = AddressPool(
        name=name,
        networks=tuple(sorted((n for n, _ in located), key=lambda n: (n.version, n))),
        auto_assign=boolean(item, "autoAssign", True, f"{where}.autoAssign"),
        avoid_buggy_ips=boolean(item, "avoidBuggyIPs", False, f"{where}.avoidBuggyIPs"),
        allow_subnet_router_anycast=boolean(
            item, "allowSubnetRouterAnycast", False, f"{where}.allowSubnetRouterAnycast"
        ),
        block_starts=frozenset(starts),
        namespaces=string_list(item, "namespaces", f"{where}.namespaces"),
        namespace_selector=_selector(item, "namespaceSelector", f"{where}.namespaceSelector"),
        service_selector=_selector(item, "serviceSelector", f"{where}.serviceSelector"),
    )
    if pool.size() == 0:
        raise PoolError(
            f"{where}.addresses: no usable address once .0/.255 or the IPv6 Subnet-Router "
            "anycast addresses are avoided"
        )
    return pool


def _check_usable(net: IPNetwork, where: str, forbidden: Forbidden) -> None:
    for special, what in _SPECIAL:
        if net.version == special.version and net.overlaps(special):
            raise PoolError(f"{where}: {net} overlaps the {what} range {special}")
    for addr in forbidden.node_addresses:
        if addr.version == net.version and addr in net:
            raise PoolError(f"{where}: {net} contains the node address {addr}")
    for label, cidrs in (("pod", forbidden.pod_cidrs), ("service", forbidden.service_cidrs)):
        for cidr in cidrs:
            if cidr.version == net.version and net.overlaps(cidr):
                raise PoolError(f"{where}: {net} overlaps the {label} CIDR {cidr}")


def _check_disjoint(located: list[tuple[IPNetwork, str]]) -> None:
    """Raise when two networks overlap; sorting by start makes neighbours the only suspects."""
    ordered = sorted(located, key=lambda nw: (nw[0].version, int(nw[0].network_address)))
    for (a, a_where), (b, b_where) in itertools.pairwise(ordered):
        if a.version == b.version and int(b.network_address) <= int(a.broadcast_address):
            raise PoolError(f"{b_where}: {b} overlaps {a} of {a_where}")


def parse_pools(raw: Any, *, forbidden: Forbidden) -> PoolSet | None:
    """Return the validated pools, or None when pools are not configured at all.

    None (the key is absent) means nodelb does not allocate: the controller leaves
    `status.loadBalancer` alone. An empty list means nodelb allocates and has nothing to give:
    every Service gets NO_POOL_FOR_FAMILY and existing addresses count as outside every pool.
    Raises PoolError naming the pool and field for anything invalid.
    """
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise PoolError(str(wrong("pools", "a list of pools", raw)))
    try:
        pools = [_parse_one(i, item, forbidden) for i, item in enumerate(raw)]
    except PoolError:
        raise
    except ConfigError as exc:  # a value of the wrong type: one error class for pools
        raise PoolError(str(exc)) from None
    seen: dict[str, int] = {}
    for i, pool in enumerate(pools):
        if pool.name in seen:
            raise PoolError(
                f"pools[{i}].name: {pool.name!r} is already the name of pools[{seen[pool.name]}]"
            )
        seen[pool.name] = i
    located = [
        (net, f"pools[{i}] ({pool.name})") for i, pool in enumerate(pools) for net in pool.networks
    ]
    _check_disjoint(located)
    return PoolSet(pools=tuple(pools))
