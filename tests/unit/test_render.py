"""rules.render: the full transaction, checked against the in-memory fake and as text."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings

from agent.dataplane.fake import FakeError, FakeTable, applied
from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import Protocol
from rules import layout as L
from rules.plan import Contributions, Emitter
from rules.render import RenderError, objects_after, render, render_cleanup
from rules.transaction import Chain, Elements, Op, Table, Transaction, Verdict
from tests.unit.rules_states import desired_states, eps, fe, ip, key, state

V4 = "198.18.0.200 . tcp . 80"
V4U = "198.18.0.200 . udp . 53"
V6 = "2001:db8::200 . sctp . 443"


@dataclass(frozen=True)
class RenderCase:
    """A desired state and the elements the rendered table must (and must not) contain.

    `present[name][key]` is the expected value (None for set elements); a value ending in "*"
    is a prefix (affinity chain names are hashes).
    """

    desired: DesiredState
    present: dict[str, dict[str, str | None]]
    absent: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _matches(expected: str | None, got: str | None) -> bool:
    if expected is not None and got is not None and expected.endswith("*"):
        return got.startswith(expected[:-1])
    return expected == got


RENDER_CASES = [
    pytest.param(
        RenderCase(
            state([fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080"))]),
            present={
                "ext4": {V4: "goto ep4_2"},
                "be4_2": {f"{V4} . 0": "198.19.1.5 . 8080", f"{V4} . 1": "198.19.2.6 . 8080"},
            },
            absent={"int4": (V4,), "noep4": (V4,), "drop4": (V4,), "srfe4": (V4,)},
        ),
        id="a Cluster frontend with two endpoints dispatches to the marked two-endpoint chain "
        "and needs no internal override",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080"),
                        cluster=eps("198.19.1.5:8080", "198.19.2.6:8080", "198.19.2.7:8080"),
                        local_only=True,
                    )
                ]
            ),
            present={
                "ext4": {V4: "goto epl4_1"},
                "bl4_1": {f"{V4} . 0": "198.19.1.5 . 8080"},
                "int4": {V4: "goto epi4_3"},
                "bi4_3": {f"{V4} . 2": "198.19.2.7 . 8080"},
                "hpi4": {f"{V4} . 198.19.1.5": None},
            },
            absent={
                "noep4": (V4,),
                "drop4": (V4,),
                "hpi4": (f"{V4} . 198.19.2.6", f"{V4} . 198.19.2.7"),
            },
        ),
        id="a Local frontend sends external traffic unmarked to its local endpoint, internal "
        "traffic to all cluster endpoints, and lists its local endpoint as a hairpin source",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080", "198.19.1.5:9090", "198.19.1.6:8080"),
                        cluster=eps("198.19.1.5:8080", "198.19.1.5:9090", "198.19.2.7:8080"),
                        local_only=True,
                    )
                ]
            ),
            present={"int4": {V4: "goto epi4_3"}, "hpi4": {f"{V4} . 198.19.1.5": None}},
            absent={"hpi4": (f"{V4} . 198.19.1.6", f"{V4} . 198.19.2.7")},
        ),
        id="a local endpoint the internal path can never pick is no hairpin source, and a pod "
        "listed with two ports is one",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080"),
                        cluster=eps("198.19.1.5:8080"),
                    )
                ]
            ),
            present={
                "ext4": {V4: "goto ep4_2"},
                "int4": {V4: "goto epc4_1"},
                "bc4_1": {f"{V4} . 0": "198.19.1.5 . 8080"},
            },
            absent={"hpi4": (f"{V4} . 198.19.1.5",), "bi4_1": (f"{V4} . 0",)},
        ),
        id="a Cluster frontend whose internal endpoints differ (topology) keeps the always "
        "marked internal chain and lists no hairpin source",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "198.18.0.200",
                        cluster=eps("198.19.2.6:8080"),
                        local_only=True,
                    )
                ]
            ),
            present={"drop4": {V4: None}, "int4": {V4: "goto epi4_1"}},
            absent={"ext4": (V4,), "noep4": (V4,), "hpi4": (f"{V4} . 198.19.2.6",)},
        ),
        id="a Local frontend without local endpoints drops external traffic but still serves "
        "this node and its pods",
    ),
    pytest.param(
        RenderCase(
            state([fe("198.18.0.200", local_only=True)]),
            present={"drop4": {V4: None}, "noep4": {V4: None}},
            absent={"ext4": (V4,), "int4": (V4,)},
        ),
        id="a Local frontend with no endpoints at all drops external traffic and rejects "
        "internal traffic",
    ),
    pytest.param(
        RenderCase(
            state([fe("198.18.0.200", "udp", 53)]),
            present={"noep4": {V4U: None}},
            absent={"ext4": (V4U,), "int4": (V4U,), "drop4": (V4U,)},
        ),
        id="a Cluster frontend with no endpoints is rejected, not dropped",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.1.5:8080"),
                        ranges=("10.0.0.0/9", "10.128.0.0/9", "192.0.2.7/32", "2001:db8::/32"),
                    )
                ]
            ),
            present={
                "srfe4": {V4: None},
                "srok4": {f"{V4} . 10.0.0.0/8": None, f"{V4} . 192.0.2.7/32": None},
            },
            absent={"srok4": (f"{V4} . 10.0.0.0/9",), "srok6": (f"{V4} . 2001:db8::/32",)},
        ),
        id="source ranges are collapsed into the allowed set and ranges of the other family "
        "are ignored",
    ),
    pytest.param(
        RenderCase(
            state(
                [fe("198.18.0.200", endpoints=eps("198.19.1.5:8080"), ranges=("2001:db8::/32",))]
            ),
            present={"srfe4": {V4: None}},
            absent={"srok4": (f"{V4} . 2001:db8::/32",)},
        ),
        id="a frontend whose source ranges are all of the other family stays restricted with "
        "no allowed source (fail closed)",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "2001:db8::200",
                        "sctp",
                        443,
                        endpoints=eps("[2001:db8:1::5]:8443", "[2001:db8:1::6]:8443"),
                        affinity=600,
                    )
                ]
            ),
            present={"ext6": {V6: "goto afs6_*"}},
            absent={"be6_2": (f"{V6} . 0",)},
        ),
        id="a session-affinity frontend dispatches to its own affinity chain instead of the "
        "shared backend maps",
    ),
    pytest.param(
        RenderCase(
            state(
                [
                    fe(
                        "198.18.0.200",
                        endpoints=eps("198.19.2.6:8080", "198.19.1.5:8080", "198.19.2.6:8080"),
                    )
                ]
            ),
            present={
                "ext4": {V4: "goto ep4_2"},
                "be4_2": {f"{V4} . 0": "198.19.1.5 . 8080", f"{V4} . 1": "198.19.2.6 . 8080"},
            },
        ),
        id="duplicate endpoints collapse and endpoints are sorted so the index order is stable",
    ),
    pytest.param(
        RenderCase(
            state(
                held=("198.18.0.200", "2001:db8::200"),
                local=("198.19.1.0/24", "198.19.1.128/25", "2001:db8:1::/64"),
            ),
            present={
                "held4": {"198.18.0.200": None},
                "held6": {"2001:db8::200": None},
                "local4": {"198.19.1.0/24": None},
                "local6": {"2001:db8:1::/64": None},
            },
            absent={"local4": ("198.19.1.128/25",)},
        ),
        id="held IPs and pod CIDRs land in per-family sets, overlapping CIDRs collapsed",
    ),
]


@pytest.mark.parametrize("case", RENDER_CASES)
def test_render_elements(case: RenderCase) -> None:
    table = applied(render(case.desired))
    problems: list[str] = []
    for name, want in case.present.items():
        got = table.elements.get(name, {})
        for k, v in want.items():
            if k not in got or not _matches(v, got[k]):
                problems.append(f"{name}: want {k!r} -> {v!r}, got {got.get(k, '<missing>')!r}")
    for name, keys in case.absent.items():
        got = table.elements.get(name, {})
        problems += [f"{name}: {k!r} should be absent" for k in keys if k in got]
    assert not problems, "\n".join(problems)


def test_affinity_unit_shape() -> None:
    desired = state(
        [
            fe(
                "198.18.0.200",
                endpoints=eps("198.19.1.5:8080", "198.19.2.6:8080"),
                affinity=600,
            )
        ]
    )
    table = applied(render(desired))
    target = table.elements["ext4"][V4]
    assert target is not None
    svc = target.removeprefix("goto ")
    rules = table.chains[svc]
    assert rules[0] == f"meta mark set meta mark | {L.DEFAULT_MASQ_MARK:#x}"
    assert rules[-1].startswith("numgen random mod 2 vmap {")
    sticky = [r for r in rules if r.startswith("ip saddr @afa4_")]
    assert len(sticky) == 2
    aff_sets = {n: s for n, s in table.set_specs.items() if n.startswith("afa4_")}
    assert len(aff_sets) == 2
    assert all("timeout 600s" in s and "dynamic,timeout" in s for s in aff_sets.values())
    endpoint_chains = sorted(n for n in table.chains if n.startswith("afe4_"))
    dnats = sorted(table.chains[c][1] for c in endpoint_chains)
    assert dnats == [
        "meta l4proto tcp dnat ip to 198.19.1.5:8080",
        "meta l4proto tcp dnat ip to 198.19.2.6:8080",
    ]


MARK = f"meta mark set meta mark | {L.DEFAULT_MASQ_MARK:#x}"
HAIRPIN_OR_NODE = {
    4: [
        f"ip daddr . meta l4proto . th dport . ip saddr @hpi4 {MARK}",
        f"ip saddr != @local4 {MARK}",
    ],
    6: [
        f"ip6 daddr . meta l4proto . th dport . ip6 saddr @hpi6 {MARK}",
        f"ip6 saddr != @local6 {MARK}",
    ],
}
"""The mark rules of a Local frontend's internal path: a hairpin source, or the node itself."""


def test_local_affinity_marks_only_hairpin_and_node_traffic_on_the_internal_path() -> None:
    desired = state(
        [fe("198.18.0.200", endpoints=eps("198.19.1.5:8080"), local_only=True, affinity=60)]
    )
    table = applied(render(desired))
    ext, internal = table.elements["ext4"][V4], table.elements["int4"][V4]
    assert ext is not None and internal is not None and ext != internal
    assert not any("meta mark" in r for r in table.chains[ext.removeprefix("goto ")])
    rules = table.chains[internal.removeprefix("goto ")]
    assert rules[:2] == HAIRPIN_OR_NODE[4]
    assert MARK not in rules, "a pod that is not an endpoint must keep its address"
    assert table.elements["hpi4"] == {f"{V4} . 198.19.1.5": None}


def test_affinity_service_chains_differ_by_their_mark_rules_and_share_endpoint_units() -> None:
    """The internal path of a Cluster frontend with its own internal endpoints stays always
    marked; as Local, the same endpoints get another service chain (its name hashes the mark
    rules) but the same endpoint chains and client sets (so their clients stay)."""
    ext, cl = eps("198.19.1.5:8080"), eps("198.19.1.5:8080", "198.19.2.6:8080")
    cluster = applied(render(state([fe("198.18.0.200", endpoints=ext, cluster=cl, affinity=60)])))
    local = applied(
        render(state([fe("198.18.0.200", endpoints=ext, cluster=cl, affinity=60, local_only=True)]))
    )
    c_int, l_int = cluster.elements["int4"][V4], local.elements["int4"][V4]
    assert c_int is not None and l_int is not None and c_int != l_int
    assert cluster.chains[c_int.removeprefix("goto ")][0] == MARK
    assert local.chains[l_int.removeprefix("goto ")][:2] == HAIRPIN_OR_NODE[4]

    def internal_units(table: FakeTable, svc: str) -> set[str]:
        sticky = {r.split()[-1] for r in table.chains[svc] if r.startswith("ip saddr @afa4_")}
        assert len(sticky) == 2
        return sticky

    assert internal_units(cluster, c_int.removeprefix("goto ")) == internal_units(
        local, l_int.removeprefix("goto ")
    )


@pytest.mark.parametrize("family", [4, 6])
def test_dispatch_chains_mark_always_except_local_paths(family: int) -> None:
    """ep and epc always mark, epl never, epi only hairpin sources and the node itself."""
    fam_ip = L.IP[family]
    addr = "198.18.0.200" if family == 4 else "2001:db8::200"
    one = eps("198.19.1.5:80") if family == 4 else eps("[2001:db8:1::5]:80")
    two = one + (eps("198.19.2.6:80") if family == 4 else eps("[2001:db8:2::6]:80"))
    table = applied(
        render(
            state(
                [
                    fe(addr, "tcp", 80, endpoints=one),  # ep_1
                    fe(addr, "tcp", 81, endpoints=two, cluster=one),  # ep_2, epc_1
                    fe(addr, "tcp", 82, endpoints=one, cluster=two, local_only=True),  # epl, epi
                ]
            )
        )
    )

    def dnat(kind: L.DispatchKind, n: int) -> str:
        return (
            f"dnat {fam_ip} to {fam_ip} daddr . meta l4proto . th dport . numgen random mod {n} "
            f"map @{L.backend_map(kind, family, n)}"
        )

    assert table.chains[f"ep{family}_1"] == [MARK, dnat("ep", 1)]
    assert table.chains[f"ep{family}_2"] == [MARK, dnat("ep", 2)]
    assert table.chains[f"epc{family}_1"] == [MARK, dnat("epc", 1)]
    assert table.chains[f"epl{family}_1"] == [dnat("epl", 1)]
    assert table.chains[f"epi{family}_2"] == [*HAIRPIN_OR_NODE[family], dnat("epi", 2)]


def test_dispatch_chain_shape_and_custom_mark() -> None:
    desired = state([fe("2001:db8::200", "udp", 53, endpoints=eps("[2001:db8:1::5]:53"))])
    table = applied(render(desired, mark=0x10000))
    assert table.chains["ep6_1"] == [
        "meta mark set meta mark | 0x10000",
        "dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 1 map @be6_1",
    ]
    assert table.chains[L.NAT_POSTROUTING] == [
        "meta mark & 0x10000 == 0 return",
        "meta mark set meta mark & 0xfffeffff masquerade fully-random",
    ]


def test_render_text_rewrites_in_place_or_replaces_in_one_batch_with_bulk_elements() -> None:
    many = [
        fe("198.18.0.200", "tcp", p, endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080"))
        for p in range(1000, 1100)
    ]
    tx = render(state(many))
    lines = tx.text().splitlines()
    create = f'add table inet nodelb {{ comment "{L.table_comment(L.DEFAULT_MASQ_MARK)}" ; }}'
    assert lines[0] == create
    assert not any(line.startswith(("flush", "delete")) for line in lines)  # None: no table
    be_ops = [line for line in lines if line.startswith("add element inet nodelb be4_2 ")]
    assert len(be_ops) == 1 and be_ops[0].count(" : ") == 200
    assert tx.text().endswith("\n") and len(tx) == len(lines)
    # Rewriting a table that holds something else, in place, ends with exactly the new content.
    other = render(state([fe("198.18.0.201", endpoints=eps("198.19.2.6:80"))]))
    old = applied(other)
    in_place = render(state(many), existing=objects_after(None, other))
    lines = in_place.text().splitlines()
    assert "flush map inet nodelb ext4" in lines and "flush set inet nodelb held4" in lines
    assert f"flush chain inet nodelb {L.NAT_PREROUTING}" in lines
    assert [ln for ln in lines if ln.startswith("delete")] == [
        "delete chain inet nodelb ep4_1",
        "delete map inet nodelb be4_1",
    ]
    old.apply(in_place)
    assert old.normalized() == applied(tx).normalized()
    # A dispatch chain that exists is kept as it is; only its backend map is refilled.
    again = render(state(many), existing=objects_after(None, tx)).text().splitlines()
    kept = (
        "delete",
        "add chain inet nodelb ep4_2",
        "add rule inet nodelb ep4_2",
    )
    assert not any(ln.startswith(kept) for ln in again)
    assert "flush map inet nodelb be4_2" in again
    old.apply(Transaction.of(render(state(many), existing=objects_after(None, tx)).ops))
    assert old.normalized() == applied(tx).normalized()
    # The replacing shape throws the old table away inside the batch.
    replacing = render(state(many), replace=True)
    assert replacing.text().splitlines()[:3] == [
        "add table inet nodelb",
        "delete table inet nodelb",
        create,
    ]
    old = applied(other, replacing)
    assert old.normalized() == applied(tx).normalized()


def test_render_is_deterministic_and_order_independent() -> None:
    a = fe("198.18.0.200", endpoints=eps("198.19.1.5:8080"))
    b = fe("2001:db8::200", "udp", 53, endpoints=eps("[2001:db8:1::5]:53"), affinity=30)
    assert render(state([a, b])).text() == render(state([a, b])).text()
    assert (
        applied(render(state([a, b]))).normalized() == applied(render(state([b, a]))).normalized()
    )


def test_cleanup_removes_the_table_and_is_valid_when_absent() -> None:
    table = applied(render_cleanup())
    assert not table.exists
    table = applied(render(state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"))])))
    table.apply(render_cleanup())
    assert not table.exists and not table.chains
    assert render_cleanup().text() == "add table inet nodelb\ndelete table inet nodelb\n"


def test_transaction_value_semantics() -> None:
    a = Transaction((Op("add", Table()),))
    b = Transaction.of([Op("delete", Table())])
    both = a + b
    assert len(both) == 2 and list(both) == [*a, *b]
    assert both.text() == "add table inet nodelb\ndelete table inet nodelb\n"
    assert Transaction().text() == "" and len(Transaction()) == 0


HELD_ONE = Elements("held4", ((("198.18.0.1",), None),))


def test_fake_refuses_dangling_references() -> None:
    """The fake must refuse what the kernel would, or the property tests prove nothing."""
    base = render(state())
    with pytest.raises(FakeError, match="no such chain"):
        applied(
            base,
            Transaction(
                (
                    Op(
                        "add",
                        Elements("ext4", ((("198.18.0.1", "tcp", "1"), Verdict("goto", "nope")),)),
                    ),
                )
            ),
        )
    with pytest.raises(FakeError, match="not in"):
        applied(base, Transaction((Op("delete", HELD_ONE),)))
    with pytest.raises(FakeError, match="still referenced"):
        applied(base, Transaction((Op("delete", Chain(L.REJECT)),)))
    table = applied(base)
    before = table.normalized()
    with pytest.raises(FakeError, match="already in"):
        table.apply(
            Transaction(
                (
                    Op("add", HELD_ONE),
                    Op("add", HELD_ONE),
                )
            )
        )
    assert table.normalized() == before, "a failed transaction must change nothing"


def _bad(**changes: object) -> Frontend:
    base = {
        "service": "shop/cart",
        "key": key("198.18.0.200"),
        "endpoints": eps("198.19.1.5:8080"),
        "cluster_endpoints": eps("198.19.1.5:8080"),
    }
    base.update(changes)
    return Frontend(**base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class BadCase:
    frontend: Frontend
    message: str


BAD_CASES = [
    pytest.param(
        BadCase(_bad(endpoints=eps("[2001:db8:1::5]:8080")), "IPv6 but frontend"),
        id="an IPv6 endpoint behind an IPv4 frontend is refused",
    ),
    pytest.param(
        BadCase(_bad(cluster_endpoints=eps("[2001:db8:1::5]:8080")), "IPv6 but frontend"),
        id="an IPv6 cluster endpoint behind an IPv4 frontend is refused",
    ),
    pytest.param(
        BadCase(_bad(key=FrontendKey(ip("198.18.0.200"), Protocol.TCP, 0)), "port 0"),
        id="frontend port 0 is refused",
    ),
    pytest.param(
        BadCase(_bad(endpoints=(Endpoint(ip("198.19.1.5"), 65536),)), "port 65536"),
        id="endpoint port 65536 is refused",
    ),
    pytest.param(
        BadCase(_bad(affinity_timeout=0), "timeout 0s"),
        id="an affinity timeout of zero is refused",
    ),
    pytest.param(
        BadCase(_bad(affinity_timeout=86401), "timeout 86401s"),
        id="an affinity timeout above Kubernetes' 86400 s limit is refused",
    ),
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_render_refuses_invalid_frontends_naming_the_service(case: BadCase) -> None:
    ok = fe("198.18.0.201", endpoints=eps("198.19.1.5:80"), service="other/ok")
    with pytest.raises(RenderError, match=case.message) as info:
        render(state([ok, case.frontend]))
    assert info.value.service == "shop/cart"
    assert str(info.value).startswith("shop/cart: ")


def test_render_refuses_a_frontend_filed_under_another_key() -> None:
    f = fe("198.18.0.200", endpoints=eps("198.19.1.5:80"), service="shop/cart")
    with pytest.raises(RenderError, match="filed under") as info:
        render(DesiredState(frontends={key("198.18.0.201"): f}))
    assert info.value.service == "shop/cart"


@pytest.mark.parametrize("mark", [0, -1, 1 << 32])
def test_render_refuses_an_unusable_mark(mark: int) -> None:
    with pytest.raises(RenderError, match="mark"):
        render(state(), mark=mark)


def _big_state(services: int, per: int) -> DesiredState:
    fes = {}
    for i in range(services):
        k = FrontendKey(ip(f"198.18.{i // 250}.{i % 250 + 1}"), Protocol.TCP, 80)
        e = tuple(
            Endpoint(ip(f"198.19.{(i * per + j) // 250 % 250}.{(i * per + j) % 250 + 1}"), 8080)
            for j in range(per)
        )
        fes[k] = Frontend(f"ns/s{i}", k, e, e)
    return DesiredState(frontends=fes)


def test_a_full_render_of_10k_frontends_by_10_endpoints_emits_elements_in_bulk() -> None:
    # How long it takes is bench/dataplane.py's job; here: one op per set, not per element.
    desired = _big_state(10_000, 10)
    tx = render(desired)
    assert tx.text().count(" : ") >= 110_000  # 100k backends + 10k verdicts
    assert len(tx) < 100, "elements must be emitted in bulk, not one op each"


@settings(max_examples=200, deadline=None)
@given(desired=desired_states())
def test_every_hairpin_element_is_its_own_local_frontends(desired: DesiredState) -> None:
    """@hpi holds (key . address) for each address both local and cluster endpoint of a Local
    frontend with an internal path, once: the key makes the elements of two frontends distinct,
    so per-frontend deltas never add or delete another frontend's element."""
    acc = Contributions()
    emitter = Emitter(L.DEFAULT_MASQ_MARK)
    for f in desired.frontends.values():
        emitter.emit(acc, f)
    for family in (4, 6):
        got = [k for k, _ in acc.elements.get(L.named(L.HAIRPIN, family), [])]
        assert len(got) == len(set(got)), f"duplicate hairpin elements: {got}"
        want = {
            (str(f.key.ip), f.key.protocol.value, str(f.key.port), str(e.ip))
            for f in desired.frontends.values()
            if f.local_only and f.key.ip.version == family
            for e in f.endpoints
            if e.ip in {c.ip for c in f.cluster_endpoints}
        }
        assert set(got) == want


def test_fake_table_is_a_faithful_table_of_render() -> None:
    """Every frontend of a big render ends up with exactly its endpoints in the fake."""
    desired = _big_state(300, 3)
    table = FakeTable()
    table.apply(render(desired))
    assert len(table.elements["ext4"]) == 300
    assert len(table.elements["be4_3"]) == 900
