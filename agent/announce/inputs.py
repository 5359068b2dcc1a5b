"""From the agent's cluster cache to the ownership plan's input, and from a plan to the speaker's
configuration (pure).

The ownership plan (agent/announce/ownership.py) wants one record per Node and one per IP with
every Service using it; the speaker (agent/announce/vrrp/config.py) wants the instances this node
runs and the addresses adverts may come from. Both are derived here from plain data, so every
node builds the same plan from the same cache.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.announce.ownership import (
    IPUse,
    NodeState,
    Plan,
    ServiceUse,
    instances_for,
    startup_delay_cs,
)
from agent.announce.settings import AnnounceSettings
from agent.announce.vrrp.config import InstanceConfig, SpeakerConfig
from agent.model.endpoint_slice import AddressType, Slice
from agent.model.net import IPAddress
from agent.model.node import Node
from agent.model.service import Service


@dataclass(frozen=True, slots=True)
class OwnershipInput:
    """The plan's whole input; equal inputs give equal plans (so an unchanged one is skipped)."""

    nodes: frozenset[NodeState]
    ips: frozenset[IPUse]


def node_states(nodes: Iterable[Node]) -> frozenset[NodeState]:
    """Return the ownership view of the Nodes."""
    return frozenset(NodeState(n.name, n.ready, n.labels) for n in nodes)


def local_nodes(slices: Iterable[Slice], version: int) -> frozenset[str]:
    """Return the nodes with a ready endpoint of this IP version in these slices."""
    kind = AddressType.IPV4 if version == 4 else AddressType.IPV6
    return frozenset(
        ep.node_name
        for s in slices
        if s.address_type is kind
        for ep in s.endpoints
        if ep.ready and ep.node_name
    )


def ip_uses(
    served: Mapping[str, Iterable[IPAddress]],
    services: Mapping[str, Service],
    slices_of: Mapping[str, list[Slice]],
) -> frozenset[IPUse]:
    """Return one record per LoadBalancer IP with every Service that uses it.

    `served` maps a Service key to the LoadBalancer IPs nodelb serves for it (the agent's
    per-Service results); `slices_of` gives each Service's EndpointSlices.
    """
    by_ip: dict[IPAddress, list[ServiceUse]] = {}
    for key, ips in served.items():
        svc = services.get(key)
        if svc is None:
            continue
        for ip in ips:
            nodes = local_nodes(slices_of.get(key, ()), ip.version) if svc.local_policy else None
            use = ServiceUse(key, svc.local_policy, nodes or frozenset())
            by_ip.setdefault(ip, []).append(use)
    return frozenset(ip_use(ip, uses) for ip, uses in by_ip.items())


def ip_use(ip: IPAddress, uses: Iterable[ServiceUse]) -> IPUse:
    """Return the record of `ip` used by `uses` (ordered by Service, so equal uses compare
    equal)."""
    return IPUse(ip, tuple(sorted(uses, key=lambda u: u.service)))


def held_by(plan: Plan, node: str) -> dict[IPAddress, int]:
    """Return the IPs `node` is the preferred holder of, with their VRID (for Events)."""
    return {d.ip: d.vrid for d in plan.ips if d.holder == node and d.vrid is not None}


def peer_sources(
    nodes: Iterable[Node], reported: Mapping[str, Iterable[IPAddress]], me: str
) -> frozenset[IPAddress]:
    """Return the addresses adverts may come from: the other nodes' IPv4 addresses (from the
    Node objects) and the IPv6 link-local sources they report (adverts over IPv6 come from
    link-local addresses, which the Node objects do not carry)."""
    out: set[IPAddress] = set()
    for n in nodes:
        if n.name != me:
            out.update(a for a in n.addresses if a.version == 4)
    for name, sources in reported.items():
        if name != me:
            out.update(a for a in sources if a.version == 6 and a.is_link_local)
    return frozenset(out)


def speaker_config(
    *,
    node: str,
    plan: Plan | None,
    settings: AnnounceSettings,
    source4: ipaddress.IPv4Address | None,
    peers: frozenset[IPAddress],
) -> SpeakerConfig:
    """Return what this node's speaker runs for `plan` (no instances before the first plan).

    IPv4 instances need this node's IPv4 source; without one they are left out (the node
    cannot advertise over IPv4 and must not hold IPv4 addresses).
    """
    instances = []
    for inst in instances_for(node, plan) if plan is not None else ():
        version = inst.version
        if version == 4 and source4 is None:
            continue
        instances.append(
            InstanceConfig(
                vrid=inst.vrid,
                family=version,
                priority=inst.priority,
                advert_interval_cs=settings.advert_interval_cs,
                preempt=settings.preempt,
                preempt_delay_cs=settings.preempt_delay_cs,
                startup_delay_cs=startup_delay_cs(inst.priority, settings.advert_interval_cs),
                addresses=inst.addresses,
            )
        )
    return SpeakerConfig(
        interface=settings.interface,
        source4=source4,
        peers=peers,
        checksum_mode=settings.checksum_mode,
        instances=tuple(instances),
        gratuitous=settings.gratuitous,
    )
