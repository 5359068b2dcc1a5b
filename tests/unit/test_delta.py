"""rules.delta: minimal element deltas, checked against the fake and against a full render."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.dataplane.fake import applied
from agent.model.desired_state import DesiredState, Frontend, FrontendKey
from rules.delta import changed_keys, delta
from rules.plan import Contributions, Emitter
from rules.render import RenderError, objects_after, render
from rules.transaction import Transaction
from tests.unit.rules_states import desired_states, eps, fe, state
from tests.unit.test_render import _big_state

V4 = "198.18.0.200 . tcp . 80"

WEB = fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080"))
DNS = fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53", "198.19.2.6:53"))
LOCAL = fe(
    "198.18.0.200",
    endpoints=eps("198.19.1.5:8080"),
    cluster=eps("198.19.1.5:8080", "198.19.2.6:8080"),
    local_only=True,
)
LOCAL81 = dataclasses.replace(LOCAL, key=dataclasses.replace(LOCAL.key, port=81))
STICKY = fe(
    "198.18.0.200",
    endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080"),
    affinity=600,
)


@dataclass(frozen=True)
class DeltaCase:
    """Old and new states and exactly which elements/objects the delta deletes and adds.

    Element entries are "map key" strings; `objects_*` are name prefixes of chains and sets
    created or deleted (affinity names are hashes). None for an object list means "not checked".
    """

    old: DesiredState
    new: DesiredState
    deleted: frozenset[str] = frozenset()
    added: frozenset[str] = frozenset()
    objects_added: tuple[str, ...] | None = ()
    objects_deleted: tuple[str, ...] | None = ()
    checks: tuple[str, ...] = field(default_factory=tuple)


_ELEM = re.compile(r"^(add|delete) element inet nodelb (\S+) \{ (.*) \}$")
_OBJ = re.compile(r"^(add|delete) (chain|set|map) inet nodelb (\S+)")


def _element_changes(tx: Transaction) -> tuple[set[str], set[str]]:
    deleted: set[str] = set()
    added: set[str] = set()
    for line in tx.text().splitlines():
        m = _ELEM.match(line)
        if not m:
            continue
        verb, name, body = m.groups()
        for item in body.split(", "):
            k = item.partition(" : ")[0]
            (added if verb == "add" else deleted).add(f"{name} {k}")
    return deleted, added


def _objects(tx: Transaction, verb: str) -> list[str]:
    return sorted(
        m.group(3) for line in tx.text().splitlines() if (m := _OBJ.match(line)) and m[1] == verb
    )


DELTA_CASES = [
    pytest.param(
        DeltaCase(
            state([WEB, DNS], held=["198.18.0.200"]), state([DNS, WEB], held=["198.18.0.200"])
        ),
        id="equal states (in any dict order) give an empty delta",
    ),
    pytest.param(
        DeltaCase(
            state([WEB]),
            state([dataclasses.replace(WEB, endpoints=eps("198.19.2.6:8080", "198.19.1.5:8080"))]),
        ),
        id="the same endpoints listed in another order change nothing",
    ),
    pytest.param(
        DeltaCase(
            state([WEB]),
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080", "198.19.2.7:8080"),
                    )
                ]
            ),
            deleted=frozenset({f"be4_2 {V4} . 1"}),
            added=frozenset({f"be4_2 {V4} . 1"}),
        ),
        id="replacing one endpoint rewrites only that backend element, not the verdict",
    ),
    pytest.param(
        DeltaCase(
            state([WEB]),
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080", "198.19.2.7:8080"),
                    )
                ]
            ),
            deleted=frozenset({f"be4_2 {V4} . 0", f"be4_2 {V4} . 1", f"ext4 {V4}"}),
            added=frozenset(
                {f"be4_3 {V4} . 0", f"be4_3 {V4} . 1", f"be4_3 {V4} . 2", f"ext4 {V4}"}
            ),
            objects_added=("be4_3", "ep4_3"),
            objects_deleted=("be4_2", "ep4_2"),
        ),
        id="a third endpoint moves the frontend to the three-endpoint chain, created because "
        "no old frontend used it, and deletes the two-endpoint chain it was the last user of",
    ),
    pytest.param(
        DeltaCase(
            state(
                [
                    WEB,
                    fe(
                        "198.18.0.202",
                        endpoints=eps("198.19.1.5:1", "198.19.1.5:2", "198.19.1.5:3"),
                    ),
                ]
            ),
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080", "198.19.2.7:8080"),
                    ),
                    fe(
                        "198.18.0.202",
                        endpoints=eps("198.19.1.5:1", "198.19.1.5:2", "198.19.1.5:3"),
                    ),
                ]
            ),
            deleted=frozenset({f"be4_2 {V4} . 0", f"be4_2 {V4} . 1", f"ext4 {V4}"}),
            added=frozenset(
                {f"be4_3 {V4} . 0", f"be4_3 {V4} . 1", f"be4_3 {V4} . 2", f"ext4 {V4}"}
            ),
            objects_deleted=("be4_2", "ep4_2"),
        ),
        id="no dispatch chain is created for a count another old frontend already uses, and "
        "the one whose last user left is deleted with its backend map",
    ),
    pytest.param(
        DeltaCase(
            state([WEB, DNS]),
            state([DNS]),
            deleted=frozenset({f"be4_2 {V4} . 0", f"be4_2 {V4} . 1", f"ext4 {V4}"}),
        ),
        id="a removed frontend deletes exactly its elements",
    ),
    pytest.param(
        DeltaCase(
            state([WEB]),
            state([dataclasses.replace(WEB, endpoints=(), cluster_endpoints=())]),
            deleted=frozenset({f"be4_2 {V4} . 0", f"be4_2 {V4} . 1", f"ext4 {V4}"}),
            added=frozenset({f"noep4 {V4}"}),
            objects_deleted=("be4_2", "ep4_2"),
        ),
        id="losing every endpoint turns DNAT into reject",
    ),
    pytest.param(
        DeltaCase(
            state([WEB]),
            state([dataclasses.replace(WEB, local_only=True, endpoints=())]),
            deleted=frozenset({f"be4_2 {V4} . 0", f"be4_2 {V4} . 1", f"ext4 {V4}"}),
            added=frozenset({f"drop4 {V4}", f"int4 {V4}", f"bi4_2 {V4} . 0", f"bi4_2 {V4} . 1"}),
            objects_added=("bi4_2", "epi4_2"),
            objects_deleted=("be4_2", "ep4_2"),
        ),
        id="switching to Local with no local endpoint drops external traffic and keeps serving "
        "internal traffic, with no hairpin source",
    ),
    pytest.param(
        DeltaCase(
            state([DNS]),
            state([DNS, LOCAL]),
            added=frozenset(
                {
                    f"ext4 {V4}",
                    f"bl4_1 {V4} . 0",
                    f"int4 {V4}",
                    f"bi4_2 {V4} . 0",
                    f"bi4_2 {V4} . 1",
                    f"hpi4 {V4} . 198.19.1.5",
                }
            ),
            objects_added=("bi4_2", "bl4_1", "epi4_2", "epl4_1"),
        ),
        id="a new Local frontend adds its local endpoint as a hairpin source",
    ),
    pytest.param(
        DeltaCase(
            state([DNS, LOCAL]),
            state([DNS]),
            deleted=frozenset(
                {
                    f"ext4 {V4}",
                    f"bl4_1 {V4} . 0",
                    f"int4 {V4}",
                    f"bi4_2 {V4} . 0",
                    f"bi4_2 {V4} . 1",
                    f"hpi4 {V4} . 198.19.1.5",
                }
            ),
            objects_deleted=("bi4_2", "bl4_1", "epi4_2", "epl4_1"),
        ),
        id="a removed Local frontend deletes its hairpin source with its other elements",
    ),
    pytest.param(
        DeltaCase(
            state([LOCAL, LOCAL81]),
            state([dataclasses.replace(LOCAL, endpoints=eps("198.19.2.6:8080")), LOCAL81]),
            deleted=frozenset({f"bl4_1 {V4} . 0", f"hpi4 {V4} . 198.19.1.5"}),
            added=frozenset({f"bl4_1 {V4} . 0", f"hpi4 {V4} . 198.19.2.6"}),
        ),
        id="a Local frontend whose local endpoint moves swaps only its own hairpin element, "
        "not the same pod's element of another frontend",
    ),
    pytest.param(
        DeltaCase(
            state([WEB]),
            state([dataclasses.replace(WEB, source_ranges=())]),
        ),
        id="an unchanged field value in a new object changes nothing",
    ),
    pytest.param(
        DeltaCase(
            state([WEB], held=["198.18.0.200"], local=["198.19.1.0/24"]),
            state([WEB], held=["198.18.0.201"], local=["198.19.0.0/16"]),
            deleted=frozenset({"held4 198.18.0.200", "local4 198.19.1.0/24"}),
            added=frozenset({"held4 198.18.0.201", "local4 198.19.0.0/16"}),
        ),
        id="held IPs and pod CIDRs change by element only",
    ),
    pytest.param(
        DeltaCase(
            state([STICKY]),
            state(
                [
                    dataclasses.replace(
                        STICKY,
                        endpoints=eps("198.19.1.5:8080"),
                        cluster_endpoints=eps("198.19.1.5:8080"),
                    )
                ]
            ),
            deleted=frozenset({f"ext4 {V4}"}),
            added=frozenset({f"ext4 {V4}"}),
            objects_added=("afs4_",),
            objects_deleted=("afa4_", "afe4_", "afs4_"),
        ),
        id="removing an endpoint of an affinity frontend swaps its service chain and deletes "
        "only the removed endpoint's chain and set, keeping the others' client memory",
    ),
    pytest.param(
        DeltaCase(
            state([STICKY]),
            state([dataclasses.replace(STICKY, affinity_timeout=None)]),
            deleted=frozenset({f"ext4 {V4}"}),
            added=frozenset({f"ext4 {V4}", f"be4_2 {V4} . 0", f"be4_2 {V4} . 1"}),
            objects_added=("be4_2", "ep4_2"),
            objects_deleted=("afa4_", "afa4_", "afe4_", "afe4_", "afs4_"),
        ),
        id="turning affinity off deletes the whole affinity unit",
    ),
]


def _prefix_match(names: list[str], prefixes: tuple[str, ...]) -> bool:
    if len(names) != len(prefixes):
        return False
    return all(n.startswith(p) for n, p in zip(names, sorted(prefixes), strict=True))


@pytest.mark.parametrize("case", DELTA_CASES)
def test_delta_cases(case: DeltaCase) -> None:
    tx = delta(case.old, case.new)
    deleted, added = _element_changes(tx)
    problems = []
    if deleted != case.deleted:
        problems.append(
            f"deleted: extra {deleted - case.deleted}, missing {case.deleted - deleted}"
        )
    if added != case.added:
        problems.append(f"added: extra {added - case.added}, missing {case.added - added}")
    got_added = _objects(tx, "add")
    if case.objects_added is not None and not _prefix_match(got_added, case.objects_added):
        problems.append(f"objects added {got_added}, want {case.objects_added}")
    got_deleted = _objects(tx, "delete")
    if case.objects_deleted is not None and not _prefix_match(got_deleted, case.objects_deleted):
        problems.append(f"objects deleted {got_deleted}, want {case.objects_deleted}")
    assert not problems, "\n".join(problems)
    # And the delta really takes the old table to the new one.
    table = applied(render(case.old), tx)
    assert table.normalized() == applied(render(case.new)).normalized()
    if not case.deleted and not case.added and not case.objects_added:
        assert len(tx) == 0


def test_delta_keeps_the_surviving_endpoints_affinity_set() -> None:
    one = eps("198.19.1.5:8080")
    old = state([STICKY])
    new = state([dataclasses.replace(STICKY, endpoints=one, cluster_endpoints=one)])
    before = {n for n in applied(render(old)).set_specs if n.startswith("afa4_")}
    after = {n for n in applied(render(new)).set_specs if n.startswith("afa4_")}
    assert len(before) == 2 and len(after) == 1 and after < before
    assert not any(f"delete set inet nodelb {n}" in delta(old, new).text() for n in after)


def test_delta_deletes_a_dispatch_chain_with_its_last_user_and_creates_it_again() -> None:
    """a -> b -> a -> c: ep4_3 is created, deleted with its last user, and created again."""
    three = eps("198.19.1.5:1", "198.19.1.5:2", "198.19.1.5:3")
    a = state([WEB])
    b = state([dataclasses.replace(WEB, endpoints=three, cluster_endpoints=three)])
    c = state([WEB, fe("198.18.0.201", endpoints=three)])
    assert "delete chain inet nodelb ep4_3" in delta(b, a).text()
    table = applied(render(a), delta(a, b), delta(b, a))
    assert "ep4_3" not in table.chains and "be4_3" not in table.set_specs
    table.apply(delta(a, c))
    assert table.normalized() == applied(render(c)).normalized()


def test_every_dispatch_chain_reads_a_backend_map_of_its_own() -> None:
    """ep4_2 reads be4_2 and epl4_2 reads bl4_2: each is created and deleted with its map, so
    no rule is ever added over a map loaded from the kernel (which nft 1.0.6 refuses)."""
    local = fe("198.18.0.201", endpoints=WEB.endpoints, cluster=(), local_only=True)
    both = state([WEB, local])
    tx = delta(state([WEB]), both)
    assert "add map inet nodelb bl4_2 " in tx.text() and "map inet nodelb be4_2" not in tx.text()
    tx = delta(both, state([local]))
    assert tx.text().endswith("delete chain inet nodelb ep4_2\ndelete map inet nodelb be4_2\n")
    assert applied(render(both), tx).normalized() == applied(render(state([local]))).normalized()


def test_what_the_kernel_holds_replaces_the_search_for_an_existing_user() -> None:
    old = state([WEB, DNS])
    new = state([WEB, dataclasses.replace(DNS, endpoints=eps("198.19.1.5:53"))])
    held = objects_after(None, render(old))
    assert delta(old, new, existing=held) == delta(old, new)
    assert "add chain inet nodelb ep4_1" in delta(old, new).text()


def test_a_count_reached_only_through_duplicates_keeps_its_chain() -> None:
    dup = fe("198.18.0.201", endpoints=eps("198.19.1.5:1", "198.19.1.5:1", "198.19.1.5:2"))
    old = state([WEB, dup])
    tx = delta(old, state([dup]))
    assert "delete chain" not in tx.text()
    assert applied(render(old), tx).normalized() == applied(render(state([dup]))).normalized()


def test_delta_refuses_an_invalid_new_frontend() -> None:
    bad = dataclasses.replace(WEB, service="shop/cart", endpoints=eps("[2001:db8::1]:80"))
    with pytest.raises(RenderError) as info:
        delta(state([WEB]), state([bad]))
    assert info.value.service == "shop/cart"


def test_changed_keys_reports_added_removed_and_changed() -> None:
    web2 = dataclasses.replace(WEB, endpoints=eps("198.19.1.5:8080"))
    sctp = fe("198.18.0.200", "sctp", 80)
    old, new = state([WEB, DNS]), state([web2, sctp])
    got = changed_keys(old, new)
    assert set(got) == {WEB.key, DNS.key, sctp.key} and len(got) == 3
    hinted = changed_keys(old, new, candidates=[WEB.key, WEB.key, sctp.key, STICKY.key])
    assert hinted == [WEB.key, sctp.key]


def test_one_changed_frontend_in_10k_gives_a_small_delta_that_looks_at_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What it costs is measured in bench/dataplane.py; here: the delta is small, and with the
    # applier's hint it emits the changed frontend (old and new) and, to prove the dispatch
    # chain for 10 endpoints is still used, the first other frontend that uses it: not 10k.
    old = _big_state(10_000, 10)
    k = next(iter(old.frontends))
    nine = old.frontends[k].endpoints[:9]
    changed = dataclasses.replace(old.frontends[k], endpoints=nine, cluster_endpoints=nine)
    new = DesiredState(frontends={**old.frontends, k: changed})
    held = objects_after(None, render(old))  # what the applier knows the kernel holds
    tx = delta(old, new, existing=held)
    deleted, added = _element_changes(tx)
    assert len(deleted) == 11 and len(added) == 10  # 10 backends + verdict, 9 + verdict
    emitted: list[str] = []
    emit = Emitter.emit

    def counting(self: Emitter, acc: Contributions, fe: Frontend) -> None:
        emitted.append(fe.service)
        emit(self, acc, fe)

    monkeypatch.setattr(Emitter, "emit", counting)
    hinted = delta(old, new, candidates=[k], existing=held)  # as the applier calls it
    assert hinted == tx
    assert emitted[:2] == [old.frontends[k].service] * 2
    assert len(emitted) == 3, emitted


def _frontend_of(element: str) -> str | None:
    """Return "ip . proto . port" of a frontend element, or None for held/local elements."""
    name, _, k = element.partition(" ")
    if name.startswith(("held", "local")):
        return None
    return " . ".join(k.split(" . ")[:3])


def _key_text(k: FrontendKey) -> str:
    return f"{k.ip} . {k.protocol.value} . {k.port}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=desired_states(), b=desired_states())
def test_delta_takes_render_a_to_render_b(a: DesiredState, b: DesiredState) -> None:
    table = applied(render(a))
    tx = delta(a, b)
    table.apply(tx)  # raises on dangling references, duplicate adds, missing deletes
    assert table.normalized() == applied(render(b)).normalized()
    changed = {_key_text(k) for k in changed_keys(a, b)}
    deleted, added = _element_changes(tx)
    strays = {e for e in deleted | added if (f := _frontend_of(e)) is not None and f not in changed}
    assert not strays, f"delta touched unchanged frontends: {strays}"
    if a.held_ips == b.held_ips and a.local_cidrs == b.local_cidrs:
        assert all(_frontend_of(e) is not None for e in deleted | added)
    assert (len(tx) == 0) == (applied(render(a)).normalized() == applied(render(b)).normalized())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states=st.lists(desired_states(), min_size=2, max_size=5))
def test_a_chain_of_deltas_tracks_the_latest_render(states: list[DesiredState]) -> None:
    table = applied(render(states[0]))
    for old, new in itertools.pairwise(states):
        table.apply(delta(old, new))
    assert table.normalized() == applied(render(states[-1])).normalized()


@settings(max_examples=100, deadline=None)
@given(a=desired_states())
def test_delta_to_itself_is_empty_and_render_rewrites_any_table(a: DesiredState) -> None:
    assert len(delta(a, a)) == 0
    copy = DesiredState(frontends=dict(a.frontends), held_ips=a.held_ips, local_cidrs=a.local_cidrs)
    assert len(delta(a, copy)) == 0
    web = render(state([WEB]))
    held = objects_after(None, web)
    want = applied(render(a)).normalized()
    assert applied(web, render(a, existing=held)).normalized() == want
    assert applied(web, render(a, replace=True)).normalized() == want


def test_frontend_helper_types() -> None:
    assert isinstance(WEB, Frontend)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states=st.lists(desired_states(), min_size=2, max_size=4))
def test_a_full_render_in_place_over_any_earlier_table_gives_a_fresh_renders_table(
    states: list[DesiredState],
) -> None:
    """full(s0), deltas to s1..sn-1, then an in-place full render of sn: the table of full(sn)."""
    table = applied(render(states[0]))
    held = objects_after(None, render(states[0]))
    for old, new in itertools.pairwise(states[:-1]):
        tx = delta(old, new, existing=held)
        assert tx == delta(old, new)
        table.apply(tx)
        held = objects_after(held, tx)
    tx = render(states[-1], existing=held)
    assert "delete table" not in tx.text()
    table.apply(tx)  # the fake refuses a rule over a backend map the batch did not create
    assert table.normalized() == applied(render(states[-1])).normalized()
    assert objects_after(held, tx) == objects_after(None, render(states[-1]))
