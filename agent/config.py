"""The agent's configuration: a YAML/JSON file (mounted from a ConfigMap) plus flags.

Validation happens here, once, with errors that name the offending key, so nothing past this
module sees a string where an address or a number belongs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.announce.settings import AnnounceConfigError, AnnounceSettings, parse_announce
from agent.model.net import IPNetwork
from agent.model.pools import PoolError, parse_block
from agent.model.service_class import DEFAULT_CLASS

DEFAULT_METRICS_ADDRESS = "0.0.0.0:9472,[::]:9472"  # both families, one socket each


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the bad value."""


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
    serve_all_ips: bool = True  # hold every LoadBalancer IP (until election decides)
    sync: SyncTiming = field(default_factory=SyncTiming)
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    # Answer healthCheckNodePorts (kube-proxy does where it runs: on only without it).
    health_check_node_ports: bool = False
    announce: AnnounceSettings = field(default_factory=AnnounceSettings)


def _networks(value: Any, key: str) -> tuple[IPNetwork, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of CIDRs, got {value!r}")
    out: list[IPNetwork] = []
    for i, item in enumerate(value):
        try:
            out.append(ipaddress.ip_network(str(item), strict=True))
        except ValueError as exc:
            raise ConfigError(f"{key}[{i}]: {item!r} is not a CIDR ({exc})") from None
    return tuple(out)


def _pools(value: Any) -> tuple[Pool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"pools: expected a list, got {value!r}")
    pools: list[Pool] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ConfigError(f"pools[{i}]: each pool needs a name")
        nets: list[IPNetwork] = []
        for j, block in enumerate(item.get("addresses") or []):
            try:
                nets.extend(parse_block(str(block), f"pools[{i}].addresses[{j}]"))
            except PoolError as exc:
                raise ConfigError(str(exc)) from None
        if not nets:
            raise ConfigError(f"pools[{i}] ({item['name']}): no addresses")
        pools.append(Pool(name=str(item["name"]), networks=tuple(nets)))
    return tuple(pools)


def _seconds(raw: Mapping[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"sync.{key}: expected a non-negative number of seconds, got {value!r}")
    return float(value)


KNOWN_KEYS = {
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
    "announce",
}


def parse_config(raw: Mapping[str, Any]) -> AgentConfig:
    """Return the validated AgentConfig for a parsed config document."""
    unknown = set(raw) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
    sync_raw = raw.get("sync") or {}
    if not isinstance(sync_raw, Mapping):
        raise ConfigError(f"sync: expected a mapping, got {sync_raw!r}")
    unknown_sync = set(sync_raw) - {"minInterval", "fullResyncPeriod", "driftCheckPeriod"}
    if unknown_sync:
        raise ConfigError(f"unknown sync keys: {', '.join(sorted(unknown_sync))}")
    d = SyncTiming()
    sync = SyncTiming(
        min_interval=_seconds(sync_raw, "minInterval", d.min_interval),
        full_resync_period=_seconds(sync_raw, "fullResyncPeriod", d.full_resync_period),
        drift_check_period=_seconds(sync_raw, "driftCheckPeriod", d.drift_check_period),
    )
    lb_class = raw.get("loadBalancerClass", DEFAULT_CLASS)
    if not isinstance(lb_class, str) or "/" not in lb_class:
        raise ConfigError(
            f"loadBalancerClass: {lb_class!r} must be a label-style name such as {DEFAULT_CLASS}"
        )
    return AgentConfig(
        node_name=str(raw.get("nodeName") or ""),
        lb_class=lb_class,
        handle_classless=bool(raw.get("handleClasslessServices", True)),
        external_ip_cidrs=_networks(raw.get("externalIPCIDRs"), "externalIPCIDRs"),
        local_cidrs=_networks(raw.get("localCIDRs"), "localCIDRs"),
        service_cidrs=_networks(raw.get("serviceCIDRs"), "serviceCIDRs"),
        pools=_pools(raw.get("pools")),
        serve_all_ips=bool(raw.get("serveAllIPs", True)),
        sync=sync,
        metrics_address=str(raw.get("metricsAddress", DEFAULT_METRICS_ADDRESS)),
        health_check_node_ports=bool(raw.get("healthCheckNodePorts", False)),
        announce=_announce(raw.get("announce")),
    )


def _announce(raw: Any) -> AnnounceSettings:
    try:
        return parse_announce(raw)
    except AnnounceConfigError as exc:
        raise ConfigError(str(exc)) from None
