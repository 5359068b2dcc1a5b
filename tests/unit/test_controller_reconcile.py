"""The controller's pure decisions for one Service and for a round (agent/controller/reconcile.py).

Each reconcile case starts from a small world — a two-address pool, an allocator and a
PoolExhausted limiter — lets earlier Services be reconciled and their writes land, then
reconciles one Service and compares everything the decision says: its step, the address it
would write, the Events that wait for the write and those that go at once, retries, and the
failure counted.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.controller.allocator import AllocationReason, Allocator
from agent.controller.exhaustion import ExhaustionLimiter
from agent.controller.finalizer import FINALIZER, FinalizerChange
from agent.controller.reconcile import (
    REPORT_SLACK,
    BatchEnd,
    Reconcile,
    ReportRefusal,
    ReportRules,
    RetryTimers,
    Step,
    adopt,
    in_allocation_order,
    reconcile,
    run_batch,
    update_serving,
)
from agent.controller.service_status import ServiceView, parse_view
from agent.kube.node_report import parse_report, report_body
from agent.model.labels import LabelSelector
from agent.model.net import IPAddress
from agent.model.pools import Forbidden, PoolSet, parse_pools

R = AllocationReason
WALL = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
NOW = 1000.0


def make_pools(raw: list[dict[str, Any]]) -> PoolSet:
    pools = parse_pools(raw, forbidden=Forbidden())
    assert pools is not None
    return pools


POOLS = make_pools([{"name": "p", "addresses": ["198.19.0.1-198.19.0.2"]}])


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def raw_service(
    name: str,
    minute: int = 0,
    *,
    annotations: dict[str, str] | None = None,
    ingress: tuple[str, ...] = (),
    lb_class: str | None = None,
    ports: tuple[Any, ...] = (80,),
) -> dict[str, Any]:
    """Return a raw LoadBalancer Service ns/<name>, created `minute` minutes past ten."""
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "ports": [{"port": p, "protocol": "TCP"} for p in ports],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
    }
    if lb_class:
        spec["loadBalancerClass"] = lb_class
    status = {"loadBalancer": {"ingress": [{"ip": i, "ipMode": "VIP"} for i in ingress]}}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "creationTimestamp": f"2026-12-01T10:{minute:02d}:00Z",
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": status if ingress else {},
    }


def view_of(raw: dict[str, Any]) -> ServiceView:
    return parse_view(raw, lb_class="nodelb.io/lb", handle_classless=True)


def deleting(raw: dict[str, Any]) -> dict[str, Any]:
    """Return `raw` marked as being deleted, held by the cleanup finalizer."""
    raw["metadata"]["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    raw["metadata"]["finalizers"] = [FINALIZER]
    return raw


@dataclass
class World:
    """An allocator and limiter, and the raw Services as the API holds them."""

    allocator: Allocator = field(default_factory=lambda: Allocator(POOLS))
    limiter: ExhaustionLimiter = field(default_factory=ExhaustionLimiter)
    raws: dict[str, dict[str, Any]] = field(default_factory=dict)

    def reconcile(
        self, key: str, *, now: float = NOW, writing: bool = False, reallocated: str | None = None
    ) -> Reconcile:
        raw = self.raws.get(key)
        return reconcile(
            key,
            None if raw is None else view_of(raw),
            allocator=self.allocator,
            limiter=self.limiter,
            serving=frozenset(),
            reallocated=reallocated,
            writing=writing,
            now=now,
            wall=WALL,
        )

    def add(self, raw: dict[str, Any]) -> str:
        key = f"ns/{raw['metadata']['name']}"
        self.raws[key] = raw
        return key

    def serve(self, raw: dict[str, Any]) -> str:
        """Add a Service, reconcile it and let its write land (status says what was planned,
        the finalizer is added or removed)."""
        key = self.add(raw)
        self.land(self.reconcile(key))
        return key

    def land(self, decided: Reconcile) -> None:
        """Apply a decided write to the raw Service, as the apiserver would."""
        write = decided.write
        if write is None:
            return
        raw = self.raws[decided.key]
        if write.plan is not None:
            raw["status"] = {
                "loadBalancer": {"ingress": write.plan.ingress},
                "conditions": write.plan.conditions,
            }
        meta = raw["metadata"]
        if write.finalizer is FinalizerChange.ADD:
            meta["finalizers"] = [*meta.get("finalizers", []), FINALIZER]
        elif write.finalizer is FinalizerChange.REMOVE:
            meta["finalizers"] = [f for f in meta.get("finalizers", []) if f != FINALIZER]

    def delete(self, key: str) -> None:
        """Delete a Service as the apiserver does: mark it while it has finalizers."""
        meta = self.raws[key]["metadata"]
        if meta.get("finalizers"):
            meta["deletionTimestamp"] = "2026-12-01T12:00:00Z"
        else:
            del self.raws[key]


@dataclass(frozen=True, slots=True)
class Expect:
    step: Step
    written: tuple[str, ...] | None = None  # the ingress addresses written; None: no status
    finalizer: FinalizerChange | None = None  # what the write does to the cleanup finalizer
    after_write: tuple[str, ...] = ()  # Event reasons sent once the write succeeded
    at_once: tuple[str, ...] = ()  # Event reasons sent now (through the gate or the limiter)
    retry_at: tuple[float, ...] = ()
    retry_now: tuple[str, ...] = ()
    failure: AllocationReason | None = None


@dataclass(frozen=True, slots=True)
class ReconcileCase:
    prepare: Callable[[World], str]  # builds the world; returns the key to reconcile
    expect: Expect
    writing: bool = False
    reallocated: str | None = None


def _new(world: World) -> str:
    return world.add(raw_service("web"))


def _written_already(world: World) -> str:
    return world.serve(raw_service("web"))


def _in_flight(world: World) -> str:
    return world.add(raw_service("web"))


def _deleted_with_a_waiter(world: World) -> str:
    world.serve(raw_service("a", 1))
    world.serve(raw_service("b", 2))
    world.serve(raw_service("c", 3))  # pool full: c waits
    del world.raws["ns/a"]
    return "ns/a"


def _unparseable(world: World) -> str:
    return world.add(raw_service("web", ports=("eighty",)))


def _outside_the_pool(world: World) -> str:
    return world.add(raw_service("web", annotations={"nodelb.io/load-balancer-ips": "198.18.9.9"}))


def _outside_the_pool_already_said(world: World) -> str:
    return world.serve(
        raw_service("web", annotations={"nodelb.io/load-balancer-ips": "198.18.9.9"})
    )


def _pool_full(world: World) -> str:
    world.serve(raw_service("a", 1))
    world.serve(raw_service("b", 2))
    return world.add(raw_service("c", 3))


def _pool_full_resync_inside_backoff(world: World) -> str:
    key = _pool_full(world)
    world.serve(world.raws[key])  # the first failure: Warning sent, status written
    return key


def _lost_its_address_at_takeover(world: World) -> str:
    return world.add(raw_service("web", ingress=("198.18.9.9",)))


def _other_class_holding_ours(world: World) -> str:
    key = world.serve(raw_service("web"))
    world.raws[key]["spec"]["loadBalancerClass"] = "example.com/other"
    return key


def _served_before_the_finalizer(world: World) -> str:
    key = world.serve(raw_service("web"))
    world.raws[key]["metadata"]["finalizers"] = []  # written by a nodelb without finalizers
    return key


def _deleting_with_a_waiter(world: World) -> str:
    world.serve(raw_service("a", 1))
    world.serve(raw_service("b", 2))
    world.serve(raw_service("c", 3))  # pool full: c waits
    world.delete("ns/a")
    return "ns/a"


def _deleting_status_already_cleared(world: World) -> str:
    key = world.serve(raw_service("web"))
    world.delete(key)
    cleared = world.reconcile(key)
    assert cleared.write is not None and cleared.write.plan is not None
    world.raws[key]["status"] = {"loadBalancer": {}}  # its status landed, the removal did not
    return key


def _deleting_held_by_another_finalizer(world: World) -> str:
    key = world.add(raw_service("web"))
    world.raws[key]["metadata"]["finalizers"] = ["example.com/keep"]
    world.serve(world.raws[key])
    world.raws[key]["metadata"]["finalizers"] = ["example.com/keep"]  # ours never landed
    world.delete(key)
    return key


def _type_changed_to_cluster_ip(world: World) -> str:
    key = world.serve(raw_service("web"))
    world.raws[key]["spec"]["type"] = "ClusterIP"
    return key


def _type_changed_while_no_controller_ran(world: World) -> str:
    key = _type_changed_to_cluster_ip(world)
    world.allocator = Allocator(POOLS)  # a restart: adopt records no ClusterIP Service
    return key


def _other_class_with_its_finalizer(world: World, *, deleting: bool = False) -> str:
    raw = raw_service("web", lb_class="example.com/other", ingress=("203.0.113.9",))
    raw["metadata"]["finalizers"] = [FINALIZER]
    key = world.add(raw)
    if deleting:
        world.delete(key)
    return key


def _other_class_deleting_with_its_finalizer(world: World) -> str:
    return _other_class_with_its_finalizer(world, deleting=True)


def _unparseable_deleting_with_our_finalizer(world: World) -> str:
    key = world.serve(raw_service("web"))
    world.raws[key]["spec"]["ports"] = [{"port": "eighty", "protocol": "TCP"}]
    world.delete(key)
    return key


def _unparseable_with_our_finalizer(world: World) -> str:
    key = world.serve(raw_service("web"))
    world.raws[key]["spec"]["ports"] = [{"port": "eighty", "protocol": "TCP"}]
    return key


ADD, REMOVE = FinalizerChange.ADD, FinalizerChange.REMOVE

RECONCILE_CASES = [
    pytest.param(
        ReconcileCase(_new, Expect(Step.WRITE, ("198.19.0.1",), ADD, after_write=("IPAllocated",))),
        id="a new Service gets the lowest address and one write, which adds the finalizer first",
    ),
    pytest.param(
        ReconcileCase(_written_already, Expect(Step.UP_TO_DATE)),
        id="a Service whose status already says its allocation costs no write and no Event",
    ),
    pytest.param(
        ReconcileCase(_in_flight, Expect(Step.DEFERRED), writing=True),
        id="a Service with a write in flight is deferred: nothing decided, nothing allocated",
    ),
    pytest.param(
        ReconcileCase(_deleted_with_a_waiter, Expect(Step.RELEASED, retry_now=("ns/c",))),
        id="a deleted Service frees its address and every Service waiting on the pool retries now",
    ),
    pytest.param(
        ReconcileCase(_unparseable, Expect(Step.INVALID, at_once=("InvalidService",))),
        id="an unparseable Service gets InvalidService at once and nothing else",
    ),
    pytest.param(
        ReconcileCase(
            _outside_the_pool,
            Expect(
                Step.WRITE,
                (),
                ADD,
                after_write=("IPRequestInvalid",),
                failure=R.REQUESTED_IP_NOT_IN_POOL,
            ),
        ),
        id="a refused request's IPRequestInvalid rides on the status write that explains it",
    ),
    pytest.param(
        ReconcileCase(
            _outside_the_pool_already_said,
            Expect(
                Step.UP_TO_DATE, at_once=("IPRequestInvalid",), failure=R.REQUESTED_IP_NOT_IN_POOL
            ),
        ),
        id="a refused request whose status already says so gets its Warning at once",
    ),
    pytest.param(
        ReconcileCase(
            _pool_full,
            Expect(
                Step.WRITE,
                (),
                ADD,
                at_once=("PoolExhausted",),
                retry_at=(NOW + 5.0,),
                failure=R.POOL_EXHAUSTED,
            ),
        ),
        id="a full pool: PoolExhausted at once, retried after 5 s; the finalizer goes on anyway",
    ),
    pytest.param(
        ReconcileCase(
            _pool_full_resync_inside_backoff,
            Expect(Step.UP_TO_DATE, retry_at=(NOW + 5.0,), failure=R.POOL_EXHAUSTED),
        ),
        id="a resync inside the backoff sends no second PoolExhausted and keeps the retry time",
    ),
    pytest.param(
        ReconcileCase(
            _lost_its_address_at_takeover,
            Expect(Step.WRITE, ("198.19.0.1",), ADD, after_write=("IPReallocated",)),
            reallocated="198.18.9.9 of ns/web lies outside every pool; reallocating",
        ),
        id="a Service that lost its address at takeover moves with IPReallocated after the write",
    ),
    pytest.param(
        ReconcileCase(
            _other_class_holding_ours,
            Expect(Step.WRITE, (), REMOVE, after_write=("IPReleased",)),
        ),
        id="a Service moved to another class loses our address and our finalizer; no failure",
    ),
    pytest.param(
        ReconcileCase(_served_before_the_finalizer, Expect(Step.WRITE, None, ADD)),
        id="a Service served before finalizers gets a finalizer-only write, no status, no Event",
    ),
    pytest.param(
        ReconcileCase(
            _deleting_with_a_waiter,
            Expect(Step.WRITE, (), REMOVE, after_write=("IPReleased",), retry_now=("ns/c",)),
        ),
        id="a Service being deleted frees its address at once, clears status, then the finalizer",
    ),
    pytest.param(
        ReconcileCase(_deleting_status_already_cleared, Expect(Step.WRITE, None, REMOVE)),
        id="a Service being deleted whose cleared status landed: a finalizer-only removal",
    ),
    pytest.param(
        ReconcileCase(
            _deleting_held_by_another_finalizer,
            Expect(Step.WRITE, (), None, after_write=("IPReleased",)),
        ),
        id="a Service being deleted with only another finalizer: released and cleared all the same",
    ),
    pytest.param(
        ReconcileCase(
            _type_changed_to_cluster_ip, Expect(Step.WRITE, (), REMOVE, after_write=("IPReleased",))
        ),
        id="a Service changed to ClusterIP: address released, status cleared, finalizer removed",
    ),
    pytest.param(
        ReconcileCase(
            _type_changed_while_no_controller_ran,
            Expect(Step.WRITE, (), REMOVE, after_write=("IPReleased",)),
        ),
        id="a type change no allocator saw: the ingress nobody serves is cleared all the same",
    ),
    pytest.param(
        ReconcileCase(_other_class_with_its_finalizer, Expect(Step.UP_TO_DATE)),
        id="another class's Service with the finalizer: left alone",
    ),
    pytest.param(
        ReconcileCase(_other_class_deleting_with_its_finalizer, Expect(Step.UP_TO_DATE)),
        id="another class's Service being deleted with the finalizer: left alone",
    ),
    pytest.param(
        ReconcileCase(
            _unparseable_deleting_with_our_finalizer,
            Expect(Step.WRITE, (), REMOVE, after_write=("IPReleased",)),
        ),
        id="an unparseable Service being deleted still has its address and finalizer removed",
    ),
    pytest.param(
        ReconcileCase(
            _unparseable_with_our_finalizer, Expect(Step.INVALID, at_once=("InvalidService",))
        ),
        id="an unparseable Service not being deleted keeps its finalizer",
    ),
]


@pytest.mark.parametrize("case", RECONCILE_CASES)
def test_reconcile(case: ReconcileCase) -> None:
    world = World()
    key = case.prepare(world)
    before = world.allocator.allocations()
    decided = world.reconcile(key, writing=case.writing, reallocated=case.reallocated)
    write = decided.write
    got = Expect(
        step=decided.step,
        written=None
        if write is None or write.plan is None
        else tuple(e["ip"] for e in write.plan.ingress),
        finalizer=None if write is None else write.finalizer,
        after_write=()
        if write is None
        else tuple(e.reason for e in (*write.warnings, *write.events)),
        at_once=tuple(
            e.reason
            for e in (*decided.warnings, *(w.event for w in decided.pool_warnings))
            if e is not None
        ),
        retry_at=decided.retry_at,
        retry_now=decided.retry_now,
        failure=decided.failure,
    )
    assert got == case.expect
    if decided.step is Step.DEFERRED:
        assert world.allocator.allocations() == before  # the allocator did not move ahead
    if write is not None and write.plan is not None:
        assert write.patch()["metadata"] == {"resourceVersion": "7"}  # guarded by the view's
    if write is not None and write.finalizer is REMOVE and write.plan is not None:
        # What a Service being let go of keeps: none of our conditions.
        assert write.plan.conditions == [] and write.plan.ingress == []


def test_an_allocation_write_counts_its_pool_and_a_refusal_counts_none() -> None:
    world = World()
    allocated = world.reconcile(world.add(raw_service("web")))
    refused = world.reconcile(
        world.add(raw_service("bad", annotations={"nodelb.io/load-balancer-ips": "198.18.9.9"}))
    )
    assert allocated.write is not None and allocated.write.allocated_pools == ("p",)
    assert refused.write is not None and refused.write.allocated_pools == ()


def test_only_a_write_or_a_deletion_uses_up_a_pending_reallocation_message() -> None:
    world = World()
    key = world.serve(raw_service("web"))
    unchanged = world.reconcile(key, reallocated="moved")
    deferred = world.reconcile(key, writing=True, reallocated="moved")
    del world.raws[key]
    deleted = world.reconcile(key)
    assert (unchanged.uses_reallocation, deferred.uses_reallocation) == (False, False)
    assert (deleted.uses_reallocation, deleted.forgets) == (True, True)


@dataclass(frozen=True, slots=True)
class OrderCase:
    views: dict[str, ServiceView | None]
    order: list[str]


ORDER_CASES = [
    pytest.param(
        OrderCase(
            {
                "ns/new": view_of(raw_service("new", 9)),
                "ns/gone": None,
                "ns/old": view_of(raw_service("old", 1)),
            },
            ["ns/gone", "ns/old", "ns/new"],
        ),
        id="deletions first (their addresses free up), then oldest creationTimestamp first",
    ),
    pytest.param(
        OrderCase(
            {
                "ns/broken": view_of(raw_service("broken", 0, ports=("eighty",))),
                "ns/ok": view_of(raw_service("ok", 5)),
            },
            ["ns/ok", "ns/broken"],
        ),
        id="unparseable Services last, however old",
    ),
    pytest.param(
        OrderCase(
            {
                "ns/old": view_of(raw_service("old", 1)),
                "ns/dying": view_of(deleting(raw_service("dying", 5))),
                "ns/gone": None,
            },
            ["ns/gone", "ns/dying", "ns/old"],
        ),
        id="Services being deleted right after the deleted ones, before the oldest live one",
    ),
]


@pytest.mark.parametrize("case", ORDER_CASES)
def test_in_allocation_order(case: OrderCase) -> None:
    assert in_allocation_order(case.views) == case.order


@dataclass(frozen=True, slots=True)
class BatchCase:
    leading: tuple[bool, ...]  # what each leadership check answers, in turn
    end: BatchEnd
    processed: tuple[str, ...]
    remaining: tuple[str, ...]


BATCH_CASES = [
    pytest.param(
        BatchCase((True, True, True), BatchEnd.DONE, ("a", "b", "c"), ()),
        id="leading throughout: every Service is reconciled, nothing is left",
    ),
    pytest.param(
        BatchCase((True, False), BatchEnd.LEADERSHIP_LAPSED, ("a",), ("b", "c")),
        id="leadership lapses before the second Service: it and the rest are left for later",
    ),
    pytest.param(
        BatchCase((False,), BatchEnd.LEADERSHIP_LAPSED, (), ("a", "b", "c")),
        id="lapsed before the first: nothing is reconciled",
    ),
]


@pytest.mark.parametrize("case", BATCH_CASES)
def test_run_batch_stops_where_leadership_lapses(case: BatchCase) -> None:
    answers = iter(case.leading)
    done: list[str] = []
    batch = run_batch(["a", "b", "c"], leading=lambda: next(answers), process=done.append)
    assert (batch.end, batch.processed, batch.remaining) == (
        case.end,
        case.processed,
        case.remaining,
    )
    assert tuple(done) == case.processed


def report(node: str, ips: tuple[str, ...], renewed: datetime.datetime, duration: int) -> Any:
    body = report_body(
        node=node, namespace="ns", ips=[ip(i) for i in ips], now=renewed, duration=duration
    )
    return parse_report(body)


@dataclass(frozen=True, slots=True)
class ServingCase:
    reports: tuple[Any, ...]
    before: frozenset[IPAddress]
    serving: frozenset[IPAddress]
    services: frozenset[str]
    next_check: float | None


HOLDERS = {ip("198.19.0.1"): ("ns/a",), ip("198.19.0.2"): ("ns/b", "ns/c")}

SERVING_CASES = [
    pytest.param(
        ServingCase(
            (report("n1", ("198.19.0.1",), WALL, 30),),
            frozenset(),
            frozenset({ip("198.19.0.1")}),
            frozenset({"ns/a"}),
            NOW + 30 + REPORT_SLACK,
        ),
        id="a new report serves its address, re-evaluates its holder, and is checked at expiry",
    ),
    pytest.param(
        ServingCase(
            (report("n1", ("198.19.0.2",), WALL - datetime.timedelta(seconds=31), 30),),
            frozenset({ip("198.19.0.2")}),
            frozenset(),
            frozenset({"ns/b", "ns/c"}),
            None,
        ),
        id="an expired report serves nothing: every holder of its shared address is re-evaluated",
    ),
    pytest.param(
        ServingCase(
            (
                report("n1", ("198.19.0.1",), WALL, 30),
                report("n2", ("198.19.0.2",), WALL - datetime.timedelta(seconds=20), 30),
            ),
            frozenset({ip("198.19.0.1"), ip("198.19.0.2")}),
            frozenset({ip("198.19.0.1"), ip("198.19.0.2")}),
            frozenset(),
            NOW + 10 + REPORT_SLACK,
        ),
        id="nothing changed: no Service re-evaluated; the next check is the earliest expiry",
    ),
]


RULES = ReportRules(nodes={"n1": (), "n2": (("role", "edge"),)}, selector=None, max_duration=30)


@pytest.mark.parametrize("case", SERVING_CASES)
def test_update_serving(case: ServingCase) -> None:
    update = update_serving(
        case.reports,
        serving=case.before,
        holders_of=lambda a: HOLDERS.get(a, ()),
        rules=RULES,
        now=NOW,
        wall=WALL,
    )
    assert (update.serving, update.services, update.next_check, update.refused) == (
        case.serving,
        case.services,
        case.next_check,
        (),
    )


def lease(node: str, ips: tuple[str, ...], **changes: Any) -> dict[str, Any]:
    """Return the raw report Lease of `node`, with `changes` merged into its metadata/spec."""
    body = report_body(node=node, namespace="ns", ips=[ip(i) for i in ips], now=WALL, duration=30)
    for part in ("metadata", "spec"):
        body[part].update(changes.get(part, {}))
    return body


EDGE_ONLY = ReportRules(
    nodes=RULES.nodes,
    selector=LabelSelector(match_labels=frozenset({("role", "edge")})),
    max_duration=30,
)


@dataclass(frozen=True, slots=True)
class AdmitCase:
    """A report as a compromised or confused node writes it, and what the controller keeps."""

    body: dict[str, Any]
    serving: frozenset[IPAddress]  # what update_serving serves from it alone
    reason: ReportRefusal | None
    rules: ReportRules = RULES
    next_check: float | None = None


ONE = frozenset({ip("198.19.0.1")})
ADMIT_CASES = [
    pytest.param(
        AdmitCase(lease("n1", ("198.19.0.1",)), ONE, None, next_check=NOW + 30 + REPORT_SLACK),
        id="a node's own report of an allocated address is believed",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",), spec={"holderIdentity": "n2"}),
            frozenset(),
            ReportRefusal.MALFORMED,
        ),
        id="a Lease named for one node but held by another speaks for nobody",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",), spec={"holderIdentity": None}),
            frozenset(),
            ReportRefusal.MALFORMED,
        ),
        id="a Lease without a holder speaks for nobody",
    ),
    pytest.param(
        AdmitCase(lease("ghost", ("198.19.0.1",)), frozenset(), ReportRefusal.UNKNOWN_NODE),
        id="a report for a node that does not exist is refused",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",)), frozenset(), ReportRefusal.NOT_SELECTED, rules=EDGE_ONLY
        ),
        id="a node outside announce.nodeSelector cannot serve",
    ),
    pytest.param(
        AdmitCase(
            lease("n2", ("198.19.0.1",)),
            ONE,
            None,
            rules=EDGE_ONLY,
            next_check=NOW + 30 + REPORT_SLACK,
        ),
        id="a node inside announce.nodeSelector serves",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1", "198.19.9.9")),
            ONE,
            ReportRefusal.UNALLOCATED_IP,
            next_check=NOW + 30 + REPORT_SLACK,
        ),
        id="an address the controller did not allocate is dropped, the rest believed",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",), spec={"renewTime": "2026-12-01T13:00:00Z"}),
            frozenset(),
            ReportRefusal.RENEWED_IN_FUTURE,
        ),
        id="a renewTime an hour ahead is refused: it would serve long after the node died",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",), spec={"renewTime": "2026-12-01T12:00:20Z"}),
            ONE,
            None,
            next_check=NOW + 50 + REPORT_SLACK,
        ),
        id="a renewTime within the clock skew is believed",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",), spec={"leaseDurationSeconds": 86400}),
            ONE,
            None,
            next_check=NOW + 30 + REPORT_SLACK,
        ),
        id="a day-long lease counts only for reportLeaseSeconds",
    ),
    pytest.param(
        AdmitCase(
            lease("n1", ("198.19.0.1",), spec={"leaseDurationSeconds": "30"}), frozenset(), None
        ),
        id="a duration that is not a number makes the report expire at once",
    ),
]


@pytest.mark.parametrize("case", ADMIT_CASES)
def test_update_serving_believes_only_what_the_node_may_claim(case: AdmitCase) -> None:
    update = update_serving(
        [parse_report(case.body)],
        serving=frozenset(),
        holders_of=lambda a: HOLDERS.get(a, ()),
        rules=case.rules,
        now=NOW,
        wall=WALL,
    )
    assert update.serving == case.serving
    assert update.next_check == case.next_check
    assert [r.reason for r in update.refused] == ([case.reason] if case.reason else [])
    assert all(r.detail for r in update.refused)


def test_adopt_keeps_the_oldest_owner_of_a_duplicate_and_lists_every_service() -> None:
    views = [
        view_of(raw_service("young", 5, ingress=("198.19.0.1",))),
        view_of(raw_service("old", 1, ingress=("198.19.0.1",))),
        view_of(raw_service("broken", 0, ports=("eighty",))),
    ]
    adoption = adopt(views, pools=POOLS, namespace_labels=lambda ns: ())
    assert adoption.allocator.holders_of(ip("198.19.0.1")) == ("ns/old",)
    assert [(m.service, m.reason) for m in adoption.reallocations] == [
        ("ns/young", R.DUPLICATE_ADDRESS)
    ]
    assert adoption.keys == {"ns/young", "ns/old", "ns/broken"}


def test_adopt_leaves_an_address_to_a_live_service_over_an_older_one_being_deleted() -> None:
    views = [
        view_of(deleting(raw_service("dying", 1, ingress=("198.19.0.1",)))),
        view_of(raw_service("live", 5, ingress=("198.19.0.1",))),
    ]
    adoption = adopt(views, pools=POOLS, namespace_labels=lambda ns: ())
    assert adoption.allocator.holders_of(ip("198.19.0.1")) == ("ns/live",)
    assert adoption.allocator.ips_of("ns/dying") == ()
    assert adoption.reallocations == ()  # the live one is not moved, the dying one not reported
    assert adoption.keys == {"ns/dying", "ns/live"}


def test_adopt_records_what_a_service_being_deleted_alone_holds() -> None:
    views = [view_of(deleting(raw_service("dying", 1, ingress=("198.19.0.2",))))]
    adoption = adopt(views, pools=POOLS, namespace_labels=lambda ns: ())
    assert adoption.allocator.ips_of("ns/dying") == (ip("198.19.0.2"),)
    released = adoption.allocator.release("ns/dying", now=NOW)
    assert released.released == (ip("198.19.0.2"),)
    assert adoption.allocator.release_times() == {ip("198.19.0.2"): NOW}


def test_retry_timers_fire_once_in_time_order() -> None:
    timers = RetryTimers()
    timers.at("ns/b", 20.0)
    timers.at("ns/a", 10.0)
    timers.at("ns/a", 30.0)
    assert timers.next_at() == 10.0
    assert timers.due(9.9) == set()
    assert timers.due(20.0) == {"ns/a", "ns/b"}
    assert timers.next_at() == 30.0
    assert timers.due(100.0) == {"ns/a"}
    assert timers.next_at() is None
