"""The agent loop's decisions with a fake dataplane and clock: what gets synced and reported."""

from __future__ import annotations

import dataclasses
import gc
import ipaddress
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.announce.inputs import OwnershipInput, ip_uses
from agent.announce.vrrp.control import InstanceStatus
from agent.config import AgentConfig, Pool, SyncTiming
from agent.kube.events import ListSink
from agent.kube.store import EventType
from agent.model.desired_state import DesiredState, FrontendKey
from agent.model.net import IPAddress, Protocol
from agent.model.node import Node
from agent.model.service import Service
from agent.node.cache import new_stores
from agent.node.cluster_state import Changes
from agent.node.loop import Agent, ListFns
from agent.node.status_document import parse_status


@dataclass
class SyncResult:
    ok: bool
    retry_after: float = 0.5
    error: str = ""


@dataclass
class FakeDataplane:
    fail: bool = False
    syncs: list[tuple[DesiredState, bool]] = field(default_factory=list)
    hints: list[set[FrontendKey] | None] = field(default_factory=list)
    drift_checks: int = 0
    during_sync: Callable[[], None] | None = None  # runs inside sync, as another thread might

    def sync(self, desired: DesiredState, *, full: bool = False, changed: Any = None) -> SyncResult:
        if self.during_sync is not None:
            self.during_sync()
        self.syncs.append((desired, full))
        self.hints.append(None if changed is None else set(changed))
        return SyncResult(ok=not self.fail, error="nft said no" if self.fail else "")

    def check_drift(self) -> bool:
        self.drift_checks += 1
        return False


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def unused(**kwargs: Any) -> Any:
    raise AssertionError("the loop under test must not call the API")


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def make_agent(
    *,
    sync: SyncTiming | None = None,
    clock: Clock | None = None,
    config: dict[str, Any] | None = None,
    **agent_kw: Any,
) -> tuple[Agent, FakeDataplane, ListSink, Clock]:
    """Return an agent on node-1 with a fake dataplane, sink and clock. `config` adds
    AgentConfig fields, `agent_kw` Agent keywords (announcer, freeze_heap, sweep_batch)."""
    timing = sync or SyncTiming(min_interval=0.1, full_resync_period=300, drift_check_period=60)
    # The tests' ingress IPs lie in this pool (an agent serves only pool addresses).
    pooled = {"pools": (Pool("test", (ipaddress.ip_network("198.18.0.0/24"),)),)}
    cfg = AgentConfig(node_name="node-1", sync=timing, **{**pooled, **(config or {})})
    dp, sink, clock = FakeDataplane(), ListSink(), clock or Clock()
    agent = Agent(
        cfg,
        dataplane=dp,
        events=sink,
        lists=ListFns(unused, unused, unused),
        clock=clock,
        **agent_kw,
    )
    return agent, dp, sink, clock


def svc(name: str, port: Any = 80, ip: str = "198.18.0.200") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}"},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": port}]},
        "status": {"loadBalancer": {"ingress": [{"ip": ip}]}},
    }


def feed_services(agent: Agent, *raws: dict[str, Any]) -> None:
    store, _, _ = new_stores()
    changes = [c for raw in raws if (c := store.apply(EventType.ADDED, raw)) is not None]
    agent.apply(Changes(services=changes))


def problems_counted(reason: str) -> float:
    value = REGISTRY.get_sample_value("nodelb_service_problems_total", {"reason": reason})
    return value or 0.0


def test_first_step_is_a_full_sync_and_a_malformed_service_gets_a_warning_only() -> None:
    agent, dp, sink, _clock = make_agent()
    before = problems_counted("InvalidService")
    feed_services(agent, svc("good"), svc("bad", port=0, ip="198.18.0.201"))
    agent.step()
    assert problems_counted("InvalidService") == before + 1
    ((desired, full),) = dp.syncs
    assert full
    assert [str(k.ip) for k in desired.frontends] == ["198.18.0.200"]
    assert desired.held_ips == frozenset({ipaddress.ip_address("198.18.0.200")})
    assert [(e.ref.name, e.type, e.reason) for e in sink.events] == [
        ("bad", "Warning", "InvalidService")
    ]
    assert "spec.ports[0].port" in sink.events[0].message
    assert agent.ready.is_set()


def test_a_problem_seen_again_within_the_window_is_counted_not_posted_again() -> None:
    agent, _dp, sink, clock = make_agent()
    suppressed = metric_with("nodelb_events_repeats_suppressed_total", reason="InvalidService")
    feed_services(agent, svc("bad", port=0))
    agent.step()
    feed_services(agent, svc("bad", port=0))  # recomputed: the same problem again
    clock.now += 1.0
    agent.step()
    assert [e.reason for e in sink.events] == ["InvalidService"]
    assert (
        metric_with("nodelb_events_repeats_suppressed_total", reason="InvalidService")
        == suppressed + 1
    )


def metric_with(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_nothing_pending_means_no_sync_and_a_change_means_a_partial_one() -> None:
    agent, dp, _sink, clock = make_agent()
    feed_services(agent, svc("a"))
    agent.step()
    clock.now += 1
    agent.step()
    assert len(dp.syncs) == 1
    feed_services(agent, svc("b", ip="198.18.0.202"))
    clock.now += 1
    agent.step()
    desired, full = dp.syncs[-1]
    assert not full
    assert len(desired.frontends) == 2
    # Only the changed Service's frontend is named, so the delta need not compare all.
    assert dp.hints[0] is None
    assert [str(k.ip) for k in dp.hints[-1] or ()] == ["198.18.0.202"]


def test_a_failed_sync_is_retried_after_the_backoff_and_the_warning_is_not_repeated() -> None:
    agent, dp, sink, clock = make_agent()
    dp.fail = True
    feed_services(agent, svc("bad", port=70000))
    agent.step()
    assert agent.status.last_sync_ok is False
    assert agent.status.last_error == "nft said no"
    assert not agent.ready.is_set()
    dp.fail = False
    clock.now += 1
    agent.step()
    assert agent.status.last_sync_ok is True
    assert dp.syncs[-1][1], "the first successful sync is a full one"
    assert len(sink.events) == 1


def test_drift_is_checked_on_its_period_after_the_first_sync() -> None:
    agent, dp, _, clock = make_agent()
    feed_services(agent, svc("a"))
    agent.step()
    assert dp.drift_checks == 0
    clock.now += 61
    agent.step()
    agent.wait_drift_check(timeout=10)
    assert dp.drift_checks == 1


def test_the_status_document_names_the_last_sync_and_every_frontend() -> None:
    announcer = FakeAnnouncer(
        speaker=(
            InstanceStatus(
                vrid=7,
                family=4,
                state="Master",
                priority=254,
                addresses=(ipaddress.ip_address("198.18.0.200"),),
                master=ipaddress.ip_address("198.18.0.11"),
                adverts_sent=3,
                adverts_received=0,
                takeovers=1,
                transitions=(("Master", 1),),
            ),
        )
    )
    agent, dp, _, _ = make_agent(announcer=announcer)
    doc = agent.status_document()
    assert doc["lastSync"]["result"] == "never" and doc["frontends"] == []
    feed_services(agent, svc("web"))
    agent.step()
    doc = agent.status_document()
    assert doc["node"] == "node-1"
    assert doc["lastSync"]["result"] == "ok" and doc["lastSync"]["kind"] == "full"
    assert doc["vrrp"] == [
        {
            "vrid": 7,
            "family": "IPv4",
            "state": "Master",
            "priority": 254,
            "addresses": ["198.18.0.200"],
            "master": "198.18.0.11",
        }
    ]
    assert parse_status(doc).vrrp[0].addresses == (ipaddress.ip_address("198.18.0.200"),)
    assert [(f["ip"], f["port"], f["protocol"], f["service"]) for f in doc["frontends"]] == [
        ("198.18.0.200", 80, "TCP", "ns/web")
    ]
    dp.fail = True
    feed_services(agent, svc("web", port=81))
    agent.step()
    doc = agent.status_document()
    assert doc["lastSync"]["result"] == "error" and doc["lastSync"]["message"] == "nft said no"


def test_an_external_ip_follows_its_pool_address_owner_without_touching_others() -> None:
    pool = ipaddress.ip_network("198.18.0.0/24")
    agent, dp, _, clock = make_agent(
        config={"external_ip_cidrs": (pool,), "pools": (Pool("lab", (pool,)),)}
    )
    web = svc("web", ip="198.18.0.200")
    web["spec"]["externalIPs"] = ["198.18.0.201"]
    web["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    feed_services(agent, web, svc("other", ip="198.18.0.202"))
    agent.step()
    ext = FrontendKey(ipaddress.ip_address("198.18.0.201"), Protocol.TCP, 80)
    assert ext not in dp.syncs[-1][0].frontends  # in the pool, allocated to nobody
    assert "ExternalIPRefused" in [p.reason for p in agent.status.problems["ns/web"]]
    # web is given the address as well: now it owns it, and its externalIP is accepted.
    web["status"]["loadBalancer"]["ingress"].append({"ip": "198.18.0.201"})
    feed_services(agent, web)
    clock.now += 1
    agent.step()
    assert dp.syncs[-1][0].frontends[ext].service == "ns/web"
    assert "ns/web" not in agent.status.problems
    # An older Service listing the address owns it now: web is recomputed without a change of
    # its own (its externalIP is refused again), and only the two Services' frontends are
    # offered to the dataplane as changed ("other" is left alone).
    older = svc("older", port=81, ip="198.18.0.201")
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    feed_services(agent, older)
    clock.now += 1
    agent.step()
    assert "ExternalIPRefused" in [p.reason for p in agent.status.problems["ns/web"]]
    hint = dp.hints[-1]
    assert hint is not None
    assert {(str(k.ip), k.port) for k in hint} == {
        ("198.18.0.200", 80),
        ("198.18.0.201", 80),
        ("198.18.0.201", 81),
    }


@dataclass
class FakeAnnouncer:
    inputs: list[OwnershipInput] = field(default_factory=list)
    speaker: tuple[InstanceStatus, ...] = ()

    def submit(self, inp: OwnershipInput, nodes: tuple[Node, ...]) -> None:
        self.inputs.append(inp)

    def held(self) -> frozenset[IPAddress]:
        return frozenset()

    def report(self, programmed: frozenset[IPAddress]) -> None:
        pass

    def set_reported_sources(self, reported: Any) -> None:
        pass

    def instances(self) -> tuple[InstanceStatus, ...]:
        return self.speaker


def slice_change(service: str, node: str, addr: str, *, ready: bool = True) -> Any:
    raw = {
        "metadata": {
            "namespace": "ns",
            "name": f"{service}-1",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [addr], "nodeName": node, "conditions": {"ready": ready}}],
    }
    store = new_stores()[1]
    return store.apply(EventType.ADDED, raw)


def node_change(name: str, ready: bool) -> Any:
    raw = {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
    return new_stores()[2].apply(EventType.ADDED, raw)


def test_ownership_is_replanned_only_when_an_ip_s_eligible_nodes_may_have_moved() -> None:
    announcer = FakeAnnouncer()
    agent, _, _, clock = make_agent(announcer=announcer)
    local = svc("local", ip="198.18.0.201")
    local["spec"]["externalTrafficPolicy"] = "Local"
    feed_services(agent, svc("web"), local)
    agent.apply(Changes(nodes=[node_change("node-1", True), node_change("node-2", True)]))
    agent.step()
    assert len(announcer.inputs) == 1

    def step_with(changes: list[Any]) -> None:
        agent.apply(Changes(slices=changes))
        clock.now += 1
        agent.step()

    step_with([slice_change("web", "node-1", "198.19.1.10")])  # Cluster policy: no replan
    assert len(announcer.inputs) == 1
    step_with([slice_change("local", "node-2", "198.19.2.10")])  # node-2 becomes eligible
    assert len(announcer.inputs) == 2
    step_with([slice_change("local", "node-2", "198.19.2.11")])  # same node, new pod
    assert len(announcer.inputs) == 2
    step_with([slice_change("local", "node-2", "198.19.2.11", ready=False)])
    assert len(announcer.inputs) == 3
    (use,) = [u for u in announcer.inputs[-1].ips if str(u.ip) == "198.18.0.201"]
    assert use.services[0].local_nodes == frozenset()
    # Another node's readiness is an input too, although this node's state is unchanged.
    agent.apply(Changes(nodes=[node_change("node-2", False)]))
    clock.now += 1
    agent.step()
    assert len(announcer.inputs) == 4
    assert {(n.name, n.ready) for n in announcer.inputs[-1].nodes} == {
        ("node-1", True),
        ("node-2", False),
    }


@pytest.mark.parametrize(
    "wake",
    [
        pytest.param(lambda a: a.held_changed(), id="the announcer's held addresses changing"),
        pytest.param(
            lambda a: a.apply(Changes(nodes=[node_change("node-2", False)])),
            id="another node's readiness changing",
        ),
        pytest.param(lambda a: feed_services(a, svc("b", ip="198.18.0.9")), id="a new Service"),
    ],
)
def test_a_wake_up_that_arrives_during_a_sync_gets_a_sync_of_its_own(
    wake: Callable[[Agent], None],
) -> None:
    announcer = FakeAnnouncer()
    agent, dp, _, clock = make_agent(announcer=announcer)
    feed_services(agent, svc("web"))
    agent.step()
    feed_services(agent, svc("web", port=81))
    clock.now += 1
    dp.during_sync = lambda: wake(agent)
    agent.step()
    dp.during_sync = None
    assert agent._schedule.sync_due() is not None, "what arrived during the sync is pending"
    syncs = len(dp.syncs)
    clock.now += 1
    agent.step()
    assert len(dp.syncs) == syncs + 1


def test_the_periodic_resync_recomputes_every_service_in_batches_and_fixes_a_missed_one() -> None:
    agent, dp, _, clock = make_agent(sweep_batch=2)
    feed_services(agent, *(svc(f"s{i}", ip=f"198.18.0.{200 + i}") for i in range(5)))
    agent.step()
    assert dp.syncs[-1][1]  # the first sync is full
    # The incremental state misses an update: s3's result is stale (as if a change was lost).
    stale = dataclasses.replace(agent._state.index.results["ns/s3"], frontends=())
    agent._state.index.put(stale)
    corrections = metric("nodelb_resync_corrections_total")
    clock.now += 301  # the resync is due: 5 Services in batches of 2
    hints: list[set[FrontendKey] | None] = []
    for _ in range(3):
        agent.step()
        hints.append(dp.hints[-1])
        assert not dp.syncs[-1][1], "a periodic resync sends no full transaction"
        clock.now += 0.1  # min_interval: the next batch is due
    assert [len(h or ()) for h in hints] == [2, 2, 1]
    assert set().union(*(h or set() for h in hints)) == set(dp.syncs[0][0].frontends)
    assert metric("nodelb_resync_corrections_total") == corrections + 1
    assert dp.syncs[-1][0].frontends == dp.syncs[0][0].frontends  # s3 is back
    syncs = len(dp.syncs)
    clock.now += 100  # nothing is due until the next period
    agent.step()
    assert len(dp.syncs) == syncs
    assert agent._schedule.full_due() == pytest.approx(clock.now - 100 - 0.1 + 300)


def test_a_change_during_the_resync_rides_along_and_is_not_a_correction() -> None:
    agent, dp, _, clock = make_agent(sweep_batch=1)
    feed_services(agent, svc("a"), svc("b", ip="198.18.0.201"))
    agent.step()
    corrections = metric("nodelb_resync_corrections_total")
    clock.now += 301
    feed_services(agent, svc("a", port=81), svc("b", ip="198.18.0.201", port=82))
    agent.step()  # the resync starts; its first batch is one of the two changed Services
    assert agent._state.sweep is not None and agent._state.sweep.left == 1
    clock.now += 0.1
    agent.step()  # its second batch: recomputed already, so the same result
    assert agent._state.sweep is None
    assert metric("nodelb_resync_corrections_total") == corrections
    assert {k.port for k in dp.syncs[-1][0].frontends} == {81, 82}


def test_after_a_resync_batch_a_pending_change_goes_alone_and_the_resync_still_advances() -> None:
    agent, dp, _, clock = make_agent(sweep_batch=1)
    names = ["a", "b", "c", "d"]
    feed_services(agent, *(svc(n, ip=f"198.18.0.{200 + i}") for i, n in enumerate(names)))
    agent.step()
    clock.now += 301
    agent.step()  # the resync starts with one batch
    assert agent._state.sweep is not None and agent._state.sweep.left == 3
    # Steady churn: a change is pending at every step from now on.
    ports = iter(range(81, 99))
    recomputed: list[set[str]] = []
    while agent._state.sweep is not None:
        feed_services(agent, svc("a", port=next(ports)))
        clock.now += 0.1
        left = agent._state.sweep.left
        agent.step()
        assert dp.hints[-1] is not None
        recomputed.append({str(k.ip) for k in dp.hints[-1]})
        now_left = agent._state.sweep.left if agent._state.sweep is not None else 0
        # Alternating: a change-only step right after a batch, then a batch with the change.
        assert left - now_left == (len(recomputed) + 1) % 2
    assert recomputed[0] == {"198.18.0.200"}, "the change went alone after the first batch"
    assert len(recomputed) == 6  # three batches, each after a step of the change alone
    assert {k.port for k in dp.syncs[-1][0].frontends if str(k.ip) == "198.18.0.200"} == {
        next(ports) - 1
    }


def test_the_incremental_ownership_input_equals_one_built_from_scratch() -> None:
    announcer = FakeAnnouncer()
    agent, _, _, clock = make_agent(
        sync=SyncTiming(min_interval=0.0, full_resync_period=10**6, drift_check_period=10**6),
        announcer=announcer,
    )
    agent.apply(Changes(nodes=[node_change(n, True) for n in ("node-1", "node-2", "node-3")]))
    rng = random.Random(7)
    names = [f"s{i}" for i in range(12)]
    for _ in range(200):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.5:
            raw = svc(name, ip=f"198.18.0.{200 + rng.randrange(4)}", port=rng.randrange(80, 84))
            if rng.random() < 0.5:
                raw["spec"]["externalTrafficPolicy"] = "Local"
            feed_services(agent, raw)
        elif roll < 0.85:
            node = rng.choice(("node-1", "node-2", "node-3"))
            addr = f"198.19.{rng.randrange(1, 4)}.{rng.randrange(1, 250)}"
            agent.apply(Changes(slices=[slice_change(name, node, addr, ready=rng.random() < 0.7)]))
        else:
            store = new_stores()[0]
            store.apply(EventType.ADDED, svc(name))
            gone = store.apply(EventType.DELETED, svc(name))
            assert gone is not None
            agent.apply(Changes(services=[gone]))
        clock.now += 1
        agent.step()
        services = {k: s for k, s in agent._state.cache.services.items() if isinstance(s, Service)}
        served = {k: r.lb_ips for k, r in agent._state.index.results.items() if r.lb_ips}
        slices = {k: agent._state.cache.slices_of(k) for k in served if services[k].local_policy}
        want = ip_uses(served, services, slices)
        assert announcer.inputs, "an input was submitted"
        assert announcer.inputs[-1].ips == want


def test_the_heap_is_frozen_after_the_first_sync_and_after_each_periodic_resync(
    monkeypatch: Any,
) -> None:
    clock = Clock()
    frozen: list[float] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(clock.now))
    agent, _, _, _ = make_agent(
        sync=SyncTiming(min_interval=0.1, full_resync_period=300, drift_check_period=10**6),
        clock=clock,
        freeze_heap=True,
        sweep_batch=1,
    )
    feed_services(agent, svc("a"), svc("b", ip="198.18.0.201"))
    agent.step()
    assert frozen == [1000.0]
    feed_services(agent, svc("a", port=81))
    clock.now += 1
    agent.step()
    assert len(frozen) == 1  # an ordinary change does not freeze
    clock.now += 300
    agent.step()  # the resync's first batch
    assert len(frozen) == 1
    clock.now += 0.1
    agent.step()  # its last batch
    assert frozen[1:] == [clock.now]
