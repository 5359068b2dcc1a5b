"""This node's DesiredState from the cluster's Services, EndpointSlices and Nodes (pure).

`service_frontends` turns one Service (and its slices) into the frontends this node programs
plus the problems worth an Event; agent/node/assembly.py joins every Service's result into one
DesiredState, settling conflicts (two Services claiming one IP:port: the older keeps it).
The agent recomputes only the Services that changed and reuses the other results, so a
change to one Service costs one Service's work.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.model.desired_state import Endpoint, Frontend, FrontendKey
from agent.model.endpoint_slice import Slice
from agent.model.net import IPAddress, IPFamily, IPNetwork
from agent.model.service import InvalidService, Service
from agent.model.service_class import classify, is_ours
from agent.model.tunnel import DEFAULT_LOCAL_TRAFFIC, LOCAL_TRAFFIC_ANNOTATION, LocalTraffic
from agent.node.endpoints import PortKey, ServiceEndpoint, merge_slices
from agent.node.external_ips import check_external_ips
from agent.node.selection import select
from agent.node.spread import (
    ModeReason,
    bucket_table,
    local_traffic_mode,
    peer_buckets,
    spread_weights,
)


class ProblemReason(enum.StrEnum):
    """Why (part of) a Service is not served; the value is the Event reason."""

    INVALID_SERVICE = "InvalidService"
    EXTERNAL_IP_REFUSED = "ExternalIPRefused"
    PORT_MISMATCH = "EndpointPortMismatch"
    FRONTEND_CONFLICT = "FrontendConflict"
    LB_IP_REFUSED = "LoadBalancerIPRefused"  # agent/node/holdable.py
    LOCAL_TRAFFIC_INVALID = "LocalTrafficAnnotationInvalid"


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong with a Service, for a Warning Event and a metric."""

    reason: ProblemReason
    message: str


@dataclass(frozen=True, slots=True)
class NodeView:
    """What selection needs to know about this node."""

    name: str
    zone: str | None


@dataclass(frozen=True, slots=True)
class PolicyView:
    """The configuration the desired-state computation depends on."""

    lb_class: str
    handle_classless: bool
    external_ip_cidrs: tuple[IPNetwork, ...]
    pool_networks: tuple[IPNetwork, ...]
    local_traffic: LocalTraffic = DEFAULT_LOCAL_TRAFFIC


@dataclass(frozen=True, slots=True)
class ServiceResult:
    """One Service's contribution: its frontends, its LoadBalancer IPs and its problems.

    `lb_ips` are the Service's LoadBalancer ingress IPs that nodelb serves (candidates to be
    held by a node); externalIPs are routed to nodes by the operator and never held.
    `spread` lists, for every LoadBalancer frontend of a Local Service served with
    `localTraffic: spread`, the (bucket, node name) pairs other nodes serve (agent/node/
    spread.py); empty for every other frontend, and for one this node serves entirely.
    """

    key: str
    created: str
    uid: str
    frontends: tuple[Frontend, ...] = ()
    lb_ips: tuple[IPAddress, ...] = ()
    problems: tuple[Problem, ...] = ()
    spread: tuple[tuple[FrontendKey, tuple[tuple[int, str], ...]], ...] = ()


def _targets(endpoints: Sequence[ServiceEndpoint]) -> tuple[Endpoint, ...]:
    return tuple(sorted({ep.target for ep in endpoints}))


def service_frontends(
    svc: Service | InvalidService,
    slices: Iterable[Slice],
    *,
    node: NodeView,
    policy: PolicyView,
    allocated_to: Mapping[IPAddress, str],
) -> ServiceResult:
    """Return the frontends this node programs for `svc`, and the problems to report.

    LoadBalancer ingress IPs count only for Services of our class; externalIPs count for any
    Service type when the allow-list admits them. Source ranges apply to LoadBalancer IPs only;
    the renderer enforces those of the frontend's family and fails closed when a Service lists
    ranges of the other family only (see docs/dataplane.md).
    """
    if isinstance(svc, InvalidService):
        return ServiceResult(
            key=svc.key,
            created="",
            uid=svc.uid,
            problems=(Problem(ProblemReason.INVALID_SERVICE, svc.reason),),
        )
    problems: list[Problem] = []
    lb_ips: tuple[IPAddress, ...] = ()
    if is_ours(classify(svc, lb_class=policy.lb_class, handle_classless=policy.handle_classless)):
        lb_ips = svc.ingress_ips
    ext = check_external_ips(
        svc,
        allowed=policy.external_ip_cidrs,
        pools=policy.pool_networks,
        allocated_to=allocated_to,
    )
    problems.extend(Problem(ProblemReason.EXTERNAL_IP_REFUSED, r.message) for r in ext.refused)
    targets = [(ip, True) for ip in lb_ips] + [(ip, False) for ip in ext.accepted]
    if not targets:
        return ServiceResult(svc.key, svc.created, svc.uid, problems=tuple(problems))

    slice_list = list(slices)
    merged = merge_slices(slice_list)
    slice_port_names = {p.name for s in slice_list for p in s.ports}
    frontends: list[Frontend] = []
    spread: list[tuple[FrontendKey, tuple[tuple[int, str], ...]]] = []
    spreading = False
    if svc.local_policy and lb_ips:
        mode, why = local_traffic_mode(annotations=svc.annotations, default=policy.local_traffic)
        spreading = mode is LocalTraffic.SPREAD
        if why is ModeReason.INVALID_ANNOTATION:
            value = dict(svc.annotations)[LOCAL_TRAFFIC_ANNOTATION]
            problems.append(
                Problem(
                    ProblemReason.LOCAL_TRAFFIC_INVALID,
                    f"{LOCAL_TRAFFIC_ANNOTATION}: {value!r} is neither 'spread' nor 'holder'; "
                    f"the cluster's {policy.local_traffic.value!r} applies",
                )
            )
    for port in svc.ports:
        if slice_list and slice_port_names and port.name not in slice_port_names:
            problems.append(
                Problem(
                    ProblemReason.PORT_MISMATCH,
                    f"no EndpointSlice port is named {port.name!r} (Service port {port.port}/"
                    f"{port.protocol.value.upper()}); slices name {sorted(slice_port_names)}",
                )
            )
        for ip, is_lb in targets:
            endpoints = merged.get(PortKey(IPFamily.of(ip), port.name, port.protocol), ())
            sel = select(
                endpoints, node_name=node.name, node_zone=node.zone, local_policy=svc.local_policy
            )
            cluster = _targets(sel.cluster)
            external = _targets(sel.local) if sel.local is not None else cluster
            ranges = svc.source_ranges if is_lb else ()
            key = FrontendKey(ip, port.protocol, port.port)
            if spreading and is_lb:
                peers = peer_buckets(bucket_table(spread_weights(endpoints)), node.name)
                if peers:
                    spread.append((key, peers))
            frontends.append(
                Frontend(
                    service=svc.key,
                    key=key,
                    endpoints=external,
                    cluster_endpoints=cluster,
                    local_only=svc.local_policy,
                    source_ranges=ranges,
                    affinity_timeout=svc.affinity_timeout,
                )
            )
    return ServiceResult(
        key=svc.key,
        created=svc.created,
        uid=svc.uid,
        frontends=tuple(frontends),
        lb_ips=lb_ips,
        problems=tuple(problems),
        spread=tuple(spread),
    )
