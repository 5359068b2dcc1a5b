"""Service writes: one in flight per Service, and what each way a write can end leads to (pure).

A write is a Service's status patch, its cleanup-finalizer patch, or both in a fixed order
(agent/controller/reconcile.py, `StatusWrite`); a conflict or error at any request ends it
there. A Service has at most one write in flight. A change to it meanwhile is not reconciled
at once (the allocator would move ahead of what status is about to say, and a second write
from the same resourceVersion could only fail); it is remembered and the Service is
reconciled again when the write completes, whatever its outcome.

How a write ended decides what follows (`complete_write`):

| outcome    | its Events                          | reconcile again                      |
|------------|-------------------------------------|--------------------------------------|
| OK         | sent now                            | at once only if it changed meanwhile |
| CONFLICT   | sent now if its status patch landed | after the conflict delay (1 s)       |
| ERROR      | sent now if its status patch landed | after the error delay (5 s)          |
| NOT_LEADER | never                               | at once                              |

A conflict means the view was stale (409) or the Service is gone (404): the watch normally
brings the new version or the deletion first, the timer covers it not doing so. A status
patch can land and the finalizer removal after it fail: its Events (IPReleased) still go,
since the status they explain is stored and the retry will find nothing left to say. Each
request is counted where it is sent (nodelb_status_writes_total,
nodelb_finalizer_writes_total); NOT_LEADER was never sent: leadership lapsed before it left,
and the next round finds that out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from agent.controller.reconcile import Reconcile, Step


class WriteOutcome(enum.StrEnum):
    """How a write ended (the first three are also the metrics' result label)."""

    OK = "ok"
    CONFLICT = "conflict"  # 409 stale resourceVersion, or 404 deleted meanwhile
    ERROR = "error"
    NOT_LEADER = "not_leader"  # not sent: leadership lapsed before it left


@dataclass(frozen=True, slots=True)
class WriteResult:
    """How a write ended, and whether its status patch landed before that."""

    outcome: WriteOutcome
    status_written: bool = False


@dataclass(frozen=True, slots=True)
class RetryDelays:
    """Seconds before a Service whose write failed is reconciled again."""

    conflict: float = 1.0
    error: float = 5.0


@dataclass(frozen=True, slots=True)
class Completion:
    """What follows a completed write; see the table in the module doc.

    `redo`: reconcile the Service at once. `retry_at`: reconcile it then (monotonic).
    `announce`: send the write's Events now.
    """

    redo: bool
    retry_at: float | None
    announce: bool


def complete_write(
    result: WriteResult, *, changed_meanwhile: bool, now: float, delays: RetryDelays
) -> Completion:
    """Return what follows a write that ended with `result`.

    `changed_meanwhile`: the Service was marked while the write was in flight (a deferred
    reconcile), so it is reconciled again whatever the outcome.
    """
    outcome, landed = result.outcome, result.status_written
    if outcome is WriteOutcome.NOT_LEADER:
        return Completion(redo=True, retry_at=None, announce=False)
    if outcome is WriteOutcome.CONFLICT:
        return Completion(changed_meanwhile, now + delays.conflict, announce=landed)
    if outcome is WriteOutcome.ERROR:
        return Completion(changed_meanwhile, now + delays.error, announce=landed)
    return Completion(changed_meanwhile, None, announce=True)


@dataclass(slots=True)
class WritesInFlight:
    """The Services with a write in flight, and those that changed meanwhile."""

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
        self, key: str, result: WriteResult, *, now: float, delays: RetryDelays
    ) -> Completion:
        """Return what follows the completion of `key`'s write; it is no longer in flight."""
        self._sending.discard(key)
        changed = key in self._changed
        self._changed.discard(key)
        return complete_write(result, changed_meanwhile=changed, now=now, delays=delays)
