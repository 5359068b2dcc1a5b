"""Every Service's result joined into this node's DesiredState, kept up to date one Service at
a time.

A change to one Service (or to its EndpointSlices) must cost that Service's work. Joining all
results again per change (sorting them by age, rebuilding the frontend dict and the IP sets,
each `ipaddress` hash a hex string) took ~85 ms of agent CPU per change at 10k Services.
`FrontendIndex` keeps the winner of every (IP, protocol, port) and the Services contending
for it, and counts per IP, so `put` and `remove` cost one Service's frontends and a snapshot
copies one dict (C speed: a copy reuses the stored hashes). `assemble` is the one-shot form,
by the same code.

When two Services claim the same (IP, protocol, port), the oldest (creation time, then UID,
then key) keeps it and the others get a FRONTEND_CONFLICT problem; nothing is programmed
twice. Within one Service a later frontend with the same key replaces an earlier one (an
address that is both its LoadBalancer IP and an externalIP).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.model.desired_state import DesiredState, Frontend, FrontendKey
from agent.model.net import IPAddress, IPNetwork
from agent.node.service_frontends import Problem, ProblemReason, ServiceResult


@dataclass(frozen=True, slots=True)
class Assembly:
    """The DesiredState, plus the conflict problems found while assembling, by Service key."""

    desired: DesiredState
    conflicts: dict[str, tuple[Problem, ...]]
    programmed_ips: frozenset[IPAddress] = frozenset()  # every IP with a frontend


def _age(result: ServiceResult) -> tuple[str, str, str]:
    return (result.created, result.uid, result.key)


def _own(result: ServiceResult, key: FrontendKey) -> Frontend:
    """Return the frontend `result` programs for `key` (the last one listed wins)."""
    for fe in reversed(result.frontends):
        if fe.key == key:
            return fe
    raise KeyError(key)


def _conflict(fe: Frontend, owner: str) -> Problem:
    return Problem(
        ProblemReason.FRONTEND_CONFLICT,
        f"{fe.key.ip} {fe.key.protocol.value.upper()}/{fe.key.port} is already served for {owner}",
    )


class FrontendIndex:
    """Service results by key, and the frontends they win, updated one result at a time.

    Not thread-safe: the agent calls it under its own lock.
    """

    def __init__(self) -> None:
        self._results: dict[str, ServiceResult] = {}
        self._winners: dict[FrontendKey, Frontend] = {}
        # Keys claimed by more than one Service, with every claimant (rare: a conflict).
        self._contenders: dict[FrontendKey, set[str]] = {}
        self._ip_keys: dict[IPAddress, int] = {}  # programmed frontends per IP
        self._lb_refs: dict[IPAddress, int] = {}  # results listing the IP as LoadBalancer IP
        # LoadBalancer IPs with a programmed frontend (what a node serving all IPs holds).
        self._served: dict[IPAddress, None] = {}
        self._programmed: set[IPAddress] = set()
        self._version = 0  # bumped whenever _programmed or _served changes
        self._held_cache: tuple[object, int, frozenset[IPAddress]] | None = None
        self._programmed_cache: tuple[int, frozenset[IPAddress]] = (-1, frozenset())

    @property
    def results(self) -> Mapping[str, ServiceResult]:
        """Return every Service's current result, by Service key."""
        return self._results

    def put(self, result: ServiceResult) -> None:
        """Record `result` as its Service's current one (replacing any earlier result).

        Only what differs from the earlier result is released and claimed: a new endpoint
        list for the same keys leaves the per-IP counts (and the cached held set) alone.
        """
        previous = self._results.get(result.key)
        self._results[result.key] = result
        fes = {fe.key: fe for fe in result.frontends}
        before = {fe.key for fe in previous.frontends} if previous is not None else set()
        for key in before - fes.keys():
            self._release(result.key, key)
        for key, fe in fes.items():
            if key not in before:
                self._claim(result, fe)
            elif key in self._contenders:
                self._crown(key, self._contenders[key])
            else:
                self._winners[key] = fe
        lb_before = set(previous.lb_ips) if previous is not None else set()
        lb_now = set(result.lb_ips)
        for ip in lb_now - lb_before:
            self._lb_ref(ip, +1)
        for ip in lb_before - lb_now:
            self._lb_ref(ip, -1)

    def remove(self, key: str) -> None:
        """Forget the Service `key` (nothing happens when it is not recorded)."""
        result = self._results.pop(key, None)
        if result is None:
            return
        for fk in {fe.key for fe in result.frontends}:
            self._release(key, fk)
        for ip in set(result.lb_ips):
            self._lb_ref(ip, -1)

    def snapshot(
        self, *, held_ips: frozenset[IPAddress] | None, local_cidrs: tuple[IPNetwork, ...]
    ) -> Assembly:
        """Return the DesiredState now, and the conflict problems by Service key.

        `held_ips` are the IPs this node holds (only those with a programmed frontend count);
        None means every LoadBalancer IP of a programmed frontend (a node serving them all).
        """
        return Assembly(
            desired=DesiredState(
                frontends=dict(self._winners),
                held_ips=self._held(held_ips),
                local_cidrs=local_cidrs,
            ),
            conflicts=self._conflicts(),
            programmed_ips=self._programmed_ips(),
        )

    # -- claims ------------------------------------------------------------------------------

    def _claim(self, result: ServiceResult, fe: Frontend) -> None:
        owner = self._winners.get(fe.key)
        if owner is None:
            self._winners[fe.key] = fe
            self._ip_ref(fe.key.ip, +1)
            return
        contenders = self._contenders.setdefault(fe.key, {owner.service})
        contenders.add(result.key)
        self._crown(fe.key, contenders)

    def _release(self, service: str, key: FrontendKey) -> None:
        contenders = self._contenders.get(key)
        if contenders is None:
            del self._winners[key]
            self._ip_ref(key.ip, -1)
            return
        contenders.discard(service)
        if len(contenders) == 1:
            del self._contenders[key]
        self._crown(key, contenders)

    def _crown(self, key: FrontendKey, contenders: set[str]) -> None:
        """Give `key` to the oldest of its contenders."""
        oldest = min((self._results[s] for s in contenders), key=_age)
        self._winners[key] = _own(oldest, key)

    def _conflicts(self) -> dict[str, tuple[Problem, ...]]:
        lost: dict[str, dict[FrontendKey, str]] = {}
        for key, contenders in self._contenders.items():
            owner = self._winners[key].service
            for s in contenders - {owner}:
                lost.setdefault(s, {})[key] = owner
        out: dict[str, tuple[Problem, ...]] = {}
        for s in sorted(lost, key=lambda s: _age(self._results[s])):
            fes = {fe.key: fe for fe in self._results[s].frontends}
            out[s] = tuple(_conflict(fe, lost[s][k]) for k, fe in fes.items() if k in lost[s])
        return out

    # -- per-IP counts -------------------------------------------------------------------------

    def _ip_ref(self, ip: IPAddress, step: int) -> None:
        self._count(self._ip_keys, ip, step)

    def _lb_ref(self, ip: IPAddress, step: int) -> None:
        self._count(self._lb_refs, ip, step)

    def _count(self, counts: dict[IPAddress, int], ip: IPAddress, step: int) -> None:
        """Move `ip`'s count in `counts` by `step`; keep the derived sets when it crosses 0."""
        n = counts.get(ip, 0) + step
        if n:
            counts[ip] = n
        else:
            del counts[ip]
        if n == 0 or (n == 1 and step > 0):
            self._changed(ip)

    def _changed(self, ip: IPAddress) -> None:
        """Bring _programmed and _served up to date for `ip` after one of its counts moved."""
        programmed = ip in self._ip_keys
        if programmed:
            self._programmed.add(ip)
        else:
            self._programmed.discard(ip)
        if programmed and ip in self._lb_refs:
            self._served[ip] = None
        else:
            self._served.pop(ip, None)
        self._version += 1

    def _programmed_ips(self) -> frozenset[IPAddress]:
        """Return every IP with a frontend, reused while nothing moved."""
        if self._programmed_cache[0] != self._version:
            self._programmed_cache = (self._version, frozenset(self._programmed))
        return self._programmed_cache[1]

    def _held(self, held_ips: frozenset[IPAddress] | None) -> frozenset[IPAddress]:
        """Return the held IPs that have a programmed frontend, reused while nothing moved."""
        cached = self._held_cache
        if cached is not None and cached[0] is held_ips and cached[1] == self._version:
            return cached[2]
        value = frozenset(self._served) if held_ips is None else held_ips & self._programmed
        self._held_cache = (held_ips, self._version, value)
        return value


def assemble(
    results: Iterable[ServiceResult],
    *,
    held_ips: frozenset[IPAddress] | None,
    local_cidrs: tuple[IPNetwork, ...],
) -> Assembly:
    """Return the DesiredState for every Service's result (see FrontendIndex.snapshot)."""
    index = FrontendIndex()
    for result in results:
        index.put(result)
    return index.snapshot(held_ips=held_ips, local_cidrs=local_cidrs)
