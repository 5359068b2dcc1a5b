"""The agent's configuration: a YAML/JSON file (mounted from a ConfigMap) plus flags.

Validation happens here, once, with errors that name the offending key, so nothing past this
module sees a string where an address or a number belongs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.announce.settings import AnnounceSettings, parse_announce
from agent.model.config_values import (
    ConfigError,
    boolean,
    known_keys,
    mapping,
    number,
    section,
    string,
    string_list,
    wrong,
)
from agent.model.net import IPNetwork
from agent.model.pools import Forbidden, parse_pools
from agent.model.service_class import DEFAULT_CLASS
from agent.model.tunnel import DEFAULT_LOCAL_TRAFFIC, LocalTraffic

DEFAULT_METRICS_ADDRESS = "0.0.0.0:9472,[::]:9472"  # both families, one socket each

__all__ = ["AgentConfig", "ConfigError", "Pool", "SyncTiming", "parse_config"]


@dataclass(frozen=True, slots=True)
class Pool:
    """A named block of LoadBalancer addresses (the agent needs them for the externalIP check)."""

    name: str
    networks: tuple[IPNetwork, ...]


@dataclass(frozen=True, slots=True)
class SyncTiming:
    """How changes are batched into nft transactions, and how often state is re-checked."""

    min_interval: float = 0.05  # at least this long between two syncs, so bursts coalesce
    # A full resync and a read-back of the whole table cost seconds at 10k Services (nft
    # fetches every element), so they run rarely; partial syncs carry every change.
    full_resync_period: float = 900.0
    drift_check_period: float = 300.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything `nodelb agent` needs to know; see docs/configuration.md."""

    node_name: str = ""
    lb_class: str = DEFAULT_CLASS
    handle_classless: bool = True
    external_ip_cidrs: tuple[IPNetwork, ...] = ()
    local_cidrs: tuple[IPNetwork, ...] = ()  # empty: taken from the Node's spec.podCIDRs
    service_cidrs: tuple[IPNetwork, ...] = ()  # pools must not overlap them (controller)
    pools: tuple[Pool, ...] = ()
    # No `pools:` key: the pools are LoadBalancerIPPool objects, watched (agent/node/pools.py).
    pool_objects: bool = False
    serve_all_ips: bool = True  # hold every LoadBalancer IP (until election decides)
    sync: SyncTiming = field(default_factory=SyncTiming)
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    # Answer healthCheckNodePorts (kube-proxy does where it runs: on only without it).
    health_check_node_ports: bool = False
    # eTP=Local Services: spread over every node with endpoints, or the holder's only.
    local_traffic: LocalTraffic = DEFAULT_LOCAL_TRAFFIC
    announce: AnnounceSettings = field(default_factory=AnnounceSettings)


def _networks(raw: Mapping[str, Any], key: str) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = []
    for i, item in enumerate(string_list(raw, key, key)):
        try:
            out.append(ipaddress.ip_network(item, strict=True))
        except ValueError as exc:
            raise ConfigError(f"{key}[{i}]: {item!r} is not a CIDR ({exc})") from None
    return tuple(out)


def _pools(raw: Mapping[str, Any]) -> tuple[Pool, ...]:
    """Return the pools' names and networks, validated as the controller validates them
    (without the cluster's addresses, which only the controller reads): one file, one verdict."""
    pools = parse_pools(raw.get("pools"), forbidden=Forbidden())
    if pools is None:
        return ()
    return tuple(Pool(name=p.name, networks=p.networks) for p in pools.pools)


# The longest period a setting may name: beyond it a typo (seconds for milliseconds) is likelier.
MAX_SECONDS = 7 * 86400.0

KNOWN_KEYS = frozenset(
    {
        "nodeName",
        "loadBalancerClass",
        "handleClasslessServices",
        "externalIPCIDRs",
        "localCIDRs",
        "serviceCIDRs",
        "pools",
        "serveAllIPs",
        "sync",
        "metricsAddress",
        "healthCheckNodePorts",
        "localTraffic",
        "announce",
    }
)
SYNC_KEYS = frozenset({"minInterval", "fullResyncPeriod", "driftCheckPeriod"})


def parse_config(raw: Any) -> AgentConfig:
    """Return the validated AgentConfig for a parsed config document.

    Raises ConfigError naming the key path and the expected type for any value of the wrong
    type, shape or range (and PoolError / AnnounceConfigError, both ConfigErrors).
    """
    raw = mapping(raw, "the configuration")
    known_keys(raw, KNOWN_KEYS, "configuration")
    sync_raw = section(raw, "sync", "sync")
    known_keys(sync_raw, SYNC_KEYS, "sync")
    d = SyncTiming()

    def seconds(key: str, default: float) -> float:
        return number(sync_raw, key, default, f"sync.{key}", lo=0.0, hi=MAX_SECONDS)

    sync = SyncTiming(
        min_interval=seconds("minInterval", d.min_interval),
        full_resync_period=seconds("fullResyncPeriod", d.full_resync_period),
        drift_check_period=seconds("driftCheckPeriod", d.drift_check_period),
    )
    lb_class = string(raw, "loadBalancerClass", DEFAULT_CLASS, "loadBalancerClass")
    if "/" not in lb_class:
        raise ConfigError(
            f"loadBalancerClass: {lb_class!r} must be a label-style name such as {DEFAULT_CLASS}"
        )
    node_name = raw.get("nodeName", "")
    if not isinstance(node_name, str):
        raise wrong("nodeName", "a string", node_name)
    return AgentConfig(
        node_name=node_name,
        lb_class=lb_class,
        handle_classless=boolean(raw, "handleClasslessServices", True, "handleClasslessServices"),
        external_ip_cidrs=_networks(raw, "externalIPCIDRs"),
        local_cidrs=_networks(raw, "localCIDRs"),
        service_cidrs=_networks(raw, "serviceCIDRs"),
        pools=_pools(raw),
        pool_objects=raw.get("pools") is None,
        serve_all_ips=boolean(raw, "serveAllIPs", True, "serveAllIPs"),
        sync=sync,
        metrics_address=_address(raw),
        health_check_node_ports=boolean(raw, "healthCheckNodePorts", False, "healthCheckNodePorts"),
        local_traffic=_local_traffic(raw),
        announce=parse_announce(raw.get("announce")),
    )


def _local_traffic(raw: Mapping[str, Any]) -> LocalTraffic:
    """Return localTraffic, one of `spread` and `holder`."""
    text = string(raw, "localTraffic", DEFAULT_LOCAL_TRAFFIC.value, "localTraffic")
    try:
        return LocalTraffic(text)
    except ValueError:
        choices = " or ".join(repr(m.value) for m in LocalTraffic)
        raise wrong("localTraffic", choices, text) from None


def _address(raw: Mapping[str, Any]) -> str:
    """Return metricsAddress, checked to be "host:port" with a port in 0..65535."""
    text = string(raw, "metricsAddress", DEFAULT_METRICS_ADDRESS, "metricsAddress")
    _, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        raise ConfigError(f"metricsAddress: expected host:port, got {text!r}")
    return text
