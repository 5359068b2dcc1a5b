"""The LeaderElector shell against a fake apiserver that enforces resourceVersion on Leases."""

from __future__ import annotations

import pytest

from agent.controller.leader import ElectionTiming, LeaderElector
from tests.unit.controller_fakes import FakeClient, FakeClock, FakeServer

TIMING = ElectionTiming(lease_duration=15, renew_deadline=10.0, retry_period=2.0)


def elector(client: FakeClient, clock: FakeClock, changes: list[bool]) -> LeaderElector:
    return LeaderElector(
        client,
        namespace="nodelb-system",
        name="nodelb-controller",
        identity=client.name,
        timing=TIMING,
        on_change=changes.append,
        clock=clock,
    )


def holder(server: FakeServer) -> str | None:
    lease = server.leases.get("nodelb-system/nodelb-controller")
    return None if lease is None else lease["spec"]["holderIdentity"]


@pytest.mark.parametrize(
    "first_write",
    [
        pytest.param("create-lease", id="both read no Lease, both create it: the second fails"),
        pytest.param("replace-lease", id="both read an expired Lease, both take it: one wins"),
    ],
)
def test_two_candidates_racing_for_the_lease_make_exactly_one_leader(first_write: str) -> None:
    server = FakeServer()
    clock_a, clock_b, clock_old = FakeClock(), FakeClock(), FakeClock()
    seen_a: list[bool] = []
    seen_b: list[bool] = []
    a = elector(server.client("a"), clock_a, seen_a)
    b = elector(server.client("b"), clock_b, seen_b)
    if first_write == "replace-lease":
        old = elector(server.client("old"), clock_old, [])
        old.step()
        a.step()  # both candidates see the old holder's Lease at 1000 ...
        b.step()
        clock_a.advance(15)  # ... and it stays silent for the whole lease duration
        clock_b.advance(15)

    # b's whole round runs between a's read and a's write: both decided on the same Lease.
    def b_first(client: str, verb: str, key: str) -> None:
        if client == "a":
            server.before_write = None
            b.step()

    server.before_write = b_first
    a.step()
    assert holder(server) == "b"
    assert (b.is_leader(), seen_b) == (True, [True])
    assert (a.is_leader(), seen_a) == (False, [])
    assert [r.result for r in server.log if r.client == "a" and r.verb == first_write] == [
        "conflict"
    ]


def test_a_leader_cut_off_from_the_api_stops_before_another_may_take_over() -> None:
    server = FakeServer()
    clock_a, clock_b = FakeClock(), FakeClock()
    seen_a: list[bool] = []
    client_a = server.client("a")
    a = elector(client_a, clock_a, seen_a)
    b = elector(server.client("b"), clock_b, [])
    a.step()
    b.step()  # b sees a's fresh Lease at the same moment
    assert a.is_leader() and not b.is_leader()
    client_a.partitioned = True
    stopped_at = None
    for _ in range(40):  # both step every half second on the same clock rate
        clock_a.advance(0.5)
        clock_b.advance(0.5)
        a.step()
        b.step()
        if stopped_at is None and not a.is_leader():
            stopped_at = clock_a.now
        if b.is_leader():
            break
    assert seen_a == [True, False]
    assert stopped_at == 1000 + TIMING.renew_deadline
    assert b.is_leader() and clock_b.now == 1000 + TIMING.lease_duration
    assert stopped_at < clock_b.now  # a stopped writing 5 s before b could start


def test_a_stopping_leader_releases_the_lease_so_the_next_takes_it_at_once() -> None:
    server = FakeServer()
    clock_a, clock_b = FakeClock(), FakeClock()
    seen_a: list[bool] = []
    a = elector(server.client("a"), clock_a, seen_a)
    b = elector(server.client("b"), clock_b, [])
    a.step()
    b.step()
    a.release()
    assert seen_a == [True, False] and holder(server) is None
    clock_b.advance(TIMING.retry_period)  # far inside the 15 s lease duration
    b.step()
    assert b.is_leader() and holder(server) == "b"
    transitions = server.leases["nodelb-system/nodelb-controller"]["spec"]["leaseTransitions"]
    assert transitions == 1
