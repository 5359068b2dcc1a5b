"""EndpointSlices as compact records, parsed from raw API objects (discovery.k8s.io/v1).

`parse_slice` turns a raw EndpointSlice (a decoded JSON dict) into a `Slice`, with the
condition defaults kube-proxy applies; `parse_slice_or_error` names the Service of a slice
that cannot be parsed, so that Service is told why. As kube-proxy does, a port with no name
field or no port number (or port 0) is skipped, and only an endpoint's first address is used
(an endpoint with no address is skipped). Merging a Service's slices into per-port endpoint
lists is the node role's work (agent/node/endpoints.py). Nothing here does I/O.
"""

from __future__ import annotations

import enum
import ipaddress
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.net import IPAddress, Protocol

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class AddressType(enum.StrEnum):
    """An EndpointSlice's `addressType` (values are the API's spelling)."""

    IPV4 = "IPv4"
    IPV6 = "IPv6"
    FQDN = "FQDN"


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    """One endpoint of an EndpointSlice: its first address, placement, conditions and hints.

    `ready`, `serving` and `terminating` are the slice's conditions with kube-proxy's defaults
    already applied (absent ready or serving means True, absent terminating means False).

    `node_name` None means the slice gave no nodeName: such an endpoint is never local to any
    node. `zone` None means no zone field.

    Hints: None means the slice has no such field (no `hints`, or `hints` without
    `forNodes` / `forZones`); an empty frozenset means the field is present but lists nothing.
    Endpoint selection treats both the same way: the endpoint carries no hint of that kind, which
    disables that kind of topology for the whole Service (see agent/node/selection.py). The
    distinction is kept so that what the API said can be reported faithfully.
    """

    ip: IPAddress
    node_name: str | None = None
    zone: str | None = None
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    hints_for_nodes: frozenset[str] | None = None
    hints_for_zones: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class SlicePort:
    """One entry of an EndpointSlice's `ports`: the service port's name, protocol and number.

    `name` is "" for a Service's single unnamed port; `port` is the target port number that
    this slice's endpoints listen on.
    """

    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True, slots=True)
class Slice:
    """One parsed EndpointSlice of a Service.

    `service_name` comes from the `kubernetes.io/service-name` label. For FQDN slices
    `endpoints` is always empty: nodelb never programs FQDN endpoints.
    """

    namespace: str
    name: str
    service_name: str
    address_type: AddressType
    ports: tuple[SlicePort, ...] = ()
    endpoints: tuple[SliceEndpoint, ...] = ()


def parse_slice(obj: Mapping[str, object]) -> Slice:
    """Returns the `Slice` described by a raw EndpointSlice object (decoded JSON).

    Raises ValueError, naming the slice and the field, when the object is malformed: missing
    metadata.name or the `kubernetes.io/service-name` label, an unknown addressType or
    protocol, a field of the wrong JSON type, or an address that is not of the slice's family.

    What kube-proxy skips is skipped, not refused: ports with no name field or no port number
    (or port 0), and endpoints with no address. Absent `ready` / `serving` conditions mean
    True, absent `terminating` means False. Only the first address of an endpoint is kept. For
    FQDN slices the endpoints are not parsed at all.
    """
    metadata = _mapping(obj.get("metadata"), "metadata", "EndpointSlice")
    name = _str(metadata.get("name"), "metadata.name", "EndpointSlice")
    where = f"EndpointSlice {name!r}"
    namespace = _opt_str(metadata.get("namespace"), "metadata.namespace", where) or ""
    where = f"EndpointSlice {namespace}/{name}"
    labels = _mapping(metadata.get("labels") or {}, "metadata.labels", where)
    service_name = labels.get(SERVICE_NAME_LABEL)
    if not isinstance(service_name, str) or not service_name:
        raise ValueError(f"{where}: missing label {SERVICE_NAME_LABEL}")
    raw_type = _str(obj.get("addressType"), "addressType", where)
    try:
        address_type = AddressType(raw_type)
    except ValueError:
        raise ValueError(f"{where}: unknown addressType {raw_type!r}") from None

    ports = tuple(
        port
        for i, raw in enumerate(_list(obj.get("ports"), "ports", where))
        if (port := _parse_port(raw, f"{where}: ports[{i}]")) is not None
    )
    endpoints: tuple[SliceEndpoint, ...] = ()
    if address_type is not AddressType.FQDN:
        version = 4 if address_type is AddressType.IPV4 else 6
        endpoints = tuple(
            ep
            for i, raw in enumerate(_list(obj.get("endpoints"), "endpoints", where))
            if (ep := _parse_endpoint(raw, version, f"{where}: endpoints[{i}]")) is not None
        )
    return Slice(
        namespace=sys.intern(namespace),
        name=name,
        service_name=service_name,
        address_type=address_type,
        ports=ports,
        endpoints=endpoints,
    )


def _parse_port(raw: object, where: str) -> SlicePort | None:
    port = _mapping(raw, "", where)
    name = _opt_str(port.get("name"), "name", where)
    number = port.get("port")
    if number is not None and (not isinstance(number, int) or isinstance(number, bool)):
        raise ValueError(f"{where}: port must be an integer, got {number!r}")
    if number is not None and not 0 <= number <= 65535:
        raise ValueError(f"{where}: port {number} out of range")
    raw_protocol = _opt_str(port.get("protocol"), "protocol", where) or "TCP"
    try:
        protocol = Protocol(raw_protocol.lower())
    except ValueError:
        raise ValueError(f"{where}: unknown protocol {raw_protocol!r}") from None
    if name is None or not number:
        return None
    return SlicePort(name=name, protocol=protocol, port=number)


def _parse_endpoint(raw: object, version: int, where: str) -> SliceEndpoint | None:
    ep = _mapping(raw, "", where)
    addresses = _list(ep.get("addresses"), "addresses", where)
    if not addresses:
        return None
    ip = _parse_ip(_str(addresses[0], "addresses[0]", where), version, where)
    conditions = _mapping(ep.get("conditions") or {}, "conditions", where)
    ready = _opt_bool(conditions.get("ready"), "conditions.ready", where)
    serving = _opt_bool(conditions.get("serving"), "conditions.serving", where)
    terminating = _opt_bool(conditions.get("terminating"), "conditions.terminating", where)
    for_nodes: frozenset[str] | None = None
    for_zones: frozenset[str] | None = None
    if (raw_hints := ep.get("hints")) is not None:
        hints = _mapping(raw_hints, "hints", where)
        for_nodes = _hint_names(hints.get("forNodes"), "hints.forNodes", where)
        for_zones = _hint_names(hints.get("forZones"), "hints.forZones", where)
    node_name = _opt_str(ep.get("nodeName"), "nodeName", where)
    zone = _opt_str(ep.get("zone"), "zone", where)
    return SliceEndpoint(
        ip=ip,
        # A few node and zone names repeat over every endpoint: one string object each.
        node_name=None if node_name is None else sys.intern(node_name),
        zone=None if zone is None else sys.intern(zone),
        ready=ready is None or ready,
        serving=serving is None or serving,
        terminating=terminating is not None and terminating,
        hints_for_nodes=for_nodes,
        hints_for_zones=for_zones,
    )


def _hint_names(raw: object, field: str, where: str) -> frozenset[str] | None:
    if raw is None:
        return None
    names = []
    for i, item in enumerate(_list(raw, field, where)):
        entry = _mapping(item, f"{field}[{i}]", where)
        names.append(sys.intern(_str(entry.get("name"), f"{field}[{i}].name", where)))
    return frozenset(names)


def _parse_ip(text: str, version: int, where: str) -> IPAddress:
    """Parses an address like Go's ParseIPSloppy: IPv4 octets may carry leading zeros."""
    try:
        ip: IPAddress = ipaddress.ip_address(text)
    except ValueError:
        parts = text.split(".")
        if len(parts) != 4 or not all(p.isdigit() and p.isascii() and len(p) <= 3 for p in parts):
            raise ValueError(f"{where}: invalid address {text!r}") from None
        try:
            ip = ipaddress.IPv4Address(".".join(str(int(p)) for p in parts))
        except ValueError:
            raise ValueError(f"{where}: invalid address {text!r}") from None
    if ip.version != version:
        raise ValueError(f"{where}: address {text!r} is not IPv{version}")
    return ip


def _mapping(raw: object, field: str, where: str) -> Mapping[str, object]:
    if not isinstance(raw, Mapping):
        label = f"{where}: {field}" if field else where
        raise ValueError(f"{label} must be an object, got {type(raw).__name__}")
    return raw


def _list(raw: object, field: str, where: str) -> list[object]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{where}: {field} must be a list, got {type(raw).__name__}")
    return raw


def _str(raw: object, field: str, where: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{where}: {field} must be a non-empty string, got {raw!r}")
    return raw


def _opt_str(raw: object, field: str, where: str) -> str | None:
    if raw is not None and not isinstance(raw, str):
        raise ValueError(f"{where}: {field} must be a string, got {raw!r}")
    return raw


def _opt_bool(raw: object, field: str, where: str) -> bool | None:
    if raw is not None and not isinstance(raw, bool):
        raise ValueError(f"{where}: {field} must be a boolean, got {raw!r}")
    return raw


@dataclass(frozen=True, slots=True)
class BadSlice:
    """An EndpointSlice that could not be parsed; its Service is told why."""

    service_key: str
    reason: str


def parse_slice_or_error(obj: Mapping[str, Any]) -> Slice | BadSlice:
    """Return the parsed slice, or a BadSlice naming its Service and the problem."""
    meta = obj.get("metadata") or {}
    service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL, "")
    try:
        return parse_slice(obj)
    except ValueError as exc:
        return BadSlice(service_key=f"{meta.get('namespace', '')}/{service}", reason=str(exc))


def slice_service_key(value: Slice | BadSlice) -> str:
    """Return "namespace/service" for a parsed or bad slice."""
    if isinstance(value, BadSlice):
        return value.service_key
    return f"{value.namespace}/{value.service_name}"
