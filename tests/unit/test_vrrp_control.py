"""The speaker's control commands: what the agent writes is exactly what the speaker reads."""

from __future__ import annotations

import ipaddress

import pytest

from agent.announce.vrrp.config import GratuitousConfig, InstanceConfig, SpeakerConfig
from agent.announce.vrrp.control import Command, Configure, Stop, decode_command, encode_command

CONFIG = SpeakerConfig(
    interface="eth0",
    source4=ipaddress.IPv4Address("198.18.0.11"),
    peers=frozenset({ipaddress.ip_address("198.18.0.12"), ipaddress.ip_address("fe80::2")}),
    instances=(
        InstanceConfig(vrid=7, family=4, addresses=(ipaddress.ip_address("198.18.0.200"),)),
        InstanceConfig(
            vrid=7,
            family=6,
            priority=200,
            advert_interval_cs=10,
            preempt=False,
            preempt_delay_cs=30,
            startup_delay_cs=20,
            addresses=(ipaddress.ip_address("2001:db8::200"),),
        ),
    ),
    gratuitous=GratuitousConfig(count=3, spacing_ms=0, refresh_s=30.0, arp_reply=False),
)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(Configure(CONFIG), id="a configuration with both families survives"),
        pytest.param(Configure(SpeakerConfig(interface="eth0")), id="no instance at all"),
        pytest.param(Stop(graceful=True), id="a graceful stop"),
        pytest.param(Stop(graceful=False), id="an immediate stop"),
    ],
)
def test_a_command_survives_encoding_as_one_line(command: Command) -> None:
    line = encode_command(command)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_command(line) == command


def test_a_stop_without_graceful_is_graceful() -> None:
    assert decode_command(b'{"stop": {}}') == Stop(graceful=True)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"not json", id="not JSON"),
        pytest.param(b"[1, 2]", id="not an object"),
        pytest.param(b'{"restart": {}}', id="an unknown command"),
        pytest.param(b'{"stop": 1}', id="a stop that is not an object"),
        pytest.param(b'{"config": {"instances": []}}', id="a configuration without interface"),
        pytest.param(
            b'{"config": {"interface": "eth0", "instances": [{"vrid": 0, "family": 4,'
            b' "addresses": ["198.18.0.200"]}]}}',
            id="a configuration with an invalid instance",
        ),
    ],
)
def test_anything_else_is_refused_with_value_error(line: bytes) -> None:
    with pytest.raises(ValueError):
        decode_command(line)
