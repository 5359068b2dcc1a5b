"""When the next sync runs (pure): changes coalesce, but none waits past a maximum delay.

A burst of changes (a rollout touching many EndpointSlices) is debounced: the sync runs once
the stream has been quiet for `min_interval`, yet never later than `max_delay` after the first
change still pending, so a steady trickle cannot starve the dataplane. Periodic full resyncs
and drift checks are due on their own clocks. Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class SyncSchedule:
    """Pending-change bookkeeping; all times are monotonic seconds supplied by the caller."""

    min_interval: float
    max_delay: float
    full_resync_period: float
    drift_check_period: float
    first_pending: float | None = None
    last_change: float | None = None
    last_full: float | None = None
    last_drift_check: float | None = None

    def changed(self, now: float) -> SyncSchedule:
        """Return the schedule after a change observed at `now`."""
        first = self.first_pending if self.first_pending is not None else now
        return replace(self, first_pending=first, last_change=now)

    def synced(self, now: float, *, full: bool) -> SyncSchedule:
        """Return the schedule after a sync that took in every change seen before it."""
        return replace(
            self,
            first_pending=None,
            last_change=None,
            last_full=now if full else self.last_full,
        )

    def drift_checked(self, now: float) -> SyncSchedule:
        """Return the schedule after a drift check at `now`."""
        return replace(self, last_drift_check=now)

    def sync_due(self) -> float | None:
        """Return when pending changes must be synced, or None when nothing is pending."""
        if self.first_pending is None or self.last_change is None:
            return None
        return min(self.last_change + self.min_interval, self.first_pending + self.max_delay)

    def full_due(self) -> float:
        """Return when the next full resync is due (at once if there never was one)."""
        return 0.0 if self.last_full is None else self.last_full + self.full_resync_period

    def drift_due(self) -> float:
        """Return when the next drift check is due."""
        base = self.last_drift_check if self.last_drift_check is not None else self.last_full
        return (base or 0.0) + self.drift_check_period

    def next_wakeup(self) -> float:
        """Return the earliest time anything is due."""
        due = [self.full_due(), self.drift_due()]
        if (s := self.sync_due()) is not None:
            due.append(s)
        return min(due)
