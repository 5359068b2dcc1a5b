"""Addresses, networks, address families and L4 protocols: the vocabulary of every record."""

from __future__ import annotations

import enum
import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Protocol(enum.StrEnum):
    """L4 protocols a Service port may use (values are nftables' names)."""

    TCP = "tcp"
    UDP = "udp"
    SCTP = "sctp"


class IPFamily(enum.StrEnum):
    """An IP family, spelled as in a Service's `spec.ipFamilies`."""

    IPV4 = "IPv4"
    IPV6 = "IPv6"

    @property
    def version(self) -> int:
        return 4 if self is IPFamily.IPV4 else 6

    @staticmethod
    def of(ip: IPAddress) -> IPFamily:
        return IPFamily.IPV4 if ip.version == 4 else IPFamily.IPV6
