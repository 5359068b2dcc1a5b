"""Which endpoints serve a Service port on this node: kube-proxy's CategorizeEndpoints, in Python.

This is a pure re-statement of kube-proxy's pkg/proxy/topology.go (Kubernetes v1.35, where
PreferSameNode / KEP-3015 is GA and its feature gate always on). Choosing the topology mode
(`topology_mode`) is kept apart from applying it (`available_for_topology`), as there.

The rules, for one Service port and one node:

1. **Topology mode** looks only at *ready* endpoints (KEP-4444 / KEP-3015 hints written by the
   EndpointSlice controller; nodelb reads hints, never `spec.trafficDistribution`):

   - PreferSameNode if every ready endpoint has a `forNodes` hint and at least one names this
     node;
   - else PreferSameZone if every ready endpoint has a `forZones` hint and at least one names
     this node's `topology.kubernetes.io/zone`;
   - else no topology: every ready endpoint.

   An endpoint whose hint list is absent or empty "has no hint"; one such ready endpoint
   disables that hint kind for the whole Service. Non-ready endpoints' hints never count. A
   node with no zone label has zone "" (kube-proxy reads a missing label as ""), which only an
   endpoint hinted for the zone "" would match.

2. **Cluster endpoints** (externalTrafficPolicy=Cluster, and all pod- or node-originated
   traffic): the ready endpoints the mode allows. The mode is only chosen when it keeps at
   least one ready endpoint, so this is empty only when no endpoint anywhere is ready; then
   every endpoint that is both serving and terminating is used, ignoring topology.

3. **Local endpoints** (externalTrafficPolicy=Local): this node's ready endpoints; if it has
   none, this node's serving-and-terminating endpoints. Hints never apply. An endpoint is this
   node's when its nodeName equals the (non-empty) node name; without nodeName it is nobody's.

4. **All reachable**: the union of the two lists, which is what this node may send traffic to
   (conntrack cleanup and metrics use it).

Nothing here does I/O. Endpoint records are any objects with the attributes of
`CategorizableEndpoint` (agent/node/endpoints.py's `ServiceEndpoint` and `SliceEndpoint` both fit);
results are tuples of the very objects passed in, in input order.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class CategorizableEndpoint(Protocol):
    """What selection needs to know about an endpoint (see agent/node/endpoints.py)."""

    @property
    def node_name(self) -> str | None: ...

    @property
    def ready(self) -> bool: ...

    @property
    def serving(self) -> bool: ...

    @property
    def terminating(self) -> bool: ...

    @property
    def hints_for_nodes(self) -> frozenset[str] | None: ...

    @property
    def hints_for_zones(self) -> frozenset[str] | None: ...


E = TypeVar("E", bound=CategorizableEndpoint)


class TopologyMode(enum.StrEnum):
    """How the cluster endpoints are filtered (values are the trafficDistribution names)."""

    NONE = ""
    PREFER_SAME_NODE = "PreferSameNode"
    PREFER_SAME_ZONE = "PreferSameZone"


class HintStatus(enum.StrEnum):
    """What one kind of hint (forNodes or forZones) on the ready endpoints allowed."""

    ABSENT = "Absent"  # no ready endpoint carries this kind of hint (or no ready endpoint)
    PARTIAL = "Partial"  # some ready endpoints carry it, some do not: ignored for the Service
    NO_MATCH = "NoMatch"  # every ready endpoint carries it, none names this node / zone
    NODE_HAS_NO_ZONE = "NodeHasNoZone"  # zone hints complete, but this node has no zone label
    MATCH = "Match"  # complete, and at least one ready endpoint names this node / zone


class SelectionReason(enum.StrEnum):
    """Why a list of endpoints is what it is; logged once, surfaced in Events and metrics."""

    # cluster list
    TOPOLOGY_SAME_NODE = "TopologySameNode"  # ready endpoints hinted for this node
    TOPOLOGY_SAME_ZONE = "TopologySameZone"  # ready endpoints hinted for this node's zone
    ALL_READY = "AllReady"  # every ready endpoint (no usable hints)
    SERVING_TERMINATING_FALLBACK = "ServingTerminatingFallback"  # no ready endpoint anywhere
    NO_ENDPOINTS = "NoEndpoints"  # nothing ready or serving-terminating anywhere: reject
    # local list
    LOCAL_READY = "LocalReady"  # this node's ready endpoints
    LOCAL_SERVING_TERMINATING = "LocalServingTerminating"  # none ready here; terminating ones
    NO_LOCAL_ENDPOINTS = "NoLocalEndpoints"  # nothing usable on this node: drop, do not hold


@dataclass(frozen=True, slots=True)
class TopologyDecision:
    """The topology mode chosen for a Service port on a node, and what each hint kind allowed.

    `node_hints` / `zone_hints` explain a NONE mode (for example PARTIAL: a ready endpoint
    lacks the hint, so that kind is ignored for the whole Service). When the mode is
    PREFER_SAME_NODE, `zone_hints` is still computed but was not needed.
    """

    mode: TopologyMode
    node_hints: HintStatus
    zone_hints: HintStatus


@dataclass(frozen=True, slots=True)
class Selection(Generic[E]):
    """The endpoints a node uses for one Service port, with the reasons.

    `cluster` is the externalTrafficPolicy=Cluster list (also used for traffic from pods and
    the node itself, whatever the policy). Empty means no endpoint anywhere is usable (reason
    NO_ENDPOINTS): such traffic is rejected.

    `local` is the externalTrafficPolicy=Local list, or None when Local policy was not asked
    for. Empty (reason NO_LOCAL_ENDPOINTS) means this node has no usable endpoint: external
    traffic is dropped here, and this node must not hold the IP.

    `all_reachable` is every endpoint in either list, each once, in input order.
    """

    cluster: tuple[E, ...]
    local: tuple[E, ...] | None
    all_reachable: tuple[E, ...]
    reason: SelectionReason
    local_reason: SelectionReason | None
    topology: TopologyDecision

    @property
    def has_any(self) -> bool:
        """Returns whether the Service has a usable endpoint anywhere in the cluster.

        This can be True while `local` is empty: Local-policy traffic is then dropped on this
        node instead of rejected.
        """
        return bool(self.cluster)


def is_local(endpoint: CategorizableEndpoint, node_name: str) -> bool:
    """Returns whether the endpoint runs on the node called `node_name` (never for "")."""
    return bool(node_name) and endpoint.node_name == node_name


def _hint_status(
    has_all: bool, has_some: bool, matched: bool, *, zone_missing: bool = False
) -> HintStatus:
    if not has_some:
        return HintStatus.ABSENT
    if not has_all:
        return HintStatus.PARTIAL
    if matched:
        return HintStatus.MATCH
    return HintStatus.NODE_HAS_NO_ZONE if zone_missing else HintStatus.NO_MATCH


def topology_mode(
    endpoints: Sequence[CategorizableEndpoint], *, node_name: str, node_zone: str | None
) -> TopologyDecision:
    """Returns the topology mode for this node, judged from the ready endpoints' hints only.

    PREFER_SAME_NODE if every ready endpoint has a non-empty forNodes hint and one names
    `node_name`; else PREFER_SAME_ZONE if every ready endpoint has a non-empty forZones hint and
    one names `node_zone`; else NONE. With no ready endpoint the mode is NONE (the caller then
    falls back to serving-terminating endpoints, where topology never applies). `node_zone`
    None (no zone label) is read as "", like kube-proxy.
    """
    zone = node_zone or ""
    any_ready = False
    all_node, some_node, node_match = True, False, False
    all_zone, some_zone, zone_match = True, False, False
    for ep in endpoints:
        if not ep.ready:
            continue
        any_ready = True
        if ep.hints_for_nodes:
            some_node = True
            node_match = node_match or node_name in ep.hints_for_nodes
        else:
            all_node = False
        if ep.hints_for_zones:
            some_zone = True
            zone_match = zone_match or zone in ep.hints_for_zones
        else:
            all_zone = False
    if not any_ready:
        return TopologyDecision(TopologyMode.NONE, HintStatus.ABSENT, HintStatus.ABSENT)
    node_status = _hint_status(all_node, some_node, node_match)
    zone_status = _hint_status(all_zone, some_zone, zone_match, zone_missing=not zone)
    if node_status is HintStatus.MATCH:
        mode = TopologyMode.PREFER_SAME_NODE
    elif zone_status is HintStatus.MATCH:
        mode = TopologyMode.PREFER_SAME_ZONE
    else:
        mode = TopologyMode.NONE
    return TopologyDecision(mode, node_status, zone_status)


def available_for_topology(
    endpoint: CategorizableEndpoint, mode: TopologyMode, *, node_name: str, node_zone: str | None
) -> bool:
    """Returns whether `mode` lets this node use the endpoint (no fallback happens here)."""
    if mode is TopologyMode.PREFER_SAME_NODE:
        return node_name in (endpoint.hints_for_nodes or ())
    if mode is TopologyMode.PREFER_SAME_ZONE:
        return (node_zone or "") in (endpoint.hints_for_zones or ())
    return True


_REASON_OF_MODE = {
    TopologyMode.PREFER_SAME_NODE: SelectionReason.TOPOLOGY_SAME_NODE,
    TopologyMode.PREFER_SAME_ZONE: SelectionReason.TOPOLOGY_SAME_ZONE,
    TopologyMode.NONE: SelectionReason.ALL_READY,
}


def select(
    endpoints: Sequence[E], *, node_name: str, node_zone: str | None, local_policy: bool
) -> Selection[E]:
    """Returns the cluster and local endpoints this node uses for one Service port.

    `endpoints` are the Service port's merged endpoints (one family), `node_name` and
    `node_zone` this node's name and `topology.kubernetes.io/zone` label (None if unlabelled),
    `local_policy` whether the Service has externalTrafficPolicy=Local. The cluster list is
    always computed; `local` is None unless `local_policy`. See the module docstring for the
    rules and `Selection` for what empty lists mean.
    """
    topology = topology_mode(endpoints, node_name=node_name, node_zone=node_zone)
    cluster = tuple(
        ep
        for ep in endpoints
        if ep.ready
        and available_for_topology(ep, topology.mode, node_name=node_name, node_zone=node_zone)
    )
    reason = _REASON_OF_MODE[topology.mode]
    if not cluster:
        cluster = tuple(ep for ep in endpoints if ep.serving and ep.terminating)
        reason = (
            SelectionReason.SERVING_TERMINATING_FALLBACK
            if cluster
            else SelectionReason.NO_ENDPOINTS
        )
    if not local_policy:
        return Selection(cluster, None, cluster, reason, None, topology)

    mine = [ep for ep in endpoints if is_local(ep, node_name)]
    local = tuple(ep for ep in mine if ep.ready)
    local_reason = SelectionReason.LOCAL_READY
    if not local:
        local = tuple(ep for ep in mine if ep.serving and ep.terminating)
        local_reason = (
            SelectionReason.LOCAL_SERVING_TERMINATING
            if local
            else SelectionReason.NO_LOCAL_ENDPOINTS
        )
    if topology.mode is TopologyMode.NONE and local_reason is not (
        SelectionReason.LOCAL_SERVING_TERMINATING
    ):
        # Every ready endpoint is in `cluster`, and `local` holds only ready ones (or none).
        all_reachable = cluster
    else:
        wanted = {id(ep) for ep in cluster} | {id(ep) for ep in local}
        all_reachable = tuple(ep for ep in endpoints if id(ep) in wanted)
    return Selection(cluster, local, all_reachable, reason, local_reason, topology)
