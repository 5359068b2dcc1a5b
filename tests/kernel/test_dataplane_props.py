"""Property: a delta applied in the kernel leaves exactly the table a full render leaves.

For random desired states, full(a) then delta(a -> b) must read back (rules.readback.from_json)
exactly as full(b) does, and as expected(b); and the applier, taken through a short chain of
states, must leave the table a full render of the last one leaves. Runs in one throwaway
namespace per test, through NetnsNftRunner.

The raw rules/ test skips (`assume`) the pairs whose delta nft 1.0.6 refuses (a new rule over a
`typeof ... th dport` map loaded from the kernel, see agent/dataplane/applier.py); the applier test
covers those too, since the applier sends the full table for them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.dataplane.applier import Dataplane, SyncMode, SyncOutcome
from agent.dataplane.libnft import NetnsNftRunner
from agent.model.desired_state import DesiredState
from rules import layout as L
from rules.delta import delta
from rules.readback import Snapshot, expected, from_json
from rules.render import render, render_cleanup
from tests.kernel.test_dataplane_apply import throwaway_netns
from tests.unit.rules_states import desired_states

pytestmark = pytest.mark.kernel

PROPS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)


@pytest.fixture(scope="module")
def runner() -> Iterator[NetnsNftRunner]:
    with throwaway_netns("prop") as name:
        r = NetnsNftRunner(name)
        try:
            yield r
        finally:
            r.close()


def _snapshot(r: NetnsNftRunner) -> Snapshot:
    return from_json(r.list_table(L.TABLE_FAMILY, L.TABLE_NAME))


def _full(r: NetnsNftRunner, s: DesiredState) -> Snapshot:
    dp = Dataplane(r)
    dp.cleanup()
    res = dp.sync(s)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL), res.error
    return _snapshot(r)


def _through_applier(r: NetnsNftRunner, states: list[DesiredState]) -> Snapshot:
    dp = Dataplane(r)
    dp.cleanup()
    first = dp.sync(states[0])
    assert first.mode is SyncMode.FULL and first.ok, first.error
    for s in states[1:]:
        res = dp.sync(s)
        assert res.ok, res.error
        assert res.mode is not SyncMode.FULL
    return _snapshot(r)


@PROPS
@given(a=desired_states(), b=desired_states())
def test_full_then_delta_reads_back_like_a_full_render(
    runner: NetnsNftRunner, a: DesiredState, b: DesiredState
) -> None:
    full_a, step = render(a), delta(a, b)
    runner.run(render_cleanup())
    runner.run(full_a)
    if step.ops:
        runner.run(step)
    via_delta = _snapshot(runner)
    via_full = _full(runner, b)
    assert via_full.differences(via_delta) == []
    assert expected(b).differences(via_full) == []


@PROPS
@given(states=st.lists(desired_states(), min_size=2, max_size=5))
def test_the_applier_through_a_chain_of_states_reads_back_like_a_full_render_of_the_last(
    runner: NetnsNftRunner, states: list[DesiredState]
) -> None:
    via_applier = _through_applier(runner, states)
    via_full = _full(runner, states[-1])
    assert via_full.differences(via_applier) == []
    assert expected(states[-1]).differences(via_applier) == []


@PROPS
@given(a=desired_states(), b=desired_states())
def test_a_full_sync_in_place_over_a_populated_table_reads_back_like_a_fresh_one(
    runner: NetnsNftRunner, a: DesiredState, b: DesiredState
) -> None:
    dp = Dataplane(runner)
    dp.cleanup()
    assert dp.sync(a).ok
    res = dp.sync(b, full=True)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL), res.error
    assert expected(b).differences(_snapshot(runner)) == []
    restarted = Dataplane(runner)  # takes the table over: reads it, rewrites it in place
    assert restarted.sync(a).ok
    assert expected(a).differences(_snapshot(runner)) == []
