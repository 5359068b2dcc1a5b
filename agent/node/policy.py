"""Which Services and addresses are nodelb's to serve (pure).

Two questions, each answered with a reason rather than a bool: is this LoadBalancer Service of
our class, and may this Service's externalIPs be programmed (the allow-list, and the
CVE-2020-8554 mitigation: an address inside a LoadBalancer pool is only usable by the Service
it is allocated to).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.model.desired_state import IPAddress, IPNetwork
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


class ExternalIPReason(enum.StrEnum):
    """Why a Service's externalIPs were refused (reaches Events and metrics)."""

    OUTSIDE_ALLOW_LIST = "OutsideAllowList"
    IN_POOL_NOT_ALLOCATED = "InPoolNotAllocated"


@dataclass(frozen=True, slots=True)
class RefusedIP:
    """One externalIP that may not be programmed, with the reason and a sentence for Events."""

    ip: IPAddress
    reason: ExternalIPReason
    message: str


@dataclass(frozen=True, slots=True)
class ExternalIPVerdict:
    """The externalIPs to program (empty when any is refused) and the refused ones."""

    accepted: tuple[IPAddress, ...]
    refused: tuple[RefusedIP, ...]


def check_external_ips(
    svc: Service,
    *,
    allowed: Sequence[IPNetwork],
    pools: Sequence[IPNetwork],
    allocated_to: Mapping[IPAddress, str],
) -> ExternalIPVerdict:
    """Return which of `svc.external_ips` may be programmed.

    All or nothing: a Service asking for any address it may not have gets none of them, so a
    partly-refused Service never serves on a surprising subset. An address must lie in the
    `allowed` CIDRs (empty = nothing allowed) and, when it lies inside a LoadBalancer pool,
    must be allocated to this same Service (`allocated_to` maps pool IPs to "ns/name").
    """
    refused: list[RefusedIP] = []
    for ip in svc.external_ips:
        if not any(ip in net for net in allowed if net.version == ip.version):
            refused.append(
                RefusedIP(
                    ip,
                    ExternalIPReason.OUTSIDE_ALLOW_LIST,
                    f"externalIP {ip} is outside the allowed externalIPCIDRs",
                )
            )
        elif any(ip in net for net in pools if net.version == ip.version) and (
            allocated_to.get(ip) != svc.key
        ):
            owner = allocated_to.get(ip)
            whose = f"allocated to {owner}" if owner else "not allocated to this Service"
            refused.append(
                RefusedIP(
                    ip,
                    ExternalIPReason.IN_POOL_NOT_ALLOCATED,
                    f"externalIP {ip} lies in a LoadBalancer pool and is {whose}",
                )
            )
    if refused:
        return ExternalIPVerdict(accepted=(), refused=tuple(refused))
    return ExternalIPVerdict(accepted=svc.external_ips, refused=())
