"""Which LoadBalancer ingress IPs this agent may serve and hold (pure), with a reason per refusal.

An agent trusts `status.loadBalancer.ingress` only as far as its own configuration and what it
can see of the cluster allow: anyone who can write a Service's status (a careless operator, a
second LoadBalancer implementation, a compromised controller) could otherwise make a node take
the API server's address and cut the whole cluster off from its control plane (issue #18).

An ingress IP is served (frontends programmed) and may be held only when

1. it lies in a configured pool, or in an `externalIPCIDRs` block the operator allowed; and
2. it is none of the addresses this agent can see are taken (`Reserved`): a Node's addresses
   (`status.addresses`, InternalIP and ExternalIP), the API server's (the endpoints of
   `default/kubernetes`, and the address the agent itself talks to), a pod network (every
   Node's `spec.podCIDRs` and the configured `localCIDRs`) or a service network (the
   configured `serviceCIDRs`).

Anything else is refused as a whole: no frontend and no hold, so a refused address is never
DNATed from this node either (the output hook would otherwise redirect the node's own traffic
to, say, the API server). What "can see" leaves out is in docs/ownership.md.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from agent.model.endpoint_slice import Slice
from agent.model.net import IPAddress, IPNetwork
from agent.model.node import Node

API_SERVICE = "default/kubernetes"  # its EndpointSlices name the API servers


class RefusedReason(enum.StrEnum):
    """Why an ingress IP may not be held (the `reason` label of the refusal metric)."""

    OUTSIDE_POOLS = "OutsidePools"
    NODE_ADDRESS = "NodeAddress"
    CONTROL_PLANE = "ControlPlaneAddress"
    POD_NETWORK = "PodNetwork"
    SERVICE_NETWORK = "ServiceNetwork"


@dataclass(frozen=True, slots=True)
class Reserved:
    """The addresses this agent can see belong to something other than a LoadBalancer."""

    node_addresses: frozenset[IPAddress] = frozenset()
    control_plane: frozenset[IPAddress] = frozenset()
    pod_networks: tuple[IPNetwork, ...] = ()
    service_networks: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True, slots=True)
class HoldPolicy:
    """What an ingress IP is checked against: the blocks it must lie in, and what is taken."""

    allowed: tuple[IPNetwork, ...]  # the pools' blocks and the externalIPCIDRs
    reserved: Reserved = Reserved()


@dataclass(frozen=True, slots=True)
class RefusedIP:
    """One ingress IP that may not be held, with a sentence for the Warning Event."""

    ip: IPAddress
    reason: RefusedReason
    message: str


@dataclass(frozen=True, slots=True)
class HoldVerdict:
    """The ingress IPs that may be served and held (in their order), and the refused ones."""

    accepted: tuple[IPAddress, ...]
    refused: tuple[RefusedIP, ...]


def _within(ip: IPAddress, nets: Iterable[IPNetwork]) -> IPNetwork | None:
    return next((n for n in nets if n.version == ip.version and ip in n), None)


def refusal(ip: IPAddress, policy: HoldPolicy) -> RefusedIP | None:
    """Return why `ip` may not be held, or None when it may.

    The reserved checks come first: an address inside a pool that is also a Node's or the API
    server's is refused for what it is, since that names the operator's mistake.
    """
    r = policy.reserved
    if ip in r.control_plane:
        return RefusedIP(
            ip, RefusedReason.CONTROL_PLANE, f"{ip} is an address of the Kubernetes API server"
        )
    if ip in r.node_addresses:
        return RefusedIP(ip, RefusedReason.NODE_ADDRESS, f"{ip} is the address of a Node")
    if (net := _within(ip, r.pod_networks)) is not None:
        return RefusedIP(ip, RefusedReason.POD_NETWORK, f"{ip} lies in the pod network {net}")
    if (net := _within(ip, r.service_networks)) is not None:
        return RefusedIP(
            ip, RefusedReason.SERVICE_NETWORK, f"{ip} lies in the service network {net}"
        )
    if _within(ip, policy.allowed) is None:
        return RefusedIP(
            ip,
            RefusedReason.OUTSIDE_POOLS,
            f"{ip} lies in no configured pool and no allowed externalIPCIDRs block",
        )
    return None


def check_ingress(ips: Iterable[IPAddress], policy: HoldPolicy) -> HoldVerdict:
    """Return which of a Service's ingress IPs may be served and held (each on its own: one bad
    address in the status does not take the Service's good ones down with it)."""
    accepted: list[IPAddress] = []
    refused: list[RefusedIP] = []
    for ip in ips:
        why = refusal(ip, policy)
        if why is None:
            accepted.append(ip)
        else:
            refused.append(why)
    return HoldVerdict(tuple(accepted), tuple(refused))


def reserved_from(
    *,
    nodes: Iterable[Node],
    api_slices: Iterable[Slice],
    api_addresses: Iterable[IPAddress] = (),
    local_cidrs: Iterable[IPNetwork] = (),
    service_cidrs: Iterable[IPNetwork] = (),
) -> Reserved:
    """Return what this agent can see is taken.

    `nodes`: every Node (addresses and pod CIDRs); `api_slices`: the EndpointSlices of
    `default/kubernetes` (every endpoint, ready or not: an API server that is restarting is
    still the API server); `api_addresses`: the address(es) the agent's own client talks to
    (a control-plane VIP lives only there); `local_cidrs` and `service_cidrs` from the config.
    """
    node_list = list(nodes)
    pods = set(local_cidrs) | {c for n in node_list for c in n.pod_cidrs}
    control = {ep.ip for s in api_slices for ep in s.endpoints} | set(api_addresses)
    return Reserved(
        node_addresses=frozenset(a for n in node_list for a in n.addresses),
        control_plane=frozenset(control),
        # Sorted, so the same networks always compare equal (a change recomputes everything).
        pod_networks=tuple(sorted(pods, key=_net_order)),
        service_networks=tuple(service_cidrs),
    )


def _net_order(net: IPNetwork) -> tuple[int, int, int]:
    return (net.version, int(net.network_address), net.prefixlen)
