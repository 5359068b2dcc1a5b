"""What the controller decides, as pure functions of plain data (the loop carries it out)."""

from __future__ import annotations

from agent.controller.allocator import allocation_order
from agent.controller.service_status import ServiceView
from agent.model.net import IPAddress, IPFamily
from agent.model.pools import PoolSet


def in_allocation_order(views: dict[str, ServiceView | None]) -> list[str]:
    """Return keys oldest Service first; deletions (and the report timer) first of all."""
    gone = sorted(k for k, v in views.items() if v is None)
    present = [v for v in views.values() if v is not None]
    parsed = allocation_order(v.request for v in present if v.request is not None)
    broken = sorted(v.key for v in present if v.request is None)
    return gone + [r.key for r in parsed] + broken


def pool_usage(pools: PoolSet, held: list[IPAddress]) -> list[tuple[str, str, int, int]]:
    """Return (pool, family, size, addresses of `held` in it) for every pool and family."""
    out = []
    for pool in pools.pools:
        for version in sorted(pool.families()):
            family = IPFamily.IPV4 if version == 4 else IPFamily.IPV6
            used = sum(1 for ip in held if ip.version == version and pool.contains(ip))
            out.append((pool.name, family.value, pool.size(version), used))
    return out
