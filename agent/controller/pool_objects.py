"""LoadBalancerIPPool objects -> the pools in force, with a verdict per object (pure).

Each object is checked on its own (`parse_pool`, errors naming the object and the field),
against what the cluster uses (node addresses, pod and service CIDRs: `Forbidden`) and
against the pools already placed. An object that fails keeps its **previous valid version**
in force, when there is one and it still fits: a typo in `kubectl edit` must not take the
addresses of running Services away. The verdict says why, naming the other party.

Which of two overlapping pools wins: pools whose spec is already in force and unchanged are
placed first, then new and edited ones, each group oldest first (creationTimestamp, then
name). So an edit never evicts an established pool, and after a restart (nothing in force
yet) the oldest object keeps its addresses, as the oldest Service keeps a duplicate address.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.model.config_values import ConfigError
from agent.model.pools import AddressPool, Forbidden, PoolSet, parse_pool

KIND = "LoadBalancerIPPool"
API_VERSION = "nodelb.io/v1alpha1"


class PoolVerdictReason(enum.StrEnum):
    """Why a pool object is (not) in force: the Valid condition's reason."""

    VALID = "Valid"
    INVALID = "InvalidSpec"  # the spec itself is wrong (a field named in the message)
    OVERLAPS_CLUSTER = "OverlapsCluster"  # a node address, a pod or a service CIDR
    OVERLAPS_POOL = "OverlapsPool"  # another pool object, named in the message


@dataclass(frozen=True, slots=True)
class PoolObject:
    """The parts of one LoadBalancerIPPool the controller decides on."""

    name: str
    uid: str = ""
    generation: int = 0
    created: str = ""  # creationTimestamp, RFC 3339 (sorts by time)
    spec: Mapping[str, Any] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)


def parse_pool_object(obj: Mapping[str, Any]) -> PoolObject:
    """Return the PoolObject of a raw LoadBalancerIPPool (the reflector's parser)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    status = obj.get("status")
    return PoolObject(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        created=str(meta.get("creationTimestamp") or ""),
        spec=spec if isinstance(spec, Mapping) else {},
        status=status if isinstance(status, Mapping) else {},
    )


@dataclass(frozen=True, slots=True)
class PoolVerdict:
    """What became of one object: the pool in force for it (None: none) and why."""

    obj: PoolObject
    reason: PoolVerdictReason
    message: str = ""
    pool: AddressPool | None = None
    previous: bool = False  # `pool` is the object's previous valid version, not its spec


@dataclass(frozen=True, slots=True)
class PoolResolution:
    """The pools in force (oldest object first) and a verdict for every object, by name."""

    pools: PoolSet
    verdicts: Mapping[str, PoolVerdict]


def _check(obj: PoolObject, forbidden: Forbidden) -> tuple[AddressPool | None, str, bool]:
    """Return (pool, problem, cluster): the parsed pool, or the error and whether it was the
    cluster's addresses (not the spec itself) that refused it."""
    where = f"{KIND} {obj.name}: spec"
    try:
        parse_pool(obj.spec, name=obj.name, where=where, forbidden=Forbidden())
    except ConfigError as exc:
        return None, str(exc), False
    try:
        return parse_pool(obj.spec, name=obj.name, where=where, forbidden=forbidden), "", False
    except ConfigError as exc:
        return None, str(exc), True


def overlap(pool: AddressPool, placed: Iterable[AddressPool]) -> str:
    """Return how `pool` overlaps the first of `placed` it overlaps ("" when it fits)."""
    for other in placed:
        for mine in pool.networks:
            for theirs in other.networks:
                if mine.version == theirs.version and mine.overlaps(theirs):
                    return f"{mine} overlaps {theirs} of {KIND} {other.name}"
    return ""


def resolve_pools(
    objects: Iterable[PoolObject],
    *,
    in_force: Mapping[str, AddressPool],
    forbidden: Forbidden,
) -> PoolResolution:
    """Return the pools in force for `objects` and each object's verdict.

    `in_force` holds the pools of the previous resolution by object name (empty after a
    restart); an invalid or overlapping object keeps its entry when that still fits.
    """
    checked = [(obj, *_check(obj, forbidden)) for obj in objects]

    def order(item: tuple[PoolObject, AddressPool | None, str, bool]) -> tuple[bool, str, str]:
        obj, pool = item[0], item[1]
        unchanged = pool is not None and in_force.get(obj.name) == pool
        return (not unchanged, obj.created, obj.name)

    placed: list[AddressPool] = []
    verdicts: dict[str, PoolVerdict] = {}
    for obj, pool, refused, cluster in sorted(checked, key=order):
        problem = refused
        reason = PoolVerdictReason.OVERLAPS_CLUSTER if cluster else PoolVerdictReason.INVALID
        if pool is not None:
            problem, reason = overlap(pool, placed), PoolVerdictReason.OVERLAPS_POOL
            if not problem:
                placed.append(pool)
                verdicts[obj.name] = PoolVerdict(obj, PoolVerdictReason.VALID, pool=pool)
                continue
        previous = in_force.get(obj.name)
        if previous is not None and not overlap(previous, placed):
            placed.append(previous)
            verdicts[obj.name] = PoolVerdict(obj, reason, problem, previous, previous=True)
        else:
            verdicts[obj.name] = PoolVerdict(obj, reason, problem)
    ordered = sorted(placed, key=lambda p: (verdicts[p.name].obj.created, p.name))
    return PoolResolution(PoolSet(tuple(ordered)), verdicts)
