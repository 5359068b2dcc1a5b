"""Whether a Service's addresses can serve anything, from its spec and its EndpointSlices (pure).

An allocated, held address with its rules in place can still serve nothing: every connection
is rejected (no endpoint nodelb can use) or dropped (source ranges of the other family only:
the renderer fails closed, docs/dataplane.md). Those Services used to show
LoadBalancerServing True with no Event. `servability` finds each such problem, per IP family
and Service port:

- **source ranges of the other family only** (`SourceRangesExcludeFamily`): loadBalancer-
  SourceRanges are set, none is of the address's family: every connection to it is dropped;
- **FQDN endpoints only** (`FQDNEndpointsNotSupported`): every slice that lists endpoints is
  addressType FQDN, which nodelb (like kube-proxy) never programs;
- **no endpoint of the address's family** (`NoEndpointsOfFamily`): the Service has endpoints,
  none of this family (a dual-stack Service whose pods are single-stack, hand-made slices);
- **slices without ports** (`EndpointSlicePortsMissing`): the family's slices list endpoints
  but no ports, so no Service port maps to them;
- **a port no slice serves** (`PortWithoutEndpoints`): the family's slices list endpoints,
  none under this Service port's name and protocol.

A Service with no endpoint at all (scaled to zero, not ready yet) is none of these: nodelb
rejects its connections as kube-proxy does, and says nothing. `Servability.nothing_served`
is True when every (family, port) of the Service's addresses is hit: conditions.py then says
Serving=False/Unsupported; otherwise the problems mark it Degraded (`Ports` for a port,
`IPFamilies` for a whole family).

The controller learns the slice side from its own watch of EndpointSlices, kept as one small
`SliceSummary` per slice (docs/decisions.md: why not the agents' reports).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.controller.request import Feature
from agent.model.endpoint_slice import SERVICE_NAME_LABEL
from agent.model.net import IPAddress, IPFamily, IPNetwork, Protocol
from agent.model.service import ServicePort

__all__ = [
    "Servability",
    "ServingProblem",
    "SliceSummary",
    "Unservable",
    "servability",
    "summarize_slice",
]

_FAMILY_BY_TYPE = {"IPv4": IPFamily.IPV4, "IPv6": IPFamily.IPV6}


class Unservable(enum.StrEnum):
    """Why some address or port of a Service serves nothing; the value is the Event reason."""

    SOURCE_RANGES_OTHER_FAMILY = "SourceRangesExcludeFamily"
    FQDN_ONLY = "FQDNEndpointsNotSupported"
    NO_ENDPOINTS_OF_FAMILY = "NoEndpointsOfFamily"
    SLICES_WITHOUT_PORTS = "EndpointSlicePortsMissing"
    PORT_WITHOUT_ENDPOINTS = "PortWithoutEndpoints"
    FAMILY_NOT_ALLOCATED = "IPFamilyNotAllocated"


@dataclass(frozen=True, slots=True)
class SliceSummary:
    """What the controller keeps of one EndpointSlice (a few fields, not its endpoints).

    `service` is "namespace/name" ("" when the slice names no Service); `address_type` is as
    the API spells it; `ports` the (name, protocol) pairs it lists; `has_endpoints` whether it
    lists any endpoint at all, whatever its conditions (readiness changes do not touch this
    record, so pod churn costs the controller no reconcile).
    """

    service: str
    address_type: str
    ports: frozenset[tuple[str, Protocol]]
    has_endpoints: bool


def summarize_slice(obj: Mapping[str, Any]) -> SliceSummary:
    """Return the summary of a raw EndpointSlice (never raises; odd fields count as absent)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    name = labels.get(SERVICE_NAME_LABEL)
    namespace = meta.get("namespace")
    service = f"{namespace}/{name}" if isinstance(name, str) and name else ""
    ports: set[tuple[str, Protocol]] = set()
    raw_ports = obj.get("ports")
    for raw in raw_ports if isinstance(raw_ports, list) else ():
        if not isinstance(raw, Mapping) or not raw.get("port"):
            continue  # kube-proxy skips a port with no number too
        try:
            protocol = Protocol(str(raw.get("protocol") or "TCP").lower())
        except ValueError:
            continue
        ports.add((str(raw.get("name") or ""), protocol))
    endpoints = obj.get("endpoints")
    has = isinstance(endpoints, list) and any(
        isinstance(e, Mapping) and e.get("addresses") for e in endpoints
    )
    return SliceSummary(service, str(obj.get("addressType") or ""), frozenset(ports), has)


@dataclass(frozen=True, slots=True)
class ServingProblem:
    """One reason some of a Service's addresses or ports serve nothing, and which KEP-4631
    feature that leaves unmet (for the Degraded condition)."""

    reason: Unservable
    feature: Feature
    message: str


@dataclass(frozen=True, slots=True)
class Servability:
    """The problems found (empty: everything can be served), and whether they leave nothing."""

    problems: tuple[ServingProblem, ...] = ()
    nothing_served: bool = False


def _port_text(port: ServicePort) -> str:
    named = f" ({port.name!r})" if port.name else ""
    return f"{port.port}/{port.protocol.value.upper()}{named}"


def servability(
    *,
    ips: Sequence[IPAddress],
    ports: Sequence[ServicePort],
    source_ranges: Sequence[IPNetwork],
    slices: Iterable[SliceSummary],
) -> Servability:
    """Return what of the Service's allocated `ips` x `ports` can serve nothing, and why.

    `slices` are the Service's EndpointSlice summaries. No ips or no ports: nothing to judge
    (an empty Servability).
    """
    families = sorted({IPFamily.of(ip) for ip in ips})
    if not families or not ports:
        return Servability()
    problems: list[ServingProblem] = []
    dead: set[tuple[IPFamily, ServicePort]] = set()
    range_versions = {n.version for n in source_ranges}
    for family in families:
        if source_ranges and (4 if family is IPFamily.IPV4 else 6) not in range_versions:
            shown = ", ".join(str(ip) for ip in ips if IPFamily.of(ip) is family)
            problems.append(
                ServingProblem(
                    Unservable.SOURCE_RANGES_OTHER_FAMILY,
                    Feature.IP_FAMILIES,
                    f"loadBalancerSourceRanges list no {family} range: every connection to "
                    f"{shown} is dropped",
                )
            )
            dead.update((family, p) for p in ports)
    with_endpoints = [s for s in slices if s.has_endpoints]
    ip_slices = [s for s in with_endpoints if s.address_type in _FAMILY_BY_TYPE]
    if with_endpoints and not ip_slices:
        types = sorted({s.address_type for s in with_endpoints})
        problems.append(
            ServingProblem(
                Unservable.FQDN_ONLY,
                Feature.IP_FAMILIES,
                f"every EndpointSlice with endpoints is addressType {', '.join(types)}; nodelb "
                "serves IPv4 and IPv6 endpoints only, so every connection is rejected",
            )
        )
        dead.update((f, p) for f in families for p in ports)
    elif ip_slices:
        for family in families:
            mine = [s for s in ip_slices if _FAMILY_BY_TYPE[s.address_type] is family]
            problem, lost = _family_problem(family, mine, ports)
            if problem is not None:
                problems.append(problem)
                dead.update((family, p) for p in lost)
    return Servability(tuple(problems), len(dead) == len(families) * len(ports))


def _family_problem(
    family: IPFamily, slices: Sequence[SliceSummary], ports: Sequence[ServicePort]
) -> tuple[ServingProblem | None, list[ServicePort]]:
    """Return the problem of one family's slices (None: none) and the ports it leaves dead."""
    if not slices:
        return (
            ServingProblem(
                Unservable.NO_ENDPOINTS_OF_FAMILY,
                Feature.IP_FAMILIES,
                f"the Service has endpoints, none of them {family}: every connection to its "
                f"{family} address is rejected",
            ),
            list(ports),
        )
    listed = set().union(*(s.ports for s in slices))
    if not listed:
        return (
            ServingProblem(
                Unservable.SLICES_WITHOUT_PORTS,
                Feature.PORTS,
                f"its {family} EndpointSlices list endpoints but no ports: every connection "
                "is rejected",
            ),
            list(ports),
        )
    lost = [p for p in ports if (p.name, p.protocol) not in listed]
    if not lost:
        return None, []
    names = ", ".join(sorted(f"{n or '(unnamed)'}/{proto.value.upper()}" for n, proto in listed))
    return (
        ServingProblem(
            Unservable.PORT_WITHOUT_ENDPOINTS,
            Feature.PORTS,
            f"no {family} EndpointSlice serves port {', '.join(map(_port_text, lost))} "
            f"(slices list {names}): its connections are rejected",
        ),
        lost,
    )
