"""Held addresses on one interface, through rtnetlink (pyroute2 IPRoute).

nodelb adds each held address as a host address (/32 or /128) with `noprefixroute`, and for
IPv6 `nodad` too: a new Master must answer at once, and after a crash the old holder may still
have the address configured, which Duplicate Address Detection would turn into a "dadfailed"
address that never works.

The marker: every address nodelb adds carries IFA_PROTO = `NODELB_PROTO` (110, an otherwise
unused value; the kernel uses 0-3, see `ip address help`), so `ip -d addr` shows "proto 110".
It lets a restarted speaker find and remove the addresses a crashed one left behind
(`remove_stale`), without touching addresses an operator or another program configured,
whatever their prefix length. IFA_PROTO needs Linux 6.1 or later.

Every call opens its own netlink socket for the calling thread; the speaker calls these from
its single thread.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from agent.model.net import IPAddress

NODELB_PROTO = 110
IFA_F_NODAD = 0x02
IFA_F_NOPREFIXROUTE = 0x200
_EEXIST = 17
_EADDRNOTAVAIL = 99
_ENODEV = 19


def _attr(msg: Any, name: str) -> Any:
    return msg.get_attr(name)


class AddressTable:
    """The nodelb-marked host addresses of one interface. `open()` before use, `close()` after."""

    def __init__(self, ifname: str) -> None:
        self.ifname = ifname
        self._ipr: Any = None
        self._index = 0

    def open(self) -> None:
        """Open the netlink socket and look up the interface (raises LookupError if absent)."""
        ipr = IPRoute()
        found = ipr.link_lookup(ifname=self.ifname)
        if not found:
            ipr.close()
            raise LookupError(f"no interface {self.ifname!r}")
        self._ipr = ipr
        self._index = int(found[0])

    def close(self) -> None:
        """Close the netlink socket (idempotent)."""
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def mac(self) -> bytes:
        """Return the interface's 6-octet link-layer address."""
        for msg in self._ipr.get_links(self._index):
            text = _attr(msg, "IFLA_ADDRESS")
            if text:
                return bytes(int(p, 16) for p in str(text).split(":"))
        raise LookupError(f"{self.ifname} has no link-layer address")

    def link_local(self) -> ipaddress.IPv6Address | None:
        """Return the interface's first IPv6 link-local address, None when it has none."""
        for address, _, _ in self._dump():
            if isinstance(address, ipaddress.IPv6Address) and address.is_link_local:
                return address
        return None

    def _dump(self) -> list[tuple[IPAddress, int, int]]:
        """Return (address, prefix length, IFA_PROTO) for every address on the interface."""
        out: list[tuple[IPAddress, int, int]] = []
        for msg in self._ipr.get_addr(index=self._index):
            raw = _attr(msg, "IFA_LOCAL") or _attr(msg, "IFA_ADDRESS")
            if raw is None:
                continue
            proto = _attr(msg, "IFA_PROTO") or 0
            out.append((ipaddress.ip_address(raw), int(msg["prefixlen"]), int(proto)))
        return out

    def held(self) -> frozenset[IPAddress]:
        """Return the addresses on the interface that carry nodelb's marker (empty if none)."""
        return frozenset(a for a, _, proto in self._dump() if proto == NODELB_PROTO)

    def add(self, address: IPAddress) -> bool:
        """Add `address` as a marked host address; return False if it was already there."""
        flags = IFA_F_NOPREFIXROUTE | (IFA_F_NODAD if address.version == 6 else 0)
        try:
            self._ipr.addr(
                "add",
                index=self._index,
                address=str(address),
                prefixlen=address.max_prefixlen,
                flags=flags,
                proto=NODELB_PROTO,
            )
        except NetlinkError as exc:
            if exc.code == _EEXIST:
                return False
            raise
        return True

    def remove(self, address: IPAddress) -> bool:
        """Remove the host address `address`; return False if it was not there."""
        try:
            self._ipr.addr(
                "del", index=self._index, address=str(address), prefixlen=address.max_prefixlen
            )
        except NetlinkError as exc:
            if exc.code in (_EADDRNOTAVAIL, _ENODEV):
                return False
            raise
        return True

    def remove_stale(self, keep: Iterable[IPAddress] = ()) -> frozenset[IPAddress]:
        """Remove every marked address not in `keep`; return the ones removed."""
        wanted = frozenset(keep)
        removed = {a for a in self.held() if a not in wanted and self.remove(a)}
        return frozenset(removed)
