"""What the controller writes to a Service's status, and which Events go with it (pure).

`parse_view` turns a raw Service into the few fields the controller needs (the allocation
request, the resourceVersion its write will be guarded by, what status says now, whether it is
being deleted and which finalizers it carries).
`plan_status` returns the status the Service should have after an allocation — ingress with
``ipMode: VIP`` and KEP-4631 conditions — or None when status already says exactly that, so
an unchanged Service costs no write; `plan_cleared` the status of a Service nodelb lets go
of. `allocation_events` names what changed for people.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from agent.controller.allocator import AllocationReason, AllocationResult
from agent.controller.conditions import (
    NOTHING_WRONG,
    ConditionType,
    merge_conditions,
    service_conditions,
)
from agent.controller.finalizer import FINALIZER, Owner, spec_owner
from agent.controller.request import ServiceRequest, request_from_raw
from agent.controller.servability import Servability, Unservable
from agent.kube.events import Event, ObjectRef
from agent.model.net import IPAddress
from agent.model.service import InvalidService

OUR_CONDITIONS = frozenset(c.value for c in ConditionType)

# Allocation failures that are the Service's own doing: one IPRequestInvalid Warning each.
REQUEST_INVALID = frozenset(
    {
        AllocationReason.INVALID_ANNOTATION,
        AllocationReason.REQUESTED_IP_NOT_IN_POOL,
        AllocationReason.REQUESTED_IP_IN_USE,
        AllocationReason.NO_POOL_FOR_FAMILY,
        AllocationReason.UNKNOWN_POOL,
        AllocationReason.POOL_NOT_ALLOWED,
        AllocationReason.SHARE_KEY_CONFLICT,
    }
)


@dataclass(frozen=True, slots=True)
class ServiceView:
    """One Service as the controller sees it.

    `request` is None for a Service that could not be parsed (`problem` says why); such a
    Service gets a Warning and is otherwise left alone (unless it is being deleted: see
    agent/controller/finalizer.py). `ingress` is status.loadBalancer.ingress as stored (raw
    entries), `conditions` status.conditions; both are kept as canonical JSON text so views
    compare cheaply and cannot be mutated. `deleting`: metadata.deletionTimestamp is set;
    `finalizers` are metadata.finalizers as stored (a finalizer patch must carry the others).
    `spec_owner` is what the raw spec says about the cleanup finalizer, `load_balancer`
    whether spec.type is LoadBalancer; both are read without the request, so they hold for
    an unparseable Service too.
    """

    key: str
    uid: str
    resource_version: str
    generation: int
    request: ServiceRequest | None
    problem: str | None
    ingress_json: bytes
    conditions_json: bytes
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    spec_owner: Owner = Owner.NOT_OURS
    load_balancer: bool = False

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def ingress(self) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = orjson.loads(self.ingress_json)
        return value

    @property
    def conditions(self) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = orjson.loads(self.conditions_json)
        return value

    def ref(self) -> ObjectRef:
        return ObjectRef("Service", self.namespace, self.name, self.uid)

    @property
    def has_cleanup_finalizer(self) -> bool:
        """Return True when metadata.finalizers holds the load-balancer cleanup finalizer."""
        return FINALIZER in self.finalizers

    @property
    def has_our_conditions(self) -> bool:
        """Return True when status.conditions holds a condition of a type nodelb writes."""
        return any(isinstance(c, dict) and c.get("type") in OUR_CONDITIONS for c in self.conditions)


def parse_view(obj: Mapping[str, Any], *, lb_class: str, handle_classless: bool) -> ServiceView:
    """Return the controller's view of a raw Service (never raises on malformed metadata).

    A metadata.finalizers that is not a list reads as none, and entries that are not strings
    are skipped: the apiserver stores only lists of names, so anything else is not a
    finalizer anyone could be waiting on.
    """
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    parsed = request_from_raw(obj, lb_class=lb_class, handle_classless=handle_classless)
    request = None if isinstance(parsed, InvalidService) else parsed
    problem = parsed.reason if isinstance(parsed, InvalidService) else None
    finalizers = meta.get("finalizers")
    spec = obj.get("spec")
    return ServiceView(
        key=key,
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        generation=_generation(meta.get("generation")),
        request=request,
        problem=problem,
        ingress_json=orjson.dumps((status.get("loadBalancer") or {}).get("ingress") or []),
        conditions_json=orjson.dumps(status.get("conditions") or []),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(f for f in finalizers if isinstance(f, str))
        if isinstance(finalizers, list)
        else (),
        spec_owner=spec_owner(spec, lb_class=lb_class, handle_classless=handle_classless),
        load_balancer=isinstance(spec, Mapping) and spec.get("type") == "LoadBalancer",
    )


def _generation(value: Any) -> int:
    # metadata.generation is an integer the apiserver sets; anything else reads as 0 (it is
    # only echoed into conditions' observedGeneration).
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class StatusPlan:
    """The status to write: the full ingress list and the full conditions list."""

    ingress: list[dict[str, Any]]
    conditions: list[dict[str, Any]]

    def patch(self, resource_version: str) -> dict[str, Any]:
        """Return the JSON merge patch; the resourceVersion makes it fail on a stale view."""
        return {
            "metadata": {"resourceVersion": resource_version},
            "status": {
                "loadBalancer": {"ingress": self.ingress or None},
                "conditions": self.conditions or None,
            },
        }


def plan_status(
    view: ServiceView,
    request: ServiceRequest,
    result: AllocationResult,
    *,
    serving_ips: frozenset[IPAddress],
    now: datetime.datetime,
    servable: Servability = NOTHING_WRONG,
) -> StatusPlan | None:
    """Return the status `view` should have after `result`, or None if it already has it.

    `servable` says what of its addresses can serve nothing (see conditions.py).

    A Service that is not ours keeps its ingress unless nodelb just released addresses from
    it (another implementation may own it); our conditions are removed from it.
    """
    current_ingress = view.ingress
    if request.ours and result.reason is not AllocationReason.NOT_OURS:
        ingress = [{"ip": str(ip), "ipMode": "VIP"} for ip in result.ips]
    elif result.released:
        released = {str(ip) for ip in result.released}
        ingress = [e for e in current_ingress if e.get("ip") not in released]
    else:
        ingress = current_ingress
    wanted = service_conditions(
        request=request, allocation=result, serving_ips=serving_ips, servable=servable
    )
    conditions = merge_conditions(view.conditions, wanted, now=now, generation=view.generation)
    if ingress == current_ingress and conditions == view.conditions:
        return None
    return StatusPlan(ingress, conditions)


def plan_cleared(
    view: ServiceView,
    released: tuple[IPAddress, ...],
    *,
    clear_all: bool,
) -> StatusPlan | None:
    """Return the status of a Service nodelb lets go of, or None if it already has it.

    nodelb's conditions go. `clear_all` (it is being deleted, or is no longer type
    LoadBalancer: no implementation serves it) empties the ingress; otherwise (it moved to
    another class) only the `released` addresses leave it, as in `plan_status`.
    """
    current_ingress = view.ingress
    if clear_all:
        ingress: list[dict[str, Any]] = []
    else:
        gone = {str(ip) for ip in released}
        ingress = [e for e in current_ingress if e.get("ip") not in gone]
    conditions = [
        c for c in view.conditions if not (isinstance(c, dict) and c.get("type") in OUR_CONDITIONS)
    ]
    if ingress == current_ingress and conditions == view.conditions:
        return None
    return StatusPlan(ingress, conditions)


def ingress_ips(entries: list[dict[str, Any]]) -> tuple[str, ...]:
    """Return the ip fields of ingress entries, in order (hostname-only entries skipped)."""
    return tuple(str(e["ip"]) for e in entries if e.get("ip"))


def allocation_events(
    view: ServiceView,
    result: AllocationResult,
    written: StatusPlan,
    *,
    reallocated: str | None,
) -> list[Event]:
    """Return the Events for a status write that succeeded: what the Service's addresses did.

    `reallocated` is the message of a duplicate / out-of-pool address found at startup for
    this Service, if any: its move is a Warning, not routine.
    """
    before = ingress_ips(view.ingress)
    after = ingress_ips(written.ingress)
    if before == after:
        return []
    ref = view.ref()
    if after and before:
        message = f"addresses changed from {', '.join(before)} to {', '.join(after)}"
        if reallocated:
            message = f"{reallocated}; now {', '.join(after)}"
        return [Event(ref, "Warning", "IPReallocated", message)]
    if after:
        pools = ", ".join(result.pools) or "a pool"
        return [Event(ref, "Normal", "IPAllocated", f"allocated {', '.join(after)} from {pools}")]
    return [Event(ref, "Normal", "IPReleased", f"released {', '.join(before)}")]


def problem_event(view: ServiceView, result: AllocationResult | None) -> Event | None:
    """Return the Warning for a Service nodelb refuses to serve as asked, if any.

    PoolExhausted is not here: its Events are rate limited separately (ExhaustionLimiter).
    """
    ref = view.ref()
    if view.request is None:
        return Event(ref, "Warning", "InvalidService", view.problem or "invalid Service")
    if result is not None and result.reason in REQUEST_INVALID:
        return Event(ref, "Warning", "IPRequestInvalid", f"{result.reason}: {result.message}")
    return None


def serving_events(
    view: ServiceView, result: AllocationResult, servable: Servability
) -> tuple[Event, ...]:
    """Return a Warning per reason the Service's allocated addresses serve less than asked.

    One per servability problem (its reason is the Event's), and `IPFamilyNotAllocated` for a
    PreferDualStack Service that got only some of its families (the Degraded condition's
    IPFamiliesNotSupported, which used to come with no Event).
    """
    if not result.allocated:
        return ()
    ref = view.ref()
    out = [Event(ref, "Warning", p.reason.value, p.message) for p in servable.problems]
    if result.missing_families:
        missing = ", ".join(result.missing_families)
        out.append(
            Event(
                ref,
                "Warning",
                Unservable.FAMILY_NOT_ALLOCATED.value,
                f"no {missing} address could be allocated (no pool of that family admits the "
                f"Service); served on {', '.join(map(str, result.ips))} only",
            )
        )
    return tuple(out)
