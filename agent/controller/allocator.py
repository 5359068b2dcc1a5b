"""The LoadBalancer IP allocator: a pure state machine over pools and Service requests.

The allocator holds no API client and reads no clock: the controller shell feeds it Service
requests (agent.controller.request) and the current time, and writes the results to the API.

**Restart.** Build an `Allocator` from the pools, call `record_existing` with every Service
(it adopts what status.loadBalancer.ingress already says, oldest owner first, and reports
duplicated addresses, addresses outside every pool and addresses of a family the Service does
not ask for), then call `allocate` for every Service in `allocation_order` (creationTimestamp,
then UID). Unchanged Services get ALREADY_ALLOCATED with the addresses they had: a restart
moves nothing. `rebuild` does the three steps.

**Choosing an address.** Specific addresses (``nodelb.io/load-balancer-ips`` or the
deprecated spec.loadBalancerIP) must lie in a pool that admits the Service (and in the named
pool, when ``nodelb.io/ip-pool`` is set). Otherwise the candidate pools are the named pool,
or every autoAssign pool that admits the Service, restricted pools (those with namespace or
label selectors) before unrestricted ones, configuration order within each. A Service with a
sharing key first joins an address already shared under that key; then the lowest address
never released (or released before the allocator started) is taken; only when none is left
is a released address reused, the one released longest ago first (DNS caches still point at
recent ones).

**Sharing.** Services may hold the same address when all of them carry the same
``nodelb.io/allow-shared-ip`` key, no (protocol, port) appears in two of them, and they agree
on where traffic may land: either all use externalTrafficPolicy=Cluster, or all use Local with
the same pod selector (otherwise a node might hold the address for one Service's endpoints and
black-hole the other's traffic).

**Dual-stack.** One address per family in spec.ipFamilies (SingleStack: the first family
only). RequireDualStack is all or nothing; PreferDualStack keeps what it can get, unless the
Service lists ``IPFamilies`` in ``nodelb.io/required-features``, which makes it all or nothing
as well.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.controller.request import FamilyPolicy, Feature, ProtocolPort, ServiceRequest
from agent.model.net import IPAddress, IPFamily
from agent.model.pools import AddressPool, PoolSet


class AllocationReason(enum.StrEnum):
    """Why an allocation ended as it did; the values are CamelCase Event reasons."""

    ALLOCATED = "Allocated"
    ALREADY_ALLOCATED = "AlreadyAllocated"
    RELEASED = "Released"
    NOT_OURS = "NotOurs"
    POOL_EXHAUSTED = "PoolExhausted"
    REQUESTED_IP_NOT_IN_POOL = "RequestedIPNotInPool"
    REQUESTED_IP_IN_USE = "RequestedIPInUse"
    NO_POOL_FOR_FAMILY = "NoPoolForFamily"
    UNKNOWN_POOL = "UnknownPool"
    POOL_NOT_ALLOWED = "PoolNotAllowed"
    INVALID_ANNOTATION = "InvalidAnnotation"
    SHARE_KEY_CONFLICT = "ShareKeyConflict"
    # Found by record_existing; the address is given up and the Service reallocated.
    DUPLICATE_ADDRESS = "DuplicateAddress"
    OUTSIDE_POOLS = "OutsidePools"
    WRONG_FAMILY = "WrongFamily"


SUCCESS = frozenset({AllocationReason.ALLOCATED, AllocationReason.ALREADY_ALLOCATED})


@dataclass(frozen=True, slots=True)
class FamilyOutcome:
    """What happened for one IP family of a Service: the address, or why there is none."""

    family: IPFamily
    reason: AllocationReason
    ip: IPAddress | None
    pool: str | None
    message: str


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """The outcome of `allocate` or `release` for one Service.

    `ips` are what the Service holds now, primary family first (empty on failure: status
    must then carry no ingress). `released` are addresses this call took away from it.
    `message` is a sentence for an Event; `reason` is its Event reason.
    """

    service: str
    reason: AllocationReason
    ips: tuple[IPAddress, ...]
    message: str
    families: tuple[FamilyOutcome, ...] = ()
    released: tuple[IPAddress, ...] = ()

    @property
    def allocated(self) -> bool:
        """Return True when the Service holds addresses (for every family, or some of them)."""
        return self.reason in SUCCESS

    @property
    def missing_families(self) -> tuple[IPFamily, ...]:
        """Return the families a partly served (PreferDualStack) Service has no address for.

        Empty when every family got one, and when the allocation failed as a whole.
        """
        if not self.allocated:
            return ()
        return tuple(o.family for o in self.families if o.ip is None)

    @property
    def pools(self) -> tuple[str, ...]:
        """Return the pools involved, for metrics and the PoolExhausted rate limiter."""
        return tuple(dict.fromkeys(o.pool for o in self.families if o.pool))

    @property
    def warning(self) -> bool:
        """Return True when the Event for this result is a Warning rather than Normal."""
        return not self.allocated and self.reason not in (
            AllocationReason.RELEASED,
            AllocationReason.NOT_OURS,
        )


@dataclass(frozen=True, slots=True)
class Reallocation:
    """An address found in a Service's status that it may not keep (from record_existing)."""

    service: str
    ip: IPAddress
    reason: AllocationReason
    message: str
    kept_by: str | None = None  # the older owner of a duplicated address


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """A pool's size and the number of its addresses in use (shared ones count once)."""

    pool: str
    size: int
    used: int


@dataclass(frozen=True, slots=True)
class _Holder:
    ports: frozenset[ProtocolPort]
    share_key: str | None
    backend: str


def allocation_order(requests: Iterable[ServiceRequest]) -> list[ServiceRequest]:
    """Return the requests oldest first (creationTimestamp, then UID): the allocation order."""
    return sorted(requests, key=lambda r: r.order)


class Allocator:
    """Which Service holds which address, and the release time of every freed address.

    Pure state: no I/O, no clock. Time arrives as `now` (seconds, any monotonic origin).
    `released` seeds the release times, so a rebuild in the same process (after a pool
    configuration change, or when this replica becomes leader again) keeps the reuse order;
    after a restart of every replica they are unknown and every free address counts as never
    used (docs/allocation.md says why).
    """

    def __init__(self, pools: PoolSet, *, released: Mapping[IPAddress, float] | None = None):
        self._pools = pools
        self._holders: dict[IPAddress, dict[str, _Holder]] = {}
        self._held: dict[str, dict[IPFamily, IPAddress]] = {}
        self._released: dict[IPAddress, float] = dict(released or {})
        # Below the hint, every address of (pool, version) is held or released: fresh
        # addresses are searched from there, so filling a pool is linear, not quadratic.
        self._fresh_hint: dict[tuple[str, int], int] = {}
        self._shared: dict[str, set[IPAddress]] = {}  # sharing key -> addresses under it
        self._reused: dict[IPAddress, float] = {}  # release times taken by this allocate()

    # -- queries ---------------------------------------------------------------------------

    @property
    def pools(self) -> PoolSet:
        return self._pools

    def ips_of(self, service: str) -> tuple[IPAddress, ...]:
        """Return the addresses `service` holds, IPv4 first (empty when none)."""
        held = self._held.get(service, {})
        return tuple(held[f] for f in IPFamily if f in held)

    def holders_of(self, ip: IPAddress) -> tuple[str, ...]:
        """Return the Services holding `ip`, sorted (more than one only when shared)."""
        return tuple(sorted(self._holders.get(ip, {})))

    def allocations(self) -> dict[IPAddress, tuple[str, ...]]:
        """Return every held address with its holders (for the externalIP check)."""
        return {ip: tuple(sorted(h)) for ip, h in self._holders.items()}

    def release_times(self) -> Mapping[IPAddress, float]:
        """Return when each currently free, once-held address was released."""
        return dict(self._released)

    def usage(self) -> tuple[PoolUsage, ...]:
        """Return size and use of every pool, in configuration order (for metrics)."""
        out = []
        for pool in self._pools.pools:
            used = sum(1 for ip in self._holders if pool.contains(ip))
            out.append(PoolUsage(pool=pool.name, size=pool.size(), used=used))
        return tuple(out)

    # -- restart ---------------------------------------------------------------------------

    def record_existing(self, requests: Iterable[ServiceRequest]) -> list[Reallocation]:
        """Adopt the addresses already in Service status; return those that must move.

        Services are taken oldest first, so when an address appears in two Services that may
        not share it, the older (creationTimestamp, then UID) keeps it. Services that are not
        ours are skipped. An adopted address is validated again by the next `allocate`.
        """
        problems: list[Reallocation] = []
        for req in allocation_order(requests):
            if not req.ours:
                continue
            wanted = req.wanted_families()
            for ip in req.current_ips:
                problem = self._record_one(req, ip, wanted)
                if problem is not None:
                    problems.append(problem)
        return problems

    def _record_one(
        self, req: ServiceRequest, ip: IPAddress, wanted: tuple[IPFamily, ...]
    ) -> Reallocation | None:
        family = IPFamily.of(ip)
        held = self._held.get(req.key, {})
        if family not in wanted or family in held:
            why = "a second" if family in held else "an"
            return Reallocation(
                req.key,
                ip,
                AllocationReason.WRONG_FAMILY,
                f"{req.key} had {why} {family} address {ip} it does not ask for; releasing it",
            )
        if self._pools.pool_for(ip) is None:
            return Reallocation(
                req.key,
                ip,
                AllocationReason.OUTSIDE_POOLS,
                f"{ip} of {req.key} lies outside every pool; reallocating",
            )
        conflict = self._conflict(ip, req)
        if conflict is not None:
            owner = self.holders_of(ip)[0]
            return Reallocation(
                req.key,
                ip,
                AllocationReason.DUPLICATE_ADDRESS,
                f"{ip} of {req.key} is also held by the older {owner}, which keeps it; "
                "reallocating",
                kept_by=owner,
            )
        self._assign(req, family, ip)
        return None

    # -- allocation ------------------------------------------------------------------------

    def allocate(self, request: ServiceRequest, *, now: float) -> AllocationResult:
        """Return the addresses `request` holds after bringing it in line with its spec.

        Idempotent for an unchanged Service (ALREADY_ALLOCATED, nothing moves). A Service that
        is not ours, or whose annotations are invalid, loses what it held. On failure the
        Service holds nothing and `reason` is that of the first family that failed.
        """
        if not request.ours:
            return self.release(request.key, now=now, reason=AllocationReason.NOT_OURS)
        if request.annotation_error:
            released = self._drop(request.key, now=now)
            return AllocationResult(
                request.key,
                AllocationReason.INVALID_ANNOTATION,
                (),
                f"cannot allocate for {request.key}: {request.annotation_error}",
                released=released,
            )
        previous = self._take_out(request.key)
        self._reused = {}
        outcomes = [
            self._allocate_family(request, family, previous.get(family))
            for family in request.wanted_families()
        ]
        got = [o for o in outcomes if o.ip is not None]
        failed = [o for o in outcomes if o.ip is None]
        partial_ok = (
            request.family_policy is FamilyPolicy.PREFER_DUAL_STACK
            and Feature.IP_FAMILIES not in request.required_features
        )
        if failed and (not got or not partial_ok):
            for o in got:
                assert o.ip is not None
                self._unassign(request.key, o.ip)
                if o.ip in self._reused and o.ip not in self._holders:
                    # A released address picked and given back keeps its release time; a
                    # fresh one is fresh again (the fresh hint still points at it).
                    self._released[o.ip] = self._reused[o.ip]
            reason, message = failed[0].reason, failed[0].message
            if got:
                message += " (all or nothing: the other families were not kept)"
            outcomes = [o if o.ip is None else _undone(o) for o in outcomes]
            ips: tuple[IPAddress, ...] = ()
        else:
            ips = tuple(o.ip for o in outcomes if o.ip is not None)
            new = [o for o in got if o.reason is AllocationReason.ALLOCATED]
            reason = AllocationReason.ALLOCATED if new else AllocationReason.ALREADY_ALLOCATED
            message = "; ".join(o.message for o in outcomes)
        released = tuple(ip for ip in previous.values() if ip not in ips)
        for ip in released:
            if ip not in self._holders:
                self._released[ip] = now
        return AllocationResult(
            request.key, reason, ips, message, families=tuple(outcomes), released=released
        )

    def release(
        self,
        service: str,
        *,
        now: float,
        reason: AllocationReason = AllocationReason.RELEASED,
    ) -> AllocationResult:
        """Return the release of everything `service` holds (deleted, type or class changed)."""
        released = self._drop(service, now=now)
        what = ", ".join(map(str, released)) if released else "nothing"
        return AllocationResult(
            service, reason, (), f"released {what} held by {service}", released=released
        )

    # -- internals -------------------------------------------------------------------------

    def _allocate_family(
        self, req: ServiceRequest, family: IPFamily, previous: IPAddress | None
    ) -> FamilyOutcome:
        requested = [ip for ip in req.requested_ips if IPFamily.of(ip) is family]
        if requested:
            return self._allocate_specific(req, family, requested[0], previous)
        if previous is not None and self._still_valid(req, previous):
            self._assign(req, family, previous)
            pool = self._pools.pool_for(previous)
            return FamilyOutcome(
                family,
                AllocationReason.ALREADY_ALLOCATED,
                previous,
                pool.name if pool else None,
                f"{req.key} keeps {previous}",
            )
        candidates = self._candidate_pools(req, family)
        if isinstance(candidates, FamilyOutcome):
            return candidates
        ip = self._join_shared(req, family, candidates) or self._pick_free(family, candidates)
        if ip is None:
            names = ", ".join(p.name for p in candidates)
            return FamilyOutcome(
                family,
                AllocationReason.POOL_EXHAUSTED,
                None,
                names,
                f"no free {family} address for {req.key} in pool {names}",
            )
        self._assign(req, family, ip)
        pool = self._pools.pool_for(ip)
        assert pool is not None
        return FamilyOutcome(
            family,
            AllocationReason.ALLOCATED,
            ip,
            pool.name,
            f"allocated {ip} to {req.key} from pool {pool.name}",
        )

    def _allocate_specific(
        self, req: ServiceRequest, family: IPFamily, ip: IPAddress, previous: IPAddress | None
    ) -> FamilyOutcome:
        pool = self._pools.pool_for(ip)
        if pool is None or (req.pool is not None and pool.name != req.pool):
            where = f"pool {req.pool}" if req.pool else "any pool"
            return FamilyOutcome(
                family,
                AllocationReason.REQUESTED_IP_NOT_IN_POOL,
                None,
                req.pool,
                f"the requested address {ip} for {req.key} is not in {where}",
            )
        if not _admits(pool, req):
            return FamilyOutcome(
                family,
                AllocationReason.POOL_NOT_ALLOWED,
                None,
                pool.name,
                f"pool {pool.name} of the requested address {ip} does not admit {req.key}",
            )
        conflict = self._conflict(ip, req)
        if conflict is not None:
            reason, why = conflict
            return FamilyOutcome(
                family, reason, None, pool.name, f"cannot give {ip} to {req.key}: {why}"
            )
        self._assign(req, family, ip)
        if ip == previous:
            return FamilyOutcome(
                family, AllocationReason.ALREADY_ALLOCATED, ip, pool.name, f"{req.key} keeps {ip}"
            )
        return FamilyOutcome(
            family,
            AllocationReason.ALLOCATED,
            ip,
            pool.name,
            f"allocated the requested {ip} to {req.key} from pool {pool.name}",
        )

    def _still_valid(self, req: ServiceRequest, ip: IPAddress) -> bool:
        pool = self._pools.pool_for(ip)
        if pool is None or not _admits(pool, req):
            return False
        if req.pool is not None and pool.name != req.pool:
            return False
        return self._conflict(ip, req) is None

    def _candidate_pools(
        self, req: ServiceRequest, family: IPFamily
    ) -> list[AddressPool] | FamilyOutcome:
        if req.pool is not None:
            named = self._pools.get(req.pool)
            if named is None:
                return FamilyOutcome(
                    family,
                    AllocationReason.UNKNOWN_POOL,
                    None,
                    None,
                    f"{req.key} asks for pool {req.pool}, which does not exist",
                )
            if not _admits(named, req):
                return FamilyOutcome(
                    family,
                    AllocationReason.POOL_NOT_ALLOWED,
                    None,
                    named.name,
                    f"pool {named.name} does not admit {req.key} (namespace or labels)",
                )
            pools = [named]
        else:
            admitted = [p for p in self._pools.pools if p.auto_assign and _admits(p, req)]
            pools = [p for p in admitted if p.restricted] + [
                p for p in admitted if not p.restricted
            ]
        pools = [p for p in pools if family.version in p.families()]
        if not pools:
            which = f"pool {req.pool} has" if req.pool else "no pool usable by it has"
            return FamilyOutcome(
                family,
                AllocationReason.NO_POOL_FOR_FAMILY,
                None,
                req.pool,
                f"{req.key} asks for {family}, but {which} no {family} addresses",
            )
        return pools

    def _join_shared(
        self, req: ServiceRequest, family: IPFamily, pools: Sequence[AddressPool]
    ) -> IPAddress | None:
        """Return the lowest address shared under the request's key that it may join."""
        if req.share_key is None:
            return None
        joinable = [
            ip
            for ip in self._shared.get(req.share_key, ())
            if ip.version == family.version and self._may_join(ip, req)
        ]
        return min((ip for ip in joinable if any(p.contains(ip) for p in pools)), default=None)

    def _may_join(self, ip: IPAddress, req: ServiceRequest) -> bool:
        """Return True when `req` may share `ip` with its holders (fast path of _conflict)."""
        for name, h in self._holders.get(ip, {}).items():
            if name != req.key and (
                h.share_key != req.share_key or h.backend != req.backend_key or h.ports & req.ports
            ):
                return False
        return True

    def _pick_free(self, family: IPFamily, pools: Sequence[AddressPool]) -> IPAddress | None:
        version = family.version
        for pool in pools:
            start = self._fresh_hint.get((pool.name, version), 0)
            for ip in pool.addresses(version, start=start):
                if ip not in self._holders and ip not in self._released:
                    # The hint stays *at* the pick, not past it: if allocate undoes the pick
                    # (all-or-nothing dual-stack), the address is found again next time.
                    self._fresh_hint[(pool.name, version)] = int(ip)
                    return ip
            self._fresh_hint[(pool.name, version)] = 1 << 128  # nothing fresh is left
        reusable = [
            (at, ip)
            for ip, at in self._released.items()
            if ip.version == version and any(p.contains(ip) for p in pools)
        ]
        return min(reusable)[1] if reusable else None

    def _conflict(self, ip: IPAddress, req: ServiceRequest) -> tuple[AllocationReason, str] | None:
        holders = {k: h for k, h in self._holders.get(ip, {}).items() if k != req.key}
        if not holders:
            return None
        owners = ", ".join(sorted(holders))
        if req.share_key is None or any(h.share_key is None for h in holders.values()):
            return AllocationReason.REQUESTED_IP_IN_USE, f"it is in use by {owners}"
        for name, h in sorted(holders.items()):
            if h.share_key != req.share_key:
                return (
                    AllocationReason.SHARE_KEY_CONFLICT,
                    f"{name} shares it under key {h.share_key!r}, not {req.share_key!r}",
                )
            if h.backend != req.backend_key:
                return (
                    AllocationReason.SHARE_KEY_CONFLICT,
                    f"{name} shares it but their externalTrafficPolicy or, under Local, "
                    "their pod selectors differ",
                )
            clash = sorted(h.ports & req.ports)
            if clash:
                return (
                    AllocationReason.SHARE_KEY_CONFLICT,
                    f"{name} already uses {', '.join(map(str, clash))} on it",
                )
        return None

    def _assign(self, req: ServiceRequest, family: IPFamily, ip: IPAddress) -> None:
        self._holders.setdefault(ip, {})[req.key] = _Holder(
            ports=req.ports, share_key=req.share_key, backend=req.backend_key
        )
        self._held.setdefault(req.key, {})[family] = ip
        released_at = self._released.pop(ip, None)
        if released_at is not None:
            self._reused[ip] = released_at
        if req.share_key is not None:
            self._shared.setdefault(req.share_key, set()).add(ip)

    def _unassign(self, service: str, ip: IPAddress) -> None:
        holders = self._holders.get(ip, {})
        gone = holders.pop(service, None)
        if not holders:
            self._holders.pop(ip, None)
            if gone is not None and gone.share_key is not None:
                self._shared.get(gone.share_key, set()).discard(ip)
        held = self._held.get(service, {})
        held.pop(IPFamily.of(ip), None)
        if not held:
            self._held.pop(service, None)

    def _take_out(self, service: str) -> dict[IPFamily, IPAddress]:
        """Remove `service` from the state without stamping release times; return its IPs."""
        previous = dict(self._held.get(service, {}))
        for ip in previous.values():
            self._unassign(service, ip)
        return previous

    def _drop(self, service: str, *, now: float) -> tuple[IPAddress, ...]:
        released = tuple(self._take_out(service).values())
        for ip in released:
            if ip not in self._holders:
                self._released[ip] = now
        return released


def _admits(pool: AddressPool, req: ServiceRequest) -> bool:
    return pool.admits(
        namespace=req.namespace,
        namespace_labels=dict(req.namespace_labels),
        service_labels=dict(req.labels),
    )


def _undone(outcome: FamilyOutcome) -> FamilyOutcome:
    return FamilyOutcome(
        outcome.family,
        outcome.reason,
        None,
        outcome.pool,
        outcome.message + " (not kept: another family failed)",
    )


def freed_addresses(before: ServiceRequest | None, after: ServiceRequest | None) -> set[IPAddress]:
    """Return the addresses a Service's status stopped naming between two of its versions.

    What a watch shows of a release, whoever made it: every replica keeps a record of
    these, so the one that becomes leader knows the reuse order of addresses another freed.
    `after` None: the Service was deleted (everything it named is free).
    """
    if before is None:
        return set()
    kept = set(after.current_ips) if after is not None else set()
    return set(before.current_ips) - kept


def latest_releases(*records: Mapping[IPAddress, float]) -> dict[IPAddress, float]:
    """Return, for every address any record names, the latest release time recorded."""
    out: dict[IPAddress, float] = {}
    for record in records:
        for ip, at in record.items():
            if at > out.get(ip, float("-inf")):
                out[ip] = at
    return out


def rebuild(
    pools: PoolSet,
    requests: Sequence[ServiceRequest],
    *,
    now: float,
    released: Mapping[IPAddress, float] | None = None,
) -> tuple[Allocator, list[Reallocation], list[AllocationResult]]:
    """Return an allocator rebuilt after a restart, the reallocations, and every result.

    Records every existing allocation first, then allocates in `allocation_order`. Use it
    on start-up and whenever the pool configuration changes (pass the old allocator's
    `release_times()` as `released` then).
    """
    allocator = Allocator(pools, released=released)
    problems = allocator.record_existing(requests)
    results = [allocator.allocate(r, now=now) for r in allocation_order(requests)]
    return allocator, problems, results
