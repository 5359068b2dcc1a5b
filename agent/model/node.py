"""Node records parsed from raw API objects: name, zone, readiness, addresses, pod CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.net import IPAddress, IPNetwork


@dataclass(frozen=True, slots=True)
class Node:
    """A Node's name, zone label, readiness and addresses."""

    name: str
    zone: str | None
    ready: bool
    addresses: tuple[IPAddress, ...]
    labels: tuple[tuple[str, str], ...]
    pod_cidrs: tuple[IPNetwork, ...] = ()


ZONE_LABEL = "topology.kubernetes.io/zone"


def parse_node(obj: Mapping[str, Any]) -> Node:
    """Return the Node record for a raw Node (unparseable addresses and CIDRs are skipped)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    addresses: list[IPAddress] = []
    for a in status.get("addresses") or []:
        if a.get("type") in ("InternalIP", "ExternalIP"):
            try:
                addresses.append(ipaddress.ip_address(a.get("address", "")))
            except ValueError:
                continue
    pod_cidrs: list[IPNetwork] = []
    for cidr in (obj.get("spec") or {}).get("podCIDRs") or []:
        try:
            pod_cidrs.append(ipaddress.ip_network(str(cidr), strict=False))
        except ValueError:
            continue
    return Node(
        name=str(meta.get("name", "")),
        zone=labels.get(ZONE_LABEL),
        ready=ready,
        addresses=tuple(addresses),
        labels=tuple(sorted(labels.items())),
        pod_cidrs=tuple(pod_cidrs),
    )
