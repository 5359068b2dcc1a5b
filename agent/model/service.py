"""Service records parsed from raw API objects, with validation (parse at the boundary).

The core never sees a raw dict: `parse_service` returns a frozen `Service`, or an
`InvalidService` naming what is wrong, so one malformed Service is skipped (with a Warning
Event) while every other Service keeps being served.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.net import IPAddress, IPNetwork, Protocol

MAX_AFFINITY_TIMEOUT = 86400  # seconds; the API's own upper bound for ClientIP affinity
DEFAULT_AFFINITY_TIMEOUT = 10800


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One entry of spec.ports: the name EndpointSlices use, protocol and frontend port."""

    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True, slots=True)
class Service:
    """The fields of a Service nodelb acts on, validated."""

    key: str  # "namespace/name"
    uid: str
    created: str  # RFC 3339 creationTimestamp; sorts chronologically as text
    type: str
    lb_class: str | None
    ports: tuple[ServicePort, ...]
    external_ips: tuple[IPAddress, ...]
    ingress_ips: tuple[IPAddress, ...]  # status.loadBalancer.ingress[].ip
    local_policy: bool  # externalTrafficPolicy: Local
    affinity_timeout: int | None  # ClientIP affinity timeout, None without affinity
    source_ranges: tuple[IPNetwork, ...]
    annotations: tuple[tuple[str, str], ...]
    # spec.healthCheckNodePort (LoadBalancer + externalTrafficPolicy=Local only), else None
    health_check_node_port: int | None = None

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]


@dataclass(frozen=True, slots=True)
class InvalidService:
    """A Service that could not be parsed: skipped, reported with `reason`."""

    key: str
    uid: str
    reason: str


class ParseError(ValueError):
    """A field of an API object is malformed; the message names the field and the value."""


def _ip(value: Any, field: str) -> IPAddress:
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        raise ParseError(f"{field}: {value!r} is not an IP address") from None


def _port(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ParseError(f"{field}: {value!r} is not a port in 1..65535")
    return value


def _protocol(value: Any, field: str) -> Protocol:
    try:
        return Protocol(str(value or "TCP").lower())
    except ValueError:
        raise ParseError(f"{field}: unknown protocol {value!r}") from None


def _meta_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}", str(meta.get("uid", ""))


def parse_service(obj: Mapping[str, Any]) -> Service | InvalidService:
    """Return the Service record for a raw Service, or InvalidService saying what is wrong."""
    key, uid = _meta_key(obj)
    try:
        return _parse_service(obj, key, uid)
    except ParseError as exc:
        return InvalidService(key=key, uid=uid, reason=str(exc))


def _parse_service(obj: Mapping[str, Any], key: str, uid: str) -> Service:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ports = tuple(
        ServicePort(
            name=str(p.get("name") or ""),
            protocol=_protocol(p.get("protocol"), f"spec.ports[{i}].protocol"),
            port=_port(p.get("port"), f"spec.ports[{i}].port"),
        )
        for i, p in enumerate(spec.get("ports") or [])
    )
    external_ips = tuple(
        _ip(a, f"spec.externalIPs[{i}]") for i, a in enumerate(spec.get("externalIPs") or [])
    )
    ingress = (status.get("loadBalancer") or {}).get("ingress") or []
    ingress_ips = tuple(
        _ip(ing["ip"], f"status.loadBalancer.ingress[{i}].ip")
        for i, ing in enumerate(ingress)
        if ing.get("ip")
    )
    affinity: int | None = None
    if spec.get("sessionAffinity") == "ClientIP":
        cfg = (spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}
        affinity = cfg.get("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT)
        if not isinstance(affinity, int) or not 0 < affinity <= MAX_AFFINITY_TIMEOUT:
            raise ParseError(
                f"spec.sessionAffinityConfig.clientIP.timeoutSeconds: {affinity!r} is not in "
                f"1..{MAX_AFFINITY_TIMEOUT}"
            )
    ranges: list[IPNetwork] = []
    for i, r in enumerate(spec.get("loadBalancerSourceRanges") or []):
        try:
            ranges.append(ipaddress.ip_network(str(r).strip(), strict=False))
        except ValueError:
            raise ParseError(f"spec.loadBalancerSourceRanges[{i}]: {r!r} is not a CIDR") from None
    return Service(
        key=key,
        uid=uid,
        created=str(meta.get("creationTimestamp", "")),
        type=str(spec.get("type") or "ClusterIP"),
        lb_class=spec.get("loadBalancerClass"),
        ports=ports,
        external_ips=external_ips,
        ingress_ips=ingress_ips,
        local_policy=spec.get("externalTrafficPolicy") == "Local",
        affinity_timeout=affinity,
        source_ranges=tuple(ranges),
        annotations=tuple(sorted((meta.get("annotations") or {}).items())),
        health_check_node_port=_health_port(spec),
    )


def _health_port(spec: Mapping[str, Any]) -> int | None:
    """Return spec.healthCheckNodePort when it applies (Local LoadBalancer), else None."""
    port = spec.get("healthCheckNodePort")
    local = spec.get("externalTrafficPolicy") == "Local" and spec.get("type") == "LoadBalancer"
    if not local or port in (None, 0):
        return None
    return _port(port, "spec.healthCheckNodePort")
