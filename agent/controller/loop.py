"""The allocation controller: watches Services, allocates while it leads, writes status.

The shell around the pure allocator (allocator.py), the conditions (conditions.py) and the
status planner (service_status.py). One worker thread makes every decision, so the
allocator needs no locks; reflector threads only mark keys dirty.

**Becoming leader** (and after a pool reload): the controller reads every Service with a fresh
LIST — not the watch cache, which may lag behind the previous leader's last writes — records
the addresses already in status (`Allocator.record_existing`: oldest owner keeps a duplicate),
then allocates in creationTimestamp/UID order and writes what changed.

**Writes** are JSON merge patches of status carrying the resourceVersion they were computed
from: a write based on a stale view fails with 409 and the key is retried once the watch
delivers the new version. Before every write the controller checks it still holds the Lease
within its renew deadline (`LeaderElector.is_leader`), so a leader cut off from the API stops
writing before another may start.

**Waiting Services**: a pool-exhausted Service is retried with backoff and gets rate-limited
PoolExhausted Warnings (agent.controller.exhaustion); whenever an address is released every
waiting Service is retried at once, so it gets the freed address without waiting out its
backoff.

**Serving**: node report Leases (agent.kube.node_report) say which IPs are held with their
rules in place; a change, or a report expiring, re-evaluates the Services using those IPs.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from agent.config import ConfigError
from agent.controller import metrics
from agent.controller.allocator import (
    AllocationReason,
    AllocationResult,
    Allocator,
)
from agent.controller.api import APIError, Clock, ControllerAPI, PatchResult, SystemClock
from agent.controller.config import (
    REFUSED_RECHECK,
    ControllerConfig,
    Refusal,
    cluster_addresses,
    parse_controller_config,
    read_document,
)
from agent.controller.exhaustion import ExhaustionLimiter
from agent.controller.leader import ElectionTiming, LeaderElector
from agent.controller.reconcile import in_allocation_order, pool_usage
from agent.controller.request import ServiceRequest
from agent.controller.service_status import (
    ServiceView,
    StatusPlan,
    allocation_events,
    parse_view,
    plan_status,
    problem_event,
)
from agent.controller.writes import WriteOutcome
from agent.kube.events import Event, EventGate, EventSink
from agent.kube.node_report import (
    NodeReport,
    next_expiry,
    parse_report,
    serving_ips,
)
from agent.kube.reflector import Reflector
from agent.kube.store import Change, Store
from agent.model.net import IPAddress

log = logging.getLogger(__name__)

LEASE_NAME = "nodelb-controller"
METRICS_PERIOD = 1.0  # seconds between two exports of the pool gauges


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Where the controller runs and how it elects and reloads."""

    namespace: str
    identity: str
    config_path: Path | None
    election: ElectionTiming = field(default_factory=ElectionTiming)
    reload_period: float = 2.0
    conflict_retry: float = 1.0
    error_retry: float = 5.0
    write_concurrency: int = 4  # status patches in flight (one per Service at most)


@dataclass(frozen=True, slots=True)
class _Write:
    key: str
    view: ServiceView
    result: AllocationResult
    plan: StatusPlan
    reallocated: str | None
    problem: Event | None  # the Warning about the request, sent once this write succeeded


def namespace_labels(obj: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Return a Namespace's labels, sorted (what pool namespace selectors match)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


class Controller:
    """The allocation controller; start with `run(stop)` (blocks until stop is set)."""

    def __init__(
        self,
        api: ControllerAPI,
        settings: ControllerSettings,
        *,
        events: EventSink,
        clock: Clock | None = None,
    ) -> None:
        self._settings = settings
        self._api = api
        self._clock = clock or SystemClock()
        self._events = events
        self._gate = EventGate()
        self._limiter = ExhaustionLimiter()
        self._cond = threading.Condition()
        self._dirty: set[str] = set()
        self._reports_changed = False
        self._leadership_changed = False
        self._timers: list[tuple[float, str]] = []
        self._writer = ThreadPoolExecutor(settings.write_concurrency, thread_name_prefix="write")
        self._inflight: set[str] = set()
        self._deferred: set[str] = set()
        self._completions: list[tuple[_Write, WriteOutcome]] = []
        self._allocator: Allocator | None = None
        self._released: dict[IPAddress, float] = {}
        self._reallocated: dict[str, str] = {}
        self._serving: frozenset[IPAddress] = frozenset()
        self._config: ControllerConfig | None = None
        self._config_digest = b""
        self._refused: Refusal | None = None
        self._next_reload = 0.0
        self._next_metrics = 0.0
        self.services: Store[ServiceView] = Store(self._parse_view)
        self.namespaces: Store[tuple[tuple[str, str], ...]] = Store(namespace_labels)
        self.reports: Store[NodeReport] = Store(parse_report)
        self.ready = threading.Event()
        self.elector = LeaderElector(
            api,
            namespace=settings.namespace,
            name=LEASE_NAME,
            identity=settings.identity,
            timing=settings.election,
            on_change=self._on_leadership,
            clock=self._clock,
        )
        watched = api.watched(report_namespace=settings.namespace)
        self._reflectors: list[Reflector[Any]] = [
            Reflector(
                name="services",
                list_fn=watched.services,
                store=self.services,
                on_changes=self._on_services,
            ),
            Reflector(
                name="namespaces",
                list_fn=watched.namespaces,
                store=self.namespaces,
                on_changes=self._on_namespaces,
            ),
            Reflector(
                name="reports",
                list_fn=watched.reports,
                store=self.reports,
                on_changes=self._on_reports,
            ),
        ]

    # -- wiring ----------------------------------------------------------------------------

    def _parse_view(self, obj: Any) -> ServiceView:
        cfg = self._config
        lb_class = cfg.agent.lb_class if cfg else "nodelb.io/lb"
        classless = cfg.agent.handle_classless if cfg else True
        return parse_view(obj, lb_class=lb_class, handle_classless=classless)

    def _on_services(self, changes: list[Change[ServiceView]]) -> None:
        self._mark(c.key for c in changes)

    def _on_namespaces(self, changes: list[Change[tuple[tuple[str, str], ...]]]) -> None:
        names = {c.key for c in changes}
        self._mark(k for k in self.services.items() if k.split("/", 1)[0] in names)

    def _on_reports(self, changes: list[Change[NodeReport]]) -> None:
        with self._cond:
            self._reports_changed = True
            self._cond.notify()

    def _on_leadership(self, leading: bool) -> None:
        metrics.LEADER.set(1 if leading else 0)
        with self._cond:
            self._leadership_changed = True
            self._cond.notify()

    def _mark(self, keys: Iterable[str]) -> None:
        with self._cond:
            self._dirty.update(keys)
            self._cond.notify()

    # -- loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Load the config, start watches and the election, and work until `stop` is set."""
        self._load_config(initial=True)
        threads = [
            threading.Thread(target=r.run, args=(stop,), name=f"watch-{r.name}", daemon=True)
            for r in self._reflectors
        ]
        threads.append(
            threading.Thread(target=self.elector.run, args=(stop,), name="leader", daemon=True)
        )
        for t in threads:
            t.start()
        try:
            while not stop.is_set() and not all(r.synced.is_set() for r in self._reflectors):
                stop.wait(0.05)
            self.ready.set()
            while not stop.is_set():
                self._iterate(stop)
        finally:
            for r in self._reflectors:
                r.close()
            stop.set()
            with self._cond:
                self._cond.notify_all()
            for t in threads:
                t.join(timeout=10)
            self._writer.shutdown(wait=True, cancel_futures=True)

    def _iterate(self, stop: threading.Event) -> None:
        with self._cond:
            if not (
                self._dirty
                or self._reports_changed
                or self._leadership_changed
                or self._completions
            ):
                self._cond.wait(timeout=max(0.0, min(self._next_wake(), 1.0)))
            keys, self._dirty = self._dirty, set()
            reports_changed, self._reports_changed = self._reports_changed, False
            self._leadership_changed = False
        if stop.is_set():
            return
        self._finish_writes()
        now = self._clock.monotonic()
        if now >= self._next_reload:
            self._next_reload = now + self._settings.reload_period
            if self._load_config(initial=False):
                self._allocator = None  # pools changed: rebuild from the API
        if not self.elector.is_leader():
            if self._allocator is not None:
                log.info("not the leader any more; dropping allocation state")
                self._allocator = None
            return
        if self._config is None or self._config.pools is None:
            return  # pools unset: nodelb does not allocate
        if self._allocator is None:
            keys = set(self._rebuild())
            reports_changed = True
        due = self._due_timers(now)
        if _REPORTS in due:
            due.discard(_REPORTS)
            reports_changed = True
        if reports_changed:
            keys |= self._serving_changed()
        keys |= due
        views = {k: self.services.get(k) for k in keys}
        for key in in_allocation_order(views):
            if not self.elector.is_leader():
                with self._cond:
                    self._dirty.update(keys)
                return
            self._process(key, views[key])
        self._export_pool_metrics(self._clock.monotonic())

    def _next_wake(self) -> float:
        now = self._clock.monotonic()
        due = [self._timers[0][0]] if self._timers else []
        due.append(self._next_reload)
        return min(due) - now

    def _due_timers(self, now: float) -> set[str]:
        keys: set[str] = set()
        while self._timers and self._timers[0][0] <= now:
            keys.add(heapq.heappop(self._timers)[1])
        return keys

    def _retry(self, key: str, at: float) -> None:
        heapq.heappush(self._timers, (at, key))

    # -- configuration ---------------------------------------------------------------------

    def _load_config(self, *, initial: bool) -> bool:
        """Return True when a new, valid configuration was loaded (keeps the old on error).

        A refused file is reported (log line, `nodelb_config_reloads_total{result="error"}`)
        once per distinct refusal, not at every reload period, and the same refused content is
        checked against the Nodes again only every REFUSED_RECHECK seconds: each check lists
        every Node, which a large cluster should not pay every 2 s for a file nobody changed.
        """
        path = self._settings.config_path
        now = self._clock.monotonic()
        digest = b""
        try:
            raw = read_document(path) if path is not None else {}
            digest = hashlib.sha256(orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)).digest()
            if digest == self._config_digest and not initial:
                return False
            refused = self._refused
            if refused is not None and refused.digest == digest and now < refused.recheck_at:
                return False
            cluster = cluster_addresses(self._api.list_nodes())
            cfg = parse_controller_config(raw, cluster=cluster)
        except ConfigError as exc:
            self._refuse(Refusal(digest, str(exc), now + REFUSED_RECHECK))
            if initial and self._config is None:
                raise
            return False
        except APIError as exc:  # could not check it: try again at the next period
            metrics.CONFIG_RELOADS.labels("error").inc()
            log.error("configuration not checked; keeping the previous one: %s", exc)
            if initial and self._config is None:
                raise
            return False
        self._refused = None
        self._config, self._config_digest = cfg, digest
        metrics.CONFIG_RELOADS.labels("ok").inc()
        pools = "unset" if cfg.pools is None else ", ".join(p.name for p in cfg.pools.pools)
        log.info("configuration loaded", extra={"pools": pools})
        return not initial

    def _refuse(self, refusal: Refusal) -> None:
        last = self._refused
        self._refused = refusal
        if last is not None and (last.digest, last.message) == (refusal.digest, refusal.message):
            return  # already reported
        metrics.CONFIG_RELOADS.labels("error").inc()
        log.error("configuration refused; keeping the previous one: %s", refusal.message)

    # -- allocation ------------------------------------------------------------------------

    def _rebuild(self) -> list[str]:
        """Rebuild the allocator from a fresh LIST; return every Service key to (re)process."""
        assert self._config is not None and self._config.pools is not None
        raw = self._api.list_services()
        views = [self._parse_view(obj) for obj in raw]
        requests = [self._with_namespace(v) for v in views if v.request is not None]
        allocator = Allocator(self._config.pools, released=self._released)
        for moved in allocator.record_existing(requests):
            metrics.REALLOCATIONS.labels(moved.reason).inc()
            self._reallocated[moved.service] = moved.message
            log.warning("reallocating", extra={"service": moved.service, "why": moved.message})
        self._allocator = allocator
        self._limiter = ExhaustionLimiter(self._limiter.backoff)
        self._timers = []
        log.info("allocation state rebuilt", extra={"services": len(views)})
        return [v.key for v in views]

    def _with_namespace(self, view: ServiceView) -> ServiceRequest:
        assert view.request is not None
        labels = self.namespaces.get(view.namespace) or ()
        return replace(view.request, namespace_labels=labels)

    def _process(self, key: str, view: ServiceView | None) -> None:
        assert self._allocator is not None
        if key in self._inflight:
            self._deferred.add(key)  # one write per Service at a time; redo it afterwards
            return
        now = self._clock.monotonic()
        if view is None:
            result = self._allocator.release(key, now=now)
            self._limiter.forget(service=key)
            self._gate.forget(*key.split("/", 1))
            self._reallocated.pop(key, None)
            if result.released:
                self._retry_waiting()
            return
        if view.request is None:
            self._report(problem_event(view, None))
            return
        request = self._with_namespace(view)
        result = self._allocator.allocate(request, now=now)
        if result.released:
            self._retry_waiting()
        if result.reason is AllocationReason.POOL_EXHAUSTED:
            self._exhausted(view, result.pools, result.message, now)
        else:
            self._limiter.forget(service=key)
        if not result.allocated and result.reason is not AllocationReason.NOT_OURS:
            metrics.ALLOCATION_FAILURES.labels(result.reason).inc()
        problem = problem_event(view, result)
        plan = plan_status(
            view,
            request,
            result,
            serving_ips=self._serving,
            now=self._clock.wall(),
        )
        if plan is None:
            self._report(problem)  # the status already says it
            return
        # The Warning waits for the write: a reader who sees it must find the status (the
        # Serving=False condition, no address) that it explains.
        self._inflight.add(key)
        write = _Write(key, view, result, plan, self._reallocated.pop(key, None), problem)
        future = self._writer.submit(self._write, write)
        future.add_done_callback(lambda f: self._completed(write, f))

    def _write(self, write: _Write) -> WriteOutcome:
        """Send one status patch (writer thread); the leader check is the last thing before it."""
        if not self.elector.is_leader():
            return WriteOutcome.NOT_LEADER
        try:
            result = self._api.patch_service_status(
                write.view.namespace, write.view.name, write.plan.patch(write.view.resource_version)
            )
        except APIError as exc:
            log.warning("status write failed", extra={"service": write.key, "error": str(exc)})
            return WriteOutcome.ERROR
        return WriteOutcome.CONFLICT if result is PatchResult.CONFLICT else WriteOutcome.OK

    def _completed(self, write: _Write, future: Future[WriteOutcome]) -> None:
        exc = future.exception()
        outcome = WriteOutcome.ERROR if exc is not None else future.result()
        with self._cond:
            self._completions.append((write, outcome))
            self._cond.notify()

    def _finish_writes(self) -> None:
        """Account for the writes that completed (worker thread: all state changes happen here)."""
        with self._cond:
            done, self._completions = self._completions, []
        now = self._clock.monotonic()
        for write, outcome in done:
            self._inflight.discard(write.key)
            if write.key in self._deferred:
                self._deferred.discard(write.key)
                self._mark([write.key])
            if outcome is WriteOutcome.NOT_LEADER:
                self._mark([write.key])
                continue
            metrics.STATUS_WRITES.labels(outcome.value).inc()
            if outcome is WriteOutcome.CONFLICT:
                # The watch brings the new version (or the deletion); retry in case it did not.
                self._retry(write.key, now + self._settings.conflict_retry)
            elif outcome is WriteOutcome.ERROR:
                self._retry(write.key, now + self._settings.error_retry)
            else:
                self._announce(write)

    def _announce(self, write: _Write) -> None:
        self._report(write.problem)
        for event in allocation_events(
            write.view, write.result, write.plan, reallocated=write.reallocated
        ):
            if event.reason == "IPAllocated":
                for pool in write.result.pools or ("",):
                    metrics.ALLOCATIONS.labels(pool).inc()
            self._events.record(event)

    def _exhausted(
        self, view: ServiceView, pools: tuple[str, ...], message: str, now: float
    ) -> None:
        for pool in pools or ("",):
            decision = self._limiter.exhausted(service=view.key, pool=pool, now=now)
            self._retry(view.key, decision.retry_at)
            if decision.emit_event:
                metrics.POOL_EXHAUSTED_EVENTS.labels(pool).inc()
                self._events.record(
                    _event(
                        view, "Warning", "PoolExhausted", f"{message} (retry {decision.failures})"
                    )
                )

    def _retry_waiting(self) -> None:
        """An address was freed: retry every Service waiting on a full pool now."""
        now = self._clock.monotonic()
        for key in self._limiter.waiting_services():
            self._retry(key, now)

    def _report(self, event: Event | None) -> None:
        if event is not None and self._gate.admit(event, self._clock.monotonic()):
            self._events.record(event)

    # -- serving ---------------------------------------------------------------------------

    def _serving_changed(self) -> set[str]:
        """Recompute the served IPs; return the Services whose Serving may have changed."""
        assert self._allocator is not None
        wall = self._clock.wall()
        reports = list(self.reports.items().values())
        serving = serving_ips(reports, wall)
        changed = serving ^ self._serving
        self._serving = serving
        expiry = next_expiry(reports, wall)
        if expiry is not None:
            delay = (expiry - wall).total_seconds()
            self._schedule_report_check(self._clock.monotonic() + delay + 0.05)
        keys: set[str] = set()
        for ip in changed:
            keys.update(self._allocator.holders_of(ip))
        return keys

    def _schedule_report_check(self, at: float) -> None:
        self._retry(_REPORTS, at)

    def _export_pool_metrics(self, now: float) -> None:
        """Set the pool and unheld-IP gauges, at most once a second: they walk every held
        address, which per iteration would make a burst of N new Services cost O(N²)."""
        if now < self._next_metrics:
            return
        self._next_metrics = now + METRICS_PERIOD
        assert self._allocator is not None
        held = list(self._allocator.allocations())
        for pool, family, size, used in pool_usage(self._allocator.pools, held):
            metrics.POOL_ADDRESSES.labels(pool, family).set(size)
            metrics.POOL_IN_USE.labels(pool, family).set(used)
        metrics.UNHELD_IPS.set(sum(1 for ip in held if ip not in self._serving))


_REPORTS = "\x00reports"  # a timer key that re-checks report expiry instead of a Service


def _event(view: ServiceView, type_: str, reason: str, message: str) -> Event:
    return Event(view.ref(), type_, reason, message)
