"""KEP-4631 LoadBalancer conditions for a Service, as proposed (pure).

`service_conditions` returns the three conditions nodelb writes to status.conditions:

- ``LoadBalancerServing``: True/Serving only when every address in the Service's status is
  held by some node *and* that node reports its rules in place (the `serving_ips` input);
  False/Provisioning while waiting for that; False/Unsupported when nodelb cannot or will not
  provision (below); False/Infrastructure when it could, but the resources are not there
  (pool exhausted, requested address in use, sharing conflict).
- ``LoadBalancerProvisioning``: True/Provisioning while waiting for an allocation or for a
  node to hold the address; False/Complete once serving, or once nodelb has stopped trying.
- ``LoadBalancerDegraded``: True when nodelb serves the Service but knows it does not
  implement all of it (reason: the field name + ``NotSupported``, or ``Multiple``); otherwise
  False/NotDegraded. (KEP-4631 lets an implementation leave this unset; nodelb states False
  because it checks every feature the KEP names.)

What nodelb cannot honour (KEP-4631 "Degraded" section):

- **IPFamilies**: a family with no pool usable by the Service. SingleStack and
  RequireDualStack Services are refused (Unsupported); a PreferDualStack Service is served on
  the families it got and marked IPFamiliesNotSupported.
- **LoadBalancerIP** (``nodelb.io/load-balancer-ips`` or spec.loadBalancerIP): an address
  outside every pool is refused (Unsupported), never replaced by another address, so this
  feature never degrades; an address that is in use is Infrastructure.
- **Ports**: protocols the agents report they cannot program (`unsupported_protocols`, e.g.
  SCTP without the kernel module). TCP, UDP and SCTP are normally all supported.
- **SessionAffinity** (ClientIP) and **ExternalTrafficPolicy** (Local) are implemented by the
  dataplane; they degrade only when listed in `unsupported_features` (an agent setting).

What the Service's addresses can serve (agent/controller/servability.py, the `servable`
input): an address whose connections are all rejected or dropped — EndpointSlices of type
FQDN only, slices without ports, no endpoint of the address's family, a port no slice
serves, loadBalancerSourceRanges of the other family only — is not served, whatever holds
it. When that leaves nothing served, Serving is False/Unsupported (nodelb cannot serve the
Service as it is set up; the address stays allocated, so fixing the slices or the ranges
needs no new allocation); when some addresses or ports still serve, Degraded is True
(PortsNotSupported for ports, IPFamiliesNotSupported for a whole family). These never make
a required feature refuse the Service: they come from endpoints that change by the second,
and releasing an address over them would make it flap.

``nodelb.io/required-features`` (comma list of the KEP's feature names; the proposed
``spec.requiredLoadBalancerFeatures`` field does not exist) turns a degradation of a listed
feature into a refusal: Serving=False/Unsupported and no address in status (the allocator
already makes PreferDualStack all-or-nothing when IPFamilies is required). An unknown feature
name is refused too: nodelb cannot promise what it does not know.

`merge_conditions` folds the new conditions into the Service's existing list, keeping
lastTransitionTime when a condition's status did not change and leaving other writers'
condition types alone.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.controller.allocator import AllocationReason, AllocationResult
from agent.controller.request import Feature, ServiceRequest
from agent.controller.servability import Servability
from agent.model.net import IPAddress, Protocol

__all__ = [
    "Condition",
    "ConditionReason",
    "ConditionType",
    "Feature",
    "Unmet",
    "merge_conditions",
    "refusal",
    "service_conditions",
    "unmet_features",
]


NOTHING_WRONG = Servability()  # every allocated address and port can serve


class ConditionType(enum.StrEnum):
    """The condition types nodelb owns on a Service."""

    SERVING = "LoadBalancerServing"
    PROVISIONING = "LoadBalancerProvisioning"
    DEGRADED = "LoadBalancerDegraded"


class ConditionReason(enum.StrEnum):
    """The condition reasons nodelb writes."""

    SERVING = "Serving"
    PROVISIONING = "Provisioning"
    UNSUPPORTED = "Unsupported"
    INFRASTRUCTURE = "Infrastructure"
    COMPLETE = "Complete"
    NOT_DEGRADED = "NotDegraded"
    MULTIPLE = "Multiple"
    IP_FAMILIES_NOT_SUPPORTED = "IPFamiliesNotSupported"
    PORTS_NOT_SUPPORTED = "PortsNotSupported"
    LOAD_BALANCER_IP_NOT_SUPPORTED = "LoadBalancerIPNotSupported"
    SESSION_AFFINITY_NOT_SUPPORTED = "SessionAffinityNotSupported"
    EXTERNAL_TRAFFIC_POLICY_NOT_SUPPORTED = "ExternalTrafficPolicyNotSupported"


_DEGRADED_REASON = {
    Feature.IP_FAMILIES: ConditionReason.IP_FAMILIES_NOT_SUPPORTED,
    Feature.PORTS: ConditionReason.PORTS_NOT_SUPPORTED,
    Feature.LOAD_BALANCER_IP: ConditionReason.LOAD_BALANCER_IP_NOT_SUPPORTED,
    Feature.SESSION_AFFINITY: ConditionReason.SESSION_AFFINITY_NOT_SUPPORTED,
    Feature.EXTERNAL_TRAFFIC_POLICY: ConditionReason.EXTERNAL_TRAFFIC_POLICY_NOT_SUPPORTED,
}

# Allocation failures nodelb will not fix by waiting: the Service asks for something it lacks.
_UNSUPPORTED = frozenset(
    {
        AllocationReason.REQUESTED_IP_NOT_IN_POOL,
        AllocationReason.NO_POOL_FOR_FAMILY,
        AllocationReason.UNKNOWN_POOL,
        AllocationReason.POOL_NOT_ALLOWED,
        AllocationReason.INVALID_ANNOTATION,
    }
)


@dataclass(frozen=True, slots=True)
class Condition:
    """One Service condition, without its timestamps (merge_conditions adds those)."""

    type: ConditionType
    status: bool
    reason: ConditionReason
    message: str


@dataclass(frozen=True, slots=True)
class Unmet:
    """A requested feature nodelb does not implement for this Service, and why."""

    feature: Feature
    message: str


def unmet_features(
    *,
    request: ServiceRequest,
    allocation: AllocationResult,
    unsupported_protocols: frozenset[Protocol] = frozenset(),
    unsupported_features: frozenset[Feature] = frozenset(),
) -> tuple[Unmet, ...]:
    """Return the features the Service asks for that nodelb serves it without (may be empty)."""
    out: list[Unmet] = []
    missing = allocation.missing_families if allocation.allocated else ()
    if missing:
        names = ", ".join(missing)
        out.append(Unmet(Feature.IP_FAMILIES, f"no {names} address could be allocated"))
    bad_ports = sorted(p for p in request.ports if p.protocol in unsupported_protocols)
    if bad_ports:
        out.append(
            Unmet(
                Feature.PORTS,
                f"ports {', '.join(map(str, bad_ports))} use a protocol the nodes cannot serve",
            )
        )
    elif Feature.PORTS in unsupported_features and request.ports:
        out.append(Unmet(Feature.PORTS, "the nodes are configured not to serve its ports"))
    if request.session_affinity and Feature.SESSION_AFFINITY in unsupported_features:
        out.append(
            Unmet(Feature.SESSION_AFFINITY, "ClientIP session affinity is turned off on nodes")
        )
    if request.local_policy and Feature.EXTERNAL_TRAFFIC_POLICY in unsupported_features:
        out.append(
            Unmet(
                Feature.EXTERNAL_TRAFFIC_POLICY,
                "externalTrafficPolicy=Local is turned off on the nodes",
            )
        )
    if request.requested_ips and Feature.LOAD_BALANCER_IP in unsupported_features:
        out.append(Unmet(Feature.LOAD_BALANCER_IP, "specific addresses are turned off"))
    return tuple(out)


def refusal(
    *,
    request: ServiceRequest,
    unmet: Sequence[Unmet],
) -> str | None:
    """Return why the Service must not be served at all (a required feature), or None.

    When this is not None the controller shell releases the Service's addresses
    (`Allocator.release`) and publishes none. (Unknown feature names are already refused by
    the allocator as an invalid annotation; they are checked here too for requests built
    by other means.)
    """
    known = {f.value for f in Feature}
    unknown = [f for f in request.required_features if f not in known]
    if unknown:
        return f"nodelb does not know the required feature(s) {', '.join(unknown)}"
    required = [u for u in unmet if u.feature.value in request.required_features]
    if required:
        return "; ".join(f"required feature {u.feature} not met: {u.message}" for u in required)
    return None


def service_conditions(
    *,
    request: ServiceRequest,
    allocation: AllocationResult | None,
    serving_ips: frozenset[IPAddress],
    unsupported_protocols: frozenset[Protocol] = frozenset(),
    unsupported_features: frozenset[Feature] = frozenset(),
    servable: Servability = NOTHING_WRONG,
) -> list[Condition]:
    """Return [Serving, Provisioning, Degraded] for a Service, or [] when it is not ours.

    `allocation` None means the allocator has not looked at the Service yet. `serving_ips`
    are the addresses some node reports holding with the Service's rules programmed.
    `servable` is what of its allocated addresses and ports can serve nothing (see the
    module docstring); it is judged only once the Service has its addresses.
    """
    if not request.ours or (
        allocation is not None and allocation.reason is AllocationReason.NOT_OURS
    ):
        return []
    if allocation is None:
        return _triple(
            False,
            ConditionReason.PROVISIONING,
            "waiting for an address to be allocated",
            provisioning=True,
        )
    unmet = (
        unmet_features(
            request=request,
            allocation=allocation,
            unsupported_protocols=unsupported_protocols,
            unsupported_features=unsupported_features,
        )
        if allocation.allocated
        else ()
    )
    refused = refusal(request=request, unmet=unmet)
    if refused is not None:
        return _triple(False, ConditionReason.UNSUPPORTED, refused, provisioning=False)
    if not allocation.allocated:
        reason = (
            ConditionReason.UNSUPPORTED
            if allocation.reason in _UNSUPPORTED
            else ConditionReason.INFRASTRUCTURE
        )
        return _triple(False, reason, allocation.message, provisioning=False)
    unmet = tuple(unmet) + tuple(Unmet(p.feature, p.message) for p in servable.problems)
    waiting = [ip for ip in allocation.ips if ip not in serving_ips]
    if servable.nothing_served:
        return _unservable(allocation, waiting, servable)
    provisioning = _provisioning(allocation, waiting)
    if waiting:
        text = ", ".join(map(str, waiting))
        serving = Condition(
            ConditionType.SERVING,
            False,
            ConditionReason.PROVISIONING,
            f"waiting for a node to hold {text} with the Service's rules in place",
        )
    else:
        serving = Condition(
            ConditionType.SERVING,
            True,
            ConditionReason.SERVING,
            f"serving on {', '.join(map(str, allocation.ips))}",
        )
    return [serving, provisioning, _degraded(unmet)]


def _provisioning(allocation: AllocationResult, waiting: Sequence[IPAddress]) -> Condition:
    """Return Provisioning for allocated addresses: True while some are not held yet."""
    if not waiting:
        return Condition(
            ConditionType.PROVISIONING, False, ConditionReason.COMPLETE, "provisioning is complete"
        )
    return Condition(
        ConditionType.PROVISIONING,
        True,
        ConditionReason.PROVISIONING,
        f"{', '.join(map(str, allocation.ips))} allocated; announcing "
        f"{', '.join(map(str, waiting))}",
    )


def _unservable(
    allocation: AllocationResult, waiting: Sequence[IPAddress], servable: Servability
) -> list[Condition]:
    """Return the conditions of a Service whose addresses are allocated but serve nothing."""
    text = "; ".join(p.message for p in servable.problems)
    return [
        Condition(
            ConditionType.SERVING,
            False,
            ConditionReason.UNSUPPORTED,
            f"{', '.join(map(str, allocation.ips))} can serve nothing: {text}",
        ),
        _provisioning(allocation, waiting),
        Condition(
            ConditionType.DEGRADED,
            False,
            ConditionReason.NOT_DEGRADED,
            "nothing is served to degrade",
        ),
    ]


def _degraded(unmet: Sequence[Unmet]) -> Condition:
    if not unmet:
        return Condition(
            ConditionType.DEGRADED,
            False,
            ConditionReason.NOT_DEGRADED,
            "every requested feature is implemented",
        )
    reason = _DEGRADED_REASON[unmet[0].feature] if len(unmet) == 1 else ConditionReason.MULTIPLE
    return Condition(
        ConditionType.DEGRADED, True, reason, "; ".join(f"{u.feature}: {u.message}" for u in unmet)
    )


def _triple(
    serving: bool, reason: ConditionReason, message: str, *, provisioning: bool
) -> list[Condition]:
    if provisioning:
        prov = Condition(ConditionType.PROVISIONING, True, ConditionReason.PROVISIONING, message)
    else:
        prov = Condition(
            ConditionType.PROVISIONING,
            False,
            ConditionReason.COMPLETE,
            f"gave up for now: {message}",
        )
    return [
        Condition(ConditionType.SERVING, serving, reason, message),
        prov,
        Condition(
            ConditionType.DEGRADED,
            False,
            ConditionReason.NOT_DEGRADED,
            "nothing is provisioned to degrade",
        ),
    ]


def _rfc3339(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    existing: list[dict[str, Any]],
    new: Sequence[Condition],
    *,
    now: datetime.datetime,
    generation: int,
) -> list[dict[str, Any]]:
    """Return status.conditions with nodelb's conditions replaced by `new`.

    Conditions of other types keep their place and content. A condition of ours keeps its
    place and its lastTransitionTime when its status is unchanged (reason or message changes
    do not count as a transition, as in metav1.Condition); otherwise it gets `now`. Types of
    ours missing from `new` are removed (a Service that is no longer ours loses them all);
    new types are appended. Every condition of ours carries `observedGeneration`.
    """
    ours = {c.value for c in ConditionType}
    by_type = {c.type.value: c for c in new}
    stamp = _rfc3339(now)
    out: list[dict[str, Any]] = []
    placed: set[str] = set()
    for old in existing:
        kind = old.get("type")
        if kind not in ours:
            out.append(old)
            continue
        cond = by_type.get(str(kind))
        if cond is None or kind in placed:
            continue
        status = "True" if cond.status else "False"
        same = old.get("status") == status and old.get("lastTransitionTime")
        out.append(_render(cond, old["lastTransitionTime"] if same else stamp, generation))
        placed.add(str(kind))
    for cond in new:
        if cond.type.value not in placed:
            out.append(_render(cond, stamp, generation))
            placed.add(cond.type.value)
    return out


def _render(cond: Condition, transition: str, generation: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": cond.type.value,
        "status": "True" if cond.status else "False",
        "reason": cond.reason.value,
        "message": cond.message,
        "lastTransitionTime": transition,
    }
    # Services carry no metadata.generation, and the API drops a zero observedGeneration
    # (omitempty): writing 0 would make every comparison with the stored status differ.
    if generation:
        out["observedGeneration"] = generation
    return out
