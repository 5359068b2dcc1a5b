"""Raw IP protocol 112 sockets for VRRPv3 on one interface (RFC 5798 §5.1, §7.1).

`VrrpSocket` opens one raw socket per family, tied to one interface (SO_BINDTODEVICE), joined
to the VRRP group (224.0.0.18 / ff02::12 on that interface), sending with TTL / hop limit 255
and without multicast loopback. `send` picks the source address per packet (IP_PKTINFO /
IPV6_PKTINFO) because binding a raw socket to an address would also filter what it receives
by destination, and adverts are addressed to the group. `recv` returns the VRRP message with
the IP-layer facts the codec cannot see (source, destination, TTL / hop limit); checking
them is the caller's job, so a drop is counted with its reason in one place.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from agent.announce.vrrp.codec import IPPROTO_VRRP
from agent.model.net import IPAddress

GROUP4 = ipaddress.IPv4Address("224.0.0.18")
GROUP6 = ipaddress.IPv6Address("ff02::12")
VRRP_TTL = 255
IP_PKTINFO = 8  # <linux/in.h>; not exported by Python's socket module
_RECV_BUFFER = 65535
_CMSG_SPACE = socket.CMSG_SPACE(64)


@dataclass(frozen=True, slots=True)
class Received:
    """One protocol-112 packet: the VRRP message and its IP header's facts."""

    family: int
    src: IPAddress
    dst: IPAddress
    ttl: int  # IPv4 TTL or IPv6 hop limit; -1 when the kernel did not report it
    payload: bytes


def parse_ipv4(packet: bytes) -> Received | None:
    """Return the message in a raw IPv4 datagram (header included), None if it is malformed."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    ihl = (packet[0] & 0x0F) * 4
    total = int.from_bytes(packet[2:4], "big")
    if ihl < 20 or total < ihl or len(packet) < total:
        return None
    return Received(
        family=4,
        src=ipaddress.IPv4Address(packet[12:16]),
        dst=ipaddress.IPv4Address(packet[16:20]),
        ttl=packet[8],
        payload=packet[ihl:total],
    )


class VrrpSocket:
    """A raw protocol-112 socket of one family on one interface, joined to the VRRP group.

    `open()` creates and configures it; `close()` releases it. `fileno()` is for a selector.
    """

    def __init__(self, family: int, ifname: str) -> None:
        if family not in (4, 6):
            raise ValueError(f"family must be 4 or 6, got {family}")
        self.family = family
        self.ifname = ifname
        self.ifindex = 0
        self._sock: socket.socket | None = None

    def open(self) -> None:
        """Create the socket, bind it to the interface and join the group (raises OSError)."""
        self.ifindex = socket.if_nametoindex(self.ifname)
        af = socket.AF_INET if self.family == 4 else socket.AF_INET6
        sock = socket.socket(af, socket.SOCK_RAW, IPPROTO_VRRP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname.encode())
            sock.setblocking(False)
            if self.family == 4:
                self._setup4(sock)
            else:
                self._setup6(sock)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def _setup4(self, sock: socket.socket) -> None:
        mreqn = GROUP4.packed + b"\x00" * 4 + struct.pack("@i", self.ifindex)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, VRRP_TTL)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, VRRP_TTL)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)

    def _setup6(self, sock: socket.socket) -> None:
        mreq = GROUP6.packed + struct.pack("@I", self.ifindex)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, self.ifindex)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, VRRP_TTL)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, VRRP_TTL)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)

    def fileno(self) -> int:
        """Return the socket's file descriptor (for selectors)."""
        if self._sock is None:
            raise RuntimeError("VrrpSocket is not open")
        return self._sock.fileno()

    def send(self, message: bytes, *, src: IPAddress) -> None:
        """Multicast one VRRP message from `src` to the group on the interface."""
        if self._sock is None:
            raise RuntimeError("VrrpSocket is not open")
        if self.family == 4:
            pktinfo = struct.pack("@i", self.ifindex) + src.packed + b"\x00" * 4
            self._sock.sendmsg(
                [message], [(socket.IPPROTO_IP, IP_PKTINFO, pktinfo)], 0, (str(GROUP4), 0)
            )
        else:
            pktinfo = src.packed + struct.pack("@I", self.ifindex)
            self._sock.sendmsg(
                [message],
                [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, pktinfo)],
                0,
                (str(GROUP6), 0, 0, self.ifindex),
            )

    def recv(self) -> Received | None:
        """Return the next waiting packet, or None when none is waiting or it is malformed."""
        if self._sock is None:
            raise RuntimeError("VrrpSocket is not open")
        try:
            data, ancdata, _flags, addr = self._sock.recvmsg(_RECV_BUFFER, _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        if self.family == 4:
            return parse_ipv4(data)
        hop_limit = -1
        dst: IPAddress = GROUP6
        for level, kind, value in ancdata:
            if level != socket.IPPROTO_IPV6:
                continue
            if kind == socket.IPV6_HOPLIMIT and len(value) >= 4:
                hop_limit = struct.unpack("@i", value[:4])[0]
            elif kind == socket.IPV6_PKTINFO and len(value) >= 16:
                dst = ipaddress.IPv6Address(value[:16])
        src = ipaddress.IPv6Address(str(addr[0]).split("%", 1)[0])
        return Received(family=6, src=src, dst=dst, ttl=hop_limit, payload=data)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
