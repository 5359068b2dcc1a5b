"""Tamper repair's pure parts: decoding change notifications, folding them into batches, and
when the guard repairs, compares or waits (agent/dataplane/monitor.py, tamper.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.dataplane.monitor import (
    Generation,
    GenerationTracker,
    Notification,
    notifications,
)
from agent.dataplane.tamper import (
    DEBOUNCE,
    RATE_LIMIT,
    RATE_WINDOW,
    Action,
    GuardState,
    due,
    next_wakeup,
    observe,
)
from rules.netlink import DecodeError, nla


def message(msg: int, attrs: bytes, *, family: int = 1, subsys: int = 10) -> bytes:
    """Return one nfnetlink message as the kernel multicasts it (nlmsghdr, nfgenmsg, attrs)."""
    body = struct.pack("=BBH", family, 0, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), (subsys << 8) | msg, 0, 0, 4242) + body


def table_attr(name: str) -> bytes:
    return nla(1, name.encode() + b"\0")


def newgen(gen: int, pid: int, name: str) -> bytes:
    attrs = nla(1, struct.pack("!I", gen)) + nla(2, struct.pack("!I", pid))
    return message(15, attrs + nla(3, name.encode() + b"\0"), family=0)


# What `nft delete element inet nodelb s { 198.18.0.1 }` made the kernel send (attribute layout
# as captured from a lab namespace: the table, the set, then the element list).
DELSETELEM = message(14, table_attr("nodelb") + nla(2, b"s\0") + nla(3, b"\x10\x00\x01\x00"))


def test_an_element_deletion_and_its_generation_decode() -> None:
    got = notifications(DELSETELEM + newgen(4, 27832, "nft"))
    assert got == [
        Notification("element", created=False, family=1, table="nodelb"),
        Notification("generation", generation=4, pid=27832, process="nft"),
    ]


@dataclass(frozen=True, slots=True)
class Kind:
    msg: int
    kind: str
    created: bool


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Kind(0, "table", True), id="NEWTABLE is a table created"),
        pytest.param(Kind(2, "table", False), id="DELTABLE is a table deleted"),
        pytest.param(Kind(3, "chain", True), id="NEWCHAIN"),
        pytest.param(Kind(5, "chain", False), id="DELCHAIN"),
        pytest.param(Kind(6, "rule", True), id="NEWRULE (also what a rule replaced sends)"),
        pytest.param(Kind(8, "rule", False), id="DELRULE"),
        pytest.param(Kind(9, "set", True), id="NEWSET"),
        pytest.param(Kind(11, "set", False), id="DELSET (a flush of a set sends DELSETELEMs)"),
        pytest.param(Kind(12, "element", True), id="NEWSETELEM"),
        pytest.param(Kind(14, "element", False), id="DELSETELEM"),
        pytest.param(Kind(18, "object", True), id="NEWOBJ"),
        pytest.param(Kind(24, "flowtable", False), id="DELFLOWTABLE"),
    ],
)
def test_every_object_message_names_its_kind_and_table(case: Kind) -> None:
    (n,) = notifications(message(case.msg, table_attr("nodelb")))
    assert (n.kind, n.created, n.table) == (case.kind, case.created, "nodelb")


def test_other_subsystems_and_untracked_messages_are_skipped() -> None:
    assert notifications(message(6, table_attr("nodelb"), subsys=1)) == []  # ctnetlink
    assert notifications(message(16, table_attr("nodelb"))) == []  # GETGEN: not a change


def test_changes_in_other_tables_or_families_are_skipped_while_decoding() -> None:
    kube_proxy = message(12, table_attr("kube-proxy"))
    ip_family_nodelb = message(12, table_attr("nodelb"), family=2)  # `ip nodelb`, not ours
    prefix_of_ours = message(12, table_attr("nodelb2"))
    assert notifications(kube_proxy + ip_family_nodelb + prefix_of_ours) == []
    got = notifications(memoryview(kube_proxy + DELSETELEM))
    assert got == [Notification("element", created=False, family=1, table="nodelb")]


def test_a_truncated_message_is_a_decode_error() -> None:
    data = DELSETELEM + newgen(5, 1, "nft")
    with pytest.raises(DecodeError, match="truncated"):
        notifications(data[:-6])


@given(st.binary(max_size=300))
def test_decoding_raises_only_its_own_error(data: bytes) -> None:
    try:
        got = notifications(data)
    except DecodeError:
        return
    assert all(isinstance(n, Notification) for n in got)


def test_a_batch_ends_at_its_generation_and_only_batches_touching_nodelb_count() -> None:
    tracker = GenerationTracker()
    kube_proxy = [
        Notification("rule", True, 1, "kube-proxy"),
        Notification("chain", True, 1, "kube-proxy"),
    ]
    ours = [Notification("element", True, 1, "nodelb"), Notification("rule", False, 1, "nodelb")]
    other_family = Notification("table", True, 2, "nodelb")  # ip nodelb: not our inet table
    seq = [*kube_proxy, Notification("generation", generation=7, pid=11)]
    assert [tracker.feed(n) for n in seq] == [None, None, None]
    assert tracker.feed(other_family) is None
    assert tracker.feed(Notification("generation", generation=8, pid=11)) is None
    for n in ours:
        assert tracker.feed(n) is None
    gen = tracker.feed(Notification("generation", generation=9, pid=12, process="nft"))
    assert gen == Generation(9, 12, "nft", ("element", "rule"))
    assert tracker.feed(Notification("generation", generation=10, pid=12)) is None


G = Generation(3, 99, "nft", ("rule",))


@dataclass(frozen=True, slots=True)
class Step:
    state: GuardState
    now: float
    action: Action
    after: GuardState


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Step(GuardState(), 1.0, Action.NOTHING, GuardState()), id="nothing pending: nothing"
        ),
        pytest.param(
            Step(GuardState(repair_due=1.1), 1.05, Action.NOTHING, GuardState(repair_due=1.1)),
            id="a repair before its debounce ends waits",
        ),
        pytest.param(
            Step(GuardState(repair_due=1.1), 1.1, Action.REPAIR, GuardState(recent=(1.1,))),
            id="a due repair runs and is remembered for the rate limit",
        ),
        pytest.param(
            Step(
                GuardState(repair_due=1.1, check_due=1.0),
                1.2,
                Action.REPAIR,
                GuardState(recent=(1.2,)),
            ),
            id="a repair makes a pending comparison moot",
        ),
        pytest.param(
            Step(GuardState(check_due=1.0), 1.0, Action.CHECK, GuardState()),
            id="after lost notifications the table is compared",
        ),
        pytest.param(
            Step(
                GuardState(repair_due=65.0, recent=tuple(float(10 + i) for i in range(RATE_LIMIT))),
                65.0,
                Action.LIMITED,
                GuardState(
                    repair_due=10.0 + RATE_WINDOW,
                    recent=tuple(float(10 + i) for i in range(RATE_LIMIT)),
                ),
            ),
            id="at the rate limit the repair waits until the oldest one leaves the window",
        ),
        pytest.param(
            Step(
                GuardState(repair_due=80.0, recent=(10.0, *(float(21 + i) for i in range(9)))),
                80.0,
                Action.REPAIR,
                GuardState(recent=(*(float(21 + i) for i in range(9)), 80.0)),
            ),
            id="repairs older than the window do not count",
        ),
    ],
)
def test_what_the_guard_does_when(case: Step) -> None:
    action, after = due(case.state, case.now)
    assert (action, after) == (case.action, case.after)


def test_a_foreign_batch_or_a_lost_one_schedules_after_the_debounce_once() -> None:
    s = observe(GuardState(), foreign=[G], overrun=False, now=5.0)
    assert s == GuardState(repair_due=5.0 + DEBOUNCE)
    assert observe(s, foreign=[G, G], overrun=False, now=5.05) == s  # the burst rides along
    s2 = observe(GuardState(), foreign=[], overrun=True, now=5.0)
    assert s2 == GuardState(check_due=5.0 + DEBOUNCE)
    assert observe(GuardState(), foreign=[], overrun=False, now=5.0) == GuardState()
    assert next_wakeup(GuardState(repair_due=3.0, check_due=2.0)) == 2.0
    assert next_wakeup(GuardState()) is None
