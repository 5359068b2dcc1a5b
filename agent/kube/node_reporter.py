"""The agent's node reporter: keeps its report Lease current, from a thread of its own.

It rewrites the Lease at once when the served set changes and renews it every `renew_every`
seconds otherwise, so a slow or absent apiserver never delays a sync or a takeover: the last
set asked for is written when the API answers again. The Lease's format is
agent/kube/node_report.py.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from agent.kube.node_report import lease_name, report_body
from agent.model.net import IPAddress

log = logging.getLogger(__name__)


log = logging.getLogger(__name__)


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
