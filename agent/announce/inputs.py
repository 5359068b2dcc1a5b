"""From the agent's cluster cache to the ownership plan's input, and from a plan to the speaker's
configuration (pure).

The ownership plan (agent/announce/ownership.py) wants one record per Node and one per IP with
every Service using it; the speaker (agent/announce/vrrp/config.py) wants the instances this node
runs and the addresses adverts may come from. Both are derived here from plain data, so every
node builds the same plan from the same cache. `OwnershipIndex` keeps the plan's input one
Service at a time (the node core updates it per recompute); `ip_uses` is the one-shot form.
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
    priority_for_rank,
    startup_delay_cs,
)
from agent.announce.settings import AnnounceSettings
from agent.announce.vrrp.config import InstanceConfig, SpeakerConfig
from agent.kube.node_report import PeerReport
from agent.model.endpoint_slice import AddressType, Slice
from agent.model.net import IPAddress
from agent.model.node import Node
from agent.model.service import InvalidService, Service


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


@dataclass(frozen=True, slots=True)
class OwnershipView:
    """What of one Service the ownership plan depends on: its LoadBalancer IPs, its policy,
    and (Local policy) the nodes with a ready endpoint of each family."""

    lb_ips: tuple[IPAddress, ...]
    local: bool
    nodes4: frozenset[str] = frozenset()
    nodes6: frozenset[str] = frozenset()

    def use(self, key: str, version: int) -> ServiceUse:
        """Return the Service's use of an IP of IP version `version`."""
        nodes = (self.nodes4 if version == 4 else self.nodes6) if self.local else frozenset()
        return ServiceUse(key, self.local, nodes)


def ownership_view(
    svc: Service | InvalidService | None, lb_ips: tuple[IPAddress, ...], slices: Iterable[Slice]
) -> OwnershipView | None:
    """Return what of `svc` the ownership plan depends on; None when it uses no IP the plan
    places (no LoadBalancer IP served, or the Service is gone or invalid).

    `lb_ips` are the LoadBalancer IPs nodelb serves for it (its per-Service result), `slices`
    its EndpointSlices (read only for Local policy).
    """
    if not lb_ips or not isinstance(svc, Service):
        return None
    if not svc.local_policy:
        return OwnershipView(lb_ips, False)
    slices = list(slices)
    return OwnershipView(lb_ips, True, local_nodes(slices, 4), local_nodes(slices, 6))


class OwnershipIndex:
    """The ownership plan's input, kept up to date one Service at a time.

    Building the whole input cost O(Services) per change (~140 ms at 10k), and most changes
    (an endpoint replaced in a Cluster-policy Service, a Local one keeping its nodes) leave
    every IP's eligible nodes as they were; so `update` rebuilds only the records of the IPs
    whose Services' views moved, and says when nothing did. Its input equals
    `OwnershipInput(node_states(nodes), ip_uses(...))` built from scratch.
    """

    def __init__(self) -> None:
        self._nodes: tuple[Node, ...] | None = None  # None: no input was built yet
        self._views: dict[str, OwnershipView] = {}
        self._users: dict[IPAddress, dict[str, ServiceUse]] = {}  # by IP, by Service key
        self._uses: dict[IPAddress, IPUse] = {}  # kept until an IP's users change

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Return the Nodes (sorted by name) the last input was built from."""
        return self._nodes or ()

    def update(
        self, views: Mapping[str, OwnershipView | None], nodes: Iterable[Node]
    ) -> OwnershipInput | None:
        """Record the views of the Services in `views` (None: the Service uses no IP the plan
        places) and every Node; return the whole new input when anything the plan depends on
        moved (always the first time), None when nothing did.

        Services not in `views` keep the view recorded before.
        """
        ordered = tuple(sorted(nodes, key=lambda n: n.name))
        moved = ordered != self._nodes
        touched: set[IPAddress] = set()
        for key, view in views.items():
            old = self._views.get(key)
            if view == old:
                continue
            moved = True
            for ip in old.lb_ips if old is not None else ():
                self._users[ip].pop(key, None)
                touched.add(ip)
            if view is None:
                del self._views[key]
                continue
            self._views[key] = view
            for ip in view.lb_ips:
                self._users.setdefault(ip, {})[key] = view.use(key, ip.version)
                touched.add(ip)
        if not moved:
            return None
        for ip in touched:
            users = self._users.get(ip)
            if users:
                self._uses[ip] = ip_use(ip, users.values())
            else:
                self._users.pop(ip, None)
                self._uses.pop(ip, None)
        self._nodes = ordered
        return OwnershipInput(node_states(ordered), frozenset(self._uses.values()))


def held_by(plan: Plan, node: str) -> dict[IPAddress, int]:
    """Return the IPs `node` is the preferred holder of, with their VRID (for Events)."""
    return {d.ip: d.vrid for d in plan.ips if d.holder == node and d.vrid is not None}


def peer_sources(
    nodes: Iterable[Node], reported: Mapping[str, PeerReport], me: str
) -> frozenset[IPAddress]:
    """Return the addresses adverts may come from: the other nodes' IPv4 addresses (from the
    Node objects) and the IPv6 link-local sources they report (adverts over IPv6 come from
    link-local addresses, which the Node objects do not carry).

    A report counts only for a node that exists as a Node: a report Lease for a made-up node
    adds no peer.
    """
    out: set[IPAddress] = set()
    names = set()
    for n in nodes:
        if n.name != me:
            names.add(n.name)
            out.update(a for a in n.addresses if a.version == 4)
    for name, report in reported.items():
        if name in names:
            out.update(a for a in report.sources if a.version == 6 and a.is_link_local)
    return frozenset(out)


def peer_macs(
    nodes: Iterable[Node], reported: Mapping[str, PeerReport], me: str
) -> dict[IPAddress, str]:
    """Return, for every peer address of a node that published its MAC in its own report, the
    MAC its adverts must come from (see `peer_sources` for the addresses)."""
    out: dict[IPAddress, str] = {}
    by_name = {n.name: n for n in nodes if n.name != me}
    for name, report in reported.items():
        node = by_name.get(name)
        if node is None or report.mac is None:
            continue
        for a in node.addresses:
            if a.version == 4:
                out[a] = report.mac
        for a in report.sources:
            if a.version == 6 and a.is_link_local:
                out[a] = report.mac
    return out


def peer_priority_range(plan: Plan | None) -> tuple[int, int] | None:
    """Return the (lowest, highest) priority a nodelb peer may advertise under `plan`: the
    priorities of its ranks, with one rank of slack below for a node that joined before this
    node's plan saw it. None when there is no plan yet (nothing is checked then)."""
    if plan is None or not plan.groups:
        return None
    deepest = max(len(g.ranking) for g in plan.groups)
    return (priority_for_rank(deepest), priority_for_rank(0))


def speaker_config(
    *,
    node: str,
    plan: Plan | None,
    settings: AnnounceSettings,
    source4: ipaddress.IPv4Address | None,
    peers: frozenset[IPAddress],
    peer_macs: Mapping[IPAddress, str] | None = None,
) -> SpeakerConfig:
    """Return what this node's speaker runs for `plan` (no instances before the first plan).

    IPv4 instances need this node's IPv4 source; without one they are left out (the node
    cannot advertise over IPv4 and must not hold IPv4 addresses). The configured keepalived
    peers join `peers` and may advertise any priority.
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
    keepalived = settings.keepalived_peers
    return SpeakerConfig(
        interface=settings.interface,
        source4=source4,
        peers=peers | keepalived,
        peer_macs={a: m for a, m in (peer_macs or {}).items() if a not in keepalived},
        keepalived_peers=keepalived,
        peer_priorities=peer_priority_range(plan),
        checksum_mode=settings.checksum_mode,
        instances=tuple(instances),
        gratuitous=settings.gratuitous,
    )
