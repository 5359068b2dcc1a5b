"""Sync coalescing: bursts become one sync, and no change waits past the maximum delay."""

from __future__ import annotations

from agent.schedule import SyncSchedule


def schedule() -> SyncSchedule:
    return SyncSchedule(
        min_interval=0.1, max_delay=1.0, full_resync_period=300, drift_check_period=60
    )


def test_nothing_pending_means_no_sync_but_a_first_full_sync_is_due_at_once() -> None:
    s = schedule()
    assert s.sync_due() is None
    assert s.full_due() == 0.0
    assert s.next_wakeup() == 0.0


def test_a_single_change_syncs_after_the_quiet_interval() -> None:
    s = schedule().synced(10.0, full=True).changed(20.0)
    assert s.sync_due() == 20.1
    assert s.next_wakeup() == 20.1


def test_a_burst_is_debounced_into_one_sync() -> None:
    s = schedule().synced(0.0, full=True)
    for t in (5.00, 5.05, 5.09):
        s = s.changed(t)
    assert s.sync_due() == 5.09 + 0.1


def test_a_steady_trickle_cannot_push_a_change_past_the_maximum_delay() -> None:
    s = schedule().synced(0.0, full=True)
    t = 5.0
    while t < 7.0:
        s = s.changed(t)
        t += 0.05
    assert s.sync_due() == 5.0 + 1.0


def test_a_sync_clears_pending_changes_and_records_full_resyncs() -> None:
    s = schedule().changed(1.0).synced(1.1, full=True)
    assert s.sync_due() is None
    assert s.full_due() == 1.1 + 300
    s = s.changed(2.0).synced(2.1, full=False)
    assert s.full_due() == 1.1 + 300


def test_drift_checks_follow_the_last_check_or_the_last_full_sync() -> None:
    s = schedule().synced(100.0, full=True)
    assert s.drift_due() == 160.0
    s = s.drift_checked(170.0)
    assert s.drift_due() == 230.0
    assert s.next_wakeup() == 230.0
