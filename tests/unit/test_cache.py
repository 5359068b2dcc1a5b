"""The cluster cache: slice changes dirty exactly the Services they belong to."""

from __future__ import annotations

from typing import Any

from agent.kube.store import EventType
from agent.model.endpoint_slice import BadSlice
from agent.node.cache import ClusterCache, new_stores


def raw_slice(name: str, service: str, port: int = 8080, ns: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["198.19.1.10"], "nodeName": "node-1"}],
    }


def test_slice_changes_dirty_their_service_and_a_relabel_dirties_both() -> None:
    cache = ClusterCache("node-1")
    _, slices, _ = new_stores()
    change = slices.apply(EventType.ADDED, raw_slice("s1", "web"))
    assert change is not None
    assert cache.on_slices([change]) == {"ns/web"}
    assert [s.name for s in cache.slices_of("ns/web")] == ["s1"]

    moved = slices.apply(EventType.MODIFIED, raw_slice("s1", "api"))
    assert moved is not None
    assert cache.on_slices([moved]) == {"ns/web", "ns/api"}
    assert cache.slices_of("ns/web") == []
    assert [s.name for s in cache.slices_of("ns/api")] == ["s1"]

    gone = slices.apply(EventType.DELETED, raw_slice("s1", "api"))
    assert gone is not None
    assert cache.on_slices([gone]) == {"ns/api"}
    assert cache.slices_of("ns/api") == []


def test_a_malformed_slice_is_kept_as_a_reason_for_its_service() -> None:
    cache = ClusterCache("node-1")
    _, slices, _ = new_stores()
    bad = raw_slice("s1", "web")
    bad["addressType"] = "IPv5"
    change = slices.apply(EventType.ADDED, bad)
    assert change is not None
    assert cache.on_slices([change]) == {"ns/web"}
    assert cache.slices_of("ns/web") == []
    (problem,) = cache.bad_slices_of("ns/web")
    assert isinstance(problem, BadSlice)
    assert "addressType" in problem.reason


def test_only_this_nodes_changes_matter() -> None:
    cache = ClusterCache("node-1")
    _, _, nodes = new_stores()
    other = nodes.apply(EventType.ADDED, {"metadata": {"name": "node-2"}})
    mine = nodes.apply(EventType.ADDED, {"metadata": {"name": "node-1"}})
    assert other is not None and mine is not None
    assert not cache.on_nodes([other])
    assert cache.on_nodes([mine])
    node = cache.this_node()
    assert node is not None and node.name == "node-1"
    gone = nodes.apply(EventType.DELETED, {"metadata": {"name": "node-1"}})
    assert gone is not None
    assert cache.on_nodes([gone])
    assert cache.this_node() is None
