"""The controller's writes over a real pool of concurrent writer threads (agent/controller/loop.py).

The other loop tests run writes one at a time when told; here 8 writer threads send them
against the in-memory apiserver (tests/unit/controller_fakes.py, one lock around each request,
as the real one serialises writes to one object). What must hold however the writes
interleave: each Service gets its finalizer before its status, every request carries the
resourceVersion it was decided from, a conflict is retried and ends in one address, no
address is ever in two Services' status, every allocation is announced exactly once, and no
write leaves before the Event queue has room for what it will announce.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from agent.controller.api import Patched
from agent.controller.leader import ElectionTiming
from agent.controller.loop import Controller, ControllerSettings
from agent.kube.events import ListSink
from lab.wait import wait_until
from tests.unit.controller_fakes import FakeClient, FakeClock, FakeServer

TIMING = ElectionTiming(lease_duration=15, renew_deadline=10.0, retry_period=2.0)
SERVICES = 40


class LockedClient(FakeClient):
    """A replica's API whose Service writes may come from several threads at once."""

    lock = threading.Lock()

    def patch_service_status(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        with self.lock:
            return super().patch_service_status(namespace, name, patch)

    def patch_service_metadata(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        with self.lock:
            return super().patch_service_metadata(namespace, name, patch)

    def list_services(self) -> list[dict[str, Any]]:
        with self.lock:
            return super().list_services()


def controller(
    server: FakeServer, tmp_path: Path, pool: ThreadPoolExecutor, **kw: Any
) -> tuple[Controller, LockedClient, ListSink, FakeClock]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"pools": [{"name": "main", "addresses": ["198.19.0.0/24"]}]}))
    client = LockedClient(server, "a")
    clock, events = FakeClock(), ListSink()
    settings = ControllerSettings(
        namespace="nodelb-system", identity="a", config_path=config, election=TIMING
    )
    ctl = Controller(client, settings, events=events, clock=clock, writer=pool, **kw)
    ctl.elector.step()
    assert ctl.elector.is_leader()
    return ctl, client, events, clock


def sync(ctl: Controller, client: LockedClient) -> None:
    ctl.on_services(ctl.services.replace(client.list_services()))


def settle(ctl: Controller, client: LockedClient, clock: FakeClock, server: FakeServer) -> None:
    """Run rounds (the watch delivering, the conflict delay passing) until all are allocated."""

    def allocated() -> bool:
        sync(ctl, client)
        clock.advance(1.0)  # past the conflict delay: a refused write is redone
        ctl.step()
        with client.lock:
            return all(server.ips(k) for k in server.services)

    wait_until(allocated, 20, f"{SERVICES} Services allocated")


def announced_all(ctl: Controller, events: ListSink) -> bool:
    """Run a round (it carries out completed writes: their Events); True once all are out."""
    ctl.step()
    return sum(1 for e in events.events if e.reason == "IPAllocated") >= SERVICES


def keys(server: FakeServer) -> list[str]:
    return sorted(server.services)


def test_concurrent_writes_keep_finalizer_then_status_per_service(tmp_path: Path) -> None:
    server = FakeServer()
    for i in range(SERVICES):
        server.create_service(f"s{i:02d}", created=f"2026-12-01T10:{i:02d}:00Z")
    with ThreadPoolExecutor(8) as pool:
        ctl, client, events, clock = controller(server, tmp_path, pool)
        sync(ctl, client)
        settle(ctl, client, clock, server)
        wait_until(lambda: announced_all(ctl, events), 10, "every allocation announced")
    for key in keys(server):
        mine = [(r.verb, r.result) for r in server.log if r.key == key]
        assert mine == [("patch-metadata", "ok"), ("patch-status", "ok")], key
    ips = [server.ips(k) for k in keys(server)]
    assert len(set(ips)) == SERVICES and server.duplicates == []
    announced = Counter(e.ref.name for e in events.events if e.reason == "IPAllocated")
    assert announced == Counter({f"s{i:02d}": 1 for i in range(SERVICES)})


def test_conflicts_under_concurrency_are_retried_and_never_double_allocate(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    for i in range(SERVICES):
        server.create_service(f"s{i:02d}", created=f"2026-12-01T10:{i:02d}:00Z")
    edited: set[str] = set()

    def user_edits(client: str, verb: str, key: str) -> None:
        # A user edits every third Service between its finalizer patch and its status patch,
        # once: the status patch's resourceVersion is stale and must be refused.
        if verb == "patch-status" and int(key[-2:]) % 3 == 0 and key not in edited:
            edited.add(key)
            server.annotate(key, {"edited": "yes"})

    server.before_write = user_edits
    with ThreadPoolExecutor(8) as pool:
        ctl, client, events, clock = controller(server, tmp_path, pool)
        sync(ctl, client)
        settle(ctl, client, clock, server)
        wait_until(lambda: announced_all(ctl, events), 10, "every allocation announced")
    conflicts = [r.key for r in server.log if r.result == "conflict"]
    assert sorted(conflicts) == sorted(edited) and len(edited) == 14
    # Every Service write carried a resourceVersion: the guard is never dropped.
    for r in server.log:
        if r.verb in ("patch-status", "patch-metadata"):
            assert r.body is not None and r.body["metadata"]["resourceVersion"], r
    assert server.duplicates == [] and len({server.ips(k) for k in keys(server)}) == SERVICES
    announced = Counter(e.ref.name for e in events.events if e.reason == "IPAllocated")
    assert set(announced.values()) == {1} and len(announced) == SERVICES


def test_no_write_leaves_before_the_event_queue_has_room(tmp_path: Path) -> None:
    server = FakeServer()
    for i in range(4):
        server.create_service(f"s{i:02d}")
    room = threading.Event()
    asked: list[float] = []

    def event_room(timeout: float) -> bool:
        asked.append(timeout)
        return room.wait(timeout=10)

    with ThreadPoolExecutor(4) as pool:
        ctl, client, _, clock = controller(server, tmp_path, pool, event_room=event_room)
        sync(ctl, client)
        ctl.step()
        wait_until(lambda: len(asked) == 4, 10, "every writer asking for room")
        with client.lock:
            assert [r for r in server.log if r.verb.startswith("patch")] == []
        room.set()
        settle(ctl, client, clock, server)
    assert server.duplicates == [] and all(server.ips(k) for k in keys(server))
