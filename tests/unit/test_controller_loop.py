"""The controller's loop against a fake apiserver that enforces resourceVersion, step by step.

Each replica is a real `Controller` with its own fake clock, its own store (fed by the test,
as the reflectors would be: `sync`) and a writer that runs a queued status patch only when
the test says so. Leadership is the real LeaderElector over the fake's Lease. Nothing sleeps:
time moves when a test moves a replica's clock, and `step()` does one round without waiting.
"""

from __future__ import annotations

import ipaddress
import itertools
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from agent.controller.finalizer import FINALIZER
from agent.controller.leader import ElectionTiming
from agent.controller.loop import Controller, ControllerSettings
from agent.kube.events import ListSink
from agent.kube.node_report import report_body
from agent.kube.store import EventType
from lab.wait import wait_until
from tests.unit.controller_fakes import FakeClient, FakeClock, FakeServer, ManualExecutor

TIMING = ElectionTiming(lease_duration=15, renew_deadline=10.0, retry_period=2.0)
POOLS: list[dict[str, Any]] = [
    {"name": "main", "addresses": ["198.19.0.1-198.19.0.20"]},
    {"name": "side", "addresses": ["198.19.9.1-198.19.9.9"], "autoAssign": False},
]


@dataclass
class Replica:
    """One controller replica and the knobs a test turns."""

    name: str
    ctl: Controller
    client: FakeClient
    clock: FakeClock
    writer: ManualExecutor
    events: ListSink = field(default_factory=ListSink)

    def sync(self, server: FakeServer) -> None:
        """Bring this replica's Service store up to the server's (what its watch delivers)."""
        changes = self.ctl.services.replace(self.client.list_services())
        self.ctl.on_services(changes)

    def reasons(self, name: str) -> list[str]:
        return [e.reason for e in self.events.events if e.ref.name == name]

    def write_keys(self) -> list[str]:
        """Return the Services whose status patches wait in this replica's writer, in order."""
        return [str(q.args[0].key) for q in self.writer.queued]


def config_file(tmp_path: Path, pools: list[dict[str, Any]] = POOLS) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    return path


def replica(server: FakeServer, name: str, config: Path) -> Replica:
    client = server.client(name)
    clock = FakeClock()
    writer = ManualExecutor()
    events = ListSink()
    settings = ControllerSettings(
        namespace="nodelb-system", identity=name, config_path=config, election=TIMING
    )
    ctl = Controller(client, settings, events=events, clock=clock, writer=writer)
    return Replica(name, ctl, client, clock, writer, events)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def leading(server: FakeServer, tmp_path: Path, name: str = "a") -> Replica:
    """Return a replica that holds the Lease and has synced its store."""
    r = replica(server, name, config_file(tmp_path))
    r.ctl.elector.step()
    assert r.ctl.elector.is_leader()
    r.sync(server)
    return r


def allocate_and_report(a: Replica, server: FakeServer, key: str, *, duration: int) -> None:
    """Allocate `key` its address and feed a node report holding it for `duration` s."""
    a.ctl.step()
    a.writer.run_all()
    a.sync(server)
    a.ctl.step()
    lease = report_body(
        node="n1",
        namespace="nodelb-system",
        ips=[ipaddress.ip_address(server.ips(key)[0])],
        now=a.clock.wall(),
        duration=duration,
    )
    node = a.ctl.nodes.apply(EventType.ADDED, {"metadata": {"name": "n1"}})
    change = a.ctl.reports.apply(EventType.ADDED, lease)
    assert change is not None and node is not None
    a.ctl.on_reports([node, change])


def test_a_leader_allocates_in_creation_order_and_announces_each_address_after_its_write(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    server.create_service("young", created="2026-12-01T10:05:00Z")
    server.create_service("old", created="2026-12-01T10:01:00Z")
    server.create_service(
        "pinned", annotations={"nodelb.io/load-balancer-ips": "198.18.7.7"}
    )  # outside every pool
    a = leading(server, tmp_path)
    allocated = metric("nodelb_allocations_total", pool="main")
    a.ctl.step()
    assert a.write_keys() == ["ns/pinned", "ns/old", "ns/young"]  # creation order
    assert a.events.events == []  # nothing is announced before its write succeeded
    a.writer.run_all()
    assert a.events.events == []  # completions are carried out by the next round
    a.ctl.step()
    assert server.ips("ns/old") == ("198.19.0.1",) and server.ips("ns/young") == ("198.19.0.2",)
    assert server.ips("ns/pinned") == ()
    assert a.reasons("old") == ["IPAllocated"] and a.reasons("young") == ["IPAllocated"]
    # The Warning about the request came with the status it explains (no address, refused).
    assert a.reasons("pinned") == ["IPRequestInvalid"]
    conditions = {c["type"]: c for c in server.services["ns/pinned"]["status"]["conditions"]}
    assert conditions["LoadBalancerServing"]["reason"] == "Unsupported"
    assert metric("nodelb_allocations_total", pool="main") == allocated + 2
    # A round with nothing new writes nothing and repeats nothing.
    a.sync(server)
    a.ctl.step()
    assert a.writer.queued == [] and len(a.events.events) == 3


def test_a_refused_write_sends_none_of_its_events_and_is_retried(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    server.annotate(key, {"touched": "by a user"})  # the view the write came from is stale now
    a.writer.run_all()
    a.ctl.step()
    # The write ended at its first request, the finalizer, and never reached status.
    assert server.writes("a") == [("patch-metadata", key, "conflict")]
    assert a.events.events == [] and server.ips(key) == ()
    a.sync(server)  # the watch brings the new version: redone at once
    a.ctl.step()
    a.writer.run_all()
    a.ctl.step()
    assert server.ips(key) == ("198.19.0.1",) and a.reasons("web") == ["IPAllocated"]


def test_a_change_while_its_write_is_in_flight_waits_and_is_redone_after(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    assert a.write_keys() == [key]
    server.annotate(key, {"nodelb.io/ip-pool": "side"})
    a.sync(server)
    a.ctl.step()
    assert a.write_keys() == [key]  # still the one write: the change waits for it
    a.writer.run()  # the first write went out from the old view: refused (409)
    a.ctl.step()  # completion: the deferred change is redone at once
    a.ctl.step()
    assert a.write_keys() == [key]
    a.writer.run()
    a.ctl.step()
    assert server.ips(key) == ("198.19.9.1",)
    assert server.writes("a") == [
        ("patch-metadata", key, "conflict"),
        ("patch-metadata", key, "ok"),
        ("patch-status", key, "ok"),
    ]


def test_leadership_lapsing_mid_round_stops_it_and_leaves_the_rest_for_later(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    keys = [server.create_service(f"s{i}", created=f"2026-12-01T10:0{i}:00Z") for i in range(5)]
    a = leading(server, tmp_path)
    checks = iter([True, True, True, False])  # the round's gate, then before each Service

    class Lapsing:
        def is_leader(self) -> bool:
            return next(checks, True)

    real = a.ctl.elector
    a.ctl.elector = Lapsing()  # type: ignore[assignment]
    a.ctl.step()
    assert a.write_keys() == keys[:2]  # stopped before the third Service
    a.ctl.elector = real  # it renews in time: the rest is done in the next round
    a.ctl.step()
    assert a.write_keys() == keys
    a.writer.run_all()
    assert [server.ips(k) for k in keys] == [(f"198.19.0.{i}",) for i in range(1, 6)]
    assert len(server.requests("a")) == 5  # each Service written once


def test_a_leader_past_its_renew_deadline_sends_none_of_its_queued_writes(tmp_path: Path) -> None:
    server = FakeServer()
    server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.clock.advance(TIMING.renew_deadline)  # no renewal got through meanwhile
    not_leader = metric("nodelb_status_writes_total", result="not_leader")
    a.writer.run_all()
    a.ctl.step()
    assert server.requests("a") == []  # the patch never left
    assert metric("nodelb_status_writes_total", result="not_leader") == not_leader == 0.0
    assert a.ctl.elector.is_leader() is False and a.writer.queued == []


def test_a_refused_configuration_is_reported_once_and_checked_again_once_a_minute(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    server.nodes = [{"status": {"addresses": [{"type": "InternalIP", "address": "198.19.5.5"}]}}]
    key = server.create_service("web")
    path = config_file(tmp_path)
    a = replica(server, "a", path)
    a.ctl.elector.step()
    a.sync(server)
    a.ctl.step()
    assert a.client.calls.count("list_nodes") == 1
    errors = metric("nodelb_config_reloads_total", result="error")
    path.write_text(yaml.safe_dump({"pools": [{"name": "bad", "addresses": ["198.19.5.0/24"]}]}))
    for _ in range(61):  # two minutes of reloads every 2 s
        a.clock.advance(2.0)
        a.ctl.elector.step()
        a.ctl.step()
    assert metric("nodelb_config_reloads_total", result="error") == errors + 1
    assert a.client.calls.count("list_nodes") == 1 + 3  # at 0 s, 60 s and 120 s of the refusal
    a.writer.run_all()
    assert server.ips(key) == ("198.19.0.1",)  # the pools in force kept allocating


def test_a_node_report_that_expires_turns_serving_off_without_any_watch_event(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    allocate_and_report(a, server, key, duration=3)
    a.ctl.step()
    a.writer.run_all()
    assert _serving(server, key) == "True/Serving"
    a.sync(server)
    a.clock.advance(3.0)  # the report expires; nobody tells the controller
    a.ctl.step()
    assert a.writer.queued == []  # not yet: the check is due just after the expiry
    a.clock.advance(0.1)
    a.ctl.step()
    a.writer.run_all()
    assert _serving(server, key) == "False/Provisioning"


def test_a_report_counts_only_once_its_node_exists_and_refusals_are_counted(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    a.sync(server)
    a.ctl.step()
    ip = ipaddress.ip_address(server.ips(key)[0])
    lease = report_body(
        node="n9", namespace="nodelb-system", ips=[ip], now=a.clock.wall(), duration=30
    )
    change = a.ctl.reports.apply(EventType.ADDED, lease)
    assert change is not None
    a.ctl.on_reports([change])
    a.ctl.step()
    a.writer.run_all()
    assert _serving(server, key) == "False/Provisioning"  # no Node n9: a forged report
    refused = REGISTRY.get_sample_value(
        "nodelb_controller_node_reports_refused", {"reason": "UnknownNode"}
    )
    assert refused == 1.0
    node = a.ctl.nodes.apply(EventType.ADDED, {"metadata": {"name": "n9"}})
    assert node is not None
    a.ctl.on_reports([node])
    a.ctl.step()
    a.writer.run_all()
    assert _serving(server, key) == "True/Serving"
    assert (
        REGISTRY.get_sample_value(
            "nodelb_controller_node_reports_refused", {"reason": "UnknownNode"}
        )
        == 0.0
    )


def test_a_pool_reload_keeps_the_reuse_order_of_the_addresses_freed_before_it(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    first = server.create_service("first", created="2026-12-01T10:01:00Z")
    server.create_service("second", created="2026-12-01T10:02:00Z")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    server.delete_service(first)  # frees .1: handed out again only when nothing fresh is left
    a.sync(server)
    a.ctl.step()
    config_file(tmp_path, [*POOLS, {"name": "more", "addresses": ["198.19.8.0/30"]}])
    a.clock.advance(2.0)  # the next reload sees new pools and rebuilds the allocator
    a.ctl.elector.step()
    a.ctl.step()
    third = server.create_service("third", created="2026-12-01T10:03:00Z")
    a.sync(server)
    a.ctl.step()
    a.writer.run_all()
    assert server.ips(third) == ("198.19.0.3",)  # not the .1 freed a moment ago


def _slice(name: str, address_type: str, address: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": address_type,
        "ports": [{"port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address]}],
    }


def test_a_service_with_fqdn_slices_only_is_not_serving_until_an_ip_slice_arrives(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    warned = metric("nodelb_serving_warnings_total", reason="FQDNEndpointsNotSupported")
    allocate_and_report(a, server, key, duration=600)
    fqdn = a.ctl.slices.apply(EventType.ADDED, _slice("web-a", "FQDN", "db.example.org"))
    assert fqdn is not None
    a.ctl.on_slices([fqdn])
    a.ctl.step()
    a.writer.run_all()
    a.ctl.step()
    assert _serving(server, key) == "False/Unsupported"
    assert a.reasons("web")[-1] == "FQDNEndpointsNotSupported"
    assert metric("nodelb_serving_warnings_total", reason="FQDNEndpointsNotSupported") == warned + 1
    # An IPv4 slice arrives: served; the FQDN one goes: still served, the index forgets it.
    a.sync(server)
    ipv4 = a.ctl.slices.apply(EventType.ADDED, _slice("web-b", "IPv4", "198.18.1.1"))
    assert ipv4 is not None
    a.ctl.on_slices([ipv4])
    a.ctl.step()
    a.writer.run_all()
    assert _serving(server, key) == "True/Serving"
    a.sync(server)
    gone = a.ctl.slices.apply(EventType.DELETED, _slice("web-a", "FQDN", "db.example.org"))
    assert gone is not None
    a.ctl.on_slices([gone])
    a.ctl.step()
    assert a.writer.queued == []  # nothing to change: one usable IPv4 slice remains
    last = a.ctl.slices.apply(EventType.DELETED, _slice("web-b", "IPv4", "198.18.1.1"))
    assert last is not None
    a.ctl.on_slices([last])
    assert a.ctl._slices_of == {}  # no slice left: nothing kept for the Service


def _serving(server: FakeServer, key: str) -> str:
    for c in server.services[key]["status"].get("conditions") or []:
        if c["type"] == "LoadBalancerServing":
            return f"{c['status']}/{c['reason']}"
    return "none"


# -- two replicas ---------------------------------------------------------------------------


def stale_leader_and_successor(server: FakeServer, tmp_path: Path) -> tuple[Replica, Replica]:
    """Return (a, b): a led and queued its writes, then stalled; b has taken the Lease over.

    a's clock stands still while b's runs 15 s: a stalls between its leader check and its
    requests (a long pause, a frozen VM), so it still believes it leads when it resumes.
    """
    config = config_file(tmp_path)
    a = leading(server, tmp_path, "a")
    b = replica(server, "b", config)
    b.ctl.elector.step()  # b sees a's Lease ...
    a.ctl.step()  # a allocates and queues its writes; then it stalls
    b.clock.advance(TIMING.lease_duration)  # ... and sees it unrenewed for a lease duration
    b.ctl.elector.step()
    assert b.ctl.elector.is_leader() and a.ctl.elector.is_leader()  # "the moment"
    return a, b


ORDERS = sorted(set(itertools.permutations("AABB")))


@pytest.mark.parametrize(
    "order",
    [pytest.param("".join(o), id=f"writes sent in the order {'-'.join(o)}") for o in ORDERS],
)
def test_a_stale_leaders_writes_are_refused_and_no_address_is_ever_held_twice(
    order: str, tmp_path: Path
) -> None:
    server = FakeServer()
    x = server.create_service("x", created="2026-12-01T10:01:00Z")
    y = server.create_service("y", created="2026-12-01T10:02:00Z")
    a, b = stale_leader_and_successor(server, tmp_path)
    assert a.write_keys() == [x, y]  # x -> .1, y -> .2, from the views before the edit
    server.annotate(x, {"nodelb.io/ip-pool": "side"})  # a user moves x to the other pool
    b.sync(server)
    b.ctl.step()  # b: x -> .9.1, and y gets the lowest free address, .1
    assert b.write_keys() == [x, y]
    for who in order:
        (a if who == "A" else b).writer.run()
    assert server.duplicates == []  # checked after every write, not only now
    a_results = server.write_results("a")  # how each Service's write ended
    assert a_results[x] == "conflict"  # always stale: the user's edit moved x on
    # a's y lands only when it arrives before b's, and then b's is the one refused.
    a_first = order.index("A", order.index("A") + 1) < order.index("B", order.index("B") + 1)
    assert a_results[y] == ("ok" if a_first else "conflict")
    b_results = server.write_results("b")
    assert b_results == {x: "ok", y: "conflict" if a_first else "ok"}
    # a's lapse ends the moment; b converges and every Service holds its own address.
    a.clock.advance(TIMING.renew_deadline)
    a.ctl.step()
    converge(b, server)
    assert server.ips(x) == ("198.19.9.1",)
    assert len({server.ips(k) for k in (x, y)}) == 2 and server.duplicates == []


def test_without_the_resourceversion_guard_that_race_does_hold_an_address_twice(
    tmp_path: Path,
) -> None:
    """The interleaving above needs the guard: with it off, a's stale write makes a duplicate."""
    server = FakeServer(guard=False)
    x = server.create_service("x", created="2026-12-01T10:01:00Z")
    server.create_service("y", created="2026-12-01T10:02:00Z")
    a, b = stale_leader_and_successor(server, tmp_path)
    server.annotate(x, {"nodelb.io/ip-pool": "side"})
    b.sync(server)
    b.ctl.step()
    for who in "BBAA":
        (a if who == "A" else b).writer.run()
    assert server.duplicates != []
    assert server.duplicates[0].startswith("198.19.0.1 held by ['ns/x', 'ns/y']")


def converge(r: Replica, server: FakeServer, rounds: int = 6) -> None:
    """Let replica `r` run rounds (watch caught up, writes sent, retry timers due); it must
    end quiet: nothing left to write."""
    for _ in range(rounds):
        r.sync(server)
        r.clock.advance(TIMING.retry_period)
        r.ctl.elector.step()
        r.ctl.step()
        r.writer.run_all()
    r.sync(server)
    r.ctl.step()
    assert r.writer.queued == [], f"{r.name} did not settle: {r.write_keys()}"


def landed_after_overtaken(server: FakeServer, stale: str, fresh: str) -> list[str]:
    """Return the keys where a write of `stale` landed after one of `fresh` had (none, please)."""
    written: set[str] = set()
    bad = []
    for r in server.log:
        if r.verb != "patch-status" or r.result != "ok":
            continue
        if r.client == fresh:
            written.add(r.key)
        elif r.client == stale and r.key in written:
            bad.append(r.key)
    return bad


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"interleaving seed {s}") for s in range(16)])
def test_two_replicas_that_both_lead_for_a_moment_never_hold_an_address_twice(
    seed: int, tmp_path: Path
) -> None:
    """A batch of Services created while the Lease changes hands, on a seeded schedule.

    For the moment both lead, each step of the schedule is one of: a user creates a Service,
    a's or b's watch catches up, a's or b's round runs, or one of a's or b's queued writes
    goes out (any one of them, not the oldest). a's clock stands still (it stalled);
    afterwards its lease lapses and b carries on alone.
    """
    rng = random.Random(seed)
    server = FakeServer()
    for i in range(6):
        server.create_service(f"s{i:02d}", created=f"2026-12-01T10:{i:02d}:00Z")
    a, b = stale_leader_and_successor(server, tmp_path)
    created = 6
    actions = ["create", "sync-a", "sync-b", "step-a", "step-b", "write-a", "write-b"]
    for _ in range(80):
        action = rng.choice(actions)
        r = a if action.endswith("-a") else b
        if action == "create" and created < 16:
            server.create_service(f"s{created:02d}", created=f"2026-12-01T10:{created:02d}:00Z")
            created += 1
        elif action.startswith("sync"):
            r.sync(server)
        elif action.startswith("step"):
            r.ctl.step()
        elif action.startswith("write") and r.writer.queued:
            r.writer.run(rng.randrange(len(r.writer.queued)))
        assert server.duplicates == [], f"after {action}"
    assert landed_after_overtaken(server, "a", "b") == []
    a.clock.advance(TIMING.renew_deadline)
    a.writer.run_all()
    a.ctl.step()
    converge(b, server)
    assert server.duplicates == []
    held = [server.ips(k) for k in sorted(server.services)]
    assert all(len(h) == 1 for h in held), held
    assert len({h[0] for h in held}) == len(held)


def test_known_limit_an_edit_while_both_lead_can_hold_an_address_twice_until_b_repairs_it(
    tmp_path: Path,
) -> None:
    """The resourceVersion guard is per object, not a fence across objects (docs/allocation.md).

    a queued x -> .1 and y -> .2 and stalled past b's takeover. Then a user moves x to the
    other pool, so b, listing afterwards, gives y .1 and a new z .2. a's write for x is
    refused (the edit moved x on), but its write for y lands if it arrives before b's: y has
    not changed since a's view. For that moment .2 is held twice, until b's watch shows y
    and b writes it back. Only leaders that never overlap rule this out: the renew deadline
    keeps them apart, with lease duration - renew deadline (5 s) of margin for a write that
    is slow to land.
    """
    server = FakeServer()
    x = server.create_service("x", created="2026-12-01T10:01:00Z")
    y = server.create_service("y", created="2026-12-01T10:02:00Z")
    a, b = stale_leader_and_successor(server, tmp_path)
    assert a.write_keys() == [x, y]
    server.annotate(x, {"nodelb.io/ip-pool": "side"})
    z = server.create_service("z", created="2026-12-01T10:03:00Z")
    b.sync(server)
    b.ctl.step()
    assert b.write_keys() == [x, y, z]
    b.writer.run(2)  # z -> .2
    a.writer.run(1)  # a's y -> .2: y is unchanged since a's view, so it lands
    assert server.ips(y) == server.ips(z) == ("198.19.0.2",)
    assert [d.split(" at ")[0] for d in server.duplicates] == [
        "198.19.0.2 held by ['ns/y', 'ns/z']"
    ]
    a.clock.advance(TIMING.renew_deadline)  # a stops; its x write is never sent
    a.writer.run_all()
    converge(b, server)  # b's own y write was refused; its watch shows y, and it repairs it
    assert server.ips(y) == ("198.19.0.1",) and server.ips(z) == ("198.19.0.2",)
    assert {d.split(" at ")[0] for d in server.duplicates} == {
        "198.19.0.2 held by ['ns/y', 'ns/z']"
    }  # only that one, until b's repair


# -- configuration refused at start and on reload -------------------------------------------


def _config_events(r: Replica) -> list[tuple[str, str, str]]:
    return [
        (e.reason, e.ref.kind, e.ref.name) for e in r.events.events if e.ref.kind == "ConfigMap"
    ]


def test_a_wrongly_typed_reload_is_refused_once_with_an_event_and_the_old_pools_keep_serving(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    first = server.create_service("first", created="2026-12-01T10:01:00Z")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    errors = metric("nodelb_config_reloads_total", result="error")
    path = tmp_path / "config.yaml"
    path.write_text("pools:\n- name: main\n  addresses: 5\n")  # crashed the controller before
    for _ in range(5):
        a.clock.advance(2.0)
        a.ctl.elector.step()
        a.ctl.step()
    assert metric("nodelb_config_reloads_total", result="error") == errors + 1
    assert metric("nodelb_config_refused") == 1.0
    assert _config_events(a) == [("ConfigRefused", "ConfigMap", "nodelb-config")]
    refusal = next(e for e in a.events.events if e.reason == "ConfigRefused")
    assert refusal.type == "Warning" and "pools[0] (main).addresses" in refusal.message
    assert "keeping the previous one" in refusal.message
    second = server.create_service("second", created="2026-12-01T10:02:00Z")
    a.sync(server)
    a.ctl.step()
    a.writer.run_all()
    assert server.ips(first) == ("198.19.0.1",) and server.ips(second) == ("198.19.0.2",)
    config_file(tmp_path)  # fixed: loaded at the next period, and said so once
    a.clock.advance(2.0)
    a.ctl.elector.step()
    a.ctl.step()
    assert _config_events(a)[1:] == [("ConfigLoaded", "ConfigMap", "nodelb-config")]
    assert metric("nodelb_config_refused") == 0.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param("", "the configuration is empty", id="an empty file"),
        pytest.param(
            "pools: [{name: p, addresses: [198.19.0.0/24], 3: x}]\n",
            "keys must be strings",
            id="a non-string key",
        ),
    ],
)
def test_a_replica_started_with_a_bad_file_stays_unready_and_out_of_the_election(
    tmp_path: Path, text: str, why: str
) -> None:
    server = FakeServer()
    path = tmp_path / "config.yaml"
    path.write_text(text)
    client = server.client("a")
    settings = ControllerSettings(
        namespace="nodelb-system",
        identity="a",
        config_path=path,
        election=TIMING,
        reload_period=0.01,
    )
    events = ListSink()
    ctl = Controller(client, settings, events=events, clock=FakeClock(), writer=ManualExecutor())
    stop = threading.Event()
    runner = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_until(lambda: ctl.unready_reason().startswith("configuration refused"), 10, "refusal")
        assert why in ctl.unready_reason()
        assert not ctl.ready.is_set()
        # The reason is set before the Event is recorded: wait for the Event too (a loaded
        # machine showed the gap), then check that it is the only one.
        wait_until(lambda: events.events, 10, "the ConfigRefused Event")
        assert [e.reason for e in events.events] == ["ConfigRefused"]
        assert "not ready until it is fixed" in events.events[0].message
        assert runner.is_alive()
        assert "create_lease" not in client.calls and "read_lease" not in client.calls
    finally:
        stop.set()
        runner.join(timeout=10)
    assert not runner.is_alive()


# -- reuse order across leadership changes -------------------------------------------------


def test_a_new_leader_keeps_the_reuse_order_of_addresses_the_old_one_freed(
    tmp_path: Path,
) -> None:
    """b stood by while a led; what a freed is not b's first pick once b leads."""
    server = FakeServer()
    first = server.create_service("first", created="2026-12-01T10:01:00Z")
    second = server.create_service("second", created="2026-12-01T10:02:00Z")
    a = leading(server, tmp_path, "a")
    b = replica(server, "b", config_file(tmp_path))
    b.ctl.elector.step()
    b.ctl.step()  # b loads the config; it does not lead
    a.ctl.step()
    a.writer.run_all()
    b.sync(server)  # b's watch sees .1 and .2 written
    server.delete_service(first)  # .1 is free: handed out again only when nothing fresh is left
    a.sync(server)
    a.ctl.step()
    b.sync(server)  # ... and b's watch sees the deletion
    b.clock.advance(TIMING.lease_duration)  # a stops renewing (it died); b takes the Lease
    b.ctl.elector.step()
    assert b.ctl.elector.is_leader()
    b.ctl.step()  # b rebuilds its allocator from a fresh LIST
    third = server.create_service("third", created="2026-12-01T10:03:00Z")
    b.sync(server)
    b.ctl.step()
    b.writer.run_all()
    assert server.ips(second) == ("198.19.0.2",)
    assert server.ips(third) == ("198.19.0.3",)  # not the .1 a freed a moment ago


def test_a_leader_that_loses_and_regains_the_lease_keeps_its_reuse_order(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    first = server.create_service("first", created="2026-12-01T10:01:00Z")
    server.create_service("second", created="2026-12-01T10:02:00Z")
    a = leading(server, tmp_path, "a")
    a.ctl.step()
    a.writer.run_all()
    a.sync(server)
    server.delete_service(first)
    a.sync(server)
    a.ctl.step()  # releases .1
    a.client.partitioned = True  # a cannot renew: past its renew deadline it stops leading
    a.clock.advance(TIMING.renew_deadline + 1)
    a.ctl.elector.step()
    assert not a.ctl.elector.is_leader()
    a.ctl.step()  # drops its allocator
    a.client.partitioned = False
    a.clock.advance(TIMING.lease_duration)
    a.ctl.elector.step()
    assert a.ctl.elector.is_leader()
    a.ctl.step()  # rebuilt
    third = server.create_service("third", created="2026-12-01T10:03:00Z")
    a.sync(server)
    a.ctl.step()
    a.writer.run_all()
    assert server.ips(third) == ("198.19.0.3",)


# -- the cleanup finalizer ------------------------------------------------------------------


def settle(r: Replica, server: FakeServer, rounds: int = 4) -> None:
    """Let `r` run rounds: watch caught up, writes sent, completions and timers handled."""
    for _ in range(rounds):
        r.sync(server)
        r.ctl.step()
        r.writer.run_all()
        r.clock.advance(1.0)  # past the conflict delay: a refused write is retried
        r.ctl.elector.step()
        r.ctl.step()


def test_a_new_service_gets_the_finalizer_before_its_status(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    added = metric("nodelb_finalizer_writes_total", action="add", result="ok")
    a.ctl.step()
    a.writer.run_all()
    assert server.writes("a") == [("patch-metadata", key, "ok"), ("patch-status", key, "ok")]
    assert server.finalizers(key) == [FINALIZER] and server.ips(key) == ("198.19.0.1",)
    assert metric("nodelb_finalizer_writes_total", action="add", result="ok") == added + 1
    # The status patch was guarded by the version the finalizer patch returned, not the view's.
    first, second = server.log[-2:]
    assert second.body is not None and first.body is not None
    assert second.body["metadata"]["resourceVersion"] != first.body["metadata"]["resourceVersion"]
    a.sync(server)
    a.ctl.step()
    assert a.writer.queued == []  # finalizer there, status right: nothing more


def test_a_deleted_service_is_released_cleared_and_only_then_let_go(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    freed = server.ips(key)
    server.delete_service(key)  # held by the finalizer: only marked
    assert server.services[key]["metadata"]["deletionTimestamp"]
    a.sync(server)
    a.ctl.step()
    # Released at once: a Service asking for that very address gets it in the next round.
    taker = server.create_service("taker", annotations={"nodelb.io/load-balancer-ips": freed[0]})
    a.sync(server)
    a.ctl.step()
    assert a.write_keys() == [key, taker]
    a.writer.run(0)
    assert server.writes("a")[-2:] == [("patch-status", key, "ok"), ("patch-metadata", key, "ok")]
    assert key not in server.services  # the last finalizer gone: the deletion completed
    a.writer.run_all()
    a.ctl.step()
    assert server.ips(taker) == freed
    assert a.reasons("web") == ["IPAllocated", "IPReleased"]
    assert server.duplicates == []  # the status was cleared before the address was written again


def test_a_service_changed_to_cluster_ip_loses_status_then_finalizer(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    removed = metric("nodelb_finalizer_writes_total", action="remove", result="ok")
    server.set_type(key, "ClusterIP")
    a.sync(server)
    a.ctl.step()
    a.writer.run_all()
    assert server.writes("a")[-2:] == [("patch-status", key, "ok"), ("patch-metadata", key, "ok")]
    assert server.ips(key) == ()
    assert not server.services[key]["status"].get("conditions")  # none of ours left
    assert server.finalizers(key) == []
    assert metric("nodelb_finalizer_writes_total", action="remove", result="ok") == removed + 1


def test_a_refused_status_clear_keeps_the_finalizer_until_a_retry_clears_it(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    server.delete_service(key)
    a.sync(server)
    a.ctl.step()
    server.annotate(key, {"touched": "by a user"})  # the write's view is stale now
    a.writer.run_all()
    assert server.writes("a")[-1] == ("patch-status", key, "conflict")
    assert server.finalizers(key) == [FINALIZER]  # not removed: status was not cleared
    assert server.ips(key) != ()
    settle(a, server)
    assert key not in server.services
    assert a.reasons("web") == ["IPAllocated", "IPReleased"]


def test_a_refused_finalizer_removal_still_announces_the_release_once(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    server.delete_service(key)
    a.sync(server)
    a.ctl.step()

    def touch_once(client: str, verb: str, target: str) -> None:
        if verb == "patch-metadata" and target == key:
            server.before_write = None
            server.annotate(key, {"touched": "between the two patches"})

    server.before_write = touch_once
    a.writer.run_all()
    assert server.writes("a")[-2:] == [
        ("patch-status", key, "ok"),
        ("patch-metadata", key, "conflict"),
    ]
    a.ctl.step()
    assert a.reasons("web") == ["IPAllocated", "IPReleased"]  # its status landed: announced
    sent = len(server.writes("a"))
    settle(a, server)
    assert key not in server.services
    landed = [w for w in server.writes("a")[sent:] if w[2] == "ok"]
    assert landed == [("patch-metadata", key, "ok")]  # a finalizer-only retry
    assert a.reasons("web") == ["IPAllocated", "IPReleased"]  # not twice


def test_another_classes_service_keeps_its_finalizer_and_status(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("theirs")
    obj = server.services[key]
    obj["spec"]["loadBalancerClass"] = "example.com/other"
    obj["metadata"]["finalizers"] = [FINALIZER]
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}
    a = leading(server, tmp_path)
    a.ctl.step()
    server.delete_service(key)
    settle(a, server)
    assert server.writes("a") == []
    assert server.finalizers(key) == [FINALIZER] and server.ips(key) == ("203.0.113.7",)


def test_an_unparseable_service_being_deleted_is_let_go(tmp_path: Path) -> None:
    server = FakeServer()
    key = server.create_service("web")
    a = leading(server, tmp_path)
    a.ctl.step()
    a.writer.run_all()
    server.services[key]["spec"]["ports"] = [{"port": "eighty", "protocol": "TCP"}]
    server.delete_service(key)
    settle(a, server)
    assert key not in server.services
    assert a.reasons("web")[0] == "IPAllocated" and "IPReleased" in a.reasons("web")
    assert "InvalidService" not in a.reasons("web")  # no Warning for what is going away
