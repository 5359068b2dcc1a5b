"""The carrier's pure part (agent/announce/vrrp/carrier.py): when the link came back."""

from __future__ import annotations

import struct

import pytest

from agent.announce.vrrp.carrier import IFF_LOWER_UP, RTM_NEWLINK, link_flags, regained

UP = 0x1 | 0x40  # IFF_UP | IFF_RUNNING, as the kernel reports them with the carrier


@pytest.mark.parametrize(
    ("had", "flags", "want"),
    [
        pytest.param(False, UP | IFF_LOWER_UP, (True, True), id="lost, then back: back"),
        pytest.param(True, UP | IFF_LOWER_UP, (True, False), id="still up: not back again"),
        pytest.param(True, 0x1, (False, False), id="lost (the interface itself stays up)"),
        pytest.param(False, 0x1, (False, False), id="still without"),
        pytest.param(None, UP | IFF_LOWER_UP, (True, False), id="first reading: no loss seen"),
        pytest.param(None, 0x1, (False, False), id="first reading without the carrier"),
    ],
)
def test_the_carrier_is_back_only_after_it_was_seen_lost(
    had: bool | None, flags: int, want: tuple[bool, bool]
) -> None:
    assert regained(had, flags) == want


def _message(kind: int, body: bytes) -> bytes:
    length = 16 + len(body)
    padded = body + b"\0" * (-length % 4)
    return struct.pack("=IHHII", length, kind, 0, 0, 0) + padded


def _newlink(index: int, flags: int) -> bytes:
    # ifinfomsg and one attribute the parser must step over (IFLA_IFNAME "eth0").
    return _message(
        RTM_NEWLINK,
        struct.pack("=BxHiII", 0, 1, index, flags, 0xFFFFFFFF)
        + (struct.pack("=HH", 9, 3) + b"eth0\0"),
    )


def test_link_notifications_are_read_message_by_message() -> None:
    read = _newlink(2, UP) + _message(20, b"\0" * 24) + _newlink(3, UP | IFF_LOWER_UP)
    assert list(link_flags(read)) == [(2, UP), (3, UP | IFF_LOWER_UP)]


def test_a_truncated_read_yields_what_is_whole_and_stops() -> None:
    whole = _newlink(3, UP)
    assert list(link_flags(whole + whole[:10])) == [(3, UP)]
    bad_length = struct.pack("=IHHII", 8, RTM_NEWLINK, 0, 0, 0)  # shorter than its header
    assert list(link_flags(bad_length + whole)) == []
    assert list(link_flags(b"")) == []
