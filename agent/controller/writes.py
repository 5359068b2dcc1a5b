"""Status writes: one in flight per Service, and what each way a write can end leads to (pure).

A Service has at most one status write in flight. A change to it meanwhile is not reconciled
at once (the allocator would move ahead of what status is about to say, and a second write
from the same resourceVersion could only fail); it is remembered and the Service is
reconciled again when the write completes, whatever its outcome.

How a write ended decides what follows (`complete_write`):

| outcome    | counted | its Events | reconcile again                         |
|------------|---------|------------|-----------------------------------------|
| OK         | yes     | sent now   | at once only if it changed meanwhile    |
| CONFLICT   | yes     | never      | after the conflict delay (1 s)          |
| ERROR      | yes     | never      | after the error delay (5 s)             |
| NOT_LEADER | no      | never      | at once                                 |

A conflict means the view was stale (409) or the Service is gone (404): the watch normally
brings the new version or the deletion first, the timer covers it not doing so. NOT_LEADER
was never sent: leadership lapsed before it left, and the next round finds that out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from agent.controller.reconcile import Reconcile, Step


class WriteOutcome(enum.StrEnum):
    """How a status write ended (the values are the metric's result label)."""

    OK = "ok"
    CONFLICT = "conflict"  # 409 stale resourceVersion, or 404 deleted meanwhile
    ERROR = "error"
    NOT_LEADER = "not_leader"  # not sent: leadership lapsed before it left


@dataclass(frozen=True, slots=True)
class RetryDelays:
    """Seconds before a Service whose write failed is reconciled again."""

    conflict: float = 1.0
    error: float = 5.0


@dataclass(frozen=True, slots=True)
class Completion:
    """What follows a completed write; see the table in the module doc.

    `redo`: reconcile the Service at once. `retry_at`: reconcile it then (monotonic).
    `announce`: send the write's Events now. `counted`: count it in nodelb_status_writes_total.
    """

    redo: bool
    retry_at: float | None
    announce: bool
    counted: bool


def complete_write(
    outcome: WriteOutcome, *, changed_meanwhile: bool, now: float, delays: RetryDelays
) -> Completion:
    """Return what follows a write that ended with `outcome`.

    `changed_meanwhile`: the Service was marked while the write was in flight (a deferred
    reconcile), so it is reconciled again whatever the outcome.
    """
    if outcome is WriteOutcome.NOT_LEADER:
        return Completion(redo=True, retry_at=None, announce=False, counted=False)
    if outcome is WriteOutcome.CONFLICT:
        return Completion(changed_meanwhile, now + delays.conflict, announce=False, counted=True)
    if outcome is WriteOutcome.ERROR:
        return Completion(changed_meanwhile, now + delays.error, announce=False, counted=True)
    return Completion(changed_meanwhile, None, announce=True, counted=True)


@dataclass(slots=True)
class WritesInFlight:
    """The Services with a status write in flight, and those that changed meanwhile."""

    _sending: set[str] = field(default_factory=set)
    _changed: set[str] = field(default_factory=set)

    def __contains__(self, key: object) -> bool:
        return key in self._sending

    def __len__(self) -> int:
        return len(self._sending)

    def note(self, decided: Reconcile) -> None:
        """Record a reconcile: its write is now in flight, or it was deferred behind one."""
        if decided.step is Step.DEFERRED:
            self._changed.add(decided.key)
        elif decided.write is not None:
            self._sending.add(decided.key)

    def complete(
        self, key: str, outcome: WriteOutcome, *, now: float, delays: RetryDelays
    ) -> Completion:
        """Return what follows the completion of `key`'s write; it is no longer in flight."""
        self._sending.discard(key)
        changed = key in self._changed
        self._changed.discard(key)
        return complete_write(outcome, changed_meanwhile=changed, now=now, delays=delays)
