"""The VRRPv3 codec: RFC-derived and captured golden bytes, round trip, every refusal, fuzz.

The captured constants come from keepalived 2.2.7 in the lab (tests/kernel/test_vrrp_capture.py
prints what it captured with `-s`); they freeze what the kernel test checks live, so the
interop facts stay tested without root.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.announce.vrrp.codec import (
    DEFAULT_CHECKSUM_MODE,
    Advert,
    ChecksumMode,
    DecodeReason,
    VrrpDecodeError,
    decode,
    encode,
    internet_checksum,
)
from agent.model.net import IPAddress

GROUP4 = IPv4Address("224.0.0.18")
GROUP6 = IPv6Address("ff02::12")

# -- golden vectors ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Golden:
    wire: str  # hex of the VRRP message (IP payload)
    src: IPAddress
    dst: IPAddress
    mode: ChecksumMode
    advert: Advert


# RFC 5798 §5.2 by hand: VRID 1, priority 100, Max Adver Int 100 cs (1 s), one address
# 192.0.2.1, sent from 192.0.2.10 to 224.0.0.18.
#   message, checksum zeroed: 31 01 64 01 | 00 64 00 00 | c0 00 02 01
#     words: 0x3101 + 0x6401 + 0x0064 + 0x0000 + 0xc000 + 0x0201 = 0x15767
#   IPv4 pseudo-header: c0 00 02 0a | e0 00 00 12 | 00 70 | 00 0c (zero, proto 112, len 12)
#     words: 0xc000 + 0x020a + 0xe000 + 0x0012 + 0x0070 + 0x000c = 0x1a298
#   RFC5798 mode: 0x15767 + 0x1a298 = 0x2f9ff -> fold 0xf9ff + 0x2 = 0xfa01 -> ~ = 0x05fe
#   VRRPV2_COMPAT mode (message only): 0x15767 -> fold 0x5767 + 0x1 = 0x5768 -> ~ = 0xa897
RFC_ADVERT = Advert(vrid=1, priority=100, max_adver_int=100, addresses=(IPv4Address("192.0.2.1"),))
RFC_SRC = IPv4Address("192.0.2.10")

# keepalived 2.2.7, `vrrp_version 3`, `advert_int 0.1`, priority 150, VRID 51, captured on the
# lab segment: IPv4 instance with two VIPs (checksum 0x0459 covers the IPv4 pseudo-header), and
# IPv6 instance with one VIP, sent from the node's link-local address.
KEEPALIVED_ADVERT4 = Advert(
    vrid=51,
    priority=150,
    max_adver_int=10,
    addresses=(IPv4Address("198.18.0.200"), IPv4Address("198.18.0.201")),
)
KEEPALIVED_ADVERT6 = Advert(
    vrid=51, priority=150, max_adver_int=10, addresses=(IPv6Address("2001:db8::200"),)
)
KEEPALIVED_SRC4 = IPv4Address("198.18.0.11")
KEEPALIVED_SRC6 = IPv6Address("fe80::c0b6:38ff:fe31:a539")
KEEPALIVED_WIRE4 = "31339602000a0459c61200c8c61200c9"
KEEPALIVED_WIRE6 = "31339601000a6dc820010db8000000000000000000000200"

GOLDEN = [
    pytest.param(
        Golden("31016401006405fec0000201", RFC_SRC, GROUP4, ChecksumMode.RFC5798, RFC_ADVERT),
        id="RFC 5798 IPv4 advert with the pseudo-header, checksum computed by hand",
    ),
    pytest.param(
        Golden("310164010064a897c0000201", RFC_SRC, GROUP4, ChecksumMode.VRRPV2_COMPAT, RFC_ADVERT),
        id="the same advert with a VRRPv2-style header-only checksum, computed by hand",
    ),
    pytest.param(
        Golden(
            KEEPALIVED_WIRE4, KEEPALIVED_SRC4, GROUP4, DEFAULT_CHECKSUM_MODE, KEEPALIVED_ADVERT4
        ),
        id="keepalived 2.2.7 IPv4 advert captured in the lab, default checksum mode",
    ),
    pytest.param(
        Golden(
            KEEPALIVED_WIRE6, KEEPALIVED_SRC6, GROUP6, DEFAULT_CHECKSUM_MODE, KEEPALIVED_ADVERT6
        ),
        id="keepalived 2.2.7 IPv6 advert captured in the lab, default checksum mode",
    ),
    pytest.param(
        Golden(
            KEEPALIVED_WIRE6,
            KEEPALIVED_SRC6,
            GROUP6,
            ChecksumMode.VRRPV2_COMPAT,
            KEEPALIVED_ADVERT6,
        ),
        id="keepalived's IPv6 advert decodes in VRRPV2_COMPAT mode too: IPv6 always uses it",
    ),
]


@pytest.mark.parametrize("case", GOLDEN)
def test_golden_bytes_decode_to_the_advert_and_encode_back(case: Golden) -> None:
    wire = bytes.fromhex(case.wire)
    family = case.advert.family
    assert decode(wire, src=case.src, dst=case.dst, family=family, checksum_mode=case.mode) == (
        case.advert
    )
    assert encode(case.advert, src=case.src, dst=case.dst, checksum_mode=case.mode) == wire


def test_the_default_checksum_mode_is_keepalived_2_2_7s_pseudo_header_mode() -> None:
    assert DEFAULT_CHECKSUM_MODE is ChecksumMode.RFC5798


def test_keepalived_ipv4_advert_is_refused_when_checksummed_without_the_pseudo_header() -> None:
    with pytest.raises(VrrpDecodeError) as refused:
        decode(
            bytes.fromhex(KEEPALIVED_WIRE4),
            src=KEEPALIVED_SRC4,
            dst=GROUP4,
            family=4,
            checksum_mode=ChecksumMode.VRRPV2_COMPAT,
        )
    assert refused.value.reason is DecodeReason.BAD_CHECKSUM


def test_the_ipv4_checksum_binds_the_source_address_in_rfc5798_mode_only() -> None:
    other = IPv4Address("198.18.0.12")
    wire = bytes.fromhex(KEEPALIVED_WIRE4)
    with pytest.raises(VrrpDecodeError) as refused:
        decode(wire, src=other, dst=GROUP4, family=4)
    assert refused.value.reason is DecodeReason.BAD_CHECKSUM
    compat_mode = ChecksumMode.VRRPV2_COMPAT
    compat = encode(KEEPALIVED_ADVERT4, src=KEEPALIVED_SRC4, dst=GROUP4, checksum_mode=compat_mode)
    advert = decode(compat, src=other, dst=GROUP4, family=4, checksum_mode=compat_mode)
    assert advert == KEEPALIVED_ADVERT4


def test_internet_checksum_of_a_message_with_its_checksum_is_zero() -> None:
    assert internet_checksum(b"") == 0xFFFF
    assert internet_checksum(b"\x01") == 0xFEFF  # odd length: padded with a zero octet
    assert internet_checksum(bytes.fromhex("31016401006405fec0000201") + RFC_SRC.packed) != 0
    pseudo = RFC_SRC.packed + GROUP4.packed + struct.pack("!xBH", 112, 12)
    assert internet_checksum(pseudo + bytes.fromhex("31016401006405fec0000201")) == 0


def test_reserved_bits_of_max_adver_int_are_ignored_on_receipt() -> None:
    wire = bytearray(encode(RFC_ADVERT, src=RFC_SRC, dst=GROUP4))
    wire[4] |= 0xF0  # reserved nibble set ...
    wire[6:8] = b"\x00\x00"
    wire[6:8] = struct.pack("!H", internet_checksum(_pseudo4(RFC_SRC, len(wire)) + bytes(wire)))
    assert decode(bytes(wire), src=RFC_SRC, dst=GROUP4, family=4) == RFC_ADVERT  # ... ignored


def _pseudo4(src: IPv4Address, length: int) -> bytes:
    return src.packed + GROUP4.packed + struct.pack("!xBH", 112, length)


# -- refusals ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    wire: bytes
    reason: DecodeReason
    family: int = 4
    src: IPAddress = RFC_SRC
    dst: IPAddress = GROUP4


def _refit(wire: bytes) -> bytes:
    """Recompute the RFC5798 IPv4 checksum so only the intended defect remains."""
    zeroed = wire[:6] + b"\x00\x00" + wire[8:]
    csum = internet_checksum(_pseudo4(RFC_SRC, len(zeroed)) + zeroed)
    return zeroed[:6] + struct.pack("!H", csum) + zeroed[8:]


GOOD = bytes.fromhex("31016401006405fec0000201")

REFUSALS = [
    pytest.param(Refusal(b"", DecodeReason.TOO_SHORT), id="an empty packet is too short"),
    pytest.param(Refusal(GOOD[:7], DecodeReason.TOO_SHORT), id="seven octets are too short"),
    pytest.param(
        Refusal(_refit(b"\x21" + GOOD[1:]), DecodeReason.BAD_VERSION),
        id="a VRRPv2 header (version 2) is refused",
    ),
    pytest.param(
        Refusal(_refit(b"\x32" + GOOD[1:]), DecodeReason.BAD_TYPE),
        id="type 2 is not an ADVERTISEMENT",
    ),
    pytest.param(
        Refusal(_refit(GOOD[:1] + b"\x00" + GOOD[2:]), DecodeReason.BAD_VRID),
        id="VRID 0 is refused",
    ),
    pytest.param(
        Refusal(_refit(GOOD[:3] + b"\x00" + GOOD[4:8]), DecodeReason.NO_ADDRESSES),
        id="a count of zero addresses is refused (the minimum is one)",
    ),
    pytest.param(
        Refusal(_refit(GOOD[:3] + b"\x02" + GOOD[4:]), DecodeReason.BAD_LENGTH),
        id="a count of two with one address present is a length error",
    ),
    pytest.param(
        Refusal(_refit(GOOD + b"\x00\x00\x00\x00"), DecodeReason.BAD_LENGTH),
        id="trailing octets after the addresses are a length error",
    ),
    pytest.param(
        Refusal(GOOD[:2] + b"\x65" + GOOD[3:], DecodeReason.BAD_CHECKSUM),
        id="a priority changed in flight fails the checksum",
    ),
    pytest.param(
        Refusal(GOOD, DecodeReason.BAD_CHECKSUM, dst=IPv4Address("198.18.0.12")),
        id="a multicast advert presented as unicast fails the pseudo-header checksum",
    ),
    pytest.param(
        Refusal(GOOD, DecodeReason.BAD_LENGTH, family=6, src=KEEPALIVED_SRC6, dst=GROUP6),
        id="an IPv4-sized advert received over IPv6 is a length error",
    ),
    pytest.param(
        Refusal(GOOD, DecodeReason.FAMILY_MISMATCH, family=6),
        id="IPv4 src and dst with family 6 is a family mismatch",
    ),
    pytest.param(
        Refusal(GOOD, DecodeReason.FAMILY_MISMATCH, family=5),
        id="a family other than 4 or 6 is a family mismatch",
    ),
]


@pytest.mark.parametrize("case", REFUSALS)
def test_decode_refuses_with_a_reason(case: Refusal) -> None:
    with pytest.raises(VrrpDecodeError) as refused:
        decode(case.wire, src=case.src, dst=case.dst, family=case.family)
    assert refused.value.reason is case.reason, refused.value


def test_adverts_the_wire_cannot_carry_are_refused_at_construction() -> None:
    a4, a6 = IPv4Address("192.0.2.1"), IPv6Address("2001:db8::1")
    bad: list[dict[str, object]] = [
        {"vrid": 0},
        {"vrid": 256},
        {"priority": -1},
        {"priority": 256},
        {"max_adver_int": 4096},
        {"max_adver_int": -1},
        {"addresses": ()},
        {"addresses": (a4, a6)},
        {"addresses": (a4,) * 256},
        {"version": 2},
        {"type": 2},
    ]
    for change in bad:
        fields: dict[str, object] = {
            "vrid": 1,
            "priority": 100,
            "max_adver_int": 100,
            "addresses": (a4,),
        }
        fields.update(change)
        with pytest.raises(ValueError):
            Advert(**fields)  # type: ignore[arg-type]


def test_encode_refuses_a_src_or_dst_of_the_other_family() -> None:
    with pytest.raises(ValueError):
        encode(RFC_ADVERT, src=KEEPALIVED_SRC6, dst=GROUP6)
    with pytest.raises(ValueError):
        encode(RFC_ADVERT, src=RFC_SRC, dst=GROUP6)


# -- properties -------------------------------------------------------------------------------

ipv4 = st.builds(IPv4Address, st.integers(0, 2**32 - 1))
ipv6 = st.builds(IPv6Address, st.integers(0, 2**128 - 1))
modes = st.sampled_from(list(ChecksumMode))


@st.composite
def adverts_with_endpoints(draw: st.DrawFn) -> tuple[Advert, IPAddress, IPAddress]:
    family = draw(st.sampled_from([4, 6]))
    addr: st.SearchStrategy[IPAddress] = ipv4 if family == 4 else ipv6
    advert = Advert(
        vrid=draw(st.integers(1, 255)),
        priority=draw(st.integers(0, 255)),
        max_adver_int=draw(st.integers(0, 4095)),
        addresses=tuple(draw(st.lists(addr, min_size=1, max_size=255))),
    )
    return advert, draw(addr), draw(addr)


@given(adverts_with_endpoints(), modes)
def test_decode_of_encode_is_the_identity(
    case: tuple[Advert, IPAddress, IPAddress], mode: ChecksumMode
) -> None:
    advert, src, dst = case
    wire = encode(advert, src=src, dst=dst, checksum_mode=mode)
    assert len(wire) == 8 + len(advert.addresses) * (4 if advert.family == 4 else 16)
    assert decode(wire, src=src, dst=dst, family=advert.family, checksum_mode=mode) == advert


@given(adverts_with_endpoints(), modes, st.data())
def test_any_single_bit_flip_is_refused(
    case: tuple[Advert, IPAddress, IPAddress], mode: ChecksumMode, data: st.DataObject
) -> None:
    advert, src, dst = case
    wire = bytearray(encode(advert, src=src, dst=dst, checksum_mode=mode))
    bit = data.draw(st.integers(0, len(wire) * 8 - 1))
    if bit // 8 == 4 and bit % 8 >= 4:
        return  # the reserved nibble is ignored on receipt, by design (§5.2.6)
    wire[bit // 8] ^= 0x80 >> (bit % 8)
    with pytest.raises(VrrpDecodeError):
        decode(bytes(wire), src=src, dst=dst, family=advert.family, checksum_mode=mode)


@given(
    st.binary(max_size=4200),
    st.sampled_from([4, 6, 0]),
    st.one_of(ipv4, ipv6),
    st.one_of(ipv4, ipv6),
    modes,
)
def test_decode_of_random_bytes_raises_only_its_own_error(
    packet: bytes, family: int, src: IPAddress, dst: IPAddress, mode: ChecksumMode
) -> None:
    try:
        advert = decode(packet, src=src, dst=dst, family=family, checksum_mode=mode)
    except VrrpDecodeError:
        return
    assert encode(advert, src=src, dst=dst, checksum_mode=mode)[:4] == packet[:4]


@given(st.binary(min_size=8, max_size=8 + 16 * 4), modes, st.sampled_from([4, 6]))
def test_decode_of_random_advert_shaped_bytes_raises_only_its_own_error(
    body: bytes, mode: ChecksumMode, family: int
) -> None:
    # A plausible first octet and a count matching the length reach the checksum check.
    size = 4 if family == 4 else 16
    count = (len(body) - 8) // size
    packet = b"\x31" + body[1:3] + bytes([count]) + body[4 : 8 + count * size]
    src, dst = (RFC_SRC, GROUP4) if family == 4 else (KEEPALIVED_SRC6, GROUP6)
    with contextlib.suppress(VrrpDecodeError):  # anything else fails the test
        decode(packet, src=src, dst=dst, family=family, checksum_mode=mode)
