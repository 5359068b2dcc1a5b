"""The agent's main loop: reflectors feed the node's ClusterState, and the dataplane is synced on
the coalescing schedule.

The imperative shell around agent/node/cluster_state.py (what this node must program) and
agent/node/schedule.py (when): it owns the threads (one reflector per resource, the drift
check), the lock that protects the state, the clock, and the calls into the dataplane, the
announcer, the Event sink, the health check listeners and the metrics. It decides nothing.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from kubernetes import client

from agent.announce.inputs import OwnershipInput
from agent.announce.vrrp.control import InstanceStatus
from agent.config import AgentConfig
from agent.kube import metrics as kube_metrics
from agent.kube.events import Event, EventGate, EventSink, ObjectRef
from agent.kube.node_report import PeerReport, report_sources
from agent.kube.reflector import ListFn, Reflector
from agent.kube.store import Store
from agent.model.desired_state import DesiredState, FrontendKey
from agent.model.net import IPAddress
from agent.model.node import Node
from agent.model.tunnel import SpreadState
from agent.node import metrics
from agent.node.cache import new_stores
from agent.node.cluster_state import (
    SWEEP_BATCH,
    Changes,
    ClusterState,
    Dirty,
    Outcome,
    ProblemReport,
)
from agent.node.health_answers import HealthAnswer
from agent.node.pools import pool_of_object
from agent.node.schedule import SyncSchedule
from agent.node.service_frontends import Problem
from agent.node.status_document import status_document, to_document

log = logging.getLogger(__name__)


class DataplaneLike(Protocol):
    """What the loop needs from agent/dataplane/applier.py."""

    def sync(
        self,
        desired: DesiredState,
        *,
        full: bool = False,
        changed: Iterable[FrontendKey] | None = None,
    ) -> Any: ...

    def check_drift(self) -> bool: ...


class SpreadLike(Protocol):
    """What the loop needs of agent/dataplane/spread_plane.py's SpreadPlane."""

    def sync(self, state: SpreadState | None) -> bool: ...


class AnnouncerLike(Protocol):
    """What the loop needs of agent.announce.announcer.Announcer."""

    def submit(self, inp: OwnershipInput, nodes: tuple[Node, ...]) -> None: ...

    def held(self) -> frozenset[IPAddress]: ...

    def report(self, programmed: frozenset[IPAddress]) -> None: ...

    def set_reported_sources(self, reported: Mapping[str, PeerReport]) -> None: ...

    def instances(self) -> tuple[InstanceStatus, ...]: ...


@dataclass(frozen=True, slots=True)
class ListFns:
    """The official client's list calls for the three watched resources."""

    services: ListFn
    slices: ListFn
    nodes: ListFn
    reports: ListFn | None = None  # node report Leases (the announcer's peers), when announcing
    pools: ListFn | None = None  # LoadBalancerIPPool objects, when the config has no pools:


def list_fns(api: Any) -> ListFns:
    """Return the raw list/watch calls of an ApiClient (called with _preload_content=False)."""
    core = client.CoreV1Api(api)
    discovery = client.DiscoveryV1Api(api)
    return ListFns(
        services=cast(ListFn, core.list_service_for_all_namespaces),
        slices=cast(ListFn, discovery.list_endpoint_slice_for_all_namespaces),
        nodes=cast(ListFn, core.list_node),
        pools=cast(
            ListFn,
            functools.partial(
                client.CustomObjectsApi(api).list_cluster_custom_object,
                "nodelb.io",
                "v1alpha1",
                "loadbalancerippools",
            ),
        ),
    )


@dataclass
class AgentStatus:
    """What `nodelb status` and /readyz report about the loop."""

    caches_synced: bool = False
    first_sync_done: bool = False
    last_sync_time: float | None = None
    last_sync_ok: bool | None = None
    last_error: str = ""
    last_sync_duration: float = 0.0
    last_sync_full: bool = True
    frontends: int = 0
    services: int = 0
    problems: dict[str, tuple[Problem, ...]] = field(default_factory=dict)


class Agent:
    """Keeps this node's nftables table equal to what the cluster asks of it."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        dataplane: DataplaneLike,
        events: EventSink,
        lists: ListFns,
        clock: Callable[[], float] = time.monotonic,
        on_problem: Callable[[Problem], None] | None = None,
        on_health: Callable[[dict[int, HealthAnswer]], list[str]] | None = None,
        announcer: AnnouncerLike | None = None,
        freeze_heap: bool = False,
        sweep_batch: int = SWEEP_BATCH,
        api_addresses: tuple[IPAddress, ...] = (),
        spread: SpreadLike | None = None,
    ) -> None:
        self.cfg = cfg
        self._spread = spread
        self._last_spread: SpreadState | None = None
        self._dataplane = dataplane
        self._events = events
        self._lists = lists
        self._clock = clock
        self._on_problem = on_problem or (lambda p: None)
        self._on_health = on_health
        self._announcer = announcer
        self._freeze_heap = freeze_heap
        self._freeze_due = False  # a periodic resync finished: freeze after its last sync
        self._state = ClusterState(
            cfg,
            announcing=announcer is not None,
            health_checks=on_health is not None,
            sweep_batch=sweep_batch,
            api_addresses=api_addresses,
        )
        self._dirty: set[str] = set()  # Services to recompute at the next step
        self._everything = True  # the next step recomputes every Service
        self._wanted = False  # a sync was asked for since the last recompute
        self._cond = threading.Condition()
        self._gate = EventGate()
        s = cfg.sync
        self._schedule = SyncSchedule(
            min_interval=s.min_interval,
            full_resync_period=s.full_resync_period,
            drift_check_period=s.drift_check_period,
        )
        self.status = AgentStatus()
        self.ready = threading.Event()
        self._reflectors: list[Reflector[Any]] = []
        self._drift_thread: threading.Thread | None = None
        self._last_desired: DesiredState | None = None

    # --- change intake (reflector and announcer threads) ------------------------------------

    def apply(self, changes: Changes) -> None:
        """Record what a reflector (or the announcer) saw, and wake the loop (any thread)."""
        with self._cond:
            dirty = self._state.apply(changes)
            self._dirty |= dirty.services
            self._everything |= dirty.everything
            if dirty.sync:
                self._wanted = True
                self._schedule = self._schedule.changed(self._clock())
                self._cond.notify()
        if dirty.reported is not None and self._announcer is not None:
            self._announcer.set_reported_sources(dirty.reported)

    def held_changed(self) -> None:
        """The announcer's held addresses changed: re-assemble and sync (any thread)."""
        self.apply(Changes(held=True))

    # --- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Watch and sync until `stop` is set."""
        services, slices, nodes = new_stores()

        def restarted(resource: str) -> Callable[[str], None]:
            return lambda reason: kube_metrics.WATCH_RESTARTS.labels(resource, reason).inc()

        wiring: list[tuple[str, ListFn, Store[Any], Callable[[list[Any]], None]]] = [
            ("services", self._lists.services, services, lambda c: self.apply(Changes(services=c))),
            ("endpointslices", self._lists.slices, slices, lambda c: self.apply(Changes(slices=c))),
            ("nodes", self._lists.nodes, nodes, lambda c: self.apply(Changes(nodes=c))),
        ]
        if self.cfg.pool_objects and self._lists.pools is not None:
            pools = Store(pool_of_object)
            wiring.append(
                ("pools", self._lists.pools, pools, lambda c: self.apply(Changes(pools=c)))
            )
        if self._announcer is not None and self._lists.reports is not None:
            reports = Store(report_sources)
            wiring.append(
                ("reports", self._lists.reports, reports, lambda c: self.apply(Changes(reports=c)))
            )
        self._reflectors = [
            Reflector(
                name=name,
                list_fn=list_fn,
                store=store,
                on_changes=on_changes,
                on_restart=restarted(name),
            )
            for name, list_fn, store, on_changes in wiring
        ]
        threads = [
            threading.Thread(target=r.run, args=(stop,), name=f"watch-{r.name}", daemon=True)
            for r in self._reflectors
        ]
        for t in threads:
            t.start()
        threading.Thread(target=self._wake_on_stop, args=(stop,), daemon=True).start()
        try:
            while not stop.is_set() and not all(r.synced.is_set() for r in self._reflectors):
                stop.wait(0.05)
            self.status.caches_synced = True
            log.info("caches synced", extra={"services": len(self._state.cache.services)})
            while not stop.is_set():
                self._wait_until_due(stop)
                if not stop.is_set():
                    self.step()
        finally:
            for r in self._reflectors:
                r.close()
            for t in threads:
                t.join(timeout=5)

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        with self._cond:
            self._cond.notify_all()

    def _wait_until_due(self, stop: threading.Event) -> None:
        with self._cond:
            while not stop.is_set():
                now = self._clock()
                due = self._schedule.next_wakeup(sweeping=self._state.sweep is not None)
                if due <= now:
                    return
                self._cond.wait(timeout=min(due - now, 1.0))

    def step(self) -> None:
        """Do what the schedule says is due now: recompute what changed (and a batch of a
        periodic resync in progress), sync the dataplane, report, check drift."""
        now = self._clock()
        outcome: Outcome | None = None
        with self._cond:
            sweeping = self._state.sweep is not None
            plan = self._schedule.step(now, everything=self._everything, sweeping=sweeping)
            if plan.start_sweep:
                log.info("periodic resync started", extra={"services": self._state.start_sweep()})
            if plan.recompute:
                dirty = Dirty(frozenset(self._dirty), everything=plan.full or self._everything)
                self._dirty, self._everything, self._wanted = set(), False, False
                held = self._announcer.held() if self._announcer is not None else frozenset()
                outcome = self._state.recompute(dirty, held_ips=held, batch=plan.batch)
                self._count(outcome)
                if outcome.resynced:
                    self._schedule = self._schedule.resynced(now)
                    self._freeze_due = True
                if outcome.ownership is not None and self._announcer is not None:
                    # Under the lock, so inputs reach the announcer in the order they were built.
                    self._announcer.submit(outcome.ownership, outcome.nodes)
        if outcome is not None:
            self._sync(outcome, full=plan.full, now=now)
            if outcome.health is not None and self._on_health is not None:
                for error in self._on_health(outcome.health):
                    log.warning(error)
            if plan.batch:
                with self._cond:
                    self._schedule = self._schedule.batch_done(self._clock())
        if self._schedule.drift_check_due(now):
            with self._cond:
                self._schedule = self._schedule.drift_checked(now)
            self._start_drift_check()

    def _count(self, outcome: Outcome) -> None:
        """Publish a recompute's figures in the status and the metrics."""
        self.status.problems = outcome.problems
        self.status.services = outcome.services
        metrics.SERVICES_HANDLED.set(outcome.services)
        for key in outcome.corrections:
            metrics.RESYNC_CORRECTIONS.inc()
            log.warning("periodic resync corrected %s: its result had not been updated", key)

    def _start_drift_check(self) -> None:
        """Read the table back on a thread of its own: at 10k Services the read takes seconds,
        and syncs must not wait for it (the dataplane drops a check that a sync overtook)."""
        if self._drift_thread is not None and self._drift_thread.is_alive():
            return

        def check() -> None:
            try:
                if self._dataplane.check_drift():
                    log.warning("drift in the nodelb table was found and repaired")
            except Exception:
                log.exception("drift check failed")

        self._drift_thread = threading.Thread(target=check, name="drift-check", daemon=True)
        self._drift_thread.start()

    def wait_drift_check(self, timeout: float | None = None) -> None:
        """Wait for a running drift check to finish (tests)."""
        if self._drift_thread is not None:
            self._drift_thread.join(timeout)

    def status_document(self) -> dict[str, Any]:
        """Return what `GET /status` answers (`nodelb status`): agent.node.status_document."""
        st = self.status
        return to_document(
            status_document(
                node=self.cfg.node_name,
                now=time.time(),
                last_sync_time=st.last_sync_time,
                last_sync_ok=st.last_sync_ok,
                last_sync_message=st.last_error,
                last_sync_duration=st.last_sync_duration,
                last_sync_full=st.last_sync_full,
                desired=self._last_desired,
                vrrp=self._announcer.instances() if self._announcer else (),
                spread=self._last_spread,
            )
        )

    def _sync(self, outcome: Outcome, *, full: bool, now: float) -> None:
        desired = outcome.desired
        started = time.monotonic()
        try:
            result = self._dataplane.sync(desired, full=full, changed=outcome.changed)
            ok = bool(getattr(result, "ok", True))
            retry_after = float(getattr(result, "retry_after", 1.0) or 1.0)
            error = str(getattr(result, "error", "") or "")
        except Exception as exc:
            log.exception("dataplane sync raised")
            ok, retry_after, error = False, 1.0, str(exc)
        self.status.last_sync_time = time.time()
        self.status.last_sync_duration = time.monotonic() - started
        self.status.last_sync_full = full
        self.status.last_sync_ok = ok
        self.status.last_error = error
        with self._cond:
            if ok:
                self._schedule = self._schedule.synced(now, full=full)
                # What arrived during the sync is still pending: changes of Services, and
                # wake-ups with nothing to recompute (held addresses, another node).
                if self._wanted or self._everything:
                    self._schedule = self._schedule.changed(self._clock())
            else:
                self._schedule = self._schedule.failed(now, retry_after)
                self._everything = True
        if ok and self._spread is not None:
            ok, retry_after, error = self._sync_spread(outcome)
            self.status.last_sync_ok = ok
            self.status.last_error = error
            if not ok:
                with self._cond:
                    self._schedule = self._schedule.failed(now, retry_after)
                    self._everything = True
        if ok:
            self._last_desired = desired
            if self._announcer is not None:
                self._announcer.report(outcome.programmed_ips)
            if not self.status.first_sync_done or self._freeze_due:
                self._freeze()
            self.status.first_sync_done = True
            self.status.frontends = len(desired.frontends)
            self.ready.set()
        self._report(outcome.reports)

    def _sync_spread(self, outcome: Outcome) -> tuple[bool, float, str]:
        """Apply the outcome's spreading after the inet table (the serving path must exist
        before flows are sent to it); return (ok, retry after, error)."""
        assert self._spread is not None
        try:
            self._spread.sync(outcome.spread)
        except Exception as exc:
            log.exception("spread sync failed")
            metrics.SPREAD_SYNC_FAILURES.inc()
            return False, 1.0, f"spread: {exc}"
        self._last_spread = outcome.spread
        return True, 0.0, ""

    def _freeze(self) -> None:
        """Move every object alive now out of the cyclic collector's sight (gc.freeze).

        At 10k Services × 10 endpoints the heap holds ~850k tracked objects and a full
        collection takes 0.25 s quiet, about a second on the loaded lab machine: a change that
        meets one waits for it (the lab's p99 went to 0.9 s with a resync every 20 s, which
        makes them frequent). Frozen after the first sync and after each periodic resync,
        collections scan only what was created since. Refcounting still frees frozen objects;
        only cyclic garbage alive at the freeze is kept, and the agent's records are acyclic.
        """
        self._freeze_due = False
        if self._freeze_heap:
            gc.freeze()

    def _report(self, reports: Iterable[ProblemReport]) -> None:
        """Send each problem's Warning Event, unless the gate saw it lately."""
        now = self._clock()
        for r in reports:
            ns, _, name = r.service.partition("/")
            p = r.problem
            event = Event(ObjectRef("Service", ns, name, r.uid), "Warning", p.reason, p.message)
            if self._gate.admit(event, now):
                log.warning("%s: %s: %s", r.service, p.reason, p.message)
                metrics.count_problem(p.reason)
                self._on_problem(p)
                self._events.record(event)
            else:
                kube_metrics.EVENTS_REPEATS_SUPPRESSED.labels(p.reason).inc()
