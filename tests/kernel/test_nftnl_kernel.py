"""The netlink element fast path (agent/dataplane/netlink.py) against the real kernel, in netns.

Each comparison loads the same full table into two fresh namespaces, applies one delta through
libnftables in the first and as a raw netlink batch in the second, and requires the two
`nft -j list table inet nodelb` outputs to be identical (handles dropped, set elements sorted:
the kernel lists hash sets in an order of its own).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent import netns as agent_netns
from agent.dataplane import netlink_dump as nft_dump
from agent.dataplane.applier import Dataplane, SyncMode, SyncOutcome
from agent.dataplane.libnft import NetnsNftRunner, NftError
from agent.dataplane.netlink import NetlinkElementSender
from agent.model.desired_state import DesiredState, Endpoint
from lab import netns
from rules import layout as L
from rules import netlink as nftnl
from rules.delta import delta
from rules.readback import ABSENT, Snapshot, expected, from_json, kernel_objects
from rules.render import objects_after, render, render_cleanup
from tests.unit.rules_states import (
    _V4_EP,
    _V4_RANGES,
    _V6_EP,
    _V6_RANGES,
    desired_states,
    eps,
    fe,
    ip,
    state,
)

pytestmark = pytest.mark.kernel


@dataclass
class Side:
    """One namespace with a libnftables runner and a netlink element sender in it."""

    ns: str
    runner: NetnsNftRunner
    sender: NetlinkElementSender

    def nft(self, *args: str, check: bool = True) -> str:
        return netns.run(self.ns, ["nft", *args], check=check).stdout

    def table(self) -> Any:
        """Return `nft -j list table inet nodelb`, normalized for comparison."""
        return _normalize(json.loads(self.nft("-j", "list", "table", *L.TABLE.split())))


def _normalize(doc: Any) -> Any:
    if isinstance(doc, dict):
        out = {k: _normalize(v) for k, v in doc.items() if k not in ("handle", "metainfo")}
        if isinstance(out.get("elem"), list):
            out["elem"] = sorted(out["elem"], key=lambda e: json.dumps(e, sort_keys=True))
        return out
    if isinstance(doc, list):
        return [_normalize(v) for v in doc if not (isinstance(v, dict) and "metainfo" in v)]
    return doc


@contextmanager
def side(tag: str) -> Iterator[Side]:
    """Yield a fresh namespace `nlbt-<tag>-<hex>` with a runner and a sender; deleted on exit."""
    if os.geteuid() != 0:
        pytest.skip("kernel tests need root (they create network namespaces)")
    name = f"nlbt-{tag}-{secrets.token_hex(3)}"
    with ExitStack() as stack:
        stack.callback(netns.delete, name)
        netns.create(name)
        inode = agent_netns.netns_inode(str(netns.NETNS_DIR / name))
        assert inode not in agent_netns.root_netns_inodes(), f"{name} is the root network namespace"
        runner = NetnsNftRunner(name)
        stack.callback(runner.close)
        sender = NetlinkElementSender.in_namespace(name)
        stack.callback(sender.close)
        yield Side(name, runner, sender)


@pytest.fixture
def pair() -> Iterator[tuple[Side, Side]]:
    with side("nlA") as a, side("nlB") as b:
        yield a, b


def apply_both_ways(pair: tuple[Side, Side], old: DesiredState, new: DesiredState) -> bool:
    """Load render(old) in both namespaces, apply delta(old, new) by libnftables in the first
    and, when it is element-only, by netlink in the second. Return True if netlink was used."""
    lib, fast = pair
    for s in pair:
        s.runner.run(render_cleanup())
        s.runner.run(render(old))
    tx = delta(old, new)
    if tx.ops:
        lib.runner.run(tx)
    ops = nftnl.element_ops(tx)
    if ops is None:
        if tx.ops:
            fast.runner.run(tx)
        return False
    fast.sender.apply(ops)
    return True


BASE = state(
    [
        fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080")),
        fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53", "198.19.2.5:53")),
        fe("198.18.0.202", "sctp", 9, endpoints=eps("198.19.1.5:9")),
        fe(
            "198.18.0.203",
            local_only=True,
            endpoints=eps("198.19.1.5:80"),
            cluster=eps("198.19.1.5:80", "198.19.2.5:80"),
        ),
        fe("2001:db8::200", "tcp", 443, endpoints=eps("[2001:db8:1::5]:8443")),
        fe(
            "2001:db8::201",
            "udp",
            53,
            endpoints=eps("[2001:db8:1::5]:53", "[2001:db8:1::6]:53"),
        ),
        fe("198.18.0.204", endpoints=()),
        # keeps epl4_1 and epi4_2 in use when 198.18.0.203 changes (element-only deltas)
        fe(
            "198.18.0.206",
            local_only=True,
            endpoints=eps("198.19.1.7:80"),
            cluster=eps("198.19.1.7:80", "198.19.2.7:80"),
        ),
        fe("198.18.0.208", endpoints=eps("198.19.1.5:8080"), ranges=("203.0.113.0/25",)),
        fe(
            "2001:db8::203",
            "udp",
            53,
            local_only=True,
            endpoints=eps("[2001:db8:1::5]:53"),
            cluster=eps("[2001:db8:1::5]:53", "[2001:db8:1::6]:53"),
        ),
    ],
    held=["198.18.0.200", "2001:db8::200"],
    local=["198.19.0.0/16", "2001:db8:1::/64"],
)


def _with(fronts: list[Any], held: list[str] | None = None) -> DesiredState:
    base = {f.key: f for f in BASE.frontends.values()}
    for f in fronts:
        base[f.key] = f
    return DesiredState(
        frontends=base,
        held_ips=BASE.held_ips if held is None else frozenset(state(held=held).held_ips),
        local_cidrs=BASE.local_cidrs,
    )


@dataclass(frozen=True, slots=True)
class Change:
    new: DesiredState


CHANGES = [
    pytest.param(
        Change(_with([fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.9:8081"))])),
        id="an IPv4 endpoint is replaced: backend map element deleted and re-added",
    ),
    pytest.param(
        Change(
            _with(
                [
                    fe(
                        "2001:db8::201",
                        "udp",
                        53,
                        endpoints=eps("[2001:db8:1::5]:53", "[2001:db8:1::7]:5353"),
                    )
                ]
            )
        ),
        id="an IPv6 endpoint is replaced in a UDP frontend",
    ),
    pytest.param(
        Change(
            _with(
                [fe("198.18.0.205", "tcp", 8080, endpoints=eps("198.19.2.9:80", "198.19.2.8:80"))]
            )
        ),
        id="a new frontend adds a verdict map element (goto) and backend elements",
    ),
    pytest.param(
        Change(_with([fe("198.18.0.204", endpoints=eps("198.19.2.9:80"))])),
        id="a frontend gets its first endpoint: out of noep, into ext with goto",
    ),
    pytest.param(
        Change(_with([fe("198.18.0.200", endpoints=())])),
        id="a frontend loses every endpoint: verdict element deleted, noep element added",
    ),
    pytest.param(
        Change(
            _with(
                [
                    fe(
                        "198.18.0.203",
                        local_only=True,
                        endpoints=(),
                        cluster=eps("198.19.1.5:80", "198.19.2.5:80"),
                    )
                ]
            )
        ),
        id="a Local frontend loses its local endpoint: drop set element, int keeps goto, "
        "its hairpin source goes",
    ),
    pytest.param(
        Change(
            _with(
                [
                    fe(
                        "198.18.0.203",
                        local_only=True,
                        endpoints=eps("198.19.2.5:80"),
                        cluster=eps("198.19.1.5:80", "198.19.2.5:80"),
                    ),
                    fe(
                        "2001:db8::203",
                        "udp",
                        53,
                        local_only=True,
                        endpoints=eps("[2001:db8:1::6]:53"),
                        cluster=eps("[2001:db8:1::5]:53", "[2001:db8:1::6]:53"),
                    ),
                ]
            )
        ),
        id="Local frontends' local endpoints move: their hairpin sources move, IPv4 and IPv6",
    ),
    pytest.param(
        Change(
            _with(
                [
                    fe(
                        "198.18.0.203",
                        local_only=True,
                        endpoints=eps("198.19.1.5:80"),
                        cluster=(),
                    )
                ]
            )
        ),
        id="a Local frontend without cluster endpoints gets an accept verdict in int",
    ),
    pytest.param(
        Change(
            _with(
                [
                    fe(
                        "198.18.0.207",
                        endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080"),
                        ranges=("203.0.113.0/24", "192.0.2.7/32", "2001:db8:ffff::/48"),
                    ),
                    fe(
                        "2001:db8::202",
                        "tcp",
                        443,
                        endpoints=eps("[2001:db8:1::6]:8443"),
                        ranges=("2001:db8:ffff::/48", "2001:db8:eeee:1::/64"),
                    ),
                ]
            )
        ),
        id="frontends with IPv4 and IPv6 source ranges are added: srfe and srok ranges",
    ),
    pytest.param(
        Change(_with([fe("198.18.0.208", endpoints=eps("198.19.1.5:8080"))])),
        id="a frontend drops its source range: srfe and srok elements deleted",
    ),
    pytest.param(
        Change(_with([], held=["198.18.0.201", "2001:db8::201"])),
        id="held IPs change in both families",
    ),
]


@pytest.mark.parametrize("change", CHANGES)
def test_the_netlink_batch_leaves_exactly_the_table_libnftables_leaves(
    pair: tuple[Side, Side], change: Change
) -> None:
    assert apply_both_ways(pair, BASE, change.new), "this delta should take the fast path"
    lib, fast = pair
    assert lib.table() == fast.table()
    assert not expected(change.new).differences(from_json(fast.runner.list_table("inet", "nodelb")))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(a=desired_states(), b=desired_states())
def test_any_element_only_delta_gives_the_same_table_both_ways(
    pair: tuple[Side, Side], a: DesiredState, b: DesiredState
) -> None:
    used = apply_both_ways(pair, a, b)
    event(f"fast path used: {used}")
    lib, fast = pair
    assert lib.table() == fast.table()


def _same_count(draw: st.DrawFn, old: tuple[Endpoint, ...], v4: bool) -> tuple[Endpoint, ...]:
    n = len({(e.ip, e.port) for e in old})
    pool = _V4_EP if v4 else _V6_EP
    return tuple(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n, unique=True)))


@st.composite
def small_changes(draw: st.DrawFn) -> tuple[DesiredState, DesiredState]:
    """Draw (a, b): b changes endpoints of some frontends of a, keeping each path's endpoint
    count (so no dispatch chain comes or goes), maybe their source ranges, and maybe the
    held IPs."""
    a = draw(desired_states())
    fronts = dict(a.frontends)
    for k, f in a.frontends.items():
        if f.affinity_timeout is not None or not draw(st.booleans()):
            continue
        v4 = k.ip.version == 4
        ext, cl = f.endpoints, f.cluster_endpoints
        if cl is ext:
            ext = cl = _same_count(draw, ext, v4)
        elif f.local_only:  # the internal path always has its own endpoints
            ext, cl = _same_count(draw, ext, v4), _same_count(draw, cl, v4)
        # else: a Cluster frontend whose internal endpoints differ keeps them (redrawing could
        # make them equal, which removes its internal path and maybe a dispatch chain)
        ranges = f.source_ranges
        if draw(st.booleans()):
            ranges = tuple(draw(st.lists(st.sampled_from(_V4_RANGES + _V6_RANGES), max_size=3)))
        fronts[k] = dataclasses.replace(
            f, endpoints=ext, cluster_endpoints=cl, source_ranges=ranges
        )
    held = a.held_ips
    if draw(st.booleans()):
        held = frozenset(draw(st.sets(st.sampled_from([ip("198.18.0.200"), ip("2001:db8::200")]))))
    return a, DesiredState(frontends=fronts, held_ips=held, local_cidrs=a.local_cidrs)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ab=small_changes())
def test_small_endpoint_and_held_ip_changes_give_the_same_table_both_ways(
    pair: tuple[Side, Side], ab: tuple[DesiredState, DesiredState]
) -> None:
    a, b = ab
    used = apply_both_ways(pair, a, b)
    event(f"fast path used: {used}")
    assert used == bool(delta(a, b).ops), "every non-empty change of this kind is element-only"
    lib, fast = pair
    assert lib.table() == fast.table()


def test_a_refused_batch_applies_nothing_and_the_dataplane_falls_back(
    pair: tuple[Side, Side],
) -> None:
    _, s = pair
    dp = Dataplane(s.runner, elements=s.sender)
    assert dp.sync(BASE).ok
    assert (dp.fast_applied, dp.fast_fallbacks) == (1, 0)  # the full sync's elements
    before = s.table()
    # Deleting a missing element: the kernel refuses the whole batch (ENOENT), including the
    # addition in the same batch.
    bad = nftnl.element_ops(
        delta(BASE, _with([fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.9:1"))]))
    )
    assert bad is not None
    s.nft("delete", "element", "inet", "nodelb", "be4_2", "{ 198.18.0.200 . tcp . 80 . 1 }")
    tampered = s.table()
    with pytest.raises(NftError, match="No such file or directory"):
        s.sender.apply(bad)
    assert s.table() == tampered
    # Through the Dataplane: the same delta is refused by netlink, then by libnftables, and
    # the mirror stays; the fallback is counted.
    res = dp.sync(_with([fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.9:1"))]))
    assert res.outcome is SyncOutcome.REFUSED
    assert (dp.fast_applied, dp.fast_fallbacks) == (1, 1)
    assert dp.mirror is BASE
    assert s.table() == tampered
    # Repair the tampering by hand: the same sync now goes through the fast path.
    s.nft(
        "add",
        "element",
        "inet",
        "nodelb",
        "be4_2",
        "{ 198.18.0.200 . tcp . 80 . 1 : 198.19.1.6 . 8080 }",
    )
    assert s.table() == before
    res = dp.sync(_with([fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.9:1"))]))
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL)
    assert (dp.fast_applied, dp.fast_fallbacks) == (2, 1)
    assert not expected(dp.mirror).differences(from_json(s.runner.list_table("inet", "nodelb")))


def test_a_dead_socket_falls_back_to_libnftables_cleanly(pair: tuple[Side, Side]) -> None:
    _, s = pair
    dp = Dataplane(s.runner, elements=s.sender)
    assert dp.sync(BASE).ok
    s.sender.close()
    new = _with([fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.9:1"))])
    res = dp.sync(new)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL)
    assert (dp.fast_applied, dp.fast_fallbacks) == (1, 1)
    assert not expected(new).differences(from_json(s.runner.list_table("inet", "nodelb")))


def test_the_sender_fails_for_a_missing_namespace_without_opening_a_socket() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with pytest.raises(FileNotFoundError):
        NetlinkElementSender.in_namespace(f"nlbt-missing-{secrets.token_hex(3)}")


# -- full syncs: structure by libnftables, every element as one netlink batch ----------------


_T = ("inet", "nodelb")


def full_both_ways(pair: tuple[Side, Side], states: list[DesiredState]) -> Dataplane:
    """Apply each state as a full sync in both namespaces: by libnftables alone in the first,
    split (nftnl.split_full) in the second; the tables must be identical after each."""
    lib, fast = pair
    by_lib = Dataplane(lib.runner)
    by_fast = Dataplane(fast.runner, elements=fast.sender)
    for i, desired in enumerate(states):
        assert by_lib.sync(desired, full=True).ok
        res = by_fast.sync(desired, full=True)
        assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
        assert lib.table() == fast.table(), f"after full sync {i}"
        assert not expected(desired).differences(from_json(fast.runner.list_table(*_T)))
    return by_fast


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(a=desired_states(), b=desired_states())
def test_a_split_full_sync_leaves_exactly_the_table_libnftables_leaves(
    pair: tuple[Side, Side], a: DesiredState, b: DesiredState
) -> None:
    for s in pair:
        s.runner.run(render_cleanup())
    dp = full_both_ways(pair, [a, b, a])
    assert dp.fast_fallbacks == 0
    # Every full sync of a state with elements in an encodable set went through netlink.
    event(f"netlink full syncs: {dp.fast_applied}")


def _big(n: int, shift: int) -> DesiredState:
    """n IPv4 frontends with 10 endpoints each (and n/10 with 7), endpoints moved by `shift`."""
    fronts = [
        fe(
            f"198.18.{i // 250}.{i % 250 + 1}",
            "tcp",
            1000 + i % 7,
            endpoints=tuple(
                Endpoint(ip(f"198.19.{(i + j + shift) % 200}.{(i * 7 + j) % 250 + 1}"), 8080)
                for j in range(10 if i % 10 else 7)
            ),
        )
        for i in range(n)
    ]
    return state(fronts, held=[f"198.18.0.{i + 1}" for i in range(50)], local=["198.19.0.0/16"])


def test_a_large_full_sync_goes_as_one_batch_of_many_messages(pair: tuple[Side, Side]) -> None:
    # ~25k backend elements: a batch of ~1.5 MB, beyond the default send buffer (208 KiB) and
    # beyond one message's 64 KiB of elements, so the buffer is grown and elements are split.
    first, second = _big(2500, 0), _big(2400, 3)
    dp = full_both_ways(pair, [first, second])
    assert (dp.fast_applied, dp.fast_fallbacks) == (2, 0)
    split = nftnl.split_full(render(second))
    assert split is not None
    batch = nftnl.encode_batch(nftnl.ElementBatch(split.elements), 1)
    assert len(batch.data) > 256 * 1024
    assert len(batch.acked) > 20


def test_a_refused_full_element_batch_falls_back_to_one_libnftables_transaction(
    pair: tuple[Side, Side],
) -> None:
    lib, fast = pair
    new = _with([fe("198.18.0.205", "tcp", 8080, endpoints=eps("198.19.2.9:80", "198.19.2.8:80"))])
    by_lib = Dataplane(lib.runner)
    by_fast = Dataplane(fast.runner, elements=fast.sender)
    for dp in (by_lib, by_fast):
        assert dp.sync(BASE).ok
    fast.sender.close()  # every later batch fails: the structure is in, the elements are not
    for dp in (by_lib, by_fast):
        res = dp.sync(new, full=True)
        assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    assert (by_fast.fast_applied, by_fast.fast_fallbacks) == (1, 1)
    assert lib.table() == fast.table()
    assert not expected(new).differences(from_json(fast.runner.list_table(*_T)))


# -- the netlink read-back (agent/dataplane/netlink_dump.py) ------------------------------


def _both_readbacks(s: Side) -> tuple[Snapshot, Snapshot]:
    return nft_dump.read_snapshot(s.sender), from_json(s.runner.list_table(*_T))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(desired=desired_states())
def test_the_netlink_read_back_equals_the_json_read_back(
    pair: tuple[Side, Side], desired: DesiredState
) -> None:
    _, s = pair
    s.runner.run(render_cleanup())
    assert nft_dump.read_snapshot(s.sender) == ABSENT
    assert nft_dump.read_objects(s.sender) is None
    s.runner.run(render(desired))
    by_netlink, by_json = _both_readbacks(s)
    assert by_netlink == by_json
    assert not expected(desired).differences(by_netlink)
    objects = nft_dump.read_objects(s.sender)
    assert objects == kernel_objects(s.runner.list_declarations(*_T))
    assert objects == objects_after(None, render(desired))


def test_the_netlink_read_back_sees_tampering_as_the_json_one_does(pair: tuple[Side, Side]) -> None:
    _, s = pair
    s.runner.run(render(BASE))
    assert _both_readbacks(s)[0] == expected(BASE)
    s.nft("delete", "element", "inet", "nodelb", "be4_2", "{ 198.18.0.200 . tcp . 80 . 1 }")
    s.nft("add", "element", "inet", "nodelb", "held4", "{ 198.18.0.99 }")
    s.nft("add", "element", "inet", "nodelb", "local4", "{ 198.20.0.0/24 }")
    s.nft("add", "rule", "inet", "nodelb", "nat_output", "counter")
    s.nft("add chain inet nodelb intruder { type filter hook input priority 5 ; policy drop ; }")
    s.nft("add", "set", "inet", "nodelb", "extra", "{ type ipv4_addr ; }")
    by_netlink, by_json = _both_readbacks(s)
    assert by_netlink == by_json
    assert expected(BASE).differences(by_netlink) == [
        "be4_2: missing element 198.18.0.200 . tcp . 80 . 1 : 198.19.1.6 . 8080",
        "unexpected set/map extra",
        "held4: unexpected element 198.18.0.99",
        "local4: unexpected element 198.20.0.0/24",
        "unexpected chain intruder",
        "chain nat_output: expected 1 rules, found 2",
    ]
    objects = nft_dump.read_objects(s.sender)
    assert objects == kernel_objects(s.runner.list_declarations(*_T))
    assert objects is not None and objects.chains["intruder"] == "filter input 5 drop"


def test_the_netlink_read_back_reads_a_large_table_whole(pair: tuple[Side, Side]) -> None:
    _, s = pair
    big = _big(2500, 0)
    s.runner.run(render(big))
    assert not expected(big).differences(nft_dump.read_snapshot(s.sender))


def test_a_drift_check_over_netlink_finds_and_repairs_tampering(pair: tuple[Side, Side]) -> None:
    _, s = pair
    dp = Dataplane(s.runner, elements=s.sender, readback=nft_dump.NetlinkTableReader(s.sender))
    assert dp.sync(BASE).ok
    assert dp.check_drift() is False
    s.nft("delete", "element", "inet", "nodelb", "ext4", "{ 198.18.0.200 . tcp . 80 }")
    assert dp.check_drift() is True
    assert not expected(BASE).differences(nft_dump.read_snapshot(s.sender))
    assert dp.check_drift() is False


def _rule_handle(s: Side, chain: str, needle: str) -> str:
    """Return the handle of the first rule of `chain` whose listing contains `needle`."""
    for line in s.nft("-a", "list", "chain", *_T, chain).splitlines():
        if needle in line and "# handle" in line:
            return line.rsplit("# handle", 1)[1].strip()
    raise AssertionError(f"no rule with {needle!r} in {chain}")


@pytest.mark.parametrize(
    ("chain", "needle", "replacement"),
    [
        pytest.param("ep4_2", "dnat", "drop", id="a dispatch chain's DNAT replaced by a drop"),
        pytest.param(
            L.FILTER_PREROUTING,
            'iifname "lo" return',
            'iifname "lo0" return',
            id="a base chain's rule replaced by a look-alike",
        ),
    ],
)
def test_a_rule_replaced_in_place_is_drift_with_the_same_rule_count(
    pair: tuple[Side, Side], chain: str, needle: str, replacement: str
) -> None:
    """The Snapshot compares rule counts; the rules' fingerprints catch a same-count change."""
    _, s = pair
    dp = Dataplane(s.runner, elements=s.sender, readback=nft_dump.NetlinkTableReader(s.sender))
    assert dp.sync(BASE).ok
    before = nft_dump.read_rule_prints(s.sender)
    assert dp.check_drift() is False
    s.nft("replace", "rule", *_T, chain, "handle", _rule_handle(s, chain, needle), replacement)
    assert not expected(BASE).differences(nft_dump.read_snapshot(s.sender)), "same counts"
    assert nft_dump.read_rule_prints(s.sender)[chain] != before[chain]
    assert dp.check_drift() is True
    assert nft_dump.read_rule_prints(s.sender) == before, "repaired to what the agent wrote"
    assert dp.check_drift() is False


def test_rule_prints_ignore_handles_and_anonymous_set_names(pair: tuple[Side, Side]) -> None:
    """A table rewritten by the agent prints the same though every handle and anonymous set
    name changed (a replacing full sync), so no false drift follows a repair."""
    _, s = pair
    s.runner.run(render(BASE))
    first = nft_dump.read_rule_prints(s.sender)
    s.runner.run(render(BASE, replace=True))
    s.runner.run(render(BASE, replace=True))
    assert nft_dump.read_rule_prints(s.sender) == first
