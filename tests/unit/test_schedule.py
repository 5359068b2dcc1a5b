"""Sync scheduling: an isolated change syncs at once; bursts share one sync per interval."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.node.schedule import Step, SyncSchedule


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


def test_a_failed_sync_is_retried_after_its_backoff_and_a_good_sync_clears_it() -> None:
    s = schedule().synced(10.0, full=True).changed(20.0).failed(20.0, 0.5)
    assert s.sync_due() == 20.0, "what was pending stays pending"
    assert s.next_wakeup() == 20.5
    s = s.synced(20.6, full=False)
    assert s.retry_at == 0.0
    assert s.next_wakeup() == min(s.full_due(), s.drift_due())


def test_no_drift_check_is_due_before_the_first_full_sync() -> None:
    s = schedule()
    assert not s.drift_check_due(10**6)
    s = s.synced(100.0, full=True)
    assert not s.drift_check_due(159.9)
    assert s.drift_check_due(160.0)


@dataclass(frozen=True)
class StepCase:
    schedule: SyncSchedule
    now: float
    want: Step
    everything: bool = False
    sweeping: bool = False


SYNCED = schedule().synced(100.0, full=True)  # the first sync went out at 100.0
RESYNC_DUE = 100.0 + 300
SWEEPING = SYNCED.synced(RESYNC_DUE, full=False).batch_done(RESYNC_DUE + 0.05)

FULL = Step(full=True, start_sweep=False, batch=False, recompute=True)
IDLE = Step(full=False, start_sweep=False, batch=False, recompute=False)
PARTIAL = Step(full=False, start_sweep=False, batch=False, recompute=True)  # changes only
START = Step(full=False, start_sweep=True, batch=True, recompute=True)  # and the first batch
BATCH = Step(full=False, start_sweep=False, batch=True, recompute=True)  # with any change

STEP_CASES = [
    pytest.param(
        StepCase(schedule(), 5.0, FULL),
        id="before any sync succeeded the step is a full sync with nothing pending",
    ),
    pytest.param(
        StepCase(schedule().failed(5.0, 1.0).changed(5.5), 6.0, FULL),
        id="a first sync that failed is full again, and no resync starts before it succeeds",
    ),
    pytest.param(
        StepCase(SYNCED, 150.0, IDLE),
        id="nothing pending and no resync due means the step does nothing",
    ),
    pytest.param(
        StepCase(SYNCED.changed(150.0), 150.0, PARTIAL),
        id="a pending change is recomputed and synced as a partial sync",
    ),
    pytest.param(
        StepCase(SYNCED.failed(150.0, 0.5), 151.0, PARTIAL, everything=True),
        id="after a failed sync everything is recomputed though no change is pending",
    ),
    pytest.param(
        StepCase(SYNCED, RESYNC_DUE, START),
        id="a periodic resync falling due starts and runs its first batch in the same step",
    ),
    pytest.param(
        StepCase(SYNCED.changed(RESYNC_DUE), RESYNC_DUE, START),
        id="a change pending when the resync starts rides along with the first batch",
    ),
    pytest.param(
        StepCase(SWEEPING, RESYNC_DUE + 0.2, BATCH, sweeping=True),
        id="a resync in progress runs its next batch min_interval after the last one ended",
    ),
    pytest.param(
        StepCase(SWEEPING, RESYNC_DUE + 0.12, IDLE, sweeping=True),
        id="no batch runs sooner than min_interval after the last batch ended",
    ),
    pytest.param(
        StepCase(SWEEPING.changed(RESYNC_DUE + 0.1), RESYNC_DUE + 0.2, PARTIAL, sweeping=True),
        id="a change pending right after a batch goes alone without the next batch",
    ),
    pytest.param(
        StepCase(
            SWEEPING.synced(RESYNC_DUE + 0.15, full=False).changed(RESYNC_DUE + 0.2),
            RESYNC_DUE + 0.3,
            BATCH,
            sweeping=True,
        ),
        id="a change pending after a change-only sync rides with the next batch",
    ),
    pytest.param(
        StepCase(SWEEPING, RESYNC_DUE + 400, BATCH, sweeping=True),
        id="a resync still in progress when the next period passes is not started again",
    ),
]


@pytest.mark.parametrize("case", STEP_CASES)
def test_what_a_turn_of_the_loop_does(case: StepCase) -> None:
    got = case.schedule.step(case.now, everything=case.everything, sweeping=case.sweeping)
    assert got == case.want
