"""The node report Lease, in one place: its format (pure) and the agent's reporter (a thread).

Each agent keeps one coordination.k8s.io Lease, `nodelb-node-<node>`, in nodelb's namespace,
labelled ``nodelb.io/report=node``: `holderIdentity` is the node, `renewTime` +
`leaseDurationSeconds` say until when the report is good, and the annotation
``nodelb.io/serving-ips`` lists (comma-separated, sorted) the addresses the node holds — it is
the VRRP master for them and its last sync put their frontends in the kernel. The agent
rewrites the Lease when that set changes and renews it periodically; a node whose agent dies
stops renewing and its report expires, so `LoadBalancerServing` turns False on its own. The
annotation ``nodelb.io/vrrp-sources`` publishes the node's VRRP advert sources (its IPv6
link-local address, which the Node object does not carry) to the other agents.

Why a Lease per node (docs/decisions.md): one small object per node, written by that node
only, costs O(nodes) writes instead of O(Services); the Lease's renew time is a liveness
signal for free; and the agent needs no write access to Services at all.

`NodeReporter` rewrites the Lease at once when the served set changes and renews it every
`renew_every` seconds otherwise, from its own thread, so a slow or absent apiserver never
delays a sync or a takeover: the last set asked for is written when the API answers again.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from agent.model.net import IPAddress

log = logging.getLogger(__name__)

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


def lease_name(node: str) -> str:
    """Return the name of `node`'s report Lease."""
    return f"{NAME_PREFIX}{node}"


def report_node(obj: Mapping[str, Any]) -> str:
    """Return the node a report Lease speaks for (its holder, else from its name)."""
    meta = obj.get("metadata") or {}
    holder = (obj.get("spec") or {}).get("holderIdentity")
    return str(holder or str(meta.get("name", "")).removeprefix(NAME_PREFIX))


def parse_report(obj: Mapping[str, Any]) -> NodeReport:
    """Return the report carried by a raw Lease object (never raises)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    node = report_node(obj)
    expires = None
    renewed = spec.get("renewTime")
    try:
        if renewed:
            at = datetime.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
            expires = at + datetime.timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    except ValueError:
        return NodeReport(node, frozenset(), None, f"renewTime {renewed!r} is not a time")
    text = str((meta.get("annotations") or {}).get(SERVING_ANNOTATION) or "")
    ips: set[IPAddress] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            ips.add(ipaddress.ip_address(part))
        except ValueError:
            return NodeReport(node, frozenset(), expires, f"{part!r} is not an IP address")
    return NodeReport(node, frozenset(ips), expires)


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


def parse_sources(text: str) -> tuple[IPAddress, ...]:
    """Return the addresses of a `nodelb.io/vrrp-sources` annotation (bad entries skipped)."""
    out: list[IPAddress] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            out.append(ipaddress.ip_address(part))
        except ValueError:
            continue
    return tuple(out)


def report_sources(obj: Mapping[str, Any]) -> tuple[str, tuple[IPAddress, ...]]:
    """Return (node, VRRP advert sources) from a node report Lease."""
    meta = obj.get("metadata") or {}
    text = str((meta.get("annotations") or {}).get(SOURCES_ANNOTATION) or "")
    return report_node(obj), parse_sources(text)


class NodeReporter:
    """Writes `namespace/nodelb-node-<node>` with the IPs this node serves; see module doc."""

    def __init__(
        self,
        coordination: Any,
        *,
        node: str,
        namespace: str,
        duration: int = 30,
        renew_every: float = 10.0,
        retry_every: float = 2.0,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        extra: Mapping[str, str] | None = None,
    ) -> None:
        self._api = coordination
        self._node = node
        self._namespace = namespace
        self._duration = duration
        self._renew_every = renew_every
        self._retry_every = retry_every
        self._wall = wall
        self._extra = dict(extra or {})
        self._wanted: frozenset[IPAddress] = frozenset()
        self._written: frozenset[IPAddress] | None = None
        self._cond = threading.Condition()
        self.writes = 0

    def update(self, ips: Iterable[IPAddress]) -> None:
        """Ask for `ips` to be reported (returns at once; the thread writes)."""
        wanted = frozenset(ips)
        with self._cond:
            if wanted != self._wanted:
                self._wanted = wanted
                self._cond.notify()

    def written(self) -> frozenset[IPAddress] | None:
        """Return the set the Lease says now (None before the first successful write)."""
        with self._cond:
            return self._written

    def run(self, stop: threading.Event) -> None:
        """Write and renew until `stop` is set; then report nothing, so Serving turns False."""
        next_write = 0.0
        while not stop.is_set():
            with self._cond:
                changed = self._wanted != self._written
                if not changed:
                    self._cond.wait(timeout=max(0.0, next_write))
                wanted = self._wanted
            if stop.is_set():
                break
            if self._write(wanted):
                next_write = self._renew_every
            else:
                next_write = self._retry_every
                stop.wait(self._retry_every)
        self._write(frozenset())

    def wake(self) -> None:
        """Wake the thread (used on stop)."""
        with self._cond:
            self._cond.notify_all()

    def _write(self, ips: frozenset[IPAddress]) -> bool:
        name = lease_name(self._node)
        try:
            try:
                current = self._api.read_namespaced_lease(name, self._namespace)
                rv = current.metadata.resource_version if current.metadata else None
            except ApiException as exc:
                if exc.status != 404:
                    raise
                rv = None
            body = report_body(
                node=self._node,
                namespace=self._namespace,
                ips=ips,
                now=self._wall(),
                duration=self._duration,
                resource_version=rv,
                extra=self._extra,
            )
            if rv is None:
                self._api.create_namespaced_lease(self._namespace, body)
            else:
                self._api.replace_namespaced_lease(name, self._namespace, body)
        except Exception as exc:
            log.warning("could not write the node report Lease: %s", exc)
            return False
        with self._cond:
            self._written = ips
        self.writes += 1
        return True
