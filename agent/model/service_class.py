"""Which LoadBalancer Services are nodelb's (pure): the class filter every role applies."""

from __future__ import annotations

import enum

from agent.model.service import Service

DEFAULT_CLASS = "nodelb.io/lb"


class ClassVerdict(enum.StrEnum):
    """Why a Service is or is not handled as a LoadBalancer."""

    OURS = "Ours"
    OURS_BY_DEFAULT = "OursByDefault"  # no loadBalancerClass, and we handle class-less ones
    NOT_LOAD_BALANCER = "NotLoadBalancer"
    OTHER_CLASS = "OtherClass"
    CLASSLESS_NOT_HANDLED = "ClasslessNotHandled"


def classify(svc: Service, *, lb_class: str, handle_classless: bool) -> ClassVerdict:
    """Return whether `svc` is a LoadBalancer Service nodelb handles, and why (not)."""
    if svc.type != "LoadBalancer":
        return ClassVerdict.NOT_LOAD_BALANCER
    if svc.lb_class is None:
        return (
            ClassVerdict.OURS_BY_DEFAULT if handle_classless else ClassVerdict.CLASSLESS_NOT_HANDLED
        )
    return ClassVerdict.OURS if svc.lb_class == lb_class else ClassVerdict.OTHER_CLASS


def is_ours(verdict: ClassVerdict) -> bool:
    """Return True for the verdicts under which nodelb serves the Service's LoadBalancer IPs."""
    return verdict in (ClassVerdict.OURS, ClassVerdict.OURS_BY_DEFAULT)
