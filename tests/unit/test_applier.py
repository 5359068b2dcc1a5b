"""The applier's decisions, with a fake nft runner: full first, delta next, failures, drift.

The fake runner applies transaction text to agent/dataplane/fake.FakeTable (atomic, checks
references like the kernel) and answers `list_table` with nft-shaped JSON of that table.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.dataplane.applier import Dataplane, SyncMode, SyncOutcome
from agent.dataplane.conntrack import delete_argv, removed_udp_endpoints
from agent.dataplane.fake import FakeError, FakeTable, applied
from agent.dataplane.libnft import NftError
from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from rules import layout as L
from rules.delta import delta
from rules.readback import expected, from_json, kernel_objects
from rules.render import KernelObjects, objects_after, render
from rules.transaction import Chain, Op, Table, Transaction
from tests.unit.rules_states import eps, fe, key, state


class FakeRunner:
    """An NftRunner over FakeTable; `fail_next` makes the next N runs fail like the kernel."""

    def __init__(self) -> None:
        self.table = FakeTable()
        self.texts: list[str] = []
        self.fail_next = 0
        self.lists = 0
        self.terse_reads = 0

    def run(self, tx: Transaction) -> None:
        self.texts.append(tx.text())
        if self.fail_next:
            self.fail_next -= 1
            raise NftError("refused", "Error: Could not process rule: injected fault")
        try:
            self.table.apply(tx)
        except FakeError as exc:
            raise NftError(str(exc), str(exc)) from None

    def list_table(self, family: str, name: str) -> dict[str, Any] | None:
        self.lists += 1
        assert (family, name) == (L.TABLE_FAMILY, L.TABLE_NAME)
        return fake_json(self.table)

    def list_declarations(self, family: str, name: str) -> str | None:
        self.terse_reads += 1
        assert (family, name) == (L.TABLE_FAMILY, L.TABLE_NAME)
        return self.table.terse()


def _atom_list(text: str) -> object:
    parts = text.split(" . ")
    return parts[0] if len(parts) == 1 else {"concat": parts}


def fake_json(table: FakeTable) -> dict[str, Any] | None:
    """Return `table` in the shape of `nft -j list table inet nodelb` (None if absent)."""
    if not table.exists:
        return None
    base = {"family": L.TABLE_FAMILY, "table": L.TABLE_NAME}
    items: list[dict[str, Any]] = [{"table": {"family": "inet", "name": L.TABLE_NAME}}]
    for name, spec in table.set_specs.items():
        kind = "map" if spec.startswith("map") else "set"
        elems = [
            _atom_list(k) if v is None else [_atom_list(k), _atom_list(v)]
            for k, v in table.elements[name].items()
        ]
        items.append({kind: {**base, "name": name, "elem": elems}})
    for name, rules in table.chains.items():
        items.append({"chain": {**base, "name": name}})
        items.extend({"rule": {**base, "chain": name, "expr": [r]}} for r in rules)
    return {"nftables": items}


class Clock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


A = state(
    [
        fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080")),
        fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53", "198.19.2.5:53")),
    ],
    held=["198.18.0.200"],
    local=["198.19.0.0/16"],
)
B = state(
    [
        fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080", "198.19.2.6:80")),
        fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53")),
    ],
    held=["198.18.0.200"],
    local=["198.19.0.0/16"],
)
BAD = state([fe("198.18.0.202", port=0, endpoints=eps("198.19.1.5:80"))])


def make(**kw: Any) -> tuple[Dataplane, FakeRunner, Clock]:
    runner, clock = FakeRunner(), Clock()
    return Dataplane(runner, clock=clock, **kw), runner, clock


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_first_sync_reads_what_exists_and_writes_the_full_table_in_one_transaction() -> None:
    dp, runner, _ = make()
    res = dp.sync(A)
    assert (res.outcome, res.mode, res.ok) == (SyncOutcome.APPLIED, SyncMode.FULL, True)
    assert len(runner.texts) == 1 and runner.terse_reads == 1
    first = runner.texts[0].splitlines()
    assert (
        first[0] == f'add table {L.TABLE} {{ comment "{L.table_comment(L.DEFAULT_MASQ_MARK)}" ; }}'
    )
    assert not any(ln.startswith(("delete", "flush")) for ln in first)  # there was no table
    assert runner.texts[0] == render(A).text()
    assert dp.mirror is A
    assert runner.table.normalized() == applied(render(A)).normalized()


def test_next_sync_sends_only_element_changes() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    res = dp.sync(B)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL)
    lines = runner.texts[-1].splitlines()
    assert lines and all("table" not in ln.split(" ", 2)[1] for ln in lines)
    assert not any(ln.startswith("delete table") for ln in lines)
    assert dp.mirror is B
    assert runner.table.normalized() == applied(render(B)).normalized()


def test_an_unchanged_state_sends_nothing() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    res = dp.sync(replace(A))
    assert (res.outcome, res.mode, res.ops) == (SyncOutcome.UNCHANGED, SyncMode.NONE, 0)
    assert len(runner.texts) == 1


def test_a_refused_transaction_keeps_the_mirror_and_reports_nfts_error() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    before = metric("nodelb_nft_transaction_failures_total")
    runner.fail_next = 1
    res = dp.sync(B)
    assert res.outcome is SyncOutcome.REFUSED and not res.ok
    assert res.error is not None and "injected fault" in res.error
    assert res.retry_after == 0.5 and res.failures == 1
    assert dp.mirror is A
    assert runner.table.normalized() == applied(render(A)).normalized()
    assert metric("nodelb_nft_transaction_failures_total") == before + 1
    again = dp.sync(B)
    assert (again.outcome, again.mode, again.failures) == (SyncOutcome.APPLIED, SyncMode.PARTIAL, 0)
    assert again.retry_after is None and dp.next_attempt_at is None
    assert dp.mirror is B


def test_backoff_doubles_per_consecutive_failure_up_to_the_cap() -> None:
    dp, runner, clock = make(backoff_initial=0.5, backoff_max=3.0, full_after_failures=99)
    dp.sync(A)
    runner.fail_next = 5
    delays = [dp.sync(B).retry_after for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert dp.next_attempt_at == clock.now + 3.0
    assert dp.failures == 5


def test_after_n_consecutive_failures_the_next_attempt_is_a_full_resync() -> None:
    dp, runner, _ = make(full_after_failures=3)
    dp.sync(A)
    runner.fail_next = 3
    modes = [dp.sync(B).mode for _ in range(3)]
    assert modes == [SyncMode.PARTIAL, SyncMode.PARTIAL, SyncMode.PARTIAL]
    assert dp.next_full
    res = dp.sync(B)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    assert not dp.next_full
    assert dp.sync(A).mode is SyncMode.PARTIAL


def test_a_failed_first_sync_is_retried_as_full() -> None:
    dp, runner, _ = make()
    runner.fail_next = 1
    assert dp.sync(A).outcome is SyncOutcome.REFUSED
    assert dp.mirror is None
    res = dp.sync(A)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)


def test_an_unrenderable_state_is_reported_and_never_sent() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    res = dp.sync(BAD)
    assert res.outcome is SyncOutcome.INVALID and res.retry_after is not None
    assert res.error is not None and "port 0" in res.error
    assert len(runner.texts) == 1 and dp.mirror is A


def test_request_full_makes_the_next_sync_full() -> None:
    dp, _, _ = make()
    dp.sync(A)
    dp.request_full()
    assert dp.sync(A).mode is SyncMode.FULL


def test_no_drift_means_no_transaction() -> None:
    dp, runner, _ = make()
    assert dp.check_drift() is False  # nothing applied yet: nothing to compare
    assert runner.lists == 0
    dp.sync(A)
    assert dp.check_drift() is False
    assert runner.lists == 1 and len(runner.texts) == 1


def test_a_deleted_element_is_detected_and_repaired_by_a_full_resync() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    before = metric("nodelb_nft_drift_repairs_total")
    be = L.backend_map("ep", 4, 2)
    victim = next(iter(runner.table.elements[be]))
    del runner.table.elements[be][victim]
    assert dp.check_drift() is True
    assert metric("nodelb_nft_drift_repairs_total") == before + 1
    assert runner.texts[-1].startswith(f"add table {L.TABLE}\ndelete table")  # replaced
    assert dp.sync(A, full=True).ok and runner.terse_reads == 2  # read before the repair
    assert "delete table" not in runner.texts[-1]
    assert runner.table.normalized() == applied(render(A)).normalized()
    assert victim in runner.table.elements[be]
    assert dp.check_drift() is False


def test_a_vanished_table_is_drift_too() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    runner.table = FakeTable()
    assert dp.check_drift() is True
    assert runner.table.exists


def test_cleanup_removes_the_table_and_the_next_sync_is_full() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    dp.cleanup()
    assert not runner.table.exists and dp.mirror is None
    assert dp.sync(A).mode is SyncMode.FULL


def test_sync_metrics_count_frontends_elements_and_durations() -> None:
    dp, _, _ = make()
    n_before = metric("nodelb_sync_duration_seconds_count", {"mode": "full"})
    dp.sync(A)
    assert metric("nodelb_sync_duration_seconds_count", {"mode": "full"}) == n_before + 1
    assert metric("nodelb_programmed_frontends") == 2
    assert metric("nodelb_programmed_map_elements") == expected(A).element_count()
    dp.sync(B)
    assert metric("nodelb_programmed_map_elements") == expected(B).element_count()


# -- conntrack ----------------------------------------------------------------------------


class FakeConntrack:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def delete(self, argv: Sequence[str]) -> int:
        self.calls.append(list(argv))
        return 1


def test_an_applied_sync_deletes_conntrack_for_removed_udp_endpoints_only() -> None:
    ct = FakeConntrack()
    dp, runner, _ = make(conntrack=ct)
    dp.sync(A)
    assert ct.calls == []  # first sync: no previous state known
    res = dp.sync(B)
    assert res.conntrack_deleted == 1
    k = key("198.18.0.201", "udp", 53)
    assert ct.calls == [delete_argv(k, eps("198.19.2.5:53")[0])]
    runner.fail_next = 1
    assert dp.sync(A).outcome is SyncOutcome.REFUSED
    assert len(ct.calls) == 1  # a refused sync removed nothing from the kernel
    dp.sync(replace(B, frontends={}))
    assert len(ct.calls) == 2
    assert ct.calls[-1][ct.calls[-1].index("--reply-src") + 1] == "198.19.1.5"


@dataclass(frozen=True, slots=True)
class RemovedCase:
    old: DesiredState
    new: DesiredState
    want: set[tuple[FrontendKey, Endpoint]]


_U = key("198.18.0.201", "udp", 53)
_U6 = key("2001:db8::200", "udp", 53)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(RemovedCase(A, A, set()), id="nothing changed: nothing to delete"),
        pytest.param(
            RemovedCase(A, B, {(_U, eps("198.19.2.5:53")[0])}),
            id="a UDP endpoint dropped from the list is listed",
        ),
        pytest.param(
            RemovedCase(B, A, set()), id="a UDP endpoint added is not listed (nothing is stale)"
        ),
        pytest.param(
            RemovedCase(A, state([]), {(_U, e) for e in eps("198.19.1.5:53", "198.19.2.5:53")}),
            id="a removed UDP frontend lists every endpoint it had, TCP frontends never",
        ),
        pytest.param(
            RemovedCase(
                state([fe("198.18.0.201", "udp", 53, endpoints=(), cluster=eps("198.19.1.5:53"))]),
                state([fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53"))]),
                set(),
            ),
            id="an endpoint moving between the cluster and external lists is still served",
        ),
        pytest.param(
            RemovedCase(
                state([fe("2001:db8::200", "udp", 53, endpoints=eps("[2001:db8:1::5]:53"))]),
                state([fe("2001:db8::200", "udp", 53, endpoints=eps("[2001:db8:1::6]:53"))]),
                {(_U6, eps("[2001:db8:1::5]:53")[0])},
            ),
            id="IPv6 endpoints are handled like IPv4 ones",
        ),
    ],
)
def test_removed_udp_endpoints(case: RemovedCase) -> None:
    assert removed_udp_endpoints(case.old, case.new) == case.want


def test_delete_argv_matches_original_destination_and_reply_source() -> None:
    argv = delete_argv(_U6, eps("[2001:db8:1::5]:5353")[0])
    assert argv == [
        "conntrack",
        "-D",
        "-f",
        "ipv6",
        "-p",
        "udp",
        "--orig-dst",
        "2001:db8::200",
        "--orig-port-dst",
        "53",
        "--reply-src",
        "2001:db8:1::5",
        "--reply-port-src",
        "5353",
    ]


# -- readback normalization ---------------------------------------------------------------


def test_from_json_canonicalizes_kernel_element_forms() -> None:
    kernel = {
        "nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "inet", "name": "nodelb", "handle": 1}},
            {
                "set": {
                    "family": "inet",
                    "table": "nodelb",
                    "name": "srok4",
                    "elem": [
                        {"concat": ["198.18.0.200", "tcp", 80, "192.0.2.7"]},
                        {
                            "concat": [
                                "198.18.0.200",
                                "tcp",
                                80,
                                {"prefix": {"addr": "203.0.113.0", "len": 24}},
                            ]
                        },
                    ],
                }
            },
            {
                "map": {
                    "family": "inet",
                    "table": "nodelb",
                    "name": "int6",
                    "elem": [
                        [
                            {"concat": ["2001:0db8::0200", "udp", 53]},
                            {"goto": {"target": "epc6_1"}},
                        ],
                        [{"concat": ["2001:db8::201", "udp", 53]}, {"accept": None}],
                    ],
                }
            },
            {"set": {"family": "inet", "table": "nodelb", "name": "afa4_00", "elem": ["1.1.1.1"]}},
            {"chain": {"family": "inet", "table": "nodelb", "name": "ep4_3"}},
            {"map": {"family": "inet", "table": "nodelb", "name": "be4_3"}},
            {"chain": {"family": "inet", "table": "other", "name": "x"}},
            {"rule": {"family": "inet", "table": "nodelb", "chain": "reject_new"}},
            {"chain": {"family": "inet", "table": "nodelb", "name": "reject_new"}},
        ]
    }
    snap = from_json(kernel)
    assert snap.sets == {
        "srok4": frozenset(
            {"198.18.0.200 . tcp . 80 . 192.0.2.7", "198.18.0.200 . tcp . 80 . 203.0.113.0/24"}
        ),
        "int6": frozenset(
            {"2001:db8::200 . udp . 53 : goto epc6_1", "2001:db8::201 . udp . 53 : accept"}
        ),
        "afa4_00": frozenset(),
        "be4_3": frozenset(),
    }
    assert snap.chains == {"reject_new": 1, "ep4_3": 0}  # an unused dispatch chain counts too
    assert from_json(None).present is False


def test_expected_writes_full_length_prefixes_as_addresses_like_the_kernel() -> None:
    s = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"), ranges=("192.0.2.7/32",))])
    assert expected(s).sets["srok4"] == {"198.18.0.200 . tcp . 80 . 192.0.2.7"}


def test_the_drift_comparison_keeps_nothing_alive_after_it_returns() -> None:
    # A module-wide cache of canonical atoms once kept the last 65,536 atoms of every drift
    # check alive, scattered over the heap (~30 MB of RSS at 10k Services): what `expected`
    # and `from_json` allocate must be garbage once their result is dropped.
    big = state(
        [
            fe(
                f"198.18.{i // 250}.{i % 250 + 1}",
                endpoints=eps(f"198.19.{i // 250}.{i % 250 + 1}:80"),
            )
            for i in range(2000)
        ]
    )
    listing = fake_json(applied(render(big)))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert expected(big).differences(from_json(listing)) == []
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 64 * 1024, f"{kept} bytes still allocated after the comparison"


def test_differences_name_every_mismatch() -> None:
    a, b = expected(A), expected(B)
    diffs = a.differences(b)
    assert any("missing element" in d for d in diffs)
    assert any("unexpected element" in d for d in diffs)
    assert a.differences(expected(A)) == []


# -- full syncs rewrite the table in place ---------------------------------------------------


def test_periodic_full_syncs_rewrite_in_place_and_delete_what_is_no_longer_used() -> None:
    aff = state([fe("198.18.0.205", endpoints=eps("198.19.1.5:80", "198.19.1.6:80"), affinity=60)])
    dp, runner, _ = make()
    dp.sync(A)
    dp.sync(aff)  # a delta: adds the affinity unit, deletes ep4_2 and be4_2
    res = dp.sync(B, full=True)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    lines = runner.texts[-1].splitlines()
    assert f"delete table {L.TABLE}" not in lines
    assert runner.terse_reads == 1  # known from its own transactions: not read again
    deleted = {ln.split()[1] + " " + ln.split()[-1] for ln in lines if ln.startswith("delete")}
    assert deleted == {f"{k} {n}" for k, n in _affinity_objects(runner, aff)}
    assert runner.table.normalized() == applied(render(B)).normalized()


def _affinity_objects(runner: FakeRunner, s: DesiredState) -> set[tuple[str, str]]:
    objs = objects_after(None, render(s))
    assert objs is not None
    return {("chain", n) for n in objs.chains if n.startswith(("afs", "afe"))} | {
        ("set", n) for n in objs.sets if n.startswith("afa")
    }


def test_a_table_of_another_layout_is_replaced_as_a_whole() -> None:
    dp, runner, _ = make()
    runner.table.apply(render(A))
    runner.table.comment = "managed by nodelb; do not edit"  # an older nodelb's table
    res = dp.sync(B)
    assert res.ok and res.mode is SyncMode.FULL
    assert runner.texts[-1].startswith(f"add table {L.TABLE}\ndelete table {L.TABLE}\n")
    assert runner.table.comment == L.table_comment(L.DEFAULT_MASQ_MARK)
    assert runner.table.normalized() == applied(render(B)).normalized()


def test_a_layout_2_table_is_replaced_as_a_whole_by_the_layout_with_hairpin_sets() -> None:
    """Layout 2 marked every internal connection of a Local frontend (epc); layout 3 adds the
    hpi sets and epi chains. A table written by a layout-2 agent is replaced in one batch."""
    local = state(
        [
            fe(
                "198.18.0.200",
                endpoints=eps("198.19.1.5:8080"),
                cluster=eps("198.19.1.5:8080", "198.19.2.6:8080"),
                local_only=True,
            )
        ],
        local=["198.19.1.0/24"],
    )
    layout_2 = f"managed by nodelb; layout 2; mark {L.DEFAULT_MASQ_MARK:#x}; do not edit"
    assert L.table_comment(L.DEFAULT_MASQ_MARK) != layout_2
    dp, runner, _ = make()
    runner.table.apply(render(local))
    runner.table.comment = layout_2
    res = dp.sync(local)
    assert res.ok and res.mode is SyncMode.FULL
    assert runner.texts[-1].startswith(f"add table {L.TABLE}\ndelete table {L.TABLE}\n")
    assert runner.table.comment == L.table_comment(L.DEFAULT_MASQ_MARK)
    assert runner.table.elements["hpi4"] == {"198.18.0.200 . tcp . 80 . 198.19.1.5": None}


def test_a_base_chain_with_another_priority_makes_the_full_sync_replace_the_table() -> None:
    old = Transaction.of(
        Op(op.verb, replace(op.obj, hook=replace(op.obj.hook, priority="dstnat")))
        if isinstance(op.obj, Chain) and op.obj.hook is not None and op.obj.name == L.NAT_PREROUTING
        else op
        for op in render(A)
    )
    assert "priority dstnat ;" in old.text()
    objs = kernel_objects(applied(render(A)).terse())
    assert objs is not None and objs.chains[L.NAT_PREROUTING] == "nat prerouting -110 accept"
    runner = FakeRunner()
    runner.run(old)
    moved = kernel_objects(runner.table.terse())
    assert moved is not None and moved.chains[L.NAT_PREROUTING] == "nat prerouting -100 accept"
    assert render(B, existing=moved).ops[1] == Op("delete", Table())
    assert render(B, existing=objs).ops[1].verb == "add"  # rewritten in place
    runner.table.apply(render(B, existing=moved))
    assert runner.table.normalized() == applied(render(B)).normalized()


def test_a_refused_full_sync_is_retried_by_replacing_the_table() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    runner.fail_next = 1
    assert dp.sync(B, full=True).outcome is SyncOutcome.REFUSED
    res = dp.sync(B, full=True)
    assert res.ok and runner.terse_reads == 2
    assert runner.texts[-1].startswith(f"add table {L.TABLE}\ndelete table {L.TABLE}\n")
    assert dp.sync(A, full=True).ok
    assert f"delete table {L.TABLE}" not in runner.texts[-1]


def test_objects_after_tracks_declarations_through_transactions() -> None:
    objs = objects_after(None, render(A))
    assert objs is not None and objs.comment == L.table_comment(L.DEFAULT_MASQ_MARK)
    assert objs == kernel_objects(applied(render(A)).terse())
    assert objs.chains["ep4_2"] == "" and objs.sets["be4_2"] == "map"
    assert objs.chains[L.NAT_OUTPUT] == "nat output -110 accept"
    after = objects_after(objs, delta(A, B))
    assert after == objects_after(None, render(B))
    assert objects_after(objs, Transaction.of([Op("delete", Table())])) is None
    assert kernel_objects(None) is None
    assert KernelObjects().comment == ""


def test_a_new_dispatch_chain_over_an_existing_backend_map_is_a_plain_delta() -> None:
    cluster = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"))])
    local = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"), cluster=(), local_only=True)])
    dp, runner, _ = make()
    dp.sync(cluster)
    res = dp.sync(local)
    assert res.ok and res.mode is SyncMode.PARTIAL
    assert runner.table.normalized() == applied(render(local)).normalized()


# -- change hints ---------------------------------------------------------------------------

K200 = key("198.18.0.200")
K201 = key("198.18.0.201", "udp", 53)


def _with(s: DesiredState, f: Frontend) -> DesiredState:
    return replace(s, frontends={**s.frontends, f.key: f})


def test_a_hint_limits_the_delta_and_gives_the_same_table() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    b1 = _with(A, B.frontends[K200])
    res = dp.sync(b1, changed=[K200])
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL)
    assert runner.table.normalized() == applied(render(b1)).normalized()
    assert dp.sync(b1, changed=[]).outcome is SyncOutcome.UNCHANGED


def test_hints_of_failed_syncs_are_merged_into_the_retry() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    b1 = _with(A, B.frontends[K200])
    runner.fail_next = 1
    assert dp.sync(b1, changed=[K200]).outcome is SyncOutcome.REFUSED
    b2 = _with(b1, B.frontends[K201])
    res = dp.sync(b2, changed=[K201])  # the caller's hint names only its latest change
    assert res.outcome is SyncOutcome.APPLIED
    assert runner.table.normalized() == applied(render(b2)).normalized()


def test_a_sync_without_a_hint_after_a_failed_hinted_one_compares_everything() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    runner.fail_next = 1
    assert dp.sync(_with(A, B.frontends[K200]), changed=[K200]).outcome is SyncOutcome.REFUSED
    assert dp.sync(B).outcome is SyncOutcome.APPLIED
    assert runner.table.normalized() == applied(render(B)).normalized()
    assert removed_udp_endpoints(A, B, candidates=[K200]) == set()
    assert removed_udp_endpoints(A, B, candidates=[K201]) == removed_udp_endpoints(A, B)


def test_a_sync_applied_while_the_table_is_read_voids_the_drift_check() -> None:
    dp, runner, _ = make()
    dp.sync(A)
    stale = fake_json(runner.table)
    before = metric("nodelb_nft_drift_repairs_total")

    def read_during_a_sync(family: str, name: str) -> dict[str, Any] | None:
        dp.sync(B)  # another thread's sync lands while the table is being read
        return stale

    runner.list_table = read_during_a_sync  # type: ignore[method-assign]
    assert dp.check_drift() is False
    assert metric("nodelb_nft_drift_repairs_total") == before
    assert runner.texts[-1] != render(A).text()  # no repair back to the old state
    assert dp.mirror is B
