"""Compact records the pure core works on: what this node must program and hold.

These are plain, frozen values. The node role (agent/node/service_frontends.py) produces them
from the API caches; rules/ turns them into nftables transactions; the applier puts those in
the kernel.
Addresses are `ipaddress` objects, never strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.model.net import IPAddress, IPNetwork, Protocol


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One backend address and target port, already resolved from the EndpointSlice."""

    ip: IPAddress
    port: int


@dataclass(frozen=True, slots=True)
class FrontendKey:
    """What a packet is matched on: destination address, L4 protocol, destination port.

    The hash is computed once: keys are hashed millions of times per recompute at 10k
    Services, and `ipaddress`' own hash (of a hex string) dominated a change's CPU.
    """

    ip: IPAddress
    protocol: Protocol
    port: int
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        value = hash((self.ip.version, int(self.ip), self.protocol, self.port))
        object.__setattr__(self, "_hash", value)

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, slots=True)
class Frontend:
    """One (IP, protocol, port) this node answers for, with the endpoints chosen for it.

    `endpoints` serve traffic arriving from outside the cluster. `cluster_endpoints` serve
    traffic that originates on this node or in its pods, which always gets Cluster semantics
    (these endpoints; masqueraded, except a pod's connection to a Local frontend, which keeps
    the pod's address as kube-proxy does); for externalTrafficPolicy=Cluster both are the same
    list.

    `local_only` is externalTrafficPolicy=Local: no SNAT for external traffic (the pod sees the
    client's address), and an empty `endpoints` means *drop* (this node has no local endpoint).
    Otherwise an empty `endpoints` means *reject* (TCP reset / ICMP unreachable), as kube-proxy
    does for a Service with no endpoints at all.

    `source_ranges` empty means every source is allowed (loadBalancerSourceRanges unset).
    `affinity_timeout` is the ClientIP session-affinity timeout in seconds; None means none.
    """

    service: str  # "namespace/name", for error messages and rule comments
    key: FrontendKey
    endpoints: tuple[Endpoint, ...]
    cluster_endpoints: tuple[Endpoint, ...]
    local_only: bool = False
    source_ranges: tuple[IPNetwork, ...] = ()
    affinity_timeout: int | None = None


@dataclass(frozen=True, slots=True)
class DesiredState:
    """Everything this node's nftables table must express, and the IPs it currently holds.

    `frontends` is keyed by FrontendKey and programmed whether or not this node holds the IP
    (pod- and node-originated traffic to an IP held elsewhere is still served locally, as
    kube-proxy does). `held_ips` are the IPs bound to this node's interface: traffic to them
    on a TCP/UDP/SCTP port no frontend declares is dropped (ICMP still answers).
    `local_cidrs` are this node's pod CIDRs: traffic from them (and from the node itself) is
    cluster-internal and gets Cluster semantics even for local_only frontends.
    """

    frontends: dict[FrontendKey, Frontend] = field(default_factory=dict)
    held_ips: frozenset[IPAddress] = frozenset()
    local_cidrs: tuple[IPNetwork, ...] = ()
