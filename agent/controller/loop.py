"""The allocation controller's loop: watches Services, allocates while it leads, writes status.

The imperative shell around the decisions, which are pure and live elsewhere:
agent/controller/reconcile.py (one Service: allocation, status plan, Events and when they go,
retries; the order of a round and where it stops; takeover; serving and report expiry),
agent/controller/writes.py (one write in flight per Service, and what each outcome leads
to), agent/controller/config.py (reloads and the refused-configuration cache), on top of the
allocator, the conditions and the status planner. This module has the threads, the condition
variable, the reflectors, the writer pool, and the calls: it reads the API through
`ControllerAPI` and the time from an injected `Clock`, hands both to those functions, and
sends what they return. One worker thread makes every decision (`step`), so the allocator
needs no locks; reflector threads only mark keys dirty, writer threads only send patches.

**Becoming leader** (and after a pool reload): the controller reads every Service with a fresh
LIST — not the watch cache, which may lag behind the previous leader's last writes — records
the addresses already in status (`adopt`: the oldest owner keeps a duplicate), then allocates
in creationTimestamp/UID order and writes what changed.

**Writes** are JSON merge patches of status carrying the resourceVersion they were computed
from: a write based on a stale view fails with 409 and the key is retried once the watch
delivers the new version. A write may also add the cleanup finalizer (a metadata patch sent
before the status patch) or remove it (sent after the status patch that cleared what nodelb
wrote); each request is guarded by the resourceVersion the one before returned
(agent/controller/finalizer.py). Right before every write the controller checks it still holds the
Lease within its renew deadline (`LeaderElector.is_leader`), and before every Service of a
round, so a leader cut off from the API stops writing before another may start.

**Waiting Services**: a pool-exhausted Service is retried with backoff and gets rate-limited
PoolExhausted Warnings (agent.controller.exhaustion); whenever an address is released every
waiting Service is retried at once, so it gets the freed address without waiting out its
backoff.

**What addresses can serve**: a watch of EndpointSlices keeps one small summary per slice
(agent/controller/servability.py); a change in a Service's summaries reconciles it.

**Serving**: node report Leases (agent.kube.node_report) say which IPs are held with their
rules in place; a change, or a report expiring, re-evaluates the Services using those IPs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import ConfigError
from agent.config_file import parse_document, read_bytes
from agent.controller import metrics
from agent.controller.allocator import Allocator, freed_addresses, latest_releases
from agent.controller.api import (
    APIError,
    Clock,
    ControllerAPI,
    Patched,
    PatchResult,
    SystemClock,
)
from agent.controller.config import (
    ConfigVerdict,
    ControllerConfig,
    Refusal,
    cluster_addresses,
    config_digest,
    config_verdict,
    parse_controller_config,
    refuse,
)
from agent.controller.exhaustion import ExhaustionLimiter
from agent.controller.finalizer import FinalizerChange, finalizer_patch
from agent.controller.leader import ElectionTiming, LeaderElector
from agent.controller.pool_keeper import PoolKeeper
from agent.controller.pool_objects import PoolObject, PoolVerdictReason, parse_pool_object
from agent.controller.reconcile import (
    BatchEnd,
    Labels,
    Reconcile,
    RefusedReport,
    ReportRefusal,
    ReportRules,
    RetryTimers,
    StatusWrite,
    adopt,
    in_allocation_order,
    pool_usage,
    reconcile,
    run_batch,
    update_serving,
)
from agent.controller.servability import SliceSummary, Unservable, summarize_slice
from agent.controller.service_status import ServiceView, parse_view
from agent.controller.writes import RetryDelays, WriteOutcome, WriteResult, WritesInFlight
from agent.kube import metrics as kube_metrics
from agent.kube.events import Event, EventGate, EventSink, ObjectRef
from agent.kube.node_report import NodeReport, parse_report
from agent.kube.reflector import Reflector
from agent.kube.store import Change, Store
from agent.model.net import IPAddress

log = logging.getLogger(__name__)

LEASE_NAME = "nodelb-controller"
METRICS_PERIOD = 1.0  # seconds between two exports of the pool gauges
MAX_WAIT = 1.0  # seconds the loop sleeps at most with nothing due
SERVING_REASONS = frozenset(r.value for r in Unservable)
EVENT_MESSAGE_MAX = 1000  # characters of a refusal kept in its Event (a long one is cut)
EVENT_ROOM_WAIT = 30.0  # seconds a write waits for room in the Event queue, then goes anyway


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Where the controller runs and how it elects and reloads."""

    namespace: str
    identity: str
    config_path: Path | None
    election: ElectionTiming = field(default_factory=ElectionTiming)
    # The ConfigMap the config file is mounted from (in `namespace`): refusals are Events on it,
    # where the operator who edited it looks (`kubectl describe configmap`, `get events`).
    config_map: str = "nodelb-config"
    reload_period: float = 2.0
    conflict_retry: float = 1.0
    error_retry: float = 5.0
    write_concurrency: int = 16  # Service writes in flight (one per Service at most)


def node_labels(obj: Mapping[str, Any]) -> Labels:
    """Return a Node's labels, sorted (what announce.nodeSelector matches)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def namespace_labels(obj: Mapping[str, Any]) -> Labels:
    """Return a Namespace's labels, sorted (what pool namespace selectors match)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


class Controller:
    """The allocation controller; start with `run(stop)` (blocks until stop is set).

    `writer` runs the status patches (a pool of `write_concurrency` threads by default; tests
    pass one that runs them when told). `event_room(timeout)` is the Event sink's flow
    control (`KubeEventSink.wait_room`): each write waits for room for the Events it will
    cause before it is sent, so a bulk start does not overflow the sink's queue. Tests call
    `step()` instead of `run()` and feed the stores through `on_services` / `on_namespaces` /
    `on_reports`, as the reflectors do.
    """

    def __init__(
        self,
        api: ControllerAPI,
        settings: ControllerSettings,
        *,
        events: EventSink,
        clock: Clock | None = None,
        writer: Executor | None = None,
        event_room: Callable[[float], bool] | None = None,
    ) -> None:
        self._settings = settings
        self._event_room = event_room
        self._api = api
        self._clock = clock or SystemClock()
        self._events = events
        self._delays = RetryDelays(settings.conflict_retry, settings.error_retry)
        self._gate = EventGate()
        self._limiter = ExhaustionLimiter()
        self._cond = threading.Condition()
        self._dirty: set[str] = set()
        self._reports_changed = False
        self._leadership_changed = False
        self._timers = RetryTimers()
        self._report_check_at: float | None = None
        self._writer = writer or ThreadPoolExecutor(
            settings.write_concurrency, thread_name_prefix="write"
        )
        self._writes = WritesInFlight()
        self._completions: list[tuple[StatusWrite, WriteResult]] = []
        self._allocator: Allocator | None = None
        # When each free address was released, as far as this replica knows: what its own
        # allocator released (kept when the allocator is dropped: a reload, a lost Lease) and
        # what the watch showed other leaders release. Seeds the next rebuild's reuse order.
        self._released: dict[IPAddress, float] = {}
        self._reallocated: dict[str, str] = {}
        self._serving: frozenset[IPAddress] = frozenset()
        self._config: ControllerConfig | None = None
        self._config_digest = b""
        self._refused: Refusal | None = None
        self._unready = "waiting for a valid configuration"
        self._next_reload = 0.0
        self._next_metrics = 0.0
        self.services: Store[ServiceView] = Store(self._parse_view)
        self.namespaces: Store[Labels] = Store(namespace_labels)
        self.reports: Store[NodeReport] = Store(parse_report)
        self.slices: Store[SliceSummary] = Store(summarize_slice)
        self._slices_of: dict[str, dict[str, SliceSummary]] = {}  # by Service key, under _cond
        self.nodes: Store[Labels] = Store(node_labels)
        # LoadBalancerIPPool objects: watched only when the file has no `pools:` (run()).
        self.pool_objects: Store[PoolObject] = Store(parse_pool_object)
        self._pools = PoolKeeper()
        self._pools_changed = False
        self._refused_reports: frozenset[RefusedReport] = frozenset()
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
        self._pools_list = watched.pools
        self._reflectors: list[Reflector[Any]] = [
            Reflector(
                name="services",
                list_fn=watched.services,
                store=self.services,
                on_changes=self.on_services,
            ),
            Reflector(
                name="namespaces",
                list_fn=watched.namespaces,
                store=self.namespaces,
                on_changes=self.on_namespaces,
            ),
            Reflector(
                name="reports",
                list_fn=watched.reports,
                store=self.reports,
                on_changes=self.on_reports,
            ),
            Reflector(
                name="endpointslices",
                list_fn=watched.slices,
                store=self.slices,
                on_changes=self.on_slices,
            ),
            Reflector(
                name="nodes",
                list_fn=watched.nodes,
                store=self.nodes,
                on_changes=self.on_reports,  # a report speaks only for a Node that exists
            ),
        ]

    # -- wiring ----------------------------------------------------------------------------

    def _parse_view(self, obj: Any) -> ServiceView:
        cfg = self._config
        lb_class = cfg.agent.lb_class if cfg else "nodelb.io/lb"
        classless = cfg.agent.handle_classless if cfg else True
        return parse_view(obj, lb_class=lb_class, handle_classless=classless)

    def on_services(self, changes: list[Change[ServiceView]]) -> None:
        """Mark the changed Services and note the addresses they freed (reflector thread)."""
        now = self._clock.monotonic()
        freed = {
            ip: now
            for c in changes
            for ip in freed_addresses(
                c.old.request if c.old else None, c.new.request if c.new else None
            )
        }
        with self._cond:
            if freed:
                self._released.update(freed)
        self._mark(c.key for c in changes)

    def on_namespaces(self, changes: list[Change[Labels]]) -> None:
        """Mark the Services of Namespaces whose labels changed (pool selectors may differ)."""
        names = {c.key for c in changes}
        self._mark(k for k in self.services.items() if k.split("/", 1)[0] in names)

    def on_reports(self, changes: list[Change[Any]]) -> None:
        """Note that the node reports, or the Nodes they speak for, changed (reflector thread)."""
        with self._cond:
            self._reports_changed = True
            self._cond.notify()

    def on_slices(self, changes: list[Change[SliceSummary]]) -> None:
        """Index the changed slice summaries by Service and mark those Services (reflector)."""
        keys: set[str] = set()
        with self._cond:
            for c in changes:
                for summary in (c.old, c.new):
                    if summary is not None and summary.service:
                        keys.add(summary.service)
                        self._slices_of.setdefault(summary.service, {}).pop(c.key, None)
                if c.new is not None and c.new.service:
                    self._slices_of[c.new.service][c.key] = c.new
            for key in keys:
                if not self._slices_of.get(key):
                    self._slices_of.pop(key, None)
        self._mark(keys)

    def on_pools(self, changes: list[Change[PoolObject]]) -> None:
        """Note that pool objects changed (reflector thread): resolved at the next step."""
        with self._cond:
            self._pools_changed = True
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
        """Load the config, start watches and the election, and work until `stop` is set.

        Until the file holds a valid configuration the controller stays up and unready
        (`unready_reason` says why), takes no part in the election (a replica that cannot
        allocate must not hold the Lease) and reads the file again every reload period.
        """
        while not stop.is_set() and self._config is None:
            self._load_config()
            if self._config is None:
                stop.wait(self._settings.reload_period)
        if stop.is_set():
            self._writer.shutdown(wait=True, cancel_futures=True)
            return
        self._next_reload = self._clock.monotonic() + self._settings.reload_period
        self._unready = "waiting for the Service, Namespace and report caches to sync"
        if self._config is not None and self._config.pool_objects:
            if self._pools_list is None:
                raise RuntimeError("pool objects configured but the API has no pool list")
            self._reflectors.append(
                Reflector(
                    name="pools",
                    list_fn=self._pools_list,
                    store=self.pool_objects,
                    on_changes=self.on_pools,
                )
            )
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
            self._unready = ""
            self.ready.set()
            while not stop.is_set():
                self._wait()
                if not stop.is_set():
                    self.step()
        finally:
            for r in self._reflectors:
                r.close()
            stop.set()
            with self._cond:
                self._cond.notify_all()
            for t in threads:
                t.join(timeout=10)
            self._writer.shutdown(wait=True, cancel_futures=True)

    def _wait(self) -> None:
        """Sleep until something is marked, changed or completed, or a timer is due."""
        with self._cond:
            if not (
                self._dirty
                or self._pools_changed
                or self._reports_changed
                or self._leadership_changed
                or self._completions
            ):
                self._cond.wait(timeout=max(0.0, min(self._next_wake(), MAX_WAIT)))

    def _next_wake(self) -> float:
        due = [self._next_reload, self._timers.next_at(), self._report_check_at]
        return min(t for t in due if t is not None) - self._clock.monotonic()

    def step(self) -> None:
        """Do one round: what completed, was marked or came due since the last; never waits."""
        with self._cond:
            keys, self._dirty = self._dirty, set()
            reports_changed, self._reports_changed = self._reports_changed, False
            self._leadership_changed = False
            pools_changed, self._pools_changed = self._pools_changed, False
        self._finish_writes()
        now = self._clock.monotonic()
        if now >= self._next_reload:
            self._next_reload = now + self._settings.reload_period
            if self._load_config() and self._allocator is not None:
                # Pools changed: rebuild from the API, keeping the reuse order of what was freed.
                self._drop_allocator()
            pools_changed = True  # the Nodes a pool must not overlap are read with the file
        if pools_changed and self._config is not None and self._config.pool_objects:
            self._resolve_pools()
        if not self.elector.is_leader():
            if self._allocator is not None:
                log.info("not the leader any more; dropping allocation state")
                self._drop_allocator()
            return
        if self._config is None:
            return  # no valid configuration yet: nothing to allocate from
        if self._allocator is None:
            keys |= self._rebuild()
            reports_changed = True
        keys |= self._timers.due(now)
        if self._report_check_at is not None and now >= self._report_check_at:
            reports_changed = True
        if reports_changed:
            keys |= self._update_serving()
        views = {k: self.services.get(k) for k in keys}
        batch = run_batch(
            in_allocation_order(views),
            leading=self.elector.is_leader,
            process=lambda key: self._process(key, views[key]),
        )
        if batch.end is BatchEnd.LEADERSHIP_LAPSED:
            self._mark(batch.remaining)
            return
        self._export_pool_metrics(self._clock.monotonic())

    # -- configuration ---------------------------------------------------------------------

    def unready_reason(self) -> str:
        """Return why the controller is not ready ("" when it is): what /readyz says."""
        return self._unready

    def _load_config(self) -> bool:
        """Return True when a new, valid configuration replaced one in force.

        Never raises: a file that cannot be read or is refused keeps the configuration in
        force (at start: none, and the controller stays unready). What a reload does with what
        it read is `config_verdict`'s and `refuse`'s decision (agent/controller/config.py):
        unchanged content costs nothing, a refusal is reported once (log line, metric, a
        Warning Event on the ConfigMap), and refused content is checked against the Nodes
        again only now and then.
        """
        path = self._settings.config_path
        now = self._clock.monotonic()
        initial = self._config is None
        digest = b""
        try:
            data = read_bytes(path) if path is not None else b"{}"  # no file: defaults
            digest = config_digest(data)
            verdict = config_verdict(
                digest,
                loaded=self._config_digest,
                refused=self._refused,
                initial=initial,
                now=now,
            )
            if verdict is ConfigVerdict.UNCHANGED and self._refused is not None:
                self._refused = None  # the file is back to the configuration in force
                metrics.CONFIG_REFUSED.set(0)
                self._config_event("Normal", "ConfigLoaded", "configuration in force restored")
            if verdict is not ConfigVerdict.CHECK:
                return False
            raw = parse_document(data, path or "the configuration")
            cluster = cluster_addresses(self._api.list_nodes())
            cfg = parse_controller_config(raw, cluster=cluster)
            if self._config is not None and cfg.pool_objects != self._config.pool_objects:
                raise ConfigError(
                    "pools: switching between the file's pools and LoadBalancerIPPool objects "
                    "takes a restart of the controller"
                )
            if self._config is not None and cfg.pool_objects:
                cfg = dataclasses.replace(cfg, pools=self._config.pools)  # resolved in step()
        except ConfigError as exc:
            self._refuse(digest, str(exc), now=now, initial=initial)
            return False
        except APIError as exc:  # could not check it: try again at the next period
            metrics.CONFIG_RELOADS.labels("error").inc()
            log.error("configuration not checked; keeping the previous one: %s", exc)
            if initial:
                self._unready = f"configuration not checked: {exc}"
            return False
        if self._refused is not None:
            self._config_event("Normal", "ConfigLoaded", "configuration loaded")
        self._refused = None
        metrics.CONFIG_REFUSED.set(0)
        changed = cfg != self._config
        self._config, self._config_digest = cfg, digest
        if not changed:
            return False  # the same settings written differently: nothing to rebuild
        metrics.CONFIG_RELOADS.labels("ok").inc()
        pools = ", ".join(p.name for p in cfg.pools.pools) or "none"
        log.info("configuration loaded", extra={"pools": pools})
        return not initial

    def _refuse(self, digest: bytes, message: str, *, now: float, initial: bool) -> None:
        """Remember a refusal; report it (log, metric, Event) unless it was reported already."""
        refused = refuse(self._refused, digest=digest, message=message, now=now)
        self._refused = refused.refusal
        metrics.CONFIG_REFUSED.set(1)
        kept = "not ready until it is fixed" if initial else "keeping the previous one"
        if initial:
            self._unready = f"configuration refused: {message}"
        if refused.report:
            metrics.CONFIG_RELOADS.labels("error").inc()
            log.error("configuration refused; %s: %s", kept, message)
            self._config_event(
                "Warning", "ConfigRefused", f"configuration refused; {kept}: {message}"
            )

    def _config_event(self, kind: str, reason: str, message: str) -> None:
        if len(message) > EVENT_MESSAGE_MAX:
            message = message[: EVENT_MESSAGE_MAX - 3] + "..."
        ref = ObjectRef("ConfigMap", self._settings.namespace, self._settings.config_map)
        self._events.record(Event(ref, kind, reason, message))

    # -- pool objects ----------------------------------------------------------------------

    def _resolve_pools(self) -> None:
        """Resolve the pool objects; a change of the pools in force rebuilds the allocator."""
        assert self._config is not None
        objects = self.pool_objects.items().values()
        pools = self._pools.resolve(objects, self._config.forbidden)
        for reason in PoolVerdictReason:
            if reason is not PoolVerdictReason.VALID:
                count = sum(1 for v in self._pools.verdicts.values() if v.reason is reason)
                metrics.POOL_OBJECTS_REFUSED.labels(reason.value).set(count)
        if self.elector.is_leader():
            for event in self._pools.events():
                log.warning("pool %s: %s", event.ref.name, event.message)
                self._events.record(event)
        if pools == self._config.pools:
            return
        self._config = dataclasses.replace(self._config, pools=pools)
        log.info("pools in force", extra={"pools": ", ".join(p.name for p in pools.pools)})
        if self._allocator is not None:
            self._drop_allocator()  # rebuilt from a fresh LIST at this step, as after a reload

    def _write_pool_status(self) -> None:
        """Write the status of every pool object whose usage or verdict changed (leader)."""
        assert self._allocator is not None
        held = list(self._allocator.allocations())
        now = self._clock.wall().strftime("%Y-%m-%dT%H:%M:%SZ")
        for name, status in self._pools.statuses(held, now=now):
            try:
                self._api.patch_pool_status(name, status)
            except APIError as exc:
                log.warning("pool %s: status not written (%s); retried later", name, exc)
                continue
            self._pools.written(name, status)

    # -- allocation ------------------------------------------------------------------------

    def _rebuild(self) -> set[str]:
        """Rebuild the allocator from a fresh LIST; return every Service key to (re)process."""
        assert self._config is not None
        views = [self._parse_view(obj) for obj in self._api.list_services()]
        with self._cond:
            released = dict(self._released)
        adoption = adopt(
            views,
            pools=self._config.pools,
            namespace_labels=self._labels_of,
            released=released,
        )
        for moved in adoption.reallocations:
            metrics.REALLOCATIONS.labels(moved.reason).inc()
            self._reallocated[moved.service] = moved.message
            log.warning("reallocating", extra={"service": moved.service, "why": moved.message})
        self._allocator = adoption.allocator
        self._limiter = ExhaustionLimiter(self._limiter.backoff)
        self._timers = RetryTimers()
        log.info("allocation state rebuilt", extra={"services": len(views)})
        return set(adoption.keys)

    def _drop_allocator(self) -> None:
        """Forget the allocation state, keeping its release times for the next rebuild."""
        assert self._allocator is not None
        with self._cond:
            self._released = latest_releases(self._released, self._allocator.release_times())
        self._allocator = None

    def _labels_of(self, namespace: str) -> Labels:
        return self.namespaces.get(namespace) or ()

    def _process(self, key: str, view: ServiceView | None) -> None:
        assert self._allocator is not None
        decided = reconcile(
            key,
            view,
            allocator=self._allocator,
            limiter=self._limiter,
            serving=self._serving,
            namespace_labels=self._labels_of(key.split("/", 1)[0]),
            reallocated=self._reallocated.get(key),
            writing=key in self._writes,
            slices=self._slice_summaries(key),
            now=self._clock.monotonic(),
            wall=self._clock.wall(),
        )
        self._writes.note(decided)
        self._carry_out(decided)

    def _slice_summaries(self, key: str) -> tuple[SliceSummary, ...]:
        with self._cond:
            return tuple((self._slices_of.get(key) or {}).values())

    def _carry_out(self, decided: Reconcile) -> None:
        """Send and schedule what `reconcile` decided (worker thread)."""
        key = decided.key
        if decided.forgets:
            self._gate.forget(*key.split("/", 1))
        if decided.uses_reallocation:
            self._reallocated.pop(key, None)
        now = self._clock.monotonic()
        for waiting in decided.retry_now:
            self._timers.at(waiting, now)
        for at in decided.retry_at:
            self._timers.at(key, at)
        if decided.failure is not None:
            metrics.ALLOCATION_FAILURES.labels(decided.failure).inc()
        for warning in decided.pool_warnings:
            metrics.POOL_EXHAUSTED_EVENTS.labels(warning.pool).inc()
            self._events.record(warning.event)
        for event in decided.warnings:
            self._report(event)
        write = decided.write
        if write is not None:
            future = self._writer.submit(self._write, write)
            future.add_done_callback(lambda f: self._completed(write, f))

    def _write(self, write: StatusWrite) -> WriteResult:
        """Send one write's requests in order (writer thread); the leader check is the last
        thing before them. A conflict or error ends the write at that request."""
        if self._event_room is not None and not self._event_room(EVENT_ROOM_WAIT):
            log.debug("Event queue still full; writing anyway", extra={"service": write.key})
        if not self.elector.is_leader():
            return WriteResult(WriteOutcome.NOT_LEADER)
        view = write.view
        version = view.resource_version
        landed = False
        try:
            if write.finalizer is FinalizerChange.ADD:
                patched = self._patch_finalizer(write, version)
                if patched.result is PatchResult.CONFLICT:
                    return WriteResult(WriteOutcome.CONFLICT)
                version = patched.resource_version
            if write.plan is not None:
                patched = self._patch_status(write, version)
                if patched.result is PatchResult.CONFLICT:
                    return WriteResult(WriteOutcome.CONFLICT)
                version, landed = patched.resource_version, True
            if write.finalizer is FinalizerChange.REMOVE:
                patched = self._patch_finalizer(write, version)
                if patched.result is PatchResult.CONFLICT:
                    return WriteResult(WriteOutcome.CONFLICT, landed)
        except APIError as exc:
            log.warning("Service write failed", extra={"service": write.key, "error": str(exc)})
            return WriteResult(WriteOutcome.ERROR, landed)
        return WriteResult(WriteOutcome.OK, landed)

    def _patch_status(self, write: StatusWrite, version: str) -> Patched:
        """Send the status patch guarded by `version`; count how it ended."""
        try:
            patched = self._api.patch_service_status(
                write.view.namespace, write.view.name, write.patch(version)
            )
        except APIError:
            metrics.STATUS_WRITES.labels(WriteOutcome.ERROR.value).inc()
            raise
        metrics.STATUS_WRITES.labels(patched.result.value).inc()
        return patched

    def _patch_finalizer(self, write: StatusWrite, version: str) -> Patched:
        """Send the finalizer patch guarded by `version`; count how it ended."""
        assert write.finalizer is not None
        action = write.finalizer.value
        patch = finalizer_patch(write.view.finalizers, write.finalizer, resource_version=version)
        try:
            patched = self._api.patch_service_metadata(write.view.namespace, write.view.name, patch)
        except APIError:
            metrics.FINALIZER_WRITES.labels(action, WriteOutcome.ERROR.value).inc()
            raise
        metrics.FINALIZER_WRITES.labels(action, patched.result.value).inc()
        return patched

    def _completed(self, write: StatusWrite, future: Future[WriteResult]) -> None:
        if future.cancelled():
            return  # the writer pool shut down with it queued: the process is stopping
        exc = future.exception()
        if exc is not None:
            log.error("Service write crashed", extra={"service": write.key}, exc_info=exc)
        result = WriteResult(WriteOutcome.ERROR) if exc is not None else future.result()
        with self._cond:
            self._completions.append((write, result))
            self._cond.notify()

    def _finish_writes(self) -> None:
        """Carry out what follows the writes that completed (worker thread)."""
        with self._cond:
            done, self._completions = self._completions, []
        now = self._clock.monotonic()
        for write, result in done:
            follow = self._writes.complete(write.key, result, now=now, delays=self._delays)
            if follow.redo:
                self._mark([write.key])
            if follow.retry_at is not None:
                self._timers.at(write.key, follow.retry_at)
            if follow.announce:
                self._announce(write)

    def _announce(self, write: StatusWrite) -> None:
        for event in write.warnings:
            self._report(event)
        for pool in write.allocated_pools:
            metrics.ALLOCATIONS.labels(pool).inc()
        for event in write.events:
            self._events.record(event)

    def _report(self, event: Event | None) -> None:
        if event is None:
            return
        if self._gate.admit(event, self._clock.monotonic()):
            if event.reason in SERVING_REASONS:
                metrics.SERVING_WARNINGS.labels(event.reason).inc()
            self._events.record(event)
        else:
            kube_metrics.EVENTS_REPEATS_SUPPRESSED.labels(event.reason).inc()

    # -- serving ---------------------------------------------------------------------------

    def _update_serving(self) -> frozenset[str]:
        """Recompute the served IPs; return the Services whose Serving may have changed."""
        assert self._allocator is not None and self._config is not None
        announce = self._config.agent.announce
        rules = ReportRules(
            nodes=self.nodes.items(),
            selector=announce.ownership.selector,
            max_duration=announce.report_lease_seconds,
        )
        update = update_serving(
            self.reports.items().values(),
            serving=self._serving,
            holders_of=self._allocator.holders_of,
            rules=rules,
            now=self._clock.monotonic(),
            wall=self._clock.wall(),
        )
        self._serving = update.serving
        self._report_check_at = update.next_check
        self._note_refused_reports(frozenset(update.refused))
        return update.services

    def _note_refused_reports(self, refused: frozenset[RefusedReport]) -> None:
        """Log each newly refused report once and export how many are refused, by reason."""
        for r in sorted(refused - self._refused_reports, key=lambda r: (r.node, r.reason)):
            log.warning("node report of %r not believed (%s): %s", r.node, r.reason, r.detail)
        self._refused_reports = refused
        for reason in ReportRefusal:
            count = sum(1 for r in refused if r.reason is reason)
            metrics.REPORTS_REFUSED.labels(reason.value).set(count)

    def _export_pool_metrics(self, now: float) -> None:
        """Set the pool and unheld-IP gauges, at most once a second: they walk every held
        address, which per iteration would make a burst of N new Services cost O(N²)."""
        if now < self._next_metrics:
            return
        self._next_metrics = now + METRICS_PERIOD
        assert self._allocator is not None and self._config is not None
        if self._config.pool_objects:
            self._write_pool_status()  # usage walks every held address too
        held = list(self._allocator.allocations())
        for pool, family, size, used in pool_usage(self._allocator.pools, held):
            metrics.POOL_ADDRESSES.labels(pool, family).set(size)
            metrics.POOL_IN_USE.labels(pool, family).set(used)
        metrics.UNHELD_IPS.set(sum(1 for ip in held if ip not in self._serving))
