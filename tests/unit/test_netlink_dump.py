"""Decoding nf_tables dump replies (dataplane/netlink_dump.py) into canonical read-back text."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given, settings

from agent.dataplane import netlink_dump as nft_dump
from agent.dataplane.libnft import NftError
from agent.model.desired_state import DesiredState
from rules import netlink as nftnl
from rules.readback import expected
from rules.render import render
from rules.transaction import Elements
from tests.unit.rules_states import desired_states


def _payload(list_elem: bytes) -> bytes:
    """The inside of one NFTA_LIST_ELEM attribute (what a dump reply nests)."""
    ((kind, payload),) = list(nftnl.attribute_list(list_elem))
    assert kind == nftnl.NFTA_LIST_ELEM
    return payload


@settings(max_examples=200, deadline=None)
@given(desired=desired_states())
def test_every_encoded_element_decodes_to_the_text_the_read_back_expects(
    desired: DesiredState,
) -> None:
    want = expected(desired).sets
    for op in render(desired).ops:
        if not isinstance(op.obj, Elements) or op.verb != "add":
            continue
        name = op.obj.set
        shape = nftnl.set_shape(name)
        if shape is None:
            continue
        encoded = nftnl.encode_op(op)
        got = {
            nft_dump.decode_element(shape, _payload(nftnl.encode_element(e)))
            for e in encoded.elements
        }
        assert got == want[name], name


def _bound(addr: str, *, end: bool) -> bytes:
    key = nftnl.nla(
        nftnl.NFTA_SET_ELEM_KEY,
        nftnl.nla(nftnl.NFTA_DATA_VALUE, ipaddress.ip_address(addr).packed),
        nested=True,
    )
    flags = nftnl.nla(nft_dump.NFTA_SET_ELEM_FLAGS, struct.pack("!I", 1)) if end else b""
    return key + flags


def test_interval_elements_read_back_as_the_prefixes_they_hold() -> None:
    elems = [
        _bound("0.0.0.0", end=True),  # nft's leading end element
        _bound("198.19.0.0", end=False),
        _bound("198.20.0.0", end=True),
        _bound("198.20.0.0", end=False),  # adjacent: kept apart, as configured
        _bound("198.20.1.0", end=True),
        _bound("203.0.113.7", end=False),
        _bound("203.0.113.8", end=True),
        _bound("255.255.255.0", end=False),  # runs to the last address: no end element
    ]
    assert nft_dump.decode_intervals(reversed(elems), 4) == {
        "198.19.0.0/16",
        "198.20.0.0/24",
        "203.0.113.7",
        "255.255.255.0/24",
    }
    v6 = [_bound("2001:db8:1::", end=False), _bound("2001:db8:2::", end=True)]
    assert nft_dump.decode_intervals(v6, 6) == {"2001:db8:1::/48"}


def test_a_key_of_the_wrong_length_is_a_decode_error() -> None:
    shape = nftnl.set_shape("held4")
    assert shape is not None
    elem = nftnl.nla(
        nftnl.NFTA_SET_ELEM_KEY, nftnl.nla(nftnl.NFTA_DATA_VALUE, b"\x01\x02\x03"), nested=True
    )
    with pytest.raises(nftnl.DecodeError, match="too short"):
        nft_dump.decode_element(shape, elem)


class GarbledDumper:
    """Answers every dump with one reply naming the nodelb table, then attributes cut short."""

    def dump(self, msg_type: int, attrs: bytes) -> list[bytes]:
        table = nftnl.nla(nft_dump.NFTA_TABLE_NAME, b"nodelb\0")
        return [b"\x01\x00\x00\x00" + table + b"\x40\x00\x03\x00"]  # 64 bytes said, 4 given


def test_a_reply_that_does_not_decode_is_an_nft_error_for_the_dataplane() -> None:
    reader = nft_dump.NetlinkTableReader(GarbledDumper())
    with pytest.raises(NftError, match="cannot decode"):
        reader.snapshot()
    with pytest.raises(NftError, match="cannot decode"):
        reader.objects()
