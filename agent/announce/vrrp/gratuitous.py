"""Gratuitous ARP (IPv4) and unsolicited Neighbor Advertisements (IPv6): encoders and senders.

The encoders are pure (bytes in, bytes out) and tested against golden bytes derived from the
field layouts of RFC 826 (ARP), RFC 5227 §2.3 (ARP Announcement), RFC 5944 §4.6 (gratuitous
ARP reply) and RFC 4861 §4.4 / §7.2.6 (unsolicited NA). The two senders below them are thin:
an AF_PACKET socket for ARP frames, and an ICMPv6 raw socket (hop limit 255, RFC 4861 §7.1.2)
for NAs to ff02::1, whose checksum the kernel fills in again for ICMPv6 raw sockets.

Why both ARP forms: RFC 5227 recommends the request form (an "ARP Announcement"), but some
routers and switches only refresh their caches from replies; which forms are sent is
configuration (GratuitousConfig).
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import struct

from agent.announce.vrrp.codec import internet_checksum

BROADCAST_MAC = b"\xff" * 6
ZERO_MAC = b"\x00" * 6
ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800
ARP_HTYPE_ETHERNET = 1
ARPOP_REQUEST = 1
ARPOP_REPLY = 2
ICMPV6_NEIGHBOR_ADVERTISEMENT = 136
ND_OPT_TARGET_LINKADDR = 2
NA_FLAG_ROUTER = 0x80
NA_FLAG_SOLICITED = 0x40
NA_FLAG_OVERRIDE = 0x20
ALL_NODES = ipaddress.IPv6Address("ff02::1")
IPPROTO_ICMPV6 = 58


class Kind(enum.StrEnum):
    """Which gratuitous packet; the `kind` label of nodelb_gratuitous_sent_total."""

    ARP_REQUEST = "arp_request"
    ARP_REPLY = "arp_reply"
    NA = "na"


def parse_mac(text: str) -> bytes:
    """Return the 6 octets of a MAC written as "aa:bb:cc:dd:ee:ff"; raises ValueError."""
    parts = text.split(":")
    if len(parts) != 6:
        raise ValueError(f"not a MAC address: {text!r}")
    return bytes(int(p, 16) for p in parts)


def _check_mac(mac: bytes) -> None:
    if len(mac) != 6:
        raise ValueError(f"a MAC address is 6 octets, got {len(mac)}")


def arp_frame(kind: Kind, *, mac: bytes, address: ipaddress.IPv4Address) -> bytes:
    """Return the Ethernet frame of a gratuitous ARP for `address` held at `mac`.

    Both forms are broadcast, with sender and target protocol address = `address` (so every
    host that has an entry for it updates it, RFC 826's merge step). Request (RFC 5227 §2.3,
    ARP Announcement): target hardware address all zeroes. Reply (RFC 5944 §4.6): target
    hardware address = `mac`, the address the caches should now hold. No padding: the NIC or
    the kernel pads to the 60-octet minimum.
    """
    _check_mac(mac)
    if kind is Kind.ARP_REQUEST:
        op, target_mac = ARPOP_REQUEST, ZERO_MAC
    elif kind is Kind.ARP_REPLY:
        op, target_mac = ARPOP_REPLY, mac
    else:
        raise ValueError(f"{kind} is not an ARP form")
    ether = BROADCAST_MAC + mac + struct.pack("!H", ETH_P_ARP)
    arp = struct.pack("!HHBBH", ARP_HTYPE_ETHERNET, ETH_P_IP, 6, 4, op)
    arp += mac + address.packed + target_mac + address.packed
    return ether + arp


def unsolicited_na(
    *,
    target: ipaddress.IPv6Address,
    mac: bytes,
    src: ipaddress.IPv6Address,
    dst: ipaddress.IPv6Address = ALL_NODES,
    router: bool = False,
) -> bytes:
    """Return the ICMPv6 message of an unsolicited Neighbor Advertisement, checksum filled in.

    RFC 4861 §7.2.6: Solicited flag clear, Override flag set (so receivers replace the
    link-layer address they have cached), a Target Link-Layer Address option (§4.6.1, type 2,
    length 1 = 8 octets) carrying `mac`. `router` sets the R flag (a node that forwards may
    say so; the lab's nodes do not need it). The checksum covers the RFC 8200 §8.1
    pseudo-header for `src` -> `dst`; it must be sent with hop limit 255.
    """
    _check_mac(mac)
    flags = NA_FLAG_OVERRIDE | (NA_FLAG_ROUTER if router else 0)
    option = struct.pack("!BB", ND_OPT_TARGET_LINKADDR, 1) + mac
    body = struct.pack("!BBHB3x", ICMPV6_NEIGHBOR_ADVERTISEMENT, 0, 0, flags)
    message = body + target.packed + option
    pseudo = src.packed + dst.packed + struct.pack("!I3xB", len(message), IPPROTO_ICMPV6)
    checksum = internet_checksum(pseudo + message)
    return message[:2] + struct.pack("!H", checksum) + message[4:]


# -- senders (the imperative shell) ------------------------------------------------------------


class ArpSender:
    """An AF_PACKET socket on one interface that sends ready-made ARP frames.

    `open()` creates the socket; `close()` releases it. Nothing happens in the constructor.
    """

    def __init__(self, ifname: str) -> None:
        self.ifname = ifname
        self._sock: socket.socket | None = None

    def open(self) -> None:
        """Open the packet socket bound to the interface (ARP ethertype)."""
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
        try:
            sock.bind((self.ifname, ETH_P_ARP))
            # Sending only: nothing should queue up on this socket.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def send(self, frame: bytes) -> None:
        """Send one Ethernet frame; raises OSError if the kernel refuses it."""
        if self._sock is None:
            raise RuntimeError("ArpSender is not open")
        self._sock.send(frame)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class NaSender:
    """An ICMPv6 raw socket on one interface sending NAs to ff02::1 with hop limit 255."""

    def __init__(self, ifname: str) -> None:
        self.ifname = ifname
        self._sock: socket.socket | None = None
        self._ifindex = 0

    def open(self) -> None:
        """Open the raw ICMPv6 socket, tied to the interface, with hop limit 255 both ways."""
        self._ifindex = socket.if_nametoindex(self.ifname)
        sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, IPPROTO_ICMPV6)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname.encode())
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, self._ifindex)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
            # ICMPV6_FILTER: block every type, this socket only sends.
            sock.setsockopt(IPPROTO_ICMPV6, 1, b"\xff" * 32)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def send(self, message: bytes, *, src: ipaddress.IPv6Address) -> None:
        """Send one ICMPv6 message from `src` to ff02::1 on the interface."""
        if self._sock is None:
            raise RuntimeError("NaSender is not open")
        pktinfo = src.packed + struct.pack("@I", self._ifindex)
        self._sock.sendmsg(
            [message],
            [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, pktinfo)],
            0,
            (str(ALL_NODES), 0, 0, self._ifindex),
        )

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
