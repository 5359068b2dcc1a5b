"""What a healthCheckNodePort answers (pure): this node's ready endpoint count of a Local Service.

200 with the count when the node has a local ready endpoint, 503 when it has none, in
kube-proxy's JSON body. The HTTP listeners that serve these answers are in
agent/node/healthcheck.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

from agent.model.endpoint_slice import Slice
from agent.model.service import Service


@dataclass(frozen=True, slots=True)
class HealthAnswer:
    """What one health check port says: the Service and its ready endpoints on this node."""

    namespace: str
    name: str
    local_endpoints: int

    @property
    def status(self) -> int:
        """Return 200 when this node has a local ready endpoint, else 503."""
        return 200 if self.local_endpoints > 0 else 503

    def body(self) -> bytes:
        """Return kube-proxy's JSON body for this answer."""
        return orjson.dumps(
            {
                "service": {"namespace": self.namespace, "name": self.name},
                "localEndpoints": self.local_endpoints,
                "serviceProxyHealthy": True,
            }
        )


def local_endpoints(slices: Iterable[Slice], node: str) -> int:
    """Return the distinct ready endpoint addresses of these slices that live on `node`."""
    return len({ep.ip for s in slices for ep in s.endpoints if ep.ready and ep.node_name == node})


def answer_for(service: Service, slices: Iterable[Slice], node: str) -> HealthAnswer | None:
    """Return the answer for `service`'s health check port, None when it has none."""
    if service.health_check_node_port is None:
        return None
    return HealthAnswer(service.namespace, service.name, local_endpoints(slices, node))


def answers_by_port(by_service: Mapping[str, tuple[int, HealthAnswer]]) -> dict[int, HealthAnswer]:
    """Return the answer per port; two Services on one port (the API forbids it): first key."""
    out: dict[int, HealthAnswer] = {}
    for _, (port, answer) in sorted(by_service.items()):
        out.setdefault(port, answer)
    return out
