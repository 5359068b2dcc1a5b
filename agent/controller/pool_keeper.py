"""The controller's memory of LoadBalancerIPPool objects: what is in force, what was said.

No I/O: the loop feeds it the objects and the held addresses and sends what it returns (the
pools to allocate from, the status writes, the Events). It remembers the pools in force by
object name (an invalid edit keeps the previous version: agent/controller/pool_objects.py),
the verdict last reported per object (one Event per change of verdict, not per resync), and
the status last written per object (a write the watch has not echoed yet is not sent again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.controller.pool_objects import (
    API_VERSION,
    KIND,
    PoolObject,
    PoolVerdict,
    PoolVerdictReason,
    resolve_pools,
)
from agent.controller.pool_status import pool_status, usage, valid_message
from agent.kube.events import Event, ObjectRef
from agent.model.net import IPAddress
from agent.model.pools import AddressPool, Forbidden, PoolSet

# Events about a cluster-scoped object live in this namespace (as the Node's do).
EVENT_NAMESPACE = "default"


@dataclass
class PoolKeeper:
    """See the module docstring; `resolve` first, then `statuses` and `events`."""

    in_force: dict[str, AddressPool] = field(default_factory=dict)
    verdicts: dict[str, PoolVerdict] = field(default_factory=dict)
    _said: dict[str, tuple[str, str]] = field(default_factory=dict)
    _written: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resolve(self, objects: Iterable[PoolObject], forbidden: Forbidden) -> PoolSet:
        """Return the pools in force for `objects`, remembering them and the verdicts."""
        done = resolve_pools(objects, in_force=self.in_force, forbidden=forbidden)
        self.in_force = {p.name: p for p in done.pools.pools}
        self.verdicts = dict(done.verdicts)
        for gone in set(self._said) - set(self.verdicts):
            del self._said[gone]
        for gone in set(self._written) - set(self.verdicts):
            del self._written[gone]
        return done.pools

    def statuses(self, held: Sequence[IPAddress], *, now: str) -> list[tuple[str, dict[str, Any]]]:
        """Return (name, status) for every object whose status should be written now."""
        out = []
        for name, verdict in sorted(self.verdicts.items()):
            written = self._written.get(name)
            status = pool_status(verdict, usage(verdict, held), now=now, previous=written)
            if _same(status, verdict.obj.status) or _same(status, written):
                continue
            out.append((name, status))
        return out

    def written(self, name: str, status: dict[str, Any]) -> None:
        """Note that `status` was written to pool `name`."""
        self._written[name] = status

    def events(self) -> list[Event]:
        """Return an Event for every object whose verdict changed since the last call."""
        out = []
        for name, verdict in sorted(self.verdicts.items()):
            said = (verdict.reason.value, verdict.message)
            before = self._said.get(name)
            self._said[name] = said
            if before == said:
                continue
            ref = ObjectRef(KIND, EVENT_NAMESPACE, name, verdict.obj.uid, API_VERSION)
            if verdict.reason is not PoolVerdictReason.VALID:
                out.append(Event(ref, "Warning", verdict.reason.value, valid_message(verdict)))
            elif before is not None:
                out.append(Event(ref, "Normal", "PoolAccepted", valid_message(verdict)))
        return out


def _same(status: Mapping[str, Any], other: Mapping[str, Any] | None) -> bool:
    return other is not None and dict(status) == dict(other)
