"""Raw IP protocol 112 sockets for VRRPv3 on one interface (RFC 5798 §5.1, §7.1).

`VrrpSocket` opens one raw socket per family, tied to one interface (SO_BINDTODEVICE), joined
to the VRRP group (224.0.0.18 / ff02::12 on that interface), sending with TTL / hop limit 255
and without multicast loopback. `send` picks the source address per packet (IP_PKTINFO /
IPV6_PKTINFO) because binding a raw socket to an address would also filter what it receives
by destination, and adverts are addressed to the group. `recv` returns the VRRP message with
the facts the codec cannot see (IP source, destination, TTL / hop limit, and the Ethernet
source MAC); checking them is the caller's job, so a drop is counted with its reason in one
place.

Why receive on a packet socket: a raw IP socket cannot say which MAC a packet came from (no
socket option or ancillary message carries the link-layer source), and the speaker must check
it against the MAC the peer published (issue #18: forged adverts from a peer's address). So
the adverts are read from an AF_PACKET SOCK_DGRAM socket bound to the interface and the
family's ethertype, whose `recvfrom` address is the frame's `sockaddr_ll` (source MAC and
packet type) and whose data starts at the IP header; a classic BPF filter lets only IP
protocol 112 through. The raw socket still sends and holds the group membership (so the NIC
accepts 01:00:5e:00:00:12 / 33:33:00:00:00:12); a drop-all filter keeps it from queueing
the copies it would also receive.
"""

from __future__ import annotations

import ctypes
import dataclasses
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
SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
# <linux/if_packet.h> packet types a host receives (to us, broadcast, multicast); not
# PACKET_OTHERHOST (3: another host's unicast, seen in promiscuous mode) nor PACKET_OUTGOING
# (4: a frame this host sent), which a raw IP socket would not have delivered either.
RECEIVED_TYPES = frozenset({0, 1, 2})
_RECV_BUFFER = 65535


@dataclass(frozen=True, slots=True)
class Received:
    """One protocol-112 packet: the VRRP message and its IP header's facts."""

    family: int
    src: IPAddress
    dst: IPAddress
    ttl: int  # IPv4 TTL or IPv6 hop limit; -1 when the kernel did not report it
    payload: bytes
    src_mac: bytes | None = None  # the frame's Ethernet source; None: not known


def _bpf(*insns: tuple[int, int, int, int]) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """Return a `struct sock_fprog` for SO_ATTACH_FILTER and the buffer it points into (keep
    both alive until the setsockopt returns)."""
    code = b"".join(struct.pack("HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(code, len(code))
    return struct.pack("HL", len(insns), ctypes.addressof(buf)), buf


def only_vrrp(family: int) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """Return a filter passing packets whose IP protocol / next header is 112 (offsets from
    the IP header: a SOCK_DGRAM packet socket's data starts there)."""
    offset = 9 if family == 4 else 6
    return _bpf(
        (0x30, 0, 0, offset),  # ldb [offset]
        (0x15, 0, 1, IPPROTO_VRRP),  # jeq #112, accept, drop
        (0x06, 0, 0, 0x40000),  # ret #262144 (the whole packet)
        (0x06, 0, 0, 0),  # ret #0
    )


def drop_all() -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """Return a filter passing nothing."""
    return _bpf((0x06, 0, 0, 0))


def parse_ipv6(packet: bytes) -> Received | None:
    """Return the message in a raw IPv6 packet whose next header is VRRP, None otherwise."""
    if len(packet) < 40 or packet[0] >> 4 != 6 or packet[6] != IPPROTO_VRRP:
        return None
    length = int.from_bytes(packet[4:6], "big")
    if len(packet) < 40 + length:
        return None
    return Received(
        family=6,
        src=ipaddress.IPv6Address(packet[8:24]),
        dst=ipaddress.IPv6Address(packet[24:40]),
        ttl=packet[7],
        payload=packet[40 : 40 + length],
    )


def parse_ipv4(packet: bytes) -> Received | None:
    """Return the message in a raw IPv4 datagram (header included), None if it is malformed."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    ihl = (packet[0] & 0x0F) * 4
    total = int.from_bytes(packet[2:4], "big")
    if ihl < 20 or total < ihl or len(packet) < total or packet[9] != IPPROTO_VRRP:
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
        self._rx: socket.socket | None = None  # the packet socket adverts are read from

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
            rx = self._open_rx()
        except BaseException:
            sock.close()
            raise
        try:
            # Only now: until the packet socket is bound the raw one is the only reader.
            prog, _buf = drop_all()
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
        except BaseException:
            sock.close()
            rx.close()
            raise
        self._sock, self._rx = sock, rx

    def _open_rx(self) -> socket.socket:
        """Return the packet socket that receives this family's adverts on the interface."""
        proto = ETH_P_IP if self.family == 4 else ETH_P_IPV6
        rx = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(proto))
        try:
            prog, _buf = only_vrrp(self.family)
            rx.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
            rx.bind((self.ifname, proto))
            rx.setblocking(False)
        except BaseException:
            rx.close()
            raise
        return rx

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
        """Return the receiving socket's file descriptor (for selectors)."""
        if self._rx is None:
            raise RuntimeError("VrrpSocket is not open")
        return self._rx.fileno()

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
        """Return the next waiting packet, or None when none is waiting or it is malformed or
        one this host sent."""
        if self._rx is None:
            raise RuntimeError("VrrpSocket is not open")
        try:
            data, addr = self._rx.recvfrom(_RECV_BUFFER)
        except (BlockingIOError, InterruptedError):
            return None
        # addr is (ifname, proto, pkttype, hatype, source MAC) from the frame's sockaddr_ll.
        if len(addr) < 5 or addr[2] not in RECEIVED_TYPES:
            return None
        packet = parse_ipv4(data) if self.family == 4 else parse_ipv6(data)
        if packet is None:
            return None
        return dataclasses.replace(packet, src_mac=bytes(addr[4][:6]))

    def close(self) -> None:
        """Close the sockets (idempotent)."""
        for sock in (self._sock, self._rx):
            if sock is not None:
                sock.close()
        self._sock = self._rx = None
