"""This node's view of the cluster and what it asks of the node, kept one Service at a time (pure).

`ClusterState` holds everything the node role decides from: the parsed Services, EndpointSlices
and Nodes (agent/node/cache.py), which Service each LoadBalancer IP is allocated to
(agent/node/allocated_ips.py), every Service's result joined into the DesiredState
(agent/node/assembly.py), the ownership plan's input (agent/announce/inputs.py), the
healthCheckNodePort answers, the node reports' advert sources, and what a periodic resync has
yet to check. Two calls drive it:

- `apply(changes) -> Dirty`: record what the reflectors saw; return the Services to recompute
  and whether a sync is wanted at all;
- `recompute(dirty, ...) -> Outcome`: recompute those Services (and a resync batch) and return
  all the loop must do: the DesiredState, the frontends that may have changed, the problems to
  report, the ownership input when it moved, health answers when they changed, counts for
  metrics and the resync's corrections.

A change costs one Service's work: nothing here walks every Service unless asked to
(`Dirty.everything`, a resync). No threads, clock, I/O or metrics: agent/node/loop.py holds the
lock, reads the clock and does what an Outcome says. Not thread-safe: the loop calls it under
its lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.announce.inputs import OwnershipIndex, OwnershipInput, OwnershipView, ownership_view
from agent.config import AgentConfig, Pool
from agent.kube.node_report import PeerReport
from agent.kube.store import Change
from agent.model.desired_state import DesiredState, FrontendKey
from agent.model.endpoint_slice import BadSlice, Slice
from agent.model.net import IPAddress
from agent.model.node import Node
from agent.model.service import InvalidService, Service
from agent.model.service_class import classify, is_ours
from agent.model.tunnel import LocalTraffic, SpreadState
from agent.node.allocated_ips import IPOwners
from agent.node.assembly import FrontendIndex
from agent.node.cache import ClusterCache, new_stores
from agent.node.health_answers import HealthAnswer, answer_for, answers_by_port
from agent.node.holdable import API_SERVICE, HoldPolicy, Reserved, check_ingress, reserved_from
from agent.node.service_frontends import (
    NodeView,
    PolicyView,
    Problem,
    ProblemReason,
    service_frontends,
)
from agent.node.spread_state import spread_state

SWEEP_BATCH = 50  # Services a periodic resync recomputes per sync (see ClusterState.start_sweep)

ReportSources = PeerReport
"""One node report Lease as agent.kube.node_report.report_sources parses it: the node it is
named for, the addresses its VRRP adverts come from and their MAC."""


@dataclass(frozen=True, slots=True)
class Changes:
    """What a reflector saw change (any field may be empty), or a wake-up from the announcer."""

    services: Sequence[Change[Service | InvalidService]] = ()
    slices: Sequence[Change[Slice | BadSlice]] = ()
    nodes: Sequence[Change[Node]] = ()
    reports: Sequence[Change[ReportSources]] = ()
    pools: Sequence[Change[Pool]] = ()  # LoadBalancerIPPool objects (agent/node/pools.py)
    held: bool = False  # the addresses the announcer holds changed


@dataclass(frozen=True, slots=True)
class Dirty:
    """What the next recompute must look at.

    `services` are the Service keys to recompute; `everything` asks for every Service (this
    node's own record changed, the first sync, a failed one). `sync` is True when anything the
    DesiredState or the ownership input reads changed, even with no Service to recompute
    (another Node's readiness when announcing, the held addresses). `reported` is every node's
    advert report (by node) when a node report changed; None when none did.
    """

    services: frozenset[str] = frozenset()
    everything: bool = False
    sync: bool = False
    reported: Mapping[str, PeerReport] | None = None


@dataclass(frozen=True, slots=True)
class ProblemReport:
    """One problem of one Service, for a Warning Event about that Service."""

    service: str  # "namespace/name"
    uid: str  # "" when the Service is gone
    problem: Problem


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one recompute asks of the loop.

    `changed` are the frontend keys that may differ from the last DesiredState (each
    recomputed Service's before and after); None when every Service was recomputed, so the
    dataplane compares all. `problems` are those of the recomputed Services plus every frontend
    conflict, by Service key (a Service without problems is absent), and `reports` the same one
    per problem. `ownership` is the ownership plan's new input with the Nodes it was built from
    (`nodes`); None when it did not move or nothing is announced. `health` is every
    healthCheckNodePort's answer when one changed; None when none did. `spread` is this
    node's spreading when the cluster's `localTraffic` is spread or a Service spreads; None
    when nothing spreads (the loop then removes the tunnel and the spread table).
    """

    desired: DesiredState
    changed: frozenset[FrontendKey] | None
    problems: dict[str, tuple[Problem, ...]]
    reports: tuple[ProblemReport, ...]
    programmed_ips: frozenset[IPAddress]  # every IP with a frontend (what the node report says)
    services: int  # Services with a result (the nodelb_services gauge)
    ownership: OwnershipInput | None = None
    nodes: tuple[Node, ...] = ()
    health: dict[int, HealthAnswer] | None = None
    corrections: tuple[str, ...] = ()  # Services a resync batch found with a stale result
    resynced: bool = False  # the periodic resync's last batch ran in this recompute
    spread: SpreadState | None = None


@dataclass(frozen=True, slots=True)
class Sweep:
    """A periodic resync in progress: every Service it checks, and how many it has taken."""

    keys: tuple[str, ...]
    taken: int = 0

    @property
    def left(self) -> int:
        """Return how many Services the resync has yet to take."""
        return len(self.keys) - self.taken

    def take(self, n: int) -> tuple[frozenset[str], Sweep]:
        """Return the next `n` Services (fewer at the end) and the sweep after them."""
        end = min(self.taken + n, len(self.keys))
        return frozenset(self.keys[self.taken : end]), Sweep(self.keys, end)


def listed(
    *,
    services: Iterable[Mapping[str, Any]] = (),
    slices: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[Mapping[str, Any]] = (),
) -> Changes:
    """Return the Changes of raw API objects listed into empty stores (`nodelb render`, tests)."""
    svc_store, slice_store, node_store = new_stores()
    return Changes(
        services=svc_store.replace(services),
        slices=slice_store.replace(slices),
        nodes=node_store.replace(nodes),
    )


class ClusterState:
    """See the module docstring.

    `announcing`: an announcer plans who holds each IP, so the ownership input is kept and the
    held addresses come from it (else every programmed LoadBalancer IP is held when
    `serveAllIPs`, none otherwise). `health_checks`: healthCheckNodePort answers are kept.
    `sweep_batch`: how many Services a periodic resync recomputes per batch.
    `api_addresses`: the address(es) the agent's API client talks to (never held; see
    agent/node/holdable.py).
    """

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        announcing: bool = False,
        health_checks: bool = False,
        sweep_batch: int = SWEEP_BATCH,
        api_addresses: tuple[IPAddress, ...] = (),
    ) -> None:
        self._cfg = cfg
        self._policy = PolicyView(
            lb_class=cfg.lb_class,
            handle_classless=cfg.handle_classless,
            external_ip_cidrs=cfg.external_ip_cidrs,
            pool_networks=tuple(n for p in cfg.pools for n in p.networks),
            local_traffic=cfg.local_traffic,
        )
        self._announcing = announcing
        self._spreading: set[str] = set()  # Services whose result spreads a frontend
        self._health_checks = health_checks
        self._sweep_batch = sweep_batch
        self.cache = ClusterCache(cfg.node_name)
        self.owners = IPOwners()  # our LoadBalancer IPs by Service, for externalIP checks
        self.index = FrontendIndex()  # every Service's result, joined incrementally
        self.sweep: Sweep | None = None  # the periodic resync in progress
        self._ownership = OwnershipIndex()
        self._health: dict[str, tuple[int, HealthAnswer]] = {}  # by Service key: port, answer
        self._health_served: dict[int, HealthAnswer] = {}  # by port, as last returned
        self._reports: dict[str, ReportSources] = {}  # by Lease key
        self._api_addresses = api_addresses
        self._object_pools: dict[str, Pool] = {}  # by object name, when pools are objects
        self._hold = HoldPolicy(
            allowed=tuple(n for p in cfg.pools for n in p.networks) + cfg.external_ip_cidrs,
            reserved=self._reserved(),
        )

    # --- intake -------------------------------------------------------------------------------

    def apply(self, changes: Changes) -> Dirty:
        """Record `changes`; return what must be recomputed for them (see Dirty)."""
        keys: set[str] = set()
        if changes.services:
            keys |= self.cache.on_services(changes.services)
            for c in changes.services:
                keys |= self._note_owner(c.key, c.new)
        if changes.slices:
            keys |= self.cache.on_slices(changes.slices)
        mine = bool(changes.nodes) and self.cache.on_nodes(changes.nodes)
        if changes.pools:
            mine |= self._on_pools(changes.pools)
        if changes.nodes or API_SERVICE in keys:
            # Which addresses are taken moved: every Service's ingress IPs are checked again
            # (rare: a Node's addresses or pod CIDRs, or the API servers, changed).
            reserved = self._reserved()
            if reserved != self._hold.reserved:
                self._hold = dataclasses.replace(self._hold, reserved=reserved)
                mine = True
        reported: dict[str, PeerReport] | None = None
        if changes.reports:
            for r in changes.reports:
                if r.new is None:
                    self._reports.pop(r.key, None)
                else:
                    self._reports[r.key] = r.new
            # Lease names are unique in the namespace and each names its node, so no report
            # can stand in for another node's.
            reported = {p.node: p for p in self._reports.values() if p.problem is None}
        # Other nodes' readiness and labels decide ownership, not this node's frontends.
        others = bool(changes.nodes) and self._announcing
        sync = bool(changes.services or changes.slices or changes.held or mine or others)
        return Dirty(frozenset(keys), everything=mine, sync=sync, reported=reported)

    def _on_pools(self, changes: Sequence[Change[Pool]]) -> bool:
        """Record pool objects; return True when the servable blocks changed (every Service's
        ingress IPs and externalIPs are checked again)."""
        for c in changes:
            if c.new is None:
                self._object_pools.pop(c.key, None)
            else:
                self._object_pools[c.key] = c.new
        networks = tuple(
            n for p in (*self._cfg.pools, *self._object_pools.values()) for n in p.networks
        )
        if networks == self._policy.pool_networks:
            return False
        self._policy = dataclasses.replace(self._policy, pool_networks=networks)
        self._hold = dataclasses.replace(self._hold, allowed=networks + self._cfg.external_ip_cidrs)
        return True

    def _reserved(self) -> Reserved:
        """Return the addresses this agent can see are taken (agent/node/holdable.py)."""
        return reserved_from(
            nodes=self.cache.nodes.values(),
            api_slices=self.cache.slices_of(API_SERVICE),
            api_addresses=self._api_addresses,
            local_cidrs=self._cfg.local_cidrs,
            service_cidrs=self._cfg.service_cidrs,
        )

    def _holdable(
        self, svc: Service | InvalidService
    ) -> tuple[Service | InvalidService, tuple[Problem, ...]]:
        """Return `svc` with only the ingress IPs this node may serve and hold, and a problem
        per refused one (Services of other classes are returned as they are)."""
        if not isinstance(svc, Service) or not svc.ingress_ips:
            return svc, ()
        policy = self._policy
        kind = classify(svc, lb_class=policy.lb_class, handle_classless=policy.handle_classless)
        if not is_ours(kind):
            return svc, ()
        verdict = check_ingress(svc.ingress_ips, self._hold)
        if not verdict.refused:
            return svc, ()
        problems = tuple(
            Problem(
                ProblemReason.LB_IP_REFUSED,
                f"status.loadBalancer.ingress: {r.message}; this node neither serves nor holds"
                f" it ({r.reason})",
            )
            for r in verdict.refused
        )
        return dataclasses.replace(svc, ingress_ips=verdict.accepted), problems

    def _note_owner(self, key: str, svc: Service | InvalidService | None) -> set[str]:
        """Record which LoadBalancer IPs `svc` owns; return the Services to recompute for it."""
        if not isinstance(svc, Service):
            return self.owners.update(key, age=("", "", key))
        policy = self._policy
        kind = classify(svc, lb_class=policy.lb_class, handle_classless=policy.handle_classless)
        return self.owners.update(
            key,
            age=(svc.created, svc.uid, key),
            lb_ips=svc.ingress_ips if is_ours(kind) else (),
            external_ips=svc.external_ips,
        )

    def start_sweep(self) -> int:
        """Queue every Service for a periodic resync to check, a batch per recompute; return
        how many there are.

        Why batches: recomputing all 10k Services at once takes ~1 s, and a change arriving
        meanwhile would wait for it. A batch of 200 took ~20 ms quiet but 150-250 ms in the
        loaded lab (py-spy), and a change waited for two of them; a batch of 50 bounds that
        wait, and SyncSchedule.step lets a pending change go alone after a batch. The table
        itself is compared with the mirror by the drift check, so the resync sends nothing
        unless a result moved.
        """
        self.sweep = Sweep(tuple(self.cache.services.keys() | self.index.results.keys()))
        return len(self.sweep.keys)

    # --- recompute ----------------------------------------------------------------------------

    def recompute(
        self,
        dirty: Dirty,
        *,
        held_ips: frozenset[IPAddress] = frozenset(),
        batch: bool = False,
    ) -> Outcome:
        """Return what the recomputed Services ask of the loop (see Outcome).

        Recomputes `dirty`'s Services and, with `batch`, the periodic resync's next batch. A
        batched Service with no change of its own must come out as it was: one that does not
        is listed in `corrections` (the incremental bookkeeping missed something; the new
        result is used). `held_ips` are the addresses the announcer holds (read only when
        announcing).
        """
        keys = set(dirty.services)
        if dirty.everything:
            keys |= self.cache.services.keys() | self.index.results.keys()
        verify: frozenset[str] = frozenset()
        if batch and self.sweep is not None:
            taken, self.sweep = self.sweep.take(self._sweep_batch)
            verify = taken - dirty.services
            keys |= taken
        node = self.cache.this_node()
        view = NodeView(name=self._cfg.node_name, zone=node.zone if node else None)
        changed: set[FrontendKey] = set()
        corrections: list[str] = []
        views: dict[str, OwnershipView | None] = {}
        health_moved = False
        results = self.index.results
        for key in keys:
            previous = results.get(key)
            if previous is not None:
                changed.update(fe.key for fe in previous.frontends)
            svc = self.cache.services.get(key)
            slices = self.cache.slices_of(key) if svc is not None else []
            health_moved |= self._note_health(key, svc, slices)
            if svc is None:
                self.index.remove(key)
                self._spreading.discard(key)
                if self._announcing:
                    views[key] = None
                continue
            checked, refused = self._holdable(svc)
            result = service_frontends(
                checked, slices, node=view, policy=self._policy, allocated_to=self.owners.owners
            )
            bad = self.cache.bad_slices_of(key)
            extra = refused + tuple(Problem(ProblemReason.INVALID_SERVICE, b.reason) for b in bad)
            if extra:
                result = dataclasses.replace(result, problems=result.problems + extra)
            if key in verify and previous != result:
                corrections.append(key)
            self.index.put(result)
            if result.spread:
                self._spreading.add(key)
            else:
                self._spreading.discard(key)
            changed.update(fe.key for fe in result.frontends)
            if self._announcing:
                views[key] = ownership_view(svc, result.lb_ips, slices)
        ownership = None
        if self._announcing:
            ownership = self._ownership.update(views, self.cache.nodes.values())
        held = self._held(held_ips)
        local = self._cfg.local_cidrs or (node.pod_cidrs if node else ())
        assembly = self.index.snapshot(held_ips=held, local_cidrs=local)
        problems = {k: r.problems for k in keys if (r := results.get(k)) and r.problems}
        for key, conflicts in assembly.conflicts.items():
            problems[key] = problems.get(key, ()) + conflicts
        resynced = self.sweep is not None and self.sweep.left == 0
        if resynced:
            self.sweep = None
        spread = None
        if self._cfg.local_traffic is LocalTraffic.SPREAD or self._spreading:
            spread = spread_state(
                [results[k] for k in sorted(self._spreading) if k in results],
                frontends=assembly.desired.frontends,
                nodes=self.cache.nodes.values(),
                me=self._cfg.node_name,
                device=self._cfg.announce.interface,
            )
        return Outcome(
            desired=assembly.desired,
            changed=None if dirty.everything else frozenset(changed),
            problems=problems,
            reports=self._reports_of(problems),
            programmed_ips=assembly.programmed_ips,
            services=len(results),
            ownership=ownership,
            nodes=self._ownership.nodes if ownership is not None else (),
            health=self._health_answers() if health_moved else None,
            corrections=tuple(corrections),
            resynced=resynced,
            spread=spread,
        )

    def _held(self, announced: frozenset[IPAddress]) -> frozenset[IPAddress] | None:
        """Return the IPs this node holds (None: every LoadBalancer IP with a frontend)."""
        if self._announcing:
            return announced
        return None if self._cfg.serve_all_ips else frozenset()

    def _note_health(
        self, key: str, svc: Service | InvalidService | None, slices: list[Slice]
    ) -> bool:
        """Record the healthCheckNodePort answer of Service `key` (one of our Local Services
        with such a port); return True when it is not the one recorded before."""
        before = self._health.pop(key, None)
        if not self._health_checks or not isinstance(svc, Service):
            return before is not None
        policy = self._policy
        kind = classify(svc, lb_class=policy.lb_class, handle_classless=policy.handle_classless)
        port = svc.health_check_node_port
        answer = answer_for(svc, slices, self._cfg.node_name) if is_ours(kind) else None
        now = (port, answer) if port is not None and answer is not None else None
        if now is not None:
            self._health[key] = now
        return now != before

    def _health_answers(self) -> dict[int, HealthAnswer] | None:
        """Return every port's answer when they differ from those returned last, else None."""
        answers = answers_by_port(self._health)
        if answers == self._health_served:
            return None
        self._health_served = answers
        return answers

    def _reports_of(self, problems: Mapping[str, tuple[Problem, ...]]) -> tuple[ProblemReport, ...]:
        """Return one report per problem, naming its Service (its UID when it still exists)."""
        out: list[ProblemReport] = []
        for key, found in problems.items():
            svc = self.cache.services.get(key)
            uid = svc.uid if svc is not None else ""
            out.extend(ProblemReport(key, uid, p) for p in found)
        return tuple(out)
