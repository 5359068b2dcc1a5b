"""healthCheckNodePort answers: the pure count, the agent's bookkeeping, and real listeners."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import orjson
import urllib3

from agent.config import AgentConfig, SyncTiming
from agent.kube.events import ListSink
from agent.model.endpoint_slice import AddressType, Slice, SliceEndpoint
from agent.node.cluster_state import listed
from agent.node.health_answers import HealthAnswer, answers_by_port, local_endpoints
from agent.node.healthcheck import HealthCheckServers
from agent.node.loop import Agent, ListFns
from tests.unit.test_node_loop import Clock, FakeDataplane, unused

IP = ipaddress.ip_address


def test_local_endpoints_counts_ready_distinct_addresses_on_this_node_only() -> None:
    eps = (
        SliceEndpoint(ip=IP("198.18.1.10"), node_name="n1"),
        SliceEndpoint(ip=IP("198.18.1.10"), node_name="n1"),  # the same pod in two slices
        SliceEndpoint(ip=IP("198.18.1.11"), node_name="n1", ready=False),
        SliceEndpoint(ip=IP("198.18.2.10"), node_name="n2"),
    )
    s = Slice("ns", "s1", "web", AddressType.IPV4, endpoints=eps)
    assert local_endpoints([s], "n1") == 1
    assert local_endpoints([s], "n2") == 1
    assert local_endpoints([s], "n3") == 0


def local_service(port: int | None = 30555, policy: str = "Local") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "externalTrafficPolicy": policy,
        "ports": [{"name": "http", "port": 80}],
    }
    if port is not None:
        spec["healthCheckNodePort"] = port
    return {
        "metadata": {"namespace": "ns", "name": "web", "uid": "u1"},
        "spec": spec,
        "status": {"loadBalancer": {"ingress": [{"ip": "198.19.0.5"}]}},
    }


def slice_on(node: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "web-1",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["198.18.1.10"], "nodeName": node, "conditions": {"ready": ready}}
        ],
    }


def test_the_agent_hands_answers_to_the_listeners_when_they_change() -> None:
    seen: list[dict[int, HealthAnswer]] = []

    def serve(answers: dict[int, HealthAnswer]) -> list[str]:
        seen.append(answers)
        return []

    cfg = AgentConfig(node_name="n1", sync=SyncTiming(min_interval=0.0))
    agent = Agent(
        cfg,
        dataplane=FakeDataplane(),
        events=ListSink(),
        lists=ListFns(unused, unused, unused),
        clock=Clock(),
        on_health=serve,
    )
    agent.apply(listed(services=[local_service()], slices=[slice_on("n1")]))
    agent.step()
    assert seen == [{30555: HealthAnswer("ns", "web", 1)}]
    agent.step()  # nothing changed: no new hand-over
    assert len(seen) == 1
    agent.apply(listed(services=[local_service()], slices=[slice_on("n2")]))
    agent.step()
    assert seen[-1] == {30555: HealthAnswer("ns", "web", 0)}
    agent.apply(listed(services=[local_service(policy="Cluster")], slices=[slice_on("n1")]))
    agent.step()
    assert seen[-1] == {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_listeners_answer_like_kube_proxy_and_follow_updates() -> None:
    servers = HealthCheckServers("127.0.0.1")
    port = free_port()
    http = urllib3.PoolManager()
    try:
        assert servers.update({port: HealthAnswer("ns", "web", 2)}) == []
        resp = http.request("GET", f"http://127.0.0.1:{port}/", retries=False)
        assert resp.status == 200
        assert resp.headers["X-Load-Balancing-Endpoint-Weight"] == "2"
        assert orjson.loads(resp.data) == {
            "service": {"namespace": "ns", "name": "web"},
            "localEndpoints": 2,
            "serviceProxyHealthy": True,
        }
        servers.update({port: HealthAnswer("ns", "web", 0)})
        assert http.request("GET", f"http://127.0.0.1:{port}/", retries=False).status == 503
        # A port taken by someone else is reported, and the others still open.
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = int(taken.getsockname()[1])
            errors = servers.update(
                {port: HealthAnswer("ns", "web", 1), busy: HealthAnswer("ns", "other", 1)}
            )
            assert len(errors) == 1 and str(busy) in errors[0]
        assert servers.ports == {port}
    finally:
        servers.close()
    assert servers.ports == frozenset()


def test_two_services_on_one_port_keep_the_first_by_key() -> None:
    a, b = HealthAnswer("a", "x", 1), HealthAnswer("b", "y", 0)
    assert answers_by_port({"b/y": (30000, b), "a/x": (30000, a)}) == {30000: a}
