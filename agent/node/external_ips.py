"""May this Service's externalIPs be programmed (pure), answered with a reason per address.

The allow-list (`externalIPCIDRs`), and the CVE-2020-8554 mitigation: an address inside a
LoadBalancer pool is only usable by the Service it is allocated to.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.model.net import IPAddress, IPNetwork
from agent.model.service import Service


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
