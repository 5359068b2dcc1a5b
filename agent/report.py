"""Plain-data views of the agent's state for `nodelb render --json` and `nodelb status`."""

from __future__ import annotations

from typing import Any

from agent.model import DesiredState, Endpoint, Frontend


def _endpoints(eps: tuple[Endpoint, ...]) -> list[str]:
    return [f"[{e.ip}]:{e.port}" if e.ip.version == 6 else f"{e.ip}:{e.port}" for e in eps]


def frontend_dict(fe: Frontend) -> dict[str, Any]:
    """Return one frontend as JSON-ready data."""
    return {
        "service": fe.service,
        "ip": str(fe.key.ip),
        "protocol": fe.key.protocol.value,
        "port": fe.key.port,
        "endpoints": _endpoints(fe.endpoints),
        "clusterEndpoints": _endpoints(fe.cluster_endpoints),
        "externalTrafficPolicy": "Local" if fe.local_only else "Cluster",
        "sourceRanges": [str(r) for r in fe.source_ranges],
        "sessionAffinityTimeout": fe.affinity_timeout,
    }


def desired_dict(desired: DesiredState) -> dict[str, Any]:
    """Return the whole desired state as JSON-ready data, in a stable order."""
    frontends = sorted(
        desired.frontends.values(),
        key=lambda f: (f.key.ip.version, int(f.key.ip), f.key.protocol.value, f.key.port),
    )
    return {
        "frontends": [frontend_dict(f) for f in frontends],
        "heldIPs": sorted(str(ip) for ip in desired.held_ips),
        "localCIDRs": [str(c) for c in desired.local_cidrs],
    }
