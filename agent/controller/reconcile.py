"""What the controller decides, as pure functions of plain data (the loop carries it out).

- `reconcile` — one Service: its allocation, the status to write (`plan_status`), the cleanup
  finalizer to add or remove (agent/controller/finalizer.py), which Events go and when, when
  to look at it again, and whether a write is needed at all.
- `adopt` — taking over: an allocator that has recorded what status already says.
- `in_allocation_order` and `run_batch` — which Services a round processes, in what order,
  and where it stops when leadership lapses half-way.
- `update_serving` — the served addresses after the node reports changed or one expired, the
  Services that concerns, and when the next report expires.
- `RetryTimers` — when each Service is due again (pool-exhausted backoff, failed writes).

The allocator and the PoolExhausted limiter are state machines passed in (they do no I/O and
read no clock); time arrives as arguments. Nothing here imports the API client, threads or
the clock; `reconcile` and the others return values, and the loop sends what they say.
"""

from __future__ import annotations

import datetime
import enum
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.controller.allocator import (
    AllocationReason,
    AllocationResult,
    Allocator,
    Reallocation,
    allocation_order,
)
from agent.controller.exhaustion import ExhaustionLimiter
from agent.controller.finalizer import FinalizerChange, owner
from agent.controller.request import ServiceRequest
from agent.controller.servability import SliceSummary, servability
from agent.controller.service_status import (
    ServiceView,
    StatusPlan,
    allocation_events,
    plan_cleared,
    plan_status,
    problem_event,
    serving_events,
)
from agent.kube.events import Event
from agent.kube.node_report import NodeReport, next_expiry, serving_ips
from agent.model.labels import LabelSelector
from agent.model.net import IPAddress, IPFamily
from agent.model.pools import PoolSet

Labels = tuple[tuple[str, str], ...]

REPORT_SLACK = 0.05  # s after a report's expiry before it is checked: it has surely expired then


class Step(enum.StrEnum):
    """What reconciling one Service came to."""

    DEFERRED = "Deferred"  # its status write is in flight: reconcile it again once it completes
    RELEASED = "Released"  # deleted: whatever it held is free
    INVALID = "Invalid"  # it cannot be parsed: a Warning, nothing else
    UP_TO_DATE = "UpToDate"  # status already says what it should: no write
    WRITE = "Write"  # status must change: one write, and its Events once it succeeded


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """One write to a Service — its status patch, its finalizer patch, or both — and what
    goes out once the status patch succeeded.

    `plan` None: status is already right, only the finalizer changes. `finalizer` None: it
    stays as it is. The writer sends an ADD before the status patch (the Service is
    nodelb's before anything is written for it) and a REMOVE after it (the finalizer goes
    only once the cleared status is stored), each guarded by the resourceVersion the one
    before returned (the first by the view's).

    The Events wait for the status patch: a reader who sees one must find the status it
    explains (the Serving=False condition and no address for a refused request, the new
    address for an allocation). `allocated_pools` are counted in nodelb_allocations_total then.
    """

    key: str
    view: ServiceView
    plan: StatusPlan | None
    warnings: tuple[Event, ...]  # about the request or what it cannot serve; through the gate
    events: tuple[Event, ...]  # what the addresses did (IPAllocated, IPReallocated, ...)
    allocated_pools: tuple[str, ...]
    finalizer: FinalizerChange | None = None

    def patch(self, resource_version: str | None = None) -> dict[str, Any]:
        """Return the status merge patch, guarded by `resource_version` (default: the view's,
        which the plan was computed from). Only for a write with a plan."""
        assert self.plan is not None, "a finalizer-only write has no status patch"
        return self.plan.patch(resource_version or self.view.resource_version)


@dataclass(frozen=True, slots=True)
class PoolWarning:
    """A PoolExhausted Warning the rate limiter let through, and its pool (for the metric)."""

    pool: str
    event: Event


@dataclass(frozen=True, slots=True)
class Reconcile:
    """What to do about one Service now; see `reconcile`.

    `warnings` go now, through the EventGate (each repeats at most once per gate window):
    a refused request, and what its addresses cannot serve;
    `pool_warnings` go now as they are (the limiter already spaced them). `retry_at` are the
    times to look at this Service again; `retry_now` the Services waiting on a full pool to
    retry at once, because this one freed an address. `failure` is the reason counted in
    nodelb_allocation_failures_total, None when the Service got its addresses (or is not ours).
    """

    key: str
    step: Step
    result: AllocationResult | None = None
    write: StatusWrite | None = None
    warnings: tuple[Event, ...] = ()
    pool_warnings: tuple[PoolWarning, ...] = ()
    retry_at: tuple[float, ...] = ()
    retry_now: tuple[str, ...] = ()
    failure: AllocationReason | None = None

    @property
    def forgets(self) -> bool:
        """Return True when the Service is gone: drop what is remembered about its Events."""
        return self.step is Step.RELEASED

    @property
    def uses_reallocation(self) -> bool:
        """Return True when the pending reallocation message is used up (or moot: deleted)."""
        return self.write is not None or self.step is Step.RELEASED


def reconcile(
    key: str,
    view: ServiceView | None,
    *,
    allocator: Allocator,
    limiter: ExhaustionLimiter,
    serving: frozenset[IPAddress],
    namespace_labels: Labels = (),
    reallocated: str | None = None,
    writing: bool = False,
    slices: Sequence[SliceSummary] = (),
    now: float,
    wall: datetime.datetime,
) -> Reconcile:
    """Return what to do about Service `key` (`view` None: it was deleted).

    Updates `allocator` (the Service's addresses) and `limiter` (its PoolExhausted backoff).
    `writing`: a status write for it is in flight — nothing is decided (DEFERRED), since a
    second write computed from the same resourceVersion could only fail, and the allocator
    must not move ahead of what status will say; the loop reconciles it again afterwards.
    `reallocated` is the message of an address it lost at takeover (duplicate, outside the
    pools), which turns its next address change into an IPReallocated Warning. `now` is
    monotonic (allocator and backoff), `wall` the time for condition timestamps. `slices`
    are the Service's EndpointSlice summaries: what its addresses can serve
    (agent/controller/servability.py) shows in its conditions and Warnings.

    The cleanup finalizer: a Service that wants a load balancer from nodelb (parsed, ours,
    not being deleted) gets it added by its write if it lacks it, whatever the allocation
    came to; one that does not (being deleted, or no longer ours) has it removed, after its
    status is cleared, when the finalizer is nodelb's (`finalizer.owner`).
    """
    if writing:
        return Reconcile(key, Step.DEFERRED)
    if view is None:
        released = allocator.release(key, now=now)
        limiter.forget(service=key)
        return Reconcile(key, Step.RELEASED, released, retry_now=_freed(released, limiter))
    if view.deleting:
        return _deleting(view, allocator=allocator, limiter=limiter, now=now)
    if view.request is None:
        invalid = problem_event(view, None)
        return Reconcile(key, Step.INVALID, warnings=(invalid,) if invalid else ())
    request = replace(view.request, namespace_labels=namespace_labels)
    result = allocator.allocate(request, now=now)
    retry_now = _freed(result, limiter)
    pool_warnings: tuple[PoolWarning, ...] = ()
    retry_at: tuple[float, ...] = ()
    if result.reason is AllocationReason.POOL_EXHAUSTED:
        pool_warnings, retry_at = _exhausted(view, result, limiter, now)
    else:
        limiter.forget(service=key)
    failure = None
    if not result.allocated and result.reason is not AllocationReason.NOT_OURS:
        failure = result.reason
    problem = problem_event(view, result)
    servable = servability(
        ips=result.ips if result.allocated and request.ours else (),
        ports=request.named_ports,
        source_ranges=request.source_ranges,
        slices=slices,
    )
    warnings = ((problem,) if problem else ()) + serving_events(view, result, servable)
    plan = plan_status(view, request, result, serving_ips=serving, now=wall, servable=servable)
    finalizer = None
    if request.ours:
        finalizer = None if view.has_cleanup_finalizer else FinalizerChange.ADD
    elif view.has_cleanup_finalizer and _owned(view, result):
        # No longer a load balancer nodelb handles: its status is cleared first, then the
        # finalizer goes (a type changed away leaves an ingress nobody serves).
        plan = plan_cleared(view, result.released, clear_all=not view.load_balancer)
        finalizer = FinalizerChange.REMOVE
    write = None
    if plan is not None or finalizer is not None:
        events = (
            tuple(allocation_events(view, result, plan, reallocated=reallocated)) if plan else ()
        )
        allocated = any(e.reason == "IPAllocated" for e in events)
        pools = (result.pools or ("",)) if allocated else ()
        write = StatusWrite(key, view, plan, warnings, events, pools, finalizer)
    return Reconcile(
        key,
        Step.UP_TO_DATE if write is None else Step.WRITE,
        result,
        write=write,
        warnings=warnings if write is None else (),  # with a write, they wait for the write
        pool_warnings=pool_warnings,
        retry_at=retry_at,
        retry_now=retry_now,
        failure=failure,
    )


def _owned(view: ServiceView, result: AllocationResult) -> bool:
    # Whether the cleanup finalizer is nodelb's to remove (and its status nodelb's to clear).
    verdict = owner(
        spec=view.spec_owner,
        our_conditions=view.has_our_conditions,
        released=bool(result.released),
    )
    return verdict.ours


def _deleting(
    view: ServiceView, *, allocator: Allocator, limiter: ExhaustionLimiter, now: float
) -> Reconcile:
    """Return what to do about a Service being deleted (metadata.deletionTimestamp set).

    Its addresses are released at once, as for a deleted one: they are free for others in
    this round, and the agents stop serving them once its cleared status is stored. When it
    is nodelb's, its status is cleared (IPReleased follows the write) and then its finalizer
    removed, which lets the apiserver delete it. Whether it parses does not matter: its
    deletion must not hang on a field nodelb cannot read. No Warning goes to a Service that
    is going away.
    """
    result = allocator.release(view.key, now=now)
    limiter.forget(service=view.key)
    write = None
    if _owned(view, result):
        plan = plan_cleared(view, result.released, clear_all=True)
        finalizer = FinalizerChange.REMOVE if view.has_cleanup_finalizer else None
        if plan is not None or finalizer is not None:
            events = tuple(allocation_events(view, result, plan, reallocated=None)) if plan else ()
            write = StatusWrite(view.key, view, plan, (), events, (), finalizer)
    return Reconcile(
        view.key,
        Step.UP_TO_DATE if write is None else Step.WRITE,
        result,
        write=write,
        retry_now=_freed(result, limiter),
    )


def _freed(result: AllocationResult, limiter: ExhaustionLimiter) -> tuple[str, ...]:
    # An address came free: everyone waiting on a full pool tries now, not after its backoff.
    return tuple(limiter.waiting_services()) if result.released else ()


def _exhausted(
    view: ServiceView, result: AllocationResult, limiter: ExhaustionLimiter, now: float
) -> tuple[tuple[PoolWarning, ...], tuple[float, ...]]:
    warnings: list[PoolWarning] = []
    retries: list[float] = []
    for pool in result.pools or ("",):
        decision = limiter.exhausted(service=view.key, pool=pool, now=now)
        retries.append(decision.retry_at)
        if decision.emit_event:
            message = f"{result.message} (retry {decision.failures})"
            event = Event(view.ref(), "Warning", "PoolExhausted", message)
            warnings.append(PoolWarning(pool, event))
    return tuple(warnings), tuple(retries)


# -- taking over ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Adoption:
    """An allocator that recorded every address in status, and what it refused to keep."""

    allocator: Allocator
    reallocations: tuple[Reallocation, ...]
    keys: frozenset[str]  # every listed Service: each is reconciled next


def adopt(
    views: Iterable[ServiceView],
    *,
    pools: PoolSet,
    namespace_labels: Callable[[str], Labels],
    released: Mapping[IPAddress, float] | None = None,
) -> Adoption:
    """Return the allocator rebuilt from a fresh list of every Service (takeover, new pools).

    `Allocator.record_existing` adopts what status already says, oldest owner first; the
    Services it reports (a duplicate, an address outside every pool or of the wrong family)
    are reallocated when they are reconciled. `released` seeds the reuse order.

    Services being deleted are recorded after every other one: an address one of them still
    shows stays with a live Service that holds it too (unreported: the dying one gives it up
    anyway), and what they alone hold is released when they are reconciled, first in the
    round, so it keeps its place in the reuse order.
    """
    listed = list(views)

    def requests(deleting: bool) -> list[ServiceRequest]:
        return [
            replace(v.request, namespace_labels=namespace_labels(v.namespace))
            for v in listed
            if v.request is not None and v.deleting is deleting
        ]

    allocator = Allocator(pools, released=released)
    moved = allocator.record_existing(requests(deleting=False))
    allocator.record_existing(requests(deleting=True))
    return Adoption(allocator, tuple(moved), frozenset(v.key for v in listed))


# -- a round of work -----------------------------------------------------------------------


def in_allocation_order(views: Mapping[str, ServiceView | None]) -> list[str]:
    """Return keys oldest Service first; deletions first of all, unparseable Services last.

    Deletions — Services gone, then those being deleted — go first so that the addresses
    they free are there for the rest of the round.
    """
    gone = sorted(k for k, v in views.items() if v is None)
    deleting = sorted(k for k, v in views.items() if v is not None and v.deleting)
    present = [v for v in views.values() if v is not None and not v.deleting]
    parsed = allocation_order(v.request for v in present if v.request is not None)
    broken = sorted(v.key for v in present if v.request is None)
    return gone + deleting + [r.key for r in parsed] + broken


class BatchEnd(enum.StrEnum):
    """Why a round of reconciles ended."""

    DONE = "Done"  # every Service was reconciled
    LEADERSHIP_LAPSED = "LeadershipLapsed"  # stopped before a Service: no longer the leader


@dataclass(frozen=True, slots=True)
class Batch:
    """How a round went: the Services reconciled, and those left (to mark dirty again)."""

    end: BatchEnd
    processed: tuple[str, ...]
    remaining: tuple[str, ...]


def run_batch(
    order: Sequence[str], *, leading: Callable[[], bool], process: Callable[[str], None]
) -> Batch:
    """Return how a round went: `process` each key in `order` while `leading()` holds.

    Leadership is checked before every Service, not once per round: a leader cut off from the
    API must stop allocating within its renew deadline however long the round is. The rest of
    the round is left for whoever leads next (this replica again, after a rebuild).
    """
    for i, key in enumerate(order):
        if not leading():
            return Batch(BatchEnd.LEADERSHIP_LAPSED, tuple(order[:i]), tuple(order[i:]))
        process(key)
    return Batch(BatchEnd.DONE, tuple(order), ())


@dataclass(slots=True)
class RetryTimers:
    """When each Service is due to be reconciled again (backoff, failed writes)."""

    _heap: list[tuple[float, str]] = field(default_factory=list)

    def at(self, key: str, when: float) -> None:
        """Reconcile `key` again at `when` (monotonic); earlier timers of it still fire."""
        heapq.heappush(self._heap, (when, key))

    def due(self, now: float) -> set[str]:
        """Return (and forget) the Services whose time has come."""
        keys: set[str] = set()
        while self._heap and self._heap[0][0] <= now:
            keys.add(heapq.heappop(self._heap)[1])
        return keys

    def next_at(self) -> float | None:
        """Return the earliest pending time, None when nothing is pending."""
        return self._heap[0][0] if self._heap else None


# -- serving -------------------------------------------------------------------------------


class ReportRefusal(enum.StrEnum):
    """Why the controller did not take (all of) a node report at its word."""

    MALFORMED = "Malformed"  # unparseable, or its name and holderIdentity disagree
    UNKNOWN_NODE = "UnknownNode"  # no Node of that name exists
    NOT_SELECTED = "NodeNotSelected"  # the Node is outside announce.nodeSelector
    RENEWED_IN_FUTURE = "RenewedInTheFuture"  # renewTime later than now + REPORT_CLOCK_SKEW
    UNALLOCATED_IP = "UnallocatedIP"  # it lists an address the controller did not allocate


REPORT_CLOCK_SKEW = 30.0  # s a node's clock may run ahead of the controller's


@dataclass(frozen=True, slots=True)
class ReportRules:
    """What a node may claim in its report: see `admit_report`.

    `nodes` maps every existing Node to its labels; `selector` is announce.nodeSelector (None:
    every node announces); `max_duration` is the agents' announce.reportLeaseSeconds.
    """

    nodes: Mapping[str, Labels]
    selector: LabelSelector | None
    max_duration: int


@dataclass(frozen=True, slots=True)
class RefusedReport:
    """One report (or part of one) not believed, and why."""

    node: str
    reason: ReportRefusal
    detail: str


def admit_report(
    report: NodeReport,
    *,
    rules: ReportRules,
    allocated: Callable[[IPAddress], bool],
    wall: datetime.datetime,
) -> tuple[NodeReport | None, RefusedReport | None]:
    """Return the part of `report` the controller believes (None: none of it), and why not all.

    A report speaks only for an existing Node that may announce (the selector), only about
    addresses the controller allocated, and for no longer than the agents are configured to
    report for: `expires` is capped at renewTime + `max_duration`, and a renewTime further
    ahead than REPORT_CLOCK_SKEW is refused, so a compromised node cannot keep an address
    Serving long after it stopped. What a node cannot be checked for here (whether it really
    holds the address, has a local endpoint) is the agents' election, not the controller's.
    """

    def refuse(reason: ReportRefusal, detail: str) -> tuple[None, RefusedReport]:
        return None, RefusedReport(report.node, reason, detail)

    if report.problem is not None:
        return refuse(ReportRefusal.MALFORMED, report.problem)
    labels = rules.nodes.get(report.node)
    if labels is None:
        return refuse(ReportRefusal.UNKNOWN_NODE, f"no Node {report.node!r} exists")
    if rules.selector is not None and not rules.selector.matches(dict(labels)):
        return refuse(ReportRefusal.NOT_SELECTED, f"Node {report.node!r} does not announce")
    renewed = report.renewed
    if renewed is not None and renewed > wall + datetime.timedelta(seconds=REPORT_CLOCK_SKEW):
        return refuse(ReportRefusal.RENEWED_IN_FUTURE, f"renewTime {renewed.isoformat()}")
    expires = report.expires
    if renewed is not None and report.duration > rules.max_duration:
        expires = renewed + datetime.timedelta(seconds=rules.max_duration)
    ips = frozenset(ip for ip in report.ips if allocated(ip))
    admitted = replace(report, ips=ips, expires=expires)
    if ips != report.ips:
        stray = ", ".join(sorted(map(str, report.ips - ips)))
        return admitted, RefusedReport(
            report.node, ReportRefusal.UNALLOCATED_IP, f"not allocated: {stray}"
        )
    return admitted, None


@dataclass(frozen=True, slots=True)
class ServingUpdate:
    """The addresses served now, the Services that changes, and when to look again.

    `refused` lists the reports (or the parts of them) that were not believed.
    """

    serving: frozenset[IPAddress]
    services: frozenset[str]  # whose LoadBalancerServing may have changed
    next_check: float | None  # monotonic: when the next report expires (None: none will)
    refused: tuple[RefusedReport, ...] = ()


def update_serving(
    reports: Iterable[NodeReport],
    *,
    serving: frozenset[IPAddress],
    holders_of: Callable[[IPAddress], Iterable[str]],
    rules: ReportRules,
    now: float,
    wall: datetime.datetime,
) -> ServingUpdate:
    """Return the served addresses from the node reports, and what follows from the change.

    Each report counts only for what `admit_report` believes of it. `serving` is what was
    served before; only Services holding an address that started or stopped being served
    are re-evaluated. A report that is not renewed expires on its own, with no watch event
    to say so: `next_check` is when the first live one expires (on the monotonic clock, plus
    REPORT_SLACK), and the loop recomputes then.
    """
    listed: list[NodeReport] = []
    refused: list[RefusedReport] = []
    for report in reports:
        admitted, refusal = admit_report(
            report, rules=rules, allocated=lambda ip: any(holders_of(ip)), wall=wall
        )
        if admitted is not None:
            listed.append(admitted)
        if refusal is not None:
            refused.append(refusal)
    fresh = serving_ips(listed, wall)
    expiry = next_expiry(listed, wall)
    check = None if expiry is None else now + (expiry - wall).total_seconds() + REPORT_SLACK
    services = frozenset(k for ip in fresh ^ serving for k in holders_of(ip))
    return ServingUpdate(fresh, services, check, tuple(refused))


# -- metrics -------------------------------------------------------------------------------


def pool_usage(pools: PoolSet, held: list[IPAddress]) -> list[tuple[str, str, int, int]]:
    """Return (pool, family, size, addresses of `held` in it) for every pool and family."""
    out = []
    for pool in pools.pools:
        for version in sorted(pool.families()):
            family = IPFamily.IPV4 if version == 4 else IPFamily.IPV6
            used = sum(1 for ip in held if ip.version == version and pool.contains(ip))
            out.append((pool.name, family.value, pool.size(version), used))
    return out
