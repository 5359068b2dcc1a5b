"""Agents with LoadBalancerIPPool objects: which blocks they serve, and when that changes."""

from __future__ import annotations

from typing import Any

import pytest

from agent.kube.store import EventType, Store
from agent.node.cluster_state import Changes
from agent.node.pools import pool_of_object
from tests.unit.test_cluster_state import IP, Cluster, ownership_setup


def obj(spec: Any, status: Any = None) -> dict[str, Any]:
    raw: dict[str, Any] = {"metadata": {"name": "main"}, "spec": spec}
    if status is not None:
        raw["status"] = status
    return raw


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param(
            obj({"addresses": ["198.18.0.200-198.18.0.201"]}, {"addressesInForce": ["10.0.0.0/8"]}),
            ["198.18.0.200/31"],
            id="a spec that parses is served as written, whatever the status says",
        ),
        pytest.param(
            obj({"addresses": ["198.18.0.1/24"]}, {"addressesInForce": ["198.18.0.200/31"]}),
            ["198.18.0.200/31"],
            id="a broken edit: the blocks the controller keeps in force",
        ),
        pytest.param(obj({"addresses": ["nope"]}), [], id="a broken spec and no status: nothing"),
        pytest.param(
            obj("junk", {"addressesInForce": ["198.18.0.1/24", 7, "198.18.1.0/24"]}),
            ["198.18.1.0/24"],
            id="what is not a CIDR in the status is skipped, not trusted",
        ),
    ],
)
def test_an_agent_serves_the_spec_or_else_the_blocks_in_force(raw: Any, want: list[str]) -> None:
    assert [str(n) for n in pool_of_object(raw).networks] == want


def test_a_pool_object_arriving_makes_its_ingress_ips_servable() -> None:
    cluster = Cluster(config={"pools": (), "pool_objects": True})
    ownership_setup(cluster)
    assert cluster.recompute().desired.held_ips == frozenset()  # no pool yet: refused
    pools = Store(pool_of_object)
    change = pools.apply(EventType.ADDED, obj({"addresses": ["198.18.0.200/31"]}))
    assert change is not None
    dirty = cluster.state.apply(Changes(pools=[change]))
    assert dirty.everything and dirty.sync
    assert cluster.recompute(dirty).desired.held_ips == {IP("198.18.0.200"), IP("198.18.0.201")}
    same = pools.apply(EventType.MODIFIED, obj({"addresses": ["198.18.0.200/31"]}, {"x": 1}))
    assert same is None  # a status-only change parses to the same blocks: no change at all
    gone = pools.apply(EventType.DELETED, obj({"addresses": ["198.18.0.200/31"]}))
    assert gone is not None and cluster.state.apply(Changes(pools=[gone])).everything
    assert cluster.recompute().desired.held_ips == frozenset()
