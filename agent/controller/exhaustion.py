"""Rate limiting of PoolExhausted Events and backoff of the retries (pure).

A Service waiting on a full pool is retried with exponential backoff (`Backoff.initial`,
doubling up to `Backoff.maximum`), and gets at most one PoolExhausted Warning per
(Service, pool) per backoff window: the first failure reports at once, the next report comes
no sooner than the current backoff delay later. A resync that re-runs the allocation before
the retry is due neither emits an Event nor advances the backoff, so a Service never gets one
Event per resync. Success, deletion or a change of pool forgets the Service (`forget`), and a
new failure starts again from the initial delay.

Time is passed in (seconds on any monotonic origin); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.backoff import Backoff


@dataclass(frozen=True, slots=True)
class ExhaustedDecision:
    """What to do about one PoolExhausted failure: emit an Event?, and when to retry."""

    emit_event: bool
    retry_at: float
    failures: int


@dataclass(slots=True)
class _Waiting:
    failures: int
    retry_at: float
    next_event_at: float


@dataclass(slots=True)
class ExhaustionLimiter:
    """Per (Service, pool) backoff state for Services waiting on a full pool."""

    backoff: Backoff = field(default_factory=Backoff)
    _waiting: dict[tuple[str, str], _Waiting] = field(default_factory=dict)

    def exhausted(self, *, service: str, pool: str, now: float) -> ExhaustedDecision:
        """Return whether to emit a PoolExhausted Event now and when to retry.

        A call before the retry is due (a resync) changes nothing and returns the pending
        retry time with `emit_event` False.
        """
        key = (service, pool)
        state = self._waiting.get(key)
        if state is None:
            delay = self.backoff.delay(1)
            self._waiting[key] = _Waiting(1, now + delay, now + delay)
            return ExhaustedDecision(True, now + delay, 1)
        if now < state.retry_at:
            return ExhaustedDecision(False, state.retry_at, state.failures)
        state.failures += 1
        delay = self.backoff.delay(state.failures)
        state.retry_at = now + delay
        emit = now >= state.next_event_at
        if emit:
            state.next_event_at = now + delay
        return ExhaustedDecision(emit, state.retry_at, state.failures)

    def forget(self, *, service: str) -> None:
        """Drop the backoff state of `service` (allocated, deleted, or asking elsewhere)."""
        for key in [k for k in self._waiting if k[0] == service]:
            del self._waiting[key]

    def due(self, *, now: float) -> list[str]:
        """Return the waiting Services whose retry time has come, sorted."""
        return sorted({s for (s, _), w in self._waiting.items() if w.retry_at <= now})

    def waiting_services(self) -> list[str]:
        """Return every Service waiting on a full pool, sorted (retried when an address frees)."""
        return sorted({s for s, _ in self._waiting})

    def next_retry(self) -> float | None:
        """Return the earliest pending retry time, or None when nothing waits."""
        return min((w.retry_at for w in self._waiting.values()), default=None)

    def waiting(self) -> int:
        """Return how many (Service, pool) pairs are waiting (for a metric)."""
        return len(self._waiting)
