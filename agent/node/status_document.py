"""Plain-data views of the agent's state for `nodelb render --json` and `nodelb status`."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey


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


def _rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def status_document(
    *,
    node: str,
    now: float,
    last_sync: Mapping[str, Any],
    desired: DesiredState | None,
    vrrp: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Return the `GET /status` document `nodelb status` reads (schema: docs/status.md).

    `last_sync` holds `time` (epoch seconds or None), `ok` (None: never synced), `message`,
    `durationSeconds` and `kind`. Endpoint counts are per frontend: `endpoints` serve traffic
    from outside, `localEndpoints` are those inside this node's pod CIDRs.
    """
    ok = last_sync.get("ok")
    frontends = []
    local = desired.local_cidrs if desired else ()
    for key in sorted(desired.frontends if desired else (), key=_frontend_order):
        assert desired is not None
        fe = desired.frontends[key]
        frontends.append(
            {
                "ip": str(key.ip),
                "port": key.port,
                "protocol": key.protocol.value.upper(),
                "service": fe.service,
                "endpoints": len(fe.endpoints),
                "localEndpoints": sum(1 for e in fe.endpoints if any(e.ip in net for net in local)),
            }
        )
    return {
        "node": node,
        "time": _rfc3339(now),
        "lastSync": {
            "time": _rfc3339(last_sync.get("time")),
            "result": "never" if ok is None else ("ok" if ok else "error"),
            "message": str(last_sync.get("message") or ""),
            "durationSeconds": float(last_sync.get("durationSeconds") or 0.0),
            "kind": None if ok is None else str(last_sync.get("kind") or "full"),
        },
        "vrrp": [dict(v) for v in vrrp],
        "heldIPs": sorted((str(ip) for ip in desired.held_ips) if desired else (), key=_ip_key),
        "frontends": frontends,
    }


def _frontend_order(key: FrontendKey) -> tuple[int, int, int, str]:
    return (key.ip.version, int(key.ip), key.port, key.protocol.value)


def _ip_key(text: str) -> tuple[int, int]:
    ip = ipaddress.ip_address(text)
    return (ip.version, int(ip))
