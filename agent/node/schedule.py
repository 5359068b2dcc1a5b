"""When the next sync runs (pure): at once for an isolated change, bounded in frequency.

Like kube-proxy's minimum sync period: a change that arrives when the last sync is at least
`min_interval` old is synced at once (no fixed debounce delay on the common, quiet path); a
change that arrives sooner waits until `min_interval` after the last sync, and everything
that arrived meanwhile rides along in that one sync. So a burst (a rollout touching many
EndpointSlices) costs one sync per interval, and no change waits longer than `min_interval`
plus the sync in progress. Periodic full resyncs and drift checks are due on their own
clocks, and a failed sync is retried after its backoff. `SyncSchedule.step` says what one turn
of the loop does. Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class SyncSchedule:
    """Pending-change bookkeeping; all times are monotonic seconds supplied by the caller."""

    min_interval: float
    full_resync_period: float
    drift_check_period: float
    first_pending: float | None = None
    last_sync: float | None = None
    last_full: float | None = None
    last_drift_check: float | None = None
    last_batch_end: float | None = None  # when the last periodic-resync batch's sync ended
    retry_at: float = 0.0  # a failed sync is not retried before this

    def changed(self, now: float) -> SyncSchedule:
        """Return the schedule after a change observed at `now`."""
        if self.first_pending is not None:
            return self
        return replace(self, first_pending=now)

    def synced(self, now: float, *, full: bool) -> SyncSchedule:
        """Return the schedule after a sync that took in every change seen before it."""
        return replace(
            self,
            first_pending=None,
            last_sync=now,
            last_full=now if full else self.last_full,
            retry_at=0.0,
        )

    def failed(self, now: float, retry_after: float) -> SyncSchedule:
        """Return the schedule after a sync at `now` failed: what was pending stays pending,
        and nothing is due before `retry_after` seconds have passed."""
        return replace(self, retry_at=now + retry_after)

    def resynced(self, now: float) -> SyncSchedule:
        """Return the schedule after a periodic resync finished at `now`."""
        return replace(self, last_full=now)

    def batch_done(self, now: float) -> SyncSchedule:
        """Return the schedule after a periodic-resync batch's sync finished at `now`."""
        return replace(self, last_batch_end=now)

    def drift_checked(self, now: float) -> SyncSchedule:
        """Return the schedule after a drift check at `now`."""
        return replace(self, last_drift_check=now)

    def sync_due(self) -> float | None:
        """Return when pending changes must be synced, or None when nothing is pending."""
        if self.first_pending is None:
            return None
        if self.last_sync is None:
            return self.first_pending
        return max(self.first_pending, self.last_sync + self.min_interval)

    def full_due(self) -> float:
        """Return when the next full resync is due (at once if there never was one)."""
        return 0.0 if self.last_full is None else self.last_full + self.full_resync_period

    def sweep_due(self) -> float:
        """Return when the next batch of a periodic resync in progress may run: like a
        change, at least `min_interval` after the last sync started, and also that long
        after the last batch ended, so that a resync leaves the agent idle between batches
        however long a batch takes on a loaded machine."""
        gap = self.min_interval
        after_sync = 0.0 if self.last_sync is None else self.last_sync + gap
        after_batch = 0.0 if self.last_batch_end is None else self.last_batch_end + gap
        return max(after_sync, after_batch)

    def batch_ran_last(self) -> bool:
        """Return True when the last sync was a periodic-resync batch's (a batch ends after
        the sync it ran in started; a later sync of changes alone starts after that end)."""
        if self.last_batch_end is None:
            return False
        return self.last_sync is None or self.last_batch_end >= self.last_sync

    def drift_due(self) -> float:
        """Return when the next drift check is due."""
        base = self.last_drift_check if self.last_drift_check is not None else self.last_full
        return (base or 0.0) + self.drift_check_period

    def drift_check_due(self, now: float) -> bool:
        """Return True when a drift check is due at `now` (never before the first full sync:
        there is no table of ours to read back yet)."""
        return self.last_full is not None and now >= self.drift_due()

    def step(self, now: float, *, everything: bool, sweeping: bool) -> Step:
        """Return what a turn of the loop at `now` does.

        `everything`: every Service must be recomputed (a sync failed); `sweeping`: a periodic
        resync is in progress. The first step (no sync succeeded yet) is a full sync. A
        periodic resync starts once due, after the first sync; while it runs, a batch is due
        `min_interval` after the last one ended (see sweep_due), except that a change pending
        right after a batch goes alone: it would otherwise wait for that batch and the next
        one too. The turn after takes a batch again whatever is pending, so steady churn
        cannot stall the resync. Pending changes are recomputed whenever the loop turns; the
        loop turns when `next_wakeup` says.
        """
        full = self.last_sync is None
        start = not full and not sweeping and now >= self.full_due()
        pending = self.sync_due() is not None
        batch = (
            (sweeping or start)
            and now >= self.sweep_due()
            and not (pending and self.batch_ran_last())
        )
        return Step(
            full=full,
            start_sweep=start,
            batch=batch,
            recompute=full or pending or everything or batch,
        )

    def next_wakeup(self, *, sweeping: bool = False) -> float:
        """Return the earliest time anything is due (`sweeping`: a periodic resync is in
        progress, so its next batch is due instead of the next resync), and never before a
        failed sync's retry time."""
        due = [self.sweep_due() if sweeping else self.full_due(), self.drift_due()]
        if (s := self.sync_due()) is not None:
            due.append(s)
        return max(min(due), self.retry_at)


@dataclass(frozen=True, slots=True)
class Step:
    """What one turn of the agent loop does (see SyncSchedule.step)."""

    full: bool  # no sync succeeded yet: recompute everything, send a full transaction
    start_sweep: bool  # a periodic resync starts: every Service is queued to be checked
    batch: bool  # the periodic resync recomputes its next batch of Services
    recompute: bool  # Services are recomputed and the dataplane synced
