"""VRRPv3 advertisement codec (RFC 5798 §5.2, RFC 9568 §5.2): `encode` and `decode`, pure.

The bytes handled here are the VRRP message only, i.e. the IP payload: the I/O layer strips
the IPv4 header (and checks TTL 255 / hop limit 255, which are IP-layer facts) before calling
`decode`. The IP source and destination addresses still matter to the codec, because the
checksum may cover a pseudo-header built from them (§5.2.8).

Wire format (8 fixed octets, then the addresses)::

    0                   1                   2                   3
    |Version| Type  | Virtual Rtr ID|   Priority    |Count IPvX Addr|
    |(rsvd) |     Max Adver Int     |          Checksum             |
    |                 IPvX Address(es): 4 or 16 octets each         |

Checksum modes, and why there are two (see docs/vrrp.md for the evidence):

- `ChecksumMode.RFC5798`: the checksum covers a pseudo-header and the message, for IPv4 as
  well as IPv6 (RFC 5798 §5.2.8 read literally). keepalived 2.2.7 does this for VRRPv3 over
  IPv4 and offers no switch to turn it off; it is therefore the default here.
- `ChecksumMode.VRRPV2_COMPAT`: for IPv4 the checksum covers the VRRP message alone, as in
  VRRPv2. This is reported to be how RFC 9568 (which obsoletes RFC 5798) settles the
  ambiguity, and it is what some vendors do (Cisco, per keepalived's documentation); FRR has
  it as `no checksum-with-ipv4-pseudoheader`, keepalived after 2.2.7 as `v3_checksum_as_v2`.

IPv6 always includes the RFC 8200 §8.1 pseudo-header, whatever the mode.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

from agent.model.net import IPAddress

VRRP_VERSION = 3
ADVERTISEMENT = 1  # the only VRRPv3 packet type (§5.2.2)
IPPROTO_VRRP = 112
HEADER_LEN = 8
MAX_ADVER_INT_MAX = 0x0FFF  # 12 bits of centiseconds
_HEADER = struct.Struct("!BBBBHH")


class ChecksumMode(enum.StrEnum):
    """What the VRRPv3 checksum covers for IPv4 (IPv6 always includes the pseudo-header)."""

    RFC5798 = "rfc5798"  # IPv4 pseudo-header + message (keepalived 2.2.7's only behaviour)
    VRRPV2_COMPAT = "vrrpv2-compat"  # message only for IPv4 (RFC 9568; "v3_checksum_as_v2")


DEFAULT_CHECKSUM_MODE = ChecksumMode.RFC5798
"""The mode that interoperates with keepalived 2.2.7's default (verified by capture)."""


class DecodeReason(enum.StrEnum):
    """Why `decode` refused a packet; carried by VrrpDecodeError and fit for a metric label."""

    FAMILY_MISMATCH = "family_mismatch"  # src/dst are not of the family asked for
    TOO_SHORT = "too_short"  # fewer than the 8 fixed octets
    BAD_VERSION = "bad_version"  # version field is not 3
    BAD_TYPE = "bad_type"  # type field is not 1 (ADVERTISEMENT)
    BAD_VRID = "bad_vrid"  # VRID 0 (valid VRIDs are 1..255, §5.2.3)
    NO_ADDRESSES = "no_addresses"  # Count IPvX Addr is 0 (the minimum is 1, §5.2.5)
    BAD_LENGTH = "bad_length"  # length differs from 8 + count × address size
    BAD_CHECKSUM = "bad_checksum"  # the one's complement sum does not verify


class VrrpDecodeError(ValueError):
    """A packet is not a valid VRRPv3 advertisement; `reason` says which check failed."""

    def __init__(self, reason: DecodeReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Advert:
    """One VRRPv3 ADVERTISEMENT (RFC 5798 §5.2), as carried on the wire.

    `max_adver_int` is in centiseconds (0..4095). `addresses` are the virtual router's
    addresses, at least one and at most 255, all of one family; the family of the advert is
    theirs. The IP source and destination are not part of the message: `encode` and `decode`
    take them separately because only the checksum depends on them.
    Construction raises ValueError for a value the wire cannot carry.
    """

    vrid: int
    priority: int
    max_adver_int: int
    addresses: tuple[IPAddress, ...]
    version: int = VRRP_VERSION
    type: int = ADVERTISEMENT

    def __post_init__(self) -> None:
        if self.version != VRRP_VERSION:
            raise ValueError(f"version must be {VRRP_VERSION}, got {self.version}")
        if self.type != ADVERTISEMENT:
            raise ValueError(f"type must be {ADVERTISEMENT} (ADVERTISEMENT), got {self.type}")
        if not 1 <= self.vrid <= 255:
            raise ValueError(f"vrid must be 1..255, got {self.vrid}")
        if not 0 <= self.priority <= 255:
            raise ValueError(f"priority must be 0..255, got {self.priority}")
        if not 0 <= self.max_adver_int <= MAX_ADVER_INT_MAX:
            raise ValueError(f"max_adver_int must be 0..4095 cs, got {self.max_adver_int}")
        if not 1 <= len(self.addresses) <= 255:
            raise ValueError(f"an advert carries 1..255 addresses, got {len(self.addresses)}")
        if len({a.version for a in self.addresses}) != 1:
            raise ValueError("an advert's addresses must all be of one family")

    @property
    def family(self) -> int:
        """Return 4 or 6: the IP version of the advert's addresses."""
        return self.addresses[0].version


def internet_checksum(data: bytes) -> int:
    """Return the 16-bit one's complement of the one's complement sum of `data` (RFC 1071).

    An odd-length input is padded with one zero octet. Summing a message whose checksum
    field is already filled in gives 0 when the checksum is right.
    """
    if len(data) % 2:
        data += b"\x00"
    words: tuple[int, ...] = struct.unpack(f"!{len(data) // 2}H", data)
    total = sum(words)
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def pseudo_header(src: IPAddress, dst: IPAddress, length: int, mode: ChecksumMode) -> bytes:
    """Return the pseudo-header the checksum covers in front of a `length`-octet message.

    IPv6: RFC 8200 §8.1 (source, destination, 32-bit length, 3 zero octets, next header
    112). IPv4 in RFC5798 mode: the RFC 768-style layout (source, destination, a zero octet,
    protocol 112, 16-bit length). IPv4 in VRRPV2_COMPAT mode: empty, nothing is prepended.
    """
    if src.version == 6:
        return src.packed + dst.packed + struct.pack("!I3xB", length, IPPROTO_VRRP)
    if mode is ChecksumMode.VRRPV2_COMPAT:
        return b""
    return src.packed + dst.packed + struct.pack("!xBH", IPPROTO_VRRP, length)


def encode(
    advert: Advert,
    *,
    src: IPAddress,
    dst: IPAddress,
    checksum_mode: ChecksumMode = DEFAULT_CHECKSUM_MODE,
) -> bytes:
    """Return the VRRP message for `advert` sent from `src` to `dst`, checksum filled in.

    `src` and `dst` are the IP header's addresses (for multicast, the node's primary address
    (link-local for IPv6) and 224.0.0.18 / ff02::12). Raises ValueError when their family
    differs from the advert's. The reserved bits are sent as zero.
    """
    if src.version != advert.family or dst.version != advert.family:
        raise ValueError(
            f"src {src} and dst {dst} must be IPv{advert.family} like the advert's addresses"
        )
    body = b"".join(a.packed for a in advert.addresses)
    first = (advert.version << 4) | advert.type
    header = _HEADER.pack(
        first, advert.vrid, advert.priority, len(advert.addresses), advert.max_adver_int, 0
    )
    message = header + body
    pseudo = pseudo_header(src, dst, len(message), checksum_mode)
    checksum = internet_checksum(pseudo + message)
    return message[:6] + struct.pack("!H", checksum) + message[8:]


def decode(
    packet: bytes,
    *,
    src: IPAddress,
    dst: IPAddress,
    family: int,
    checksum_mode: ChecksumMode = DEFAULT_CHECKSUM_MODE,
) -> Advert:
    """Return the Advert in `packet` (a VRRP message received from `src` at `dst`).

    Every receive-side check of RFC 5798 §7.1 that the message itself can answer happens
    here, in this order: src/dst of `family` (4 or 6), at least 8 octets, version 3, type 1,
    VRID 1..255, at least one address, exact length 8 + count × (4 | 16), and the checksum
    (per `checksum_mode` for IPv4; always with the pseudo-header for IPv6). Reserved bits
    are ignored (§5.2.6).
    Raises VrrpDecodeError, and nothing else, for any packet that fails a check.
    """
    if family not in (4, 6) or src.version != family or dst.version != family:
        raise VrrpDecodeError(
            DecodeReason.FAMILY_MISMATCH, f"family {family} with src {src} and dst {dst}"
        )
    if len(packet) < HEADER_LEN:
        raise VrrpDecodeError(DecodeReason.TOO_SHORT, f"{len(packet)} octets, need 8")
    first, vrid, priority, count, adver_field, _checksum = _HEADER.unpack_from(packet)
    if first >> 4 != VRRP_VERSION:
        raise VrrpDecodeError(DecodeReason.BAD_VERSION, f"version {first >> 4}")
    if first & 0x0F != ADVERTISEMENT:
        raise VrrpDecodeError(DecodeReason.BAD_TYPE, f"type {first & 0x0F}")
    if vrid == 0:
        raise VrrpDecodeError(DecodeReason.BAD_VRID, "VRID 0")
    if count == 0:
        raise VrrpDecodeError(DecodeReason.NO_ADDRESSES, "Count IPvX Addr is 0")
    size = 4 if family == 4 else 16
    expected = HEADER_LEN + count * size
    if len(packet) != expected:
        raise VrrpDecodeError(
            DecodeReason.BAD_LENGTH,
            f"{len(packet)} octets for {count} IPv{family} address(es), expected {expected}",
        )
    pseudo = pseudo_header(src, dst, len(packet), checksum_mode)
    if internet_checksum(pseudo + packet) != 0:
        raise VrrpDecodeError(
            DecodeReason.BAD_CHECKSUM,
            f"checksum 0x{_checksum:04x} does not verify ({checksum_mode} mode, IPv{family})",
        )
    addresses: tuple[IPAddress, ...]
    if family == 4:
        addresses = tuple(
            ipaddress.IPv4Address(packet[i : i + 4]) for i in range(HEADER_LEN, expected, 4)
        )
    else:
        addresses = tuple(
            ipaddress.IPv6Address(packet[i : i + 16]) for i in range(HEADER_LEN, expected, 16)
        )
    return Advert(
        vrid=vrid,
        priority=priority,
        max_adver_int=adver_field & MAX_ADVER_INT_MAX,
        addresses=addresses,
    )
