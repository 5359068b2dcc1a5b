"""Sync scheduling: an isolated change syncs at once; bursts share one sync per interval."""

from __future__ import annotations

from agent.node.schedule import SyncSchedule


def schedule() -> SyncSchedule:
    return SyncSchedule(min_interval=0.1, full_resync_period=300, drift_check_period=60)


def test_nothing_pending_means_no_sync_but_a_first_full_sync_is_due_at_once() -> None:
    s = schedule()
    assert s.sync_due() is None
    assert s.full_due() == 0.0
    assert s.next_wakeup() == 0.0


def test_an_isolated_change_syncs_at_once() -> None:
    s = schedule().synced(10.0, full=True).changed(20.0)
    assert s.sync_due() == 20.0
    assert s.next_wakeup() == 20.0


def test_a_change_right_after_a_sync_waits_for_the_minimum_interval() -> None:
    s = schedule().synced(5.0, full=True).changed(5.02)
    assert s.sync_due() == 5.0 + 0.1


def test_a_burst_rides_along_in_one_sync_and_keeps_its_first_arrival_time() -> None:
    s = schedule().synced(5.0, full=True)
    for t in (5.02, 5.05, 5.09, 5.5):
        s = s.changed(t)
    assert s.first_pending == 5.02
    assert s.sync_due() == 5.0 + 0.1


def test_a_sync_clears_pending_changes_and_records_full_resyncs() -> None:
    s = schedule().changed(1.0).synced(1.1, full=True)
    assert s.sync_due() is None
    assert s.full_due() == 1.1 + 300
    s = s.changed(2.0).synced(2.1, full=False)
    assert s.full_due() == 1.1 + 300
    assert s.last_sync == 2.1


def test_drift_checks_follow_the_last_check_or_the_last_full_sync() -> None:
    s = schedule().synced(100.0, full=True)
    assert s.drift_due() == 160.0
    s = s.drift_checked(170.0)
    assert s.drift_due() == 230.0
    assert s.next_wakeup() == 230.0


def test_a_resync_batch_waits_the_minimum_interval_after_the_last_batch_ended() -> None:
    # A batch's sync started at 10.0 and, on a loaded machine, ended at 10.3: the next batch
    # is due 0.1 s after the end, not 0.1 s after the start (which had already passed).
    s = schedule().synced(10.0, full=False)
    assert s.sweep_due() == 10.0 + 0.1
    s = s.batch_done(10.3)
    assert s.sweep_due() == 10.3 + 0.1
    assert s.next_wakeup(sweeping=True) == 10.3 + 0.1
    assert s.batch_ran_last()
    # A later sync of changes alone keeps the batch spacing too, and is the last sync now.
    s = s.synced(10.5, full=False)
    assert s.sweep_due() == 10.5 + 0.1
    assert not s.batch_ran_last()
