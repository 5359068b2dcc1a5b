"""The controller with LoadBalancerIPPool objects instead of the file's pools (fake API).

The loop resolves the objects it is fed (as the pools reflector feeds them), allocates from
the pools in force, writes each pool's status while it leads, posts one Warning per refused
object, and keeps a pool's previous valid version in force when an edit breaks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY

from agent.kube.store import Change
from tests.unit.controller_fakes import FakeServer
from tests.unit.test_controller_loop import Replica, replica


def pool(name: str, created: str, *addresses: str, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "nodelb.io/v1alpha1",
        "kind": "LoadBalancerIPPool",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": generation,
            "creationTimestamp": created,
        },
        "spec": {"addresses": list(addresses)},
    }


def feed(r: Replica, *objects: dict[str, Any]) -> None:
    """Deliver `objects` as the whole set of pools, as the pools reflector would."""
    changes: list[Change[Any]] = r.ctl.pool_objects.replace(list(objects))
    r.ctl.on_pools(changes)


def leading_on_objects(server: FakeServer, tmp_path: Path) -> Replica:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"serviceCIDRs": ["198.19.128.0/20"]}))  # no pools: key
    r = replica(server, "a", path)
    r.ctl.elector.step()
    assert r.ctl.elector.is_leader()
    r.sync(server)
    return r


def settle(r: Replica, server: FakeServer) -> None:
    """Run rounds until the writes are done and the pool status is exported."""
    for _ in range(3):
        r.ctl.step()
        r.writer.run_all()
        r.sync(server)
        r.clock.advance(1.0)  # the pool status goes out with the metrics, once a second
        r.ctl.elector.step()
    r.ctl.step()


def conditions(server: FakeServer, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in server.pool_status[name]["conditions"]}


def test_a_pool_object_is_allocated_from_and_its_status_shows_usage(tmp_path: Path) -> None:
    server = FakeServer()
    svc = server.create_service("web", created="2026-12-01T10:01:00Z")
    a = leading_on_objects(server, tmp_path)
    feed(
        a,
        pool("main", "2026-12-01T00:00:00Z", "198.19.0.0/30"),
        pool("late", "2026-12-02T00:00:00Z", "198.19.0.2-198.19.0.9"),
        pool("svc", "2026-12-03T00:00:00Z", "198.19.130.0/24"),
    )
    settle(a, server)
    assert server.ips(svc) == ("198.19.0.0",)
    assert server.pool_status["main"]["ipv4"] == {"total": 4, "assigned": 1, "available": 3}
    assert conditions(server, "main")["Valid"]["status"] == "True"
    late = conditions(server, "late")["Valid"]
    assert (late["status"], late["reason"]) == ("False", "OverlapsPool")
    assert "LoadBalancerIPPool main" in late["message"]
    svc_cidr = conditions(server, "svc")["Valid"]
    assert svc_cidr["reason"] == "OverlapsCluster" and "service CIDR" in svc_cidr["message"]
    assert "ipv4" not in server.pool_status["late"]  # nothing of it is in force
    warnings = sorted((e.ref.name, e.reason) for e in a.events.events if e.type == "Warning")
    assert warnings == [("late", "OverlapsPool"), ("svc", "OverlapsCluster")]
    refused = "nodelb_pool_objects_refused"
    assert REGISTRY.get_sample_value(refused, {"reason": "OverlapsPool"}) == 1.0
    assert REGISTRY.get_sample_value(refused, {"reason": "OverlapsCluster"}) == 1.0
    assert REGISTRY.get_sample_value(refused, {"reason": "InvalidSpec"}) == 0.0
    # Nothing changed: no write and no Event is repeated.
    writes = a.client.calls.count("patch_pool_status")
    events = len(a.events.events)
    settle(a, server)
    assert a.client.calls.count("patch_pool_status") == writes
    assert len(a.events.events) == events


def test_a_broken_edit_keeps_the_previous_pool_and_its_services_addresses(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    svc = server.create_service("web", created="2026-12-01T10:01:00Z")
    a = leading_on_objects(server, tmp_path)
    feed(a, pool("main", "2026-12-01T00:00:00Z", "198.19.0.0/30"))
    settle(a, server)
    assert server.ips(svc) == ("198.19.0.0",)
    feed(a, pool("main", "2026-12-01T00:00:00Z", "2001:db8::9-2001:db8::1", generation=2))
    settle(a, server)
    assert server.ips(svc) == ("198.19.0.0",)  # still allocated from the previous version
    valid = conditions(server, "main")["Valid"]
    assert valid["reason"] == "InvalidSpec" and valid["observedGeneration"] == 2
    assert "spec.addresses[0]" in valid["message"]
    assert "previous valid version stays in force" in valid["message"]
    assert server.pool_status["main"]["ipv4"]["assigned"] == 1
    # Fixed: accepted again, said once, and the new addresses are the pool's.
    feed(a, pool("main", "2026-12-01T00:00:00Z", "198.19.5.0/30", generation=3))
    settle(a, server)
    assert server.ips(svc) == ("198.19.5.0",)  # outside every pool now: reallocated
    assert conditions(server, "main")["Valid"]["status"] == "True"
    assert [e.reason for e in a.events.events if e.ref.name == "main"] == [
        "InvalidSpec",
        "PoolAccepted",
    ]
