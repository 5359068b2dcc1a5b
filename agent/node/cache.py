"""The agent's view of the cluster: parsed Services, EndpointSlices by Service, and Nodes.

Pure bookkeeping over agent/kube/store.py changes: each `on_*` call updates the indexes and
returns the Service keys whose frontends must be recomputed, so a changed EndpointSlice
costs one Service's work, not a full rebuild. The reflectors own their stores; this cache is
built only from the changes they report, so it can live behind the agent's own lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.kube.store import Change, Store
from agent.model.endpoint_slice import BadSlice, Slice, parse_slice_or_error, slice_service_key
from agent.model.node import Node, parse_node
from agent.model.service import InvalidService, Service, parse_service


def new_stores() -> tuple[Store[Service | InvalidService], Store[Slice | BadSlice], Store[Node]]:
    """Return empty stores for Services, EndpointSlices and Nodes, with their parsers."""
    return Store(parse_service), Store(parse_slice_or_error), Store(parse_node)


class ClusterCache:
    """Services and Nodes by key plus the slices-by-Service index, fed by store changes."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.services: dict[str, Service | InvalidService] = {}
        self.nodes: dict[str, Node] = {}
        self._by_service: dict[str, dict[str, Slice | BadSlice]] = {}

    def slices_of(self, service_key: str) -> list[Slice]:
        """Return the parsed slices of a Service (bad ones are reported, never used)."""
        return [s for s in self._by_service.get(service_key, {}).values() if isinstance(s, Slice)]

    def bad_slices_of(self, service_key: str) -> list[BadSlice]:
        """Return the slices of a Service that could not be parsed."""
        return [
            s for s in self._by_service.get(service_key, {}).values() if isinstance(s, BadSlice)
        ]

    def this_node(self) -> Node | None:
        """Return this node's record, or None before it is known."""
        return self.nodes.get(self.node_name)

    def on_services(self, changes: Sequence[Change[Service | InvalidService]]) -> set[str]:
        """Record Service changes; return the Service keys to recompute."""
        for c in changes:
            if c.new is None:
                self.services.pop(c.key, None)
            else:
                self.services[c.key] = c.new
        return {c.key for c in changes}

    def on_slices(self, changes: Sequence[Change[Slice | BadSlice]]) -> set[str]:
        """Index slice changes by Service; return the Service keys to recompute."""
        dirty: set[str] = set()
        for c in changes:
            if c.old is not None:
                old_service = slice_service_key(c.old)
                self._by_service.get(old_service, {}).pop(c.key, None)
                if not self._by_service.get(old_service, True):
                    del self._by_service[old_service]
                dirty.add(old_service)
            if c.new is not None:
                new_service = slice_service_key(c.new)
                self._by_service.setdefault(new_service, {})[c.key] = c.new
                dirty.add(new_service)
        return dirty

    def on_nodes(self, changes: Sequence[Change[Node]]) -> bool:
        """Record Node changes; return True when this node's changed (recompute everything)."""
        for c in changes:
            if c.new is None:
                self.nodes.pop(c.key, None)
            else:
                self.nodes[c.key] = c.new
        return any(c.key == self.node_name for c in changes)
