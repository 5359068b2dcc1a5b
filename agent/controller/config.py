"""The controller's configuration: the agents' config file, with its pools validated in full.

The controller and the agents read the same file (one ConfigMap). The agents only need pool
addresses; the controller needs the whole pool definitions, validated against what the
cluster already uses: node addresses and pod CIDRs come from the Node objects (or the
``localCIDRs`` setting), service CIDRs from ``serviceCIDRs``.

The controller re-reads the file every reload period. `config_verdict` and `refuse` decide
what a reload does (pure): content already loaded costs nothing; a refused file is reported
once per distinct refusal, not at every period, and the same refused content is checked
against the Nodes again only every REFUSED_RECHECK seconds — each check lists every Node,
which a large cluster should not pay every 2 s for a file nobody changed.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config import AgentConfig, parse_config
from agent.model.net import IPAddress, IPNetwork
from agent.model.pools import Forbidden, PoolSet, parse_pools

REFUSED_RECHECK = 60.0  # seconds before unchanged refused content is checked again


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The shared settings plus the validated pools (empty: allocate, with nothing to give).

    `pool_objects`: the file has no `pools:` key, so the pools are the LoadBalancerIPPool
    objects (agent/controller/pool_objects.py); `pools` is then what they resolved to, and
    `forbidden` what they must not overlap.
    """

    agent: AgentConfig
    pools: PoolSet
    pool_objects: bool = False
    forbidden: Forbidden = field(default_factory=Forbidden)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The last configuration refused: its digest (empty when unreadable) and the reason."""

    digest: bytes
    message: str
    recheck_at: float  # monotonic: check the same content against the Nodes again after this


class ConfigVerdict(enum.StrEnum):
    """What a reload does with the file it read."""

    UNCHANGED = "Unchanged"  # the content is what is loaded already
    REFUSED_RECENTLY = "RefusedRecently"  # this content was refused less than a recheck ago
    CHECK = "Check"  # new content, or a refusal old enough: check it against the Nodes


@dataclass(frozen=True, slots=True)
class Refused:
    """The refusal to remember, and whether to report it (log line and metric)."""

    refusal: Refusal
    report: bool


def config_digest(data: bytes) -> bytes:
    """Return a digest of the file's bytes.

    The bytes, not the parsed document: a document of the wrong shape (non-string keys, a
    date, an alias expanding a thousand times) has no canonical form, and a refusal must be
    remembered too. A file only reformatted is checked again and, equal to what is loaded,
    changes nothing.
    """
    return hashlib.sha256(data).digest()


def config_verdict(
    digest: bytes, *, loaded: bytes, refused: Refusal | None, initial: bool, now: float
) -> ConfigVerdict:
    """Return what to do with content of `digest` (`loaded`: the digest in force).

    The first load (`initial`) always checks. `now` is monotonic, like `refused.recheck_at`.
    """
    if digest == loaded and not initial:
        return ConfigVerdict.UNCHANGED
    if refused is not None and refused.digest == digest and now < refused.recheck_at:
        return ConfigVerdict.REFUSED_RECENTLY
    return ConfigVerdict.CHECK


def refuse(last: Refusal | None, *, digest: bytes, message: str, now: float) -> Refused:
    """Return the refusal of content `digest` for `message`, reported unless `last` said it.

    `digest` is empty when the file could not be read at all. The same content refused for a
    new reason (a Node now overlaps a pool) is a new refusal and is reported.
    """
    refusal = Refusal(digest, message, now + REFUSED_RECHECK)
    same = last is not None and (last.digest, last.message) == (digest, message)
    return Refused(refusal, report=not same)


@dataclass(frozen=True, slots=True)
class ClusterAddresses:
    """What the cluster already uses, read from the Node objects."""

    node_addresses: tuple[IPAddress, ...] = ()
    pod_cidrs: tuple[IPNetwork, ...] = ()


def cluster_addresses(nodes: Iterable[Mapping[str, Any]]) -> ClusterAddresses:
    """Return the InternalIP/ExternalIP addresses and spec.podCIDRs of raw Node objects."""
    addrs: list[IPAddress] = []
    cidrs: list[IPNetwork] = []
    for node in nodes:
        for entry in (node.get("status") or {}).get("addresses") or []:
            if entry.get("type") in ("InternalIP", "ExternalIP"):
                try:
                    addrs.append(ipaddress.ip_address(str(entry.get("address"))))
                except ValueError:
                    continue  # a node's bad address is the node's problem, not the pools'
        for text in (node.get("spec") or {}).get("podCIDRs") or []:
            try:
                cidrs.append(ipaddress.ip_network(str(text), strict=False))
            except ValueError:
                continue
    return ClusterAddresses(tuple(sorted(set(addrs), key=_key)), tuple(dict.fromkeys(cidrs)))


def _key(ip: IPAddress) -> tuple[int, int]:
    return (ip.version, int(ip))


def parse_controller_config(
    raw: Mapping[str, Any], *, cluster: ClusterAddresses
) -> ControllerConfig:
    """Return the validated controller config; ConfigError naming the key on any problem.

    Without a `pools:` key the pools are the LoadBalancerIPPool objects (`pool_objects`,
    with no pool until they are read); `pools: []` says "allocate nothing" on purpose.
    """
    agent = parse_config(raw)
    pod_cidrs = agent.local_cidrs or cluster.pod_cidrs
    forbidden = Forbidden(
        node_addresses=cluster.node_addresses,
        pod_cidrs=pod_cidrs,
        service_cidrs=agent.service_cidrs,
    )
    pools = parse_pools(raw.get("pools"), forbidden=forbidden)
    return ControllerConfig(
        agent=agent,
        pools=pools or PoolSet(),
        pool_objects=pools is None,
        forbidden=forbidden,
    )
