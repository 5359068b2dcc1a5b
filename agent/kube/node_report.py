"""The node report Lease's format, in one place: what an agent writes and the controller reads.

Each agent keeps one coordination.k8s.io Lease, `nodelb-node-<node>`, in nodelb's namespace,
labelled ``nodelb.io/report=node``: `holderIdentity` is the node, `renewTime` +
`leaseDurationSeconds` say until when the report is good, and the annotation
``nodelb.io/serving-ips`` lists (comma-separated, sorted) the addresses the node holds — it is
the VRRP master for them and its last sync put their frontends in the kernel. The agent
rewrites the Lease when that set changes and renews it periodically; a node whose agent dies
stops renewing and its report expires, so `LoadBalancerServing` turns False on its own. The
annotation ``nodelb.io/vrrp-sources`` publishes the node's VRRP advert sources (its IPv6
link-local address, which the Node object does not carry) to the other agents, and
``nodelb.io/vrrp-mac`` the segment MAC they leave from (the speakers check it on receipt).

Why a Lease per node (docs/decisions.md): one small object per node, written by that node
only, costs O(nodes) writes instead of O(Services); the Lease's renew time is a liveness
signal for free; and the agent needs no write access to Services at all.

The agent's reporter, which writes and renews the Lease from a thread of its own, is
agent/kube/node_reporter.py; this module is the format both sides read (pure).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.net import IPAddress

REPORT_LABEL = "nodelb.io/report"
REPORT_LABEL_VALUE = "node"
SERVING_ANNOTATION = "nodelb.io/serving-ips"
NAME_PREFIX = "nodelb-node-"


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one node reports: the IPs it serves, and until when (UTC) the report holds.

    `problem` names a malformed report (its IPs are then empty): a broken report makes the
    node count as holding nothing rather than stopping the controller.
    """

    node: str
    ips: frozenset[IPAddress]
    expires: datetime.datetime | None
    problem: str | None = None
    renewed: datetime.datetime | None = None
    duration: int = 0


def lease_name(node: str) -> str:
    """Return the name of `node`'s report Lease."""
    return f"{NAME_PREFIX}{node}"


def report_node(obj: Mapping[str, Any]) -> str:
    """Return the node a report Lease speaks for (its holder, else from its name)."""
    meta = obj.get("metadata") or {}
    holder = (obj.get("spec") or {}).get("holderIdentity")
    return str(holder or str(meta.get("name", "")).removeprefix(NAME_PREFIX))


def identity_problem(obj: Mapping[str, Any]) -> str | None:
    """Return why a report Lease's name and holder disagree (None: it is `nodelb-node-<holder>`).

    The admission policy (deploy/node-report-policy.yaml) makes an agent's writes agree with
    the node its token is bound to; this is the readers' half, for clusters without it: a
    Lease that names one node and holds for another speaks for nobody.
    """
    meta = obj.get("metadata") or {}
    holder = (obj.get("spec") or {}).get("holderIdentity")
    name = str(meta.get("name", ""))
    if not isinstance(holder, str) or not holder:
        return f"Lease {name!r} has no holderIdentity"
    if name != lease_name(holder):
        return f"Lease {name!r} is held by {holder!r}: its name must be {lease_name(holder)!r}"
    return None


def parse_report(obj: Mapping[str, Any]) -> NodeReport:
    """Return the report carried by a raw Lease object (never raises).

    A report whose name and holder disagree, whose renewTime is not a time or whose
    serving-ips list something that is not an address carries no IPs and says why.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    node = report_node(obj)
    if (mismatch := identity_problem(obj)) is not None:
        return NodeReport(node, frozenset(), None, mismatch)
    expires = at = None
    renewed = spec.get("renewTime")
    raw_duration = spec.get("leaseDurationSeconds") or 0
    duration = raw_duration if isinstance(raw_duration, int) else 0
    try:
        if renewed:
            at = datetime.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
            expires = at + datetime.timedelta(seconds=duration)
    except (ValueError, OverflowError):
        return NodeReport(node, frozenset(), None, f"renewTime {renewed!r} is not a time")
    text = str((meta.get("annotations") or {}).get(SERVING_ANNOTATION) or "")
    ips: set[IPAddress] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            ips.add(ipaddress.ip_address(part))
        except ValueError:
            return NodeReport(node, frozenset(), expires, f"{part!r} is not an IP address")
    return NodeReport(node, frozenset(ips), expires, renewed=at, duration=duration)


def serving_ips(reports: Iterable[NodeReport], now: datetime.datetime) -> frozenset[IPAddress]:
    """Return the IPs some node reports serving in a report that has not expired."""
    out: set[IPAddress] = set()
    for report in reports:
        if report.expires is not None and report.expires > now:
            out |= report.ips
    return frozenset(out)


def next_expiry(reports: Iterable[NodeReport], now: datetime.datetime) -> datetime.datetime | None:
    """Return when the next live report with IPs expires (None: none will), to re-check then."""
    times = [r.expires for r in reports if r.ips and r.expires is not None and r.expires > now]
    return min(times, default=None)


def report_body(
    *,
    node: str,
    namespace: str,
    ips: Iterable[IPAddress],
    now: datetime.datetime,
    duration: int,
    resource_version: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Return the Lease object that reports `ips` for `node` (the agent's side).

    `extra` annotations ride along (the agent publishes its VRRP advert sources there).
    """
    meta: dict[str, Any] = {
        "name": lease_name(node),
        "namespace": namespace,
        "labels": {REPORT_LABEL: REPORT_LABEL_VALUE},
        "annotations": {
            **(extra or {}),
            SERVING_ANNOTATION: ",".join(sorted(map(str, ips), key=_ip_order)),
        },
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration,
            "renewTime": now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def _ip_order(text: str) -> tuple[int, int]:
    ip = ipaddress.ip_address(text)
    return (ip.version, int(ip))


SOURCES_ANNOTATION = "nodelb.io/vrrp-sources"
MAC_ANNOTATION = "nodelb.io/vrrp-mac"  # the MAC the node's adverts leave from


@dataclass(frozen=True, slots=True)
class PeerReport:
    """What one node report tells the other agents about that node's VRRP adverts.

    `node` is the node the Lease's *name* says it is for: the report of node X speaks for X
    only. `sources` are at most one IPv4 address and one IPv6 link-local address (a node's
    adverts leave from one of each); `mac` is the segment MAC they leave from (None: not
    published, an older agent). `problem` names a report that was refused as a whole (its
    holderIdentity names another node): it then carries no sources and no MAC.
    """

    node: str
    sources: tuple[IPAddress, ...] = ()
    mac: str | None = None
    problem: str | None = None


def parse_sources(text: str) -> tuple[IPAddress, ...]:
    """Return the addresses of a `nodelb.io/vrrp-sources` annotation (bad entries skipped)."""
    out: list[IPAddress] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            out.append(ipaddress.ip_address(part))
        except ValueError:
            continue
    return tuple(out)


def parse_mac(text: str) -> str | None:
    """Return `text` as a lowercase colon-separated unicast Ethernet MAC, None when it is not
    one (multicast, broadcast and all-zero MACs never source a node's adverts)."""
    parts = text.strip().lower().split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        return None
    try:
        octets = bytes(int(p, 16) for p in parts)
    except ValueError:
        return None
    if octets[0] & 1 or octets == bytes(6):
        return None
    return ":".join(parts)


def report_sources(obj: Mapping[str, Any]) -> PeerReport:
    """Return what a node report Lease says about its node's adverts (never raises).

    The node is taken from the Lease's name, not from what the Lease says of itself: a Lease
    whose holderIdentity names another node is refused whole, so no report can lend its
    sources to another node. Only the first IPv4 address and the first IPv6 link-local
    address are kept (extra entries are what a forged report would add).
    """
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    node = name.removeprefix(NAME_PREFIX)
    if not name.startswith(NAME_PREFIX) or not node:
        return PeerReport(node, problem=f"Lease {name!r} is not named {NAME_PREFIX}<node>")
    problem = identity_problem(obj)
    if problem is not None:
        return PeerReport(node, problem=problem)
    annotations = meta.get("annotations") or {}
    text = str(annotations.get(SOURCES_ANNOTATION) or "")
    first4 = next((a for a in parse_sources(text) if a.version == 4), None)
    first6 = next((a for a in parse_sources(text) if a.version == 6 and a.is_link_local), None)
    sources = tuple(a for a in (first4, first6) if a is not None)
    return PeerReport(node, sources, parse_mac(str(annotations.get(MAC_ANNOTATION) or "")))
