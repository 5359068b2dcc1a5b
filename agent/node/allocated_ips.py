"""Which Service each of our LoadBalancer IPs is allocated to, kept one Service at a time.

An externalIP inside a pool is programmed only for the Service the address is allocated to
(agent/node/external_ips.py), so the agent needs "IP -> owning Service" for every Service of
its class.
Rebuilding that map from all Services cost O(Services) per Service change (36 ms at 10k);
`IPOwners.update` costs one Service's addresses and returns the Services whose externalIP
verdict may have changed: those naming, as an externalIP, an address whose owner moved.

With two Services listing one address (IP sharing), the oldest (creation time, then UID, then
key) is its owner, the rule agent/node/assembly.py uses for a contested frontend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agent.model.net import IPAddress

Age = tuple[str, str, str]


class IPOwners:
    """LoadBalancer IPs by owning Service, and externalIP users by address."""

    def __init__(self) -> None:
        self._claims: dict[IPAddress, dict[str, Age]] = {}
        self._owner: dict[IPAddress, str] = {}
        self._lb_of: dict[str, frozenset[IPAddress]] = {}
        self._users: dict[IPAddress, set[str]] = {}  # Services naming the IP as externalIP
        self._ext_of: dict[str, frozenset[IPAddress]] = {}

    @property
    def owners(self) -> Mapping[IPAddress, str]:
        """Return each allocated LoadBalancer IP's owner ("namespace/name")."""
        return self._owner

    def update(
        self,
        key: str,
        *,
        age: Age,
        lb_ips: Iterable[IPAddress] = (),
        external_ips: Iterable[IPAddress] = (),
    ) -> set[str]:
        """Record Service `key`'s LoadBalancer IPs (of our class) and externalIPs (both empty
        when it is gone or not parseable); return the other Services to recompute."""
        moved: set[IPAddress] = set()
        lb_now, lb_before = frozenset(lb_ips), self._lb_of.get(key, frozenset())
        for ip in lb_before - lb_now:
            claims = self._claims[ip]
            del claims[key]
            if not claims:
                del self._claims[ip]
            moved |= self._elect(ip)
        for ip in lb_now - lb_before:
            self._claims.setdefault(ip, {})[key] = age
            moved |= self._claim(ip, key, age)
        self._set(self._lb_of, key, lb_now)
        ext_now, ext_before = frozenset(external_ips), self._ext_of.get(key, frozenset())
        for ip in ext_before - ext_now:
            users = self._users[ip]
            users.discard(key)
            if not users:
                del self._users[ip]
        for ip in ext_now - ext_before:
            self._users.setdefault(ip, set()).add(key)
        self._set(self._ext_of, key, ext_now)
        return {user for ip in moved for user in self._users.get(ip, ())} - {key}

    def _claim(self, ip: IPAddress, key: str, age: Age) -> set[IPAddress]:
        """Give `ip` to its new claimant `key` if it is older than the owner; return {ip} when
        the owner changed. One comparison: a full election per claim made N Services sharing
        an address cost O(N²)."""
        owner = self._owner.get(ip)
        if owner is not None and (self._claims[ip][owner], owner) <= (age, key):
            return set()
        self._owner[ip] = key
        return {ip}

    def _elect(self, ip: IPAddress) -> set[IPAddress]:
        """Give `ip` to its oldest claimant; return {ip} when its owner changed."""
        claims = self._claims.get(ip)
        owner = min(claims, key=lambda k: (claims[k], k)) if claims else None
        if owner == self._owner.get(ip):
            return set()
        if owner is None:
            del self._owner[ip]
        else:
            self._owner[ip] = owner
        return {ip}

    @staticmethod
    def _set(table: dict[str, frozenset[IPAddress]], key: str, value: frozenset[IPAddress]) -> None:
        if value:
            table[key] = value
        else:
            table.pop(key, None)
