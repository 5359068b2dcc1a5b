"""The load-balancer cleanup finalizer: whose it is, and the patches that add or remove it (pure).

nodelb puts ``service.kubernetes.io/load-balancer-cleanup`` on every LoadBalancer Service it
handles, before it writes the Service's status, and takes it off only once it has released the
Service's addresses and written the cleared status: on deletion (the apiserver keeps the
object, with metadata.deletionTimestamp set, until the finalizer is gone) and when the Service
stops being one nodelb handles. k8s.io/cloud-provider's service controller does the same, under
the same name, for class-less Services; the upstream e2e spec "should handle load balancer
cleanup finalizer for service" checks it.

The name is shared, so a Service may carry the finalizer of another implementation: `owner`
decides whether this one is nodelb's to remove (docs/decisions.md, "The load-balancer cleanup
finalizer").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

FINALIZER = "service.kubernetes.io/load-balancer-cleanup"


class Owner(enum.StrEnum):
    """Whether the cleanup finalizer on a Service is nodelb's to remove, and why (not)."""

    OUR_CLASS = "OurClass"  # type LoadBalancer of nodelb's class, or class-less and handled
    # Not type LoadBalancer any more, and nodelb handles class-less Services: the apiserver
    # drops spec.loadBalancerClass when the type changes away, so no other class can be meant.
    TYPE_CHANGED = "TypeChanged"
    OUR_CONDITIONS = "OurConditions"  # its status carries nodelb's conditions
    RELEASED = "Released"  # nodelb released addresses it held, in this reconcile
    NOT_OURS = "NotOurs"  # another implementation's (or nobody's): left alone

    @property
    def ours(self) -> bool:
        """Return True when nodelb removes the finalizer once the Service is cleaned up."""
        return self is not Owner.NOT_OURS


class FinalizerChange(enum.StrEnum):
    """What a write does to the finalizer (the values are the metric's action label)."""

    ADD = "add"  # sent before the status patch: the Service is nodelb's from then on
    REMOVE = "remove"  # sent after the status patch that cleared what nodelb wrote


def spec_owner(spec: Any, *, lb_class: str, handle_classless: bool) -> Owner:
    """Return what a raw Service spec alone says about the finalizer: OUR_CLASS, TYPE_CHANGED
    or NOT_OURS.

    Read from the raw object, not the parsed request, so an unparseable Service being deleted
    still has its finalizer removed (otherwise its deletion would hang forever). A spec that
    is not a mapping reads as an empty one (type ClusterIP, no class).
    """
    fields: Mapping[str, Any] = spec if isinstance(spec, Mapping) else {}
    cls = fields.get("loadBalancerClass")
    if cls is not None:
        return Owner.OUR_CLASS if cls == lb_class else Owner.NOT_OURS
    if not handle_classless:
        return Owner.NOT_OURS
    if fields.get("type") == "LoadBalancer":
        return Owner.OUR_CLASS
    return Owner.TYPE_CHANGED


def owner(*, spec: Owner, our_conditions: bool, released: bool) -> Owner:
    """Return whether nodelb owns a Service's cleanup finalizer, and the first reason it does.

    `spec` is `spec_owner`'s verdict; `our_conditions`: status carries one of nodelb's
    conditions (it handled the Service); `released`: the allocator released addresses of
    it just now. Any one of them makes the finalizer nodelb's; none leaves it to whoever
    put it there (the cloud-provider's controller uses the same name).
    """
    if spec.ours:
        return spec
    if our_conditions:
        return Owner.OUR_CONDITIONS
    if released:
        return Owner.RELEASED
    return Owner.NOT_OURS


def finalizer_patch(
    finalizers: tuple[str, ...], change: FinalizerChange, *, resource_version: str
) -> dict[str, Any]:
    """Return the JSON merge patch of metadata that adds or removes the finalizer.

    A merge patch replaces a list whole, so the patch carries every other finalizer as
    `finalizers` (what the Service had when it was read) and the resourceVersion that was
    read with them: if anyone changed the Service since, the apiserver refuses the patch
    (409) instead of dropping their finalizer.
    """
    if change is FinalizerChange.ADD:
        wanted = [*finalizers, FINALIZER] if FINALIZER not in finalizers else list(finalizers)
    else:
        wanted = [f for f in finalizers if f != FINALIZER]
    return {"metadata": {"resourceVersion": resource_version, "finalizers": wanted}}
