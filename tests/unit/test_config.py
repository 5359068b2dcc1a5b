"""Agent configuration: defaults, parsing, and errors that name the offending key."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest

from agent.config import ConfigError, parse_config
from agent.config_file import load_config
from agent.model.pools import parse_block


def test_defaults_without_a_file_take_the_node_name_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")
    cfg = load_config(None)
    assert cfg.node_name == "node-7"
    assert cfg.lb_class == "nodelb.io/lb"
    assert cfg.handle_classless
    assert cfg.external_ip_cidrs == ()


def test_file_values_are_parsed_and_a_flag_overrides_the_node_name(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "nodeName: from-file\n"
        "handleClasslessServices: false\n"
        "externalIPCIDRs: [198.18.0.0/24, '2001:db8::/64']\n"
        "pools:\n- name: default\n  addresses: [198.18.0.200-198.18.0.203, '2001:db8::200/126']\n"
        "sync: {minInterval: 0.1, fullResyncPeriod: 60}\n"
    )
    cfg = load_config(path, node_name="flag-node")
    assert cfg.node_name == "flag-node"
    assert not cfg.handle_classless
    assert [str(n) for n in cfg.external_ip_cidrs] == ["198.18.0.0/24", "2001:db8::/64"]
    assert [str(n) for n in cfg.pools[0].networks] == ["198.18.0.200/30", "2001:db8::200/126"]
    assert (cfg.sync.min_interval, cfg.sync.full_resync_period) == (0.1, 60.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            {"externalIPCIDRs": ["198.18.0.1/24"]}, "externalIPCIDRs[0]", id="host bits set"
        ),
        pytest.param({"externalIPCIDRs": "198.18.0.0/24"}, "expected a list", id="not a list"),
        pytest.param(
            {"pools": [{"name": "p"}]}, "pools[0] (p).addresses: a pool needs", id="empty pool"
        ),
        pytest.param({"pools": [{"addresses": ["198.18.0.0/30"]}]}, "pools[0].name", id="no name"),
        pytest.param(
            {"pools": [{"name": "p", "addresses": ["198.18.0.9-198.18.0.1"]}]},
            "pools[0] (p).addresses[0]",
            id="reversed range",
        ),
        pytest.param({"sync": {"minInterval": -1}}, "sync.minInterval", id="negative interval"),
        pytest.param({"sync": {"maxDelay": 1}}, "unknown sync keys: maxDelay", id="old key"),
        pytest.param({"loadBalancerClass": "plain"}, "loadBalancerClass", id="class not a name"),
        pytest.param({"surprise": 1}, "unknown configuration keys: surprise", id="unknown key"),
    ],
)
def test_invalid_config_names_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(raw)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_address_range_is_covered_exactly() -> None:
    nets = parse_block("198.18.0.200-198.18.0.210", "k")
    covered = {ip for n in nets for ip in n}
    first, last = ipaddress.ip_address("198.18.0.200"), ipaddress.ip_address("198.18.0.210")
    assert covered == {ipaddress.ip_address(i) for i in range(int(first), int(last) + 1)}
