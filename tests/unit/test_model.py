"""FrontendKey's cached hash keeps value semantics: equal keys are one dict key."""

from __future__ import annotations

import dataclasses
import ipaddress

from agent.model.desired_state import FrontendKey
from agent.model.net import Protocol


def test_equal_keys_hash_alike_and_differ_when_any_field_differs() -> None:
    ip = ipaddress.ip_address("198.18.0.200")
    a = FrontendKey(ip, Protocol.TCP, 80)
    b = FrontendKey(ipaddress.ip_address("198.18.0.200"), Protocol.TCP, 80)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    others = [
        FrontendKey(ipaddress.ip_address("198.18.0.201"), Protocol.TCP, 80),
        FrontendKey(ip, Protocol.UDP, 80),
        FrontendKey(ip, Protocol.TCP, 81),
        FrontendKey(ipaddress.ip_address("::ffff:c612:c8"), Protocol.TCP, 80),
    ]
    assert all(o != a for o in others)
    assert len({a, *others}) == 5
    moved = dataclasses.replace(a, port=81)
    assert moved == others[2] and hash(moved) == hash(others[2])
    assert "_hash" not in repr(a)
