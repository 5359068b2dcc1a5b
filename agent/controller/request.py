"""What a Service asks of the allocator, parsed from the raw object at the boundary (pure).

Annotations read here (all optional):

- ``nodelb.io/ip-pool``: the name of the pool to allocate from (may name an autoAssign=false
  pool);
- ``nodelb.io/load-balancer-ips``: comma-separated specific addresses, at most one per family;
- ``nodelb.io/allow-shared-ip``: a sharing key (see `agent.controller.allocator`);
- ``nodelb.io/required-features``: comma-separated KEP-4631 features that must be honoured
  (the API's proposed ``requiredLoadBalancerFeatures`` does not exist; see conditions.py).

The deprecated ``spec.loadBalancerIP`` is honoured as a one-address request. A malformed
annotation does not make the Service unparseable: it is carried as `annotation_error`, and the
allocator answers INVALID_ANNOTATION naming it.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.net import IPAddress, IPFamily, IPNetwork, Protocol
from agent.model.service import InvalidService, Service, ServicePort, parse_service
from agent.model.service_class import classify, is_ours

POOL_ANNOTATION = "nodelb.io/ip-pool"
IPS_ANNOTATION = "nodelb.io/load-balancer-ips"
SHARE_ANNOTATION = "nodelb.io/allow-shared-ip"
REQUIRED_FEATURES_ANNOTATION = "nodelb.io/required-features"


class Feature(enum.StrEnum):
    """KEP-4631 LoadBalancerFeature names: the values of nodelb.io/required-features."""

    IP_FAMILIES = "IPFamilies"
    PORTS = "Ports"
    LOAD_BALANCER_IP = "LoadBalancerIP"
    SESSION_AFFINITY = "SessionAffinity"
    EXTERNAL_TRAFFIC_POLICY = "ExternalTrafficPolicy"


class FamilyPolicy(enum.StrEnum):
    """spec.ipFamilyPolicy."""

    SINGLE_STACK = "SingleStack"
    PREFER_DUAL_STACK = "PreferDualStack"
    REQUIRE_DUAL_STACK = "RequireDualStack"


@dataclass(frozen=True, slots=True, order=True)
class ProtocolPort:
    """One (protocol, port) a Service listens on; two sharing Services must not have one alike."""

    protocol: Protocol
    port: int

    def __str__(self) -> str:
        return f"{self.protocol.upper()}/{self.port}"


@dataclass(frozen=True, slots=True)
class ServiceRequest:
    """Everything the allocator and the conditions need to know about one Service.

    `ours` is False for Services nodelb must not allocate for (not type LoadBalancer, or of
    another loadBalancerClass): the allocator releases whatever they held. `current_ips` are
    status.loadBalancer.ingress[].ip as the API has them (what `record_existing` rebuilds from).
    `requested_ips` merges the annotation and spec.loadBalancerIP; `pool` and `share_key` are
    None when absent. `namespace_labels` come from the Namespace object (for pool selectors).
    """

    key: str
    uid: str
    created: str
    ours: bool = True
    ip_families: tuple[IPFamily, ...] = (IPFamily.IPV4,)
    family_policy: FamilyPolicy = FamilyPolicy.SINGLE_STACK
    ports: frozenset[ProtocolPort] = frozenset()
    local_policy: bool = False
    selector: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    namespace_labels: tuple[tuple[str, str], ...] = ()
    pool: str | None = None
    requested_ips: tuple[IPAddress, ...] = ()
    share_key: str | None = None
    session_affinity: bool = False
    required_features: tuple[str, ...] = ()
    annotation_error: str | None = None
    current_ips: tuple[IPAddress, ...] = ()
    # What the conditions check the Service can be served with (agent/controller/servability.py)
    named_ports: tuple[ServicePort, ...] = ()
    source_ranges: tuple[IPNetwork, ...] = ()

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def order(self) -> tuple[str, str]:
        """Return the allocation order key: oldest first, UID breaking ties."""
        return (self.created, self.uid)

    def wanted_families(self) -> tuple[IPFamily, ...]:
        """Return the families to allocate for, primary first (SingleStack: the first only)."""
        if self.family_policy is FamilyPolicy.SINGLE_STACK:
            return self.ip_families[:1]
        return self.ip_families

    @property
    def backend_key(self) -> str:
        """Return what must match for sharing: "" under Cluster, the pod selector under Local."""
        if not self.local_policy:
            return ""
        return ",".join(f"{k}={v}" for k, v in self.selector)


def _ips(text: str, where: str) -> tuple[IPAddress, ...]:
    out: list[IPAddress] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            out.append(ipaddress.ip_address(part.strip()))
        except ValueError:
            raise ValueError(f"{where}: {part.strip()!r} is not an IP address") from None
    return tuple(out)


def _requested(
    annotations: Mapping[str, str], lb_ip: str
) -> tuple[tuple[IPAddress, ...], str | None]:
    """Return (the requested IPs, an error sentence or None)."""
    try:
        from_annotation = _ips(annotations.get(IPS_ANNOTATION, ""), IPS_ANNOTATION)
        from_spec = _ips(lb_ip, "spec.loadBalancerIP")
    except ValueError as exc:
        return (), str(exc)
    if from_annotation and from_spec and set(from_annotation) != set(from_spec):
        return (), f"{IPS_ANNOTATION} and spec.loadBalancerIP ask for different addresses"
    ips = from_annotation or from_spec
    versions = [ip.version for ip in ips]
    if len(set(versions)) != len(versions):
        return (), f"{IPS_ANNOTATION}: at most one address per IP family"
    return ips, None


def request_from_raw(
    obj: Mapping[str, Any],
    *,
    lb_class: str,
    handle_classless: bool,
    namespace_labels: Mapping[str, str] | None = None,
) -> ServiceRequest | InvalidService:
    """Return the allocation request for a raw Service, or InvalidService if it is malformed."""
    svc = parse_service(obj)
    if isinstance(svc, InvalidService):
        return svc
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    return request_from_service(
        svc,
        ip_families=tuple(spec.get("ipFamilies") or ()),
        family_policy=str(spec.get("ipFamilyPolicy") or ""),
        load_balancer_ip=str(spec.get("loadBalancerIP") or ""),
        selector=spec.get("selector") or {},
        labels=meta.get("labels") or {},
        namespace_labels=namespace_labels or {},
        ours=is_ours(classify(svc, lb_class=lb_class, handle_classless=handle_classless)),
    )


def request_from_service(
    svc: Service,
    *,
    ip_families: tuple[str, ...] = (),
    family_policy: str = "",
    load_balancer_ip: str = "",
    selector: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    ours: bool = True,
) -> ServiceRequest:
    """Return the request for a parsed Service plus the spec fields `Service` does not keep.

    Missing ipFamilies (only for objects that never went through the API server) mean IPv4.
    """
    annotations = dict(svc.annotations)
    problems: list[str] = []
    families: list[IPFamily] = []
    for i, name in enumerate(ip_families):
        try:
            families.append(IPFamily(name))
        except ValueError:
            problems.append(f"spec.ipFamilies[{i}]: unknown family {name!r}")
    try:
        policy = FamilyPolicy(family_policy) if family_policy else FamilyPolicy.SINGLE_STACK
    except ValueError:
        problems.append(f"spec.ipFamilyPolicy: unknown policy {family_policy!r}")
        policy = FamilyPolicy.SINGLE_STACK
    requested, error = _requested(annotations, load_balancer_ip)
    if error:
        problems.append(error)
    elif requested and not problems:
        for ip in requested:
            if IPFamily.of(ip) not in (families or [IPFamily.IPV4]):
                problems.append(f"{ip} is not of the Service's ipFamilies")
    pool = annotations.get(POOL_ANNOTATION, "").strip() or None
    share = annotations.get(SHARE_ANNOTATION, "").strip() or None
    required = tuple(
        f.strip() for f in annotations.get(REQUIRED_FEATURES_ANNOTATION, "").split(",") if f.strip()
    )
    unknown = [f for f in required if f not in {x.value for x in Feature}]
    if unknown:
        problems.append(
            f"{REQUIRED_FEATURES_ANNOTATION}: nodelb does not know {', '.join(unknown)} "
            "and cannot promise it"
        )
    return ServiceRequest(
        key=svc.key,
        uid=svc.uid,
        created=svc.created,
        ours=ours,
        ip_families=tuple(families) or (IPFamily.IPV4,),
        family_policy=policy,
        ports=frozenset(ProtocolPort(p.protocol, p.port) for p in svc.ports),
        local_policy=svc.local_policy,
        selector=tuple(sorted((selector or {}).items())),
        labels=tuple(sorted((labels or {}).items())),
        namespace_labels=tuple(sorted((namespace_labels or {}).items())),
        pool=pool,
        requested_ips=() if problems else requested,
        share_key=share,
        session_affinity=svc.affinity_timeout is not None,
        required_features=required,
        annotation_error="; ".join(problems) or None,
        current_ips=svc.ingress_ips,
        named_ports=svc.ports,
        source_ranges=svc.source_ranges,
    )
