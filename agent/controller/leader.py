"""Leader election over a coordination.k8s.io Lease: a pure decision and a thin renewing shell.

Only one controller allocates at a time. The rules are client-go's:

- A candidate judges a Lease held by someone else by when *it* last saw the record change
  (its own monotonic clock), never by the renewTime written on another machine, so clock
  skew between nodes cannot make two leaders.
- It may take the Lease once `leaseDurationSeconds` have passed since it saw the last change,
  or at once when the holder is empty (a leader that stopped cleanly released it).
- Every write carries the resourceVersion it was computed from, so of two candidates racing
  for an expired Lease exactly one wins (the other gets 409 Conflict).
- The leader acts only while its last successful renewal is younger than `renew_deadline`
  (shorter than the lease duration): a leader cut off from the API stops writing before any
  other candidate may take over. `LeaderElector.is_leader()` is that guard; the controller
  checks it before every status write.

`decide` holds the rules and does no I/O; `LeaderElector` reads and writes the Lease through
the narrow `LeaseAPI` (agent.controller.api) and reads the time from an injected clock.
"""

from __future__ import annotations

import datetime
import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.controller.api import Clock, LeaseAPI

log = logging.getLogger(__name__)


class LeaseVerdict(enum.StrEnum):
    """What a candidate does with the Lease it just read."""

    CREATE = "Create"  # no Lease yet
    ACQUIRE = "Acquire"  # free or expired: take it over
    RENEW = "Renew"  # ours: extend it
    WAIT = "Wait"  # someone else holds it and it has not expired


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The fields of a Lease's spec the election uses (None: the Lease does not exist)."""

    holder: str
    duration: int
    transitions: int
    acquire_time: str | None
    resource_version: str


@dataclass(frozen=True, slots=True)
class Observation:
    """The last record this candidate saw, and when (its monotonic clock) it saw it change."""

    record: LeaseRecord
    seen_at: float


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict, and the spec to write for CREATE / ACQUIRE / RENEW."""

    verdict: LeaseVerdict
    spec: dict[str, Any] | None = None


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """Return the observation after reading `record`: its clock restarts only on a change."""
    if previous is not None and _same_term(previous.record, record):
        return Observation(record, previous.seen_at)
    return Observation(record, now)


def _same_term(a: LeaseRecord, b: LeaseRecord) -> bool:
    # A renewal changes the resourceVersion; that is the change we time expiry from.
    return a.resource_version == b.resource_version


def decide(
    *,
    me: str,
    observation: Observation | None,
    now: float,
    wall: datetime.datetime,
    duration: int,
) -> Decision:
    """Return what `me` should do, given the Lease as last observed (None: it does not exist).

    `now` is this process's monotonic clock (for expiry), `wall` the time written into the
    Lease (for people reading it).
    """
    stamp = _micro_time(wall)
    if observation is None:
        spec = _spec(me, duration, stamp, stamp, transitions=0)
        return Decision(LeaseVerdict.CREATE, spec)
    rec = observation.record
    if rec.holder == me:
        spec = _spec(me, duration, rec.acquire_time or stamp, stamp, transitions=rec.transitions)
        return Decision(LeaseVerdict.RENEW, spec)
    expired = not rec.holder or now >= observation.seen_at + rec.duration
    if not expired:
        return Decision(LeaseVerdict.WAIT)
    spec = _spec(me, duration, stamp, stamp, transitions=rec.transitions + 1)
    return Decision(LeaseVerdict.ACQUIRE, spec)


def released_spec(record: LeaseRecord, wall: datetime.datetime) -> dict[str, Any]:
    """Return the spec a stopping leader writes: no holder, so a candidate takes over at once."""
    return {
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "acquireTime": record.acquire_time,
        "renewTime": _micro_time(wall),
        "leaseTransitions": record.transitions,
    }


def record_from_raw(obj: dict[str, Any]) -> LeaseRecord:
    """Return the election fields of a raw Lease object."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquire_time=spec.get("acquireTime"),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def _spec(
    me: str, duration: int, acquired: str, renewed: str, *, transitions: int
) -> dict[str, Any]:
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": duration,
        "acquireTime": acquired,
        "renewTime": renewed,
        "leaseTransitions": transitions,
    }


def _micro_time(wall: datetime.datetime) -> str:
    return wall.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    """Lease timing in seconds (client-go's defaults are 15 / 10 / 2)."""

    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, "
                f"got {self.retry_period} / {self.renew_deadline} / {self.lease_duration}"
            )


class LeaderElector:
    """Keeps trying to hold the Lease `namespace/name` as `identity`; see the module doc.

    `on_change(leading)` is called from the elector's thread whenever leadership is gained
    or lost. Start with `run(stop)` in a thread (or call `step()` by hand, as tests do); on
    stop the Lease is released if held.
    """

    def __init__(
        self,
        leases: LeaseAPI,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: ElectionTiming,
        on_change: Callable[[bool], None],
        clock: Clock,
    ) -> None:
        self._api = leases
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._timing = timing
        self._on_change = on_change
        self._clock = clock
        self._observation: Observation | None = None
        self._renewed_at: float | None = None
        self._leading = False
        self._lock = threading.Lock()

    def is_leader(self) -> bool:
        """Return True while the last successful renewal is younger than the renew deadline."""
        with self._lock:
            renewed = self._renewed_at
        return (
            renewed is not None and self._clock.monotonic() < renewed + self._timing.renew_deadline
        )

    def run(self, stop: threading.Event) -> None:
        """Acquire and renew until `stop` is set; then release the Lease if we hold it."""
        while not stop.is_set():
            self.step()
            stop.wait(self._timing.retry_period)
        self.release()

    def step(self) -> None:
        """Read the Lease and create, take over or renew it when the rules say so (one round)."""
        try:
            self._try_once()
        except Exception as exc:  # the API being away is routine; keep trying
            log.warning("leader election: %s", exc)
        if self._leading and not self.is_leader():
            self._set_leading(False)

    def release(self) -> None:
        """Give the Lease up if we lead (a stopping leader), so a candidate takes over at once."""
        if self._leading:
            self._release()
            self._set_leading(False)

    def _try_once(self) -> None:
        now = self._clock.monotonic()
        raw = self._api.read_lease(self._namespace, self._name)
        self._observation = (
            None if raw is None else observe(self._observation, record_from_raw(raw), now)
        )
        decision = decide(
            me=self.identity,
            observation=self._observation,
            now=now,
            wall=self._clock.wall(),
            duration=self._timing.lease_duration,
        )
        if decision.verdict is LeaseVerdict.WAIT:
            return
        assert decision.spec is not None
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": decision.spec,
        }
        if decision.verdict is LeaseVerdict.CREATE:
            written = self._api.create_lease(self._namespace, body)
        else:
            assert self._observation is not None
            body["metadata"]["resourceVersion"] = self._observation.record.resource_version
            written = self._api.replace_lease(self._namespace, self._name, body)
        if not written:  # another candidate wrote first
            return
        with self._lock:
            self._renewed_at = now
        if not self._leading:
            log.info("became the leader", extra={"lease": self._name, "identity": self.identity})
            self._set_leading(True)

    def _release(self) -> None:
        try:
            raw = self._api.read_lease(self._namespace, self._name)
            if raw is None:
                return
            record = record_from_raw(raw)
            if record.holder != self.identity:
                return
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self._name,
                    "namespace": self._namespace,
                    "resourceVersion": record.resource_version,
                },
                "spec": released_spec(record, self._clock.wall()),
            }
            self._api.replace_lease(self._namespace, self._name, body)
            log.info("released the leader lease", extra={"lease": self._name})
        except Exception as exc:
            log.warning("could not release the leader lease: %s", exc)

    def _set_leading(self, leading: bool) -> None:
        if not leading:
            with self._lock:
                self._renewed_at = None
        self._leading = leading
        self._on_change(leading)
