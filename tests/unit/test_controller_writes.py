"""Status writes (agent/controller/writes.py): one in flight per Service, and what follows each."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.controller.reconcile import Reconcile, Step
from agent.controller.writes import (
    Completion,
    RetryDelays,
    WriteOutcome,
    WriteResult,
    WritesInFlight,
    complete_write,
)
from tests.unit.test_controller_reconcile import World, raw_service

DELAYS = RetryDelays(conflict=1.0, error=5.0)
W = WriteOutcome


@dataclass(frozen=True, slots=True)
class CompletionCase:
    outcome: WriteOutcome
    changed_meanwhile: bool
    expect: Completion
    status_written: bool = False


COMPLETION_CASES = [
    pytest.param(
        CompletionCase(W.OK, False, Completion(False, None, announce=True)),
        id="a write that succeeded sends its Events and needs nothing more",
    ),
    pytest.param(
        CompletionCase(W.OK, True, Completion(True, None, announce=True)),
        id="a write that succeeded while the Service changed: Events now, and it is redone",
    ),
    pytest.param(
        CompletionCase(W.CONFLICT, False, Completion(False, 11.0, announce=False)),
        id="a conflict (stale view or deleted) sends no Event and retries after a second",
    ),
    pytest.param(
        CompletionCase(W.CONFLICT, True, Completion(True, 11.0, announce=False)),
        id="a conflict on a Service that changed meanwhile is redone at once, the timer kept",
    ),
    pytest.param(
        CompletionCase(W.CONFLICT, False, Completion(False, 11.0, announce=True), True),
        id="a finalizer removal refused after its status patch landed: the Events still go",
    ),
    pytest.param(
        CompletionCase(W.ERROR, False, Completion(False, 15.0, announce=False)),
        id="an error sends no Event and retries after five seconds",
    ),
    pytest.param(
        CompletionCase(W.ERROR, False, Completion(False, 15.0, announce=True), True),
        id="an error after the status patch landed: its Events go, retried after five seconds",
    ),
    pytest.param(
        CompletionCase(W.NOT_LEADER, False, Completion(True, None, announce=False)),
        id="a write never sent because leadership lapsed is redone at once",
    ),
]


@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_complete_write(case: CompletionCase) -> None:
    got = complete_write(
        WriteResult(case.outcome, case.status_written),
        changed_meanwhile=case.changed_meanwhile,
        now=10.0,
        delays=DELAYS,
    )
    assert got == case.expect


@dataclass(frozen=True, slots=True)
class DeferralCase:
    """A Service's write goes out; `during` reconciles happen while it is in flight."""

    during: int
    outcome: WriteOutcome
    redo: bool


DEFERRAL_CASES = [
    pytest.param(
        DeferralCase(0, W.OK, redo=False),
        id="no change while in flight: done when the write succeeds",
    ),
    pytest.param(
        DeferralCase(1, W.OK, redo=True),
        id="a change while in flight waits for the write, then the Service is redone",
    ),
    pytest.param(
        DeferralCase(3, W.OK, redo=True),
        id="three changes while in flight still make one write in flight, redone once after",
    ),
    pytest.param(
        DeferralCase(1, W.CONFLICT, redo=True),
        id="a change while a write fails with a conflict is redone at once after it",
    ),
]


@pytest.mark.parametrize("case", DEFERRAL_CASES)
def test_one_write_per_service_in_flight(case: DeferralCase) -> None:
    world = World()
    key = world.add(raw_service("web"))
    writes = WritesInFlight()
    first = world.reconcile(key, writing=key in writes)
    writes.note(first)
    assert first.step is Step.WRITE and key in writes
    world.raws[key]["metadata"]["labels"] = {"changed": "yes"}
    for _ in range(case.during):
        again = world.reconcile(key, writing=key in writes)
        writes.note(again)
        assert again.step is Step.DEFERRED and again.write is None
    assert len(writes) == 1  # however many changes came meanwhile
    done = writes.complete(key, WriteResult(case.outcome), now=10.0, delays=DELAYS)
    assert done.redo is case.redo
    assert key not in writes
    # The next write of the Service is a fresh one, not remembered as changed meanwhile.
    writes.note(world.reconcile(key, writing=False))
    assert writes.complete(key, WriteResult(W.OK), now=11.0, delays=DELAYS).redo is False


def test_only_a_decided_write_is_in_flight() -> None:
    writes = WritesInFlight()
    writes.note(Reconcile("ns/a", Step.UP_TO_DATE))
    writes.note(Reconcile("ns/b", Step.INVALID))
    assert "ns/a" not in writes and "ns/b" not in writes and len(writes) == 0
