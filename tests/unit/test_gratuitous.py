"""Gratuitous ARP and unsolicited NA encoders against golden bytes derived from the RFC layouts.

The MAC is 00:00:5e:00:53:01 (RFC 7042 §2.1.1's documentation range), the IPv4 address
198.18.0.200 (c6 12 00 c8) and the IPv6 target 2001:db8::200, sent from the link-local
address fe80::200:5eff:fe00:5301 to ff02::1.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.announce.vrrp.codec import internet_checksum
from agent.announce.vrrp.gratuitous import Kind, arp_frame, parse_mac, unsolicited_na

MAC = bytes.fromhex("00005e005301")
VIP4 = ipaddress.IPv4Address("198.18.0.200")
VIP6 = ipaddress.IPv6Address("2001:db8::200")
LINK_LOCAL = ipaddress.IPv6Address("fe80::200:5eff:fe00:5301")
ALL_NODES = ipaddress.IPv6Address("ff02::1")


@dataclass(frozen=True, slots=True)
class ArpCase:
    kind: Kind
    golden: str


# Ethernet (dst, src, type 0x0806) then RFC 826: htype 1, ptype 0x0800, hlen 6, plen 4, op,
# sender MAC, sender IP, target MAC, target IP. Both forms: sender IP = target IP = the VIP.
ARP_CASES = [
    pytest.param(
        ArpCase(
            Kind.ARP_REQUEST,
            "ffffffffffff" "00005e005301" "0806"
            "0001" "0800" "06" "04" "0001"
            "00005e005301" "c61200c8"
            "000000000000" "c61200c8",
        ),
        id="request form (RFC 5227 ARP Announcement): op 1, target MAC all zeroes",
    ),
    pytest.param(
        ArpCase(
            Kind.ARP_REPLY,
            "ffffffffffff" "00005e005301" "0806"
            "0001" "0800" "06" "04" "0002"
            "00005e005301" "c61200c8"
            "00005e005301" "c61200c8",
        ),
        id="reply form (RFC 5944 4.6): op 2, target MAC = the holder's MAC, broadcast",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", ARP_CASES)
def test_gratuitous_arp_frames_match_the_rfc_layout(case: ArpCase) -> None:
    frame = arp_frame(case.kind, mac=MAC, address=VIP4)
    assert frame.hex() == case.golden
    assert len(frame) == 14 + 28


# ICMPv6 type 136, code 0, checksum, flags R=0 S=0 O=1 (0x20) + 29 reserved bits, target,
# then option type 2 (target link-layer address), length 1 (8 octets), the MAC.
# Checksum by hand: the 16-bit words of the pseudo-header (fe80 0200 5eff fe00 5301 | ff02
# 0001 | length 0020 | next header 003a; zero words left out) and of the message with the
# checksum field zero (8800 2000 2001 0db8 0200 0201 5e00 5301) sum to 0x53a98; folded
# 0x3a98 + 0x5 = 0x3a9d, one's complement 0xc562.
NA_GOLDEN = (
    "88" "00" "c562" "20000000"
    "20010db8000000000000000000000200"
    "02" "01" "00005e005301"
)  # fmt: skip


def test_unsolicited_na_matches_the_rfc_layout_with_the_override_flag() -> None:
    message = unsolicited_na(target=VIP6, mac=MAC, src=LINK_LOCAL)
    assert message.hex() == NA_GOLDEN
    flags = message[4]
    assert flags & 0x20 and not flags & 0x40 and not flags & 0x80  # O set, S and R clear


def test_the_na_checksum_verifies_over_the_pseudo_header() -> None:
    message = unsolicited_na(target=VIP6, mac=MAC, src=LINK_LOCAL, dst=ALL_NODES)
    pseudo = LINK_LOCAL.packed + ALL_NODES.packed + struct.pack("!I3xB", len(message), 58)
    assert internet_checksum(pseudo + message) == 0


def test_the_router_flag_is_set_only_when_asked() -> None:
    message = unsolicited_na(target=VIP6, mac=MAC, src=LINK_LOCAL, router=True)
    assert message[4] == 0xA0
    pseudo = LINK_LOCAL.packed + ALL_NODES.packed + struct.pack("!I3xB", len(message), 58)
    assert internet_checksum(pseudo + message) == 0


@given(
    mac=st.binary(min_size=6, max_size=6),
    target=st.integers(min_value=0, max_value=2**128 - 1).map(ipaddress.IPv6Address),
    src=st.integers(min_value=0, max_value=2**64 - 1).map(
        lambda i: ipaddress.IPv6Address((0xFE80 << 112) | i)
    ),
)
def test_every_na_checksum_verifies_and_carries_the_target_and_mac(
    mac: bytes, target: ipaddress.IPv6Address, src: ipaddress.IPv6Address
) -> None:
    message = unsolicited_na(target=target, mac=mac, src=src)
    pseudo = src.packed + ALL_NODES.packed + struct.pack("!I3xB", len(message), 58)
    assert internet_checksum(pseudo + message) == 0
    assert message[8:24] == target.packed and message[26:32] == mac


@given(
    mac=st.binary(min_size=6, max_size=6),
    address=st.integers(min_value=0, max_value=2**32 - 1).map(ipaddress.IPv4Address),
    kind=st.sampled_from([Kind.ARP_REQUEST, Kind.ARP_REPLY]),
)
def test_every_arp_frame_names_the_address_as_sender_and_target(
    mac: bytes, address: ipaddress.IPv4Address, kind: Kind
) -> None:
    frame = arp_frame(kind, mac=mac, address=address)
    arp = frame[14:]
    assert frame[6:12] == arp[8:14] == mac
    assert arp[14:18] == arp[24:28] == address.packed


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="6 octets"):
        arp_frame(Kind.ARP_REQUEST, mac=b"\x00" * 5, address=VIP4)
    with pytest.raises(ValueError, match="not an ARP form"):
        arp_frame(Kind.NA, mac=MAC, address=VIP4)
    with pytest.raises(ValueError, match="6 octets"):
        unsolicited_na(target=VIP6, mac=b"\x00" * 7, src=LINK_LOCAL)
    assert parse_mac("00:00:5e:00:53:01") == MAC
    with pytest.raises(ValueError, match="not a MAC"):
        parse_mac("00:00:5e:00:53")
