"""One Service's EndpointSlices merged into per-port endpoint lists (pure).

A Service's endpoints arrive split across any number of EndpointSlices (parsed into
`agent.model.endpoint_slice.Slice` at the boundary). `merge_slices` folds one Service's slices
into `ServicePortEndpoints`: for each (address family, port name, protocol), the deduplicated
list of `ServiceEndpoint`s with the target port resolved in the endpoint's own slice.

The merge mirrors kube-proxy's EndpointSliceCache (pkg/proxy/endpointslicecache.go):

- FQDN slices are ignored; IPv4 and IPv6 slices never mix (dual-stack Services get one list per
  family, as kube-proxy runs one proxier per family).
- A slice port is keyed by its name and protocol. Named target ports are resolved per slice by
  the EndpointSlice controller: the number for port "http" is the one in *that* slice's ports
  list, so two slices of one Service may map "http" to different numbers.
- Endpoints are deduplicated by (address, target port) within one port key. When the same pair
  appears in more than one slice (an endpoint moving between slices, or a pod IP reused before
  the old pod is gone), the copy that is not terminating wins, then the ready one, then the
  serving one; among equals, the one from the slice whose name sorts first. kube-proxy's own
  tie-break depends on Go map order; this keeps its rule (a non-terminating copy beats a
  terminating one) and makes the rest deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.model.desired_state import Endpoint
from agent.model.endpoint_slice import AddressType, Slice, SliceEndpoint
from agent.model.net import IPAddress, IPFamily, Protocol


@dataclass(frozen=True, slots=True, order=True)
class PortKey:
    """Which Service port a merged endpoint list belongs to: family, port name, protocol."""

    family: IPFamily
    name: str
    protocol: Protocol


@dataclass(frozen=True, slots=True)
class ServiceEndpoint:
    """One endpoint of one Service port: a slice's `SliceEndpoint` with its target port resolved.

    `endpoint` is the slice's record itself, not a copy: its fields read through unchanged (the
    properties below, so selection takes a ServiceEndpoint where it takes a SliceEndpoint).
    `port` is the target port number from the endpoint's own slice; `slice_name` is the slice
    it was taken from (for logs). Carrying the record also makes the merge cheaper: building a
    three-field value costs less than copying eight fields into a new one for every endpoint.
    """

    endpoint: SliceEndpoint
    port: int
    slice_name: str = ""

    @property
    def ip(self) -> IPAddress:
        """Returns the endpoint's address."""
        return self.endpoint.ip

    @property
    def node_name(self) -> str | None:
        """Returns the endpoint's nodeName (None: never local to any node)."""
        return self.endpoint.node_name

    @property
    def zone(self) -> str | None:
        """Returns the endpoint's zone (None: the slice gave none)."""
        return self.endpoint.zone

    @property
    def ready(self) -> bool:
        """Returns the endpoint's ready condition."""
        return self.endpoint.ready

    @property
    def serving(self) -> bool:
        """Returns the endpoint's serving condition."""
        return self.endpoint.serving

    @property
    def terminating(self) -> bool:
        """Returns the endpoint's terminating condition."""
        return self.endpoint.terminating

    @property
    def hints_for_nodes(self) -> frozenset[str] | None:
        """Returns the endpoint's forNodes hint (see SliceEndpoint for None versus empty)."""
        return self.endpoint.hints_for_nodes

    @property
    def hints_for_zones(self) -> frozenset[str] | None:
        """Returns the endpoint's forZones hint (see SliceEndpoint for None versus empty)."""
        return self.endpoint.hints_for_zones

    @property
    def target(self) -> Endpoint:
        """Returns the (address, port) pair that rules DNAT to."""
        return Endpoint(self.endpoint.ip, self.port)


def _rank(ep: SliceEndpoint) -> tuple[bool, bool, bool]:
    """Returns the duplicate-resolution rank: higher wins (not terminating, ready, serving)."""
    return (not ep.terminating, ep.ready, ep.serving)


ServicePortEndpoints = dict[PortKey, tuple[ServiceEndpoint, ...]]
"""A Service's merged endpoints: for each port key, its endpoints sorted by (address, port)."""


_FAMILY_OF_ADDRESS_TYPE = {AddressType.IPV4: IPFamily.IPV4, AddressType.IPV6: IPFamily.IPV6}


def merge_slices(slices: Iterable[Slice]) -> ServicePortEndpoints:
    """Returns one Service's endpoints per (family, port name, protocol), deduplicated.

    `slices` are all the EndpointSlices of one Service, in any order. A port key appears in
    the result only if at least one slice lists that port and at least one endpoint; an
    absent key means no endpoints for that port (never an empty tuple). Each tuple is sorted by
    (address, port), so equal inputs give equal outputs whatever the slice order. See the module
    docstring for the rules (FQDN ignored, families apart, per-slice port numbers, which
    duplicate wins).
    """
    merged: dict[PortKey, dict[tuple[IPAddress, int], ServiceEndpoint]] = {}
    for sl in sorted(slices, key=lambda s: s.name):
        family = _FAMILY_OF_ADDRESS_TYPE.get(sl.address_type)
        if family is None:
            continue
        for port in sl.ports:
            chosen = merged.setdefault(PortKey(family, port.name, port.protocol), {})
            for ep in sl.endpoints:
                key = (ep.ip, port.port)
                existing = chosen.get(key)
                if existing is None or _rank(ep) > _rank(existing.endpoint):
                    chosen[key] = ServiceEndpoint(ep, port.port, sl.name)
    return {
        key: tuple(eps[k] for k in sorted(eps, key=_address_port_order))
        for key, eps in sorted(merged.items())
        if eps
    }


def _address_port_order(key: tuple[IPAddress, int]) -> tuple[int, int, int]:
    ip, port = key
    return (ip.version, int(ip), port)


# --- parsing ------------------------------------------------------------------------------
