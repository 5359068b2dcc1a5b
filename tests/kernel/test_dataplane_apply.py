"""The applier against the real kernel, inside throwaway network namespaces only.

Every test programs nftables through NetnsNftRunner, whose worker thread enters the test's
own namespace and refuses to run in the root one; the namespace is deleted in the fixture's
teardown whatever happens.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent import netns as agent_netns
from agent.dataplane import libnft as nft
from agent.dataplane.applier import Dataplane, SyncMode, SyncOutcome
from agent.dataplane.conntrack import ToolConntrackRunner
from agent.dataplane.libnft import NetnsNftRunner, NftError
from lab import netns
from lab.wait import wait_until
from rules import layout as L
from rules.readback import expected, from_json
from rules.render import render
from rules.transaction import Elements, Op, Table, Transaction
from tests.unit.rules_states import eps, fe, state

pytestmark = pytest.mark.kernel


def refuse_root_namespace(name: str) -> None:
    """Fail the test unless `name` is a namespace other than every root one we can see."""
    inode = agent_netns.netns_inode(str(netns.NETNS_DIR / name))
    assert inode not in agent_netns.root_netns_inodes(), f"{name} is the root network namespace"


@contextmanager
def throwaway_netns(tag: str = "dp") -> Iterator[str]:
    """Yield the name of a fresh namespace `nlbt-<tag>-<hex>`, deleted on exit."""
    if os.geteuid() != 0:
        pytest.skip("kernel tests need root (they create network namespaces)")
    name = f"nlbt-{tag}-{secrets.token_hex(3)}"
    try:
        netns.create(name)
        refuse_root_namespace(name)
        yield name
    finally:
        netns.delete(name)


class Recording:
    """An NftRunner that records the text of every transaction or script it passes on."""

    def __init__(self, inner: nft.NetnsNftRunner) -> None:
        self.inner = inner
        self.texts: list[str] = []

    def run(self, tx: Transaction) -> None:
        self.texts.append(tx.text())
        self.inner.run(tx)

    def run_text(self, text: str) -> None:
        self.texts.append(text)
        self.inner.run_text(text)

    def list_table(self, family: str, name: str) -> dict[str, Any] | None:
        return self.inner.list_table(family, name)

    def list_declarations(self, family: str, name: str) -> str | None:
        return self.inner.list_declarations(family, name)


@pytest.fixture
def ns() -> Iterator[str]:
    with throwaway_netns() as name:
        yield name


@pytest.fixture
def runner(ns: str) -> Iterator[Recording]:
    inner = NetnsNftRunner(ns)
    try:
        yield Recording(inner)
    finally:
        inner.close()


A = state(
    [
        fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080")),
        fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53", "198.19.2.5:53")),
        fe(
            "2001:db8::200",
            "tcp",
            443,
            endpoints=eps("[2001:db8:1::5]:8443"),
            ranges=("2001:db8:ffff::/48",),
            affinity=10800,
        ),
        fe("198.18.0.202", local_only=True, endpoints=(), cluster=eps("198.19.2.6:80")),
    ],
    held=["198.18.0.200", "2001:db8::200"],
    local=["198.19.0.0/16", "2001:db8:1::/64"],
)
B = state(
    [
        fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.6:8080", "198.19.2.6:80")),
        fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53")),
        fe("198.18.0.203", "sctp", 9, endpoints=(), ranges=("203.0.113.0/24",)),
    ],
    held=["198.18.0.200"],
    local=["198.19.0.0/16"],
)

OTHER = "inet kubeproxylike"
OTHER_SETUP = (
    f"add table {OTHER}\n"
    f"add chain {OTHER} services {{ type nat hook prerouting priority dstnat ; }}\n"
    f"add rule {OTHER} services ip daddr 198.18.0.200 tcp dport 80 dnat ip to 198.19.9.9:80\n"
)


def readback(r: nft.NftRunner) -> Any:
    return from_json(r.list_table(L.TABLE_FAMILY, L.TABLE_NAME))


def nft_cli(ns: str, *args: str) -> str:
    """Run the nft command line inside `ns` (behind the applier's back); return stdout."""
    return netns.run(ns, ["nft", *args]).stdout


# -- the runner itself -----------------------------------------------------------------------


def test_the_runner_programs_only_its_own_namespace(ns: str, runner: Recording) -> None:
    runner.run(Transaction((Op("add", Table()),)))
    assert "table inet nodelb" in nft_cli(ns, "list", "tables")
    with throwaway_netns("other") as other:
        assert nft_cli(other, "list", "tables") == ""
    assert runner.list_table("inet", "absent") is None
    with pytest.raises(NftError) as err:
        runner.run_text("add chain inet absent c\n")
    assert "No such file or directory" in err.value.text


def test_the_runner_refuses_a_namespace_that_is_a_root_one(
    ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = agent_netns.netns_inode(str(netns.NETNS_DIR / ns))
    monkeypatch.setattr(agent_netns, "root_netns_inodes", lambda: frozenset({target}))
    r = NetnsNftRunner(ns)
    try:
        with pytest.raises(NftError, match="refusing"):
            r.run(Transaction((Op("add", Table()),)))
    finally:
        r.close()
    assert nft_cli(ns, "list", "tables") == ""


# -- applying ----------------------------------------------------------------------------------


def test_a_full_sync_reads_back_as_expected(runner: Recording) -> None:
    dp = Dataplane(runner)
    res = dp.sync(A)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    got = readback(runner)
    assert expected(A).differences(got) == []
    assert got.sets[L.named(L.HELD, 6)] == {"2001:db8::200"}


def test_a_delta_sync_reads_back_as_the_new_state(runner: Recording) -> None:
    dp = Dataplane(runner)
    dp.sync(A)
    res = dp.sync(B)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL)
    assert "table" not in runner.texts[-1]
    assert expected(B).differences(readback(runner)) == []
    back = dp.sync(A)
    assert back.mode is SyncMode.PARTIAL
    assert expected(A).differences(readback(runner)) == []


class Faulty:
    """Appends a command the kernel refuses to every transaction, once armed."""

    def __init__(self, inner: nft.NftRunner) -> None:
        self.inner = inner
        self.armed = False

    def run(self, tx: Transaction) -> None:
        if self.armed:
            tx += Transaction((Op("add", Elements("no_such_map", ((("198.18.0.1",), None),))),))
        self.inner.run(tx)

    def list_table(self, family: str, name: str) -> dict[str, Any] | None:
        return self.inner.list_table(family, name)

    def list_declarations(self, family: str, name: str) -> str | None:
        return self.inner.list_declarations(family, name)


def test_a_refused_transaction_leaves_the_previous_table_and_surfaces_nfts_error(
    runner: Recording,
) -> None:
    faulty = Faulty(runner)
    dp = Dataplane(faulty)
    dp.sync(A)
    before = runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME)
    faulty.armed = True
    for full in (False, True):
        res = dp.sync(B, full=full)
        assert res.outcome is SyncOutcome.REFUSED and res.retry_after is not None
        assert res.error is not None and "No such file or directory" in res.error
        assert runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME) == before
        assert dp.mirror is A
    faulty.armed = False
    assert dp.sync(B).outcome is SyncOutcome.APPLIED
    assert expected(B).differences(readback(runner)) == []


def test_a_delta_the_kernel_refuses_is_repaired_by_the_forced_full_resync(
    ns: str, runner: Recording
) -> None:
    dp = Dataplane(runner, full_after_failures=2)
    dp.sync(A)
    # Behind the applier's back: remove an element the delta A -> B will try to delete.
    nft_cli(
        ns, "delete", "element", L.TABLE_FAMILY, L.TABLE_NAME, "int4", "{ 198.18.0.202 . tcp . 80 }"
    )
    tampered = runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME)
    results = [dp.sync(B) for _ in range(2)]
    assert [r.mode for r in results] == [SyncMode.PARTIAL, SyncMode.PARTIAL]
    assert all(r.outcome is SyncOutcome.REFUSED for r in results)
    assert results[0].error and "No such file or directory" in results[0].error
    assert runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME) == tampered  # nothing half-applied
    final = dp.sync(B)
    assert (final.outcome, final.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    assert expected(B).differences(readback(runner)) == []


def test_drift_behind_the_appliers_back_is_detected_and_repaired(
    ns: str, runner: Recording
) -> None:
    dp = Dataplane(runner)
    dp.sync(A)
    assert dp.check_drift() is False
    be = L.backend_map("ep", 4, 2)
    nft_cli(ns, "delete", "element", "inet", "nodelb", be, "{ 198.18.0.200 . tcp . 80 . 1 }")
    nft_cli(ns, "add", "element", "inet", "nodelb", "held4", "{ 198.18.9.9 }")
    assert expected(A).differences(readback(runner)) != []
    assert dp.check_drift() is True
    assert f"delete table {L.TABLE}" in runner.texts[-1]  # replaced: chains may be tampered
    assert expected(A).differences(readback(runner)) == []
    assert dp.check_drift() is False


def test_cleanup_removes_the_table_and_leaves_another_table_alone(
    ns: str, runner: Recording
) -> None:
    runner.run_text(OTHER_SETUP)
    other_before = nft_cli(ns, "-j", "list", "table", *OTHER.split())
    dp = Dataplane(runner)
    dp.sync(A)
    dp.sync(B, full=True)
    dp.sync(A)
    assert nft_cli(ns, "-j", "list", "table", *OTHER.split()) == other_before
    dp.cleanup()
    assert runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME) is None
    assert nft_cli(ns, "-j", "list", "table", *OTHER.split()) == other_before
    assert "ip daddr 198.18.0.200 tcp dport 80" in nft_cli(ns, "list", "ruleset")
    dp.cleanup()  # idempotent: no table is not an error
    assert runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME) is None


def test_takeover_of_a_table_of_another_layout_replaces_it_in_one_transaction(
    ns: str, runner: Recording
) -> None:
    # An older agent's table (no layout comment), a map declared as a set, junk of its own.
    runner.run_text(
        f"add table {L.TABLE}\n"
        f"add set {L.TABLE} ext4 {{ type ipv4_addr ; }}\n"
        f"add element {L.TABLE} ext4 {{ 198.18.0.250 }}\n"
        f"add chain {L.TABLE} stale {{ type nat hook prerouting priority dstnat ; }}\n"
        f"add rule {L.TABLE} stale ip daddr @ext4 drop\n"
    )
    runner.texts.clear()
    dp = Dataplane(runner)
    res = dp.sync(A)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    assert len(runner.texts) == 1  # one batch ...
    lines = runner.texts[0].splitlines()
    delete_at = lines.index(f"delete table {L.TABLE}")
    assert any(ln.startswith("add chain") for ln in lines[delete_at:])  # ... holding both
    got = readback(runner)
    assert "stale" not in got.chains
    assert expected(A).differences(got) == []
    assert f'comment "{L.table_comment(L.DEFAULT_MASQ_MARK)}"' in nft_cli(
        ns, "list", "table", *L.TABLE.split()
    )


def test_takeover_of_an_older_nodelb_table_with_th_dport_maps_replaces_them(
    ns: str, runner: Recording
) -> None:
    """The previous layout declared backend maps `typeof ... th dport`, over which nft 1.0.6
    cannot add a rule in a later batch: the first full sync must replace them."""
    one = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"))])
    runner.run_text(
        render(one, replace=True)
        .text()
        .replace("tcp dport", "th dport")
        .replace(L.table_comment(L.DEFAULT_MASQ_MARK), "managed by nodelb; do not edit")
    )
    dp = Dataplane(runner)
    assert dp.sync(one).ok
    assert f"delete table {L.TABLE}" in runner.texts[-1]
    local = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"), cluster=(), local_only=True)])
    res = dp.sync(local)  # epl4_1 over the existing be4_1: refused over a th dport map
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL), res.error
    assert expected(local).differences(readback(runner)) == []


def test_takeover_of_a_current_table_rewrites_it_in_place_and_deletes_leftovers(
    ns: str, runner: Recording
) -> None:
    sticky = state([fe("198.18.0.205", endpoints=eps("198.19.1.5:80"), affinity=60)])
    first = Dataplane(runner)
    assert first.sync(sticky).ok and first.sync(A).ok and first.sync(B, full=True).ok
    nft_cli(ns, "add", "chain", *L.TABLE.split(), "ep4_7")  # a leftover of some older agent
    runner.texts.clear()
    restarted = Dataplane(runner)
    res = restarted.sync(A)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    lines = runner.texts[0].splitlines()
    assert f"flush chain {L.TABLE} {L.NAT_PREROUTING}" in lines
    assert f"delete chain {L.TABLE} ep4_7" in lines
    assert f"delete table {L.TABLE}" not in lines
    assert expected(A).differences(readback(runner)) == []


# -- no gap while the table is replaced ------------------------------------------------------

SERVER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9000))
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""

CLIENT = """
import json, os, socket, sys
progress, stop = sys.argv[1], sys.argv[2]
sent = lost = 0
errors = []
while not os.path.exists(stop) or sent < 50:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a new flow (source port) each time
    s.settimeout(5.0)
    msg = str(sent).encode()
    s.sendto(msg, ("198.18.0.200", 5353))
    sent += 1
    try:
        data, peer = s.recvfrom(2048)
        if data != msg or peer != ("198.18.0.200", 5353):
            lost += 1
            errors.append(repr((data, peer)))
    except OSError as exc:
        lost += 1
        errors.append(repr(exc))
    s.close()
    if sent % 10 == 0:
        with open(progress + ".tmp", "w") as f:
            f.write(str(sent))
        os.replace(progress + ".tmp", progress)
print(json.dumps({"sent": sent, "lost": lost, "errors": errors[:5]}))
"""

ONE_SHOT = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
s.sendto(b"probe", ("198.18.0.200", 5353))
print(s.recvfrom(2048)[0].decode())
"""

ECHO = state([fe("198.18.0.200", "udp", 5353, endpoints=eps("198.18.1.1:9000"))])


def _wire(node: str, client: str) -> None:
    netns.run(
        node, ["ip", "link", "add", "vn", "type", "veth", "peer", "name", "vc", "netns", client]
    )
    netns.run(node, ["ip", "addr", "add", "198.18.1.1/24", "dev", "vn"])
    netns.run(node, ["ip", "link", "set", "vn", "up"])
    netns.run(client, ["ip", "addr", "add", "198.18.1.2/24", "dev", "vc"])
    netns.run(client, ["ip", "link", "set", "vc", "up"])
    netns.run(client, ["ip", "route", "add", "198.18.0.200/32", "via", "198.18.1.1"])


def _progress(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


FULL_SYNCS = 600


def test_new_udp_flows_never_fail_while_full_syncs_rewrite_the_table(
    ns: str, runner: Recording, tmp_path: Path
) -> None:
    with throwaway_netns("cl") as client:
        _wire(ns, client)
        server = netns.spawn(ns, [sys.executable, "-c", SERVER])
        loop = None
        try:
            dp = Dataplane(runner, conntrack=ToolConntrackRunner(ns))
            assert dp.sync(ECHO).ok
            wait_until(
                lambda: (
                    netns.run(client, [sys.executable, "-c", ONE_SHOT], check=False).stdout
                    == "probe\n"
                ),
                60,
                "the echo server to answer through the frontend",
            )
            progress, stop, out = tmp_path / "progress", tmp_path / "stop", tmp_path / "out"
            loop = netns.spawn(
                client, [sys.executable, "-c", CLIENT, str(progress), str(stop)], log=out
            )
            wait_until(lambda: _progress(progress) >= 20, 60, "the client loop to get going")
            start = _progress(progress)
            syncs = 0
            deadline = time.monotonic() + 50
            while syncs < FULL_SYNCS or _progress(progress) < start + 30:
                res = dp.sync(ECHO, full=True)
                assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
                assert f"flush map {L.TABLE} ext4\n" in runner.texts[-1]
                assert f"delete table {L.TABLE}\n" not in runner.texts[-1]
                syncs += 1
                assert time.monotonic() < deadline, "the client made no progress"
            during = _progress(progress) - start
            stop.touch()
            wait_until(lambda: loop is not None and loop.poll() is not None, 60, "client end")
            result = json.loads(out.read_text().splitlines()[-1])
            assert during > 0, "no new flow was sent while the table was being rewritten"
            # The base chains stay hooked while the table is rewritten in place: no new flow
            # may lose a packet. (Replacing the table, `delete table` + `add table` in one
            # batch, lost about one flow in 1000 syncs: its base chains are re-hooked.)
            assert result["lost"] == 0, result
        finally:
            if loop is not None:
                netns.stop(loop)
            netns.stop(server)


def test_stale_udp_conntrack_entries_for_a_removed_endpoint_are_deleted(
    ns: str, runner: Recording
) -> None:
    """A flow to an endpoint that the next sync removes loses its conntrack entry."""
    with throwaway_netns("cl") as client:
        _wire(ns, client)
        server = netns.spawn(ns, [sys.executable, "-c", SERVER])
        try:
            dp = Dataplane(runner, conntrack=ToolConntrackRunner(ns))
            assert dp.sync(ECHO).ok
            wait_until(
                lambda: (
                    netns.run(client, [sys.executable, "-c", ONE_SHOT], check=False).stdout
                    == "probe\n"
                ),
                60,
                "the echo server to answer through the frontend",
            )

            def entries() -> str:
                return netns.run(
                    ns, ["conntrack", "-L", "-p", "udp", "--reply-src", "198.18.1.1"], check=False
                ).stdout

            assert "dport=5353" in entries()
            moved = state([fe("198.18.0.200", "udp", 5353, endpoints=eps("198.18.1.1:9001"))])
            res = dp.sync(moved)
            assert res.ok and res.conntrack_deleted >= 1
            assert "sport=9000" not in entries()
        finally:
            netns.stop(server)


def test_dispatch_chains_come_and_go_with_their_users_in_deltas(
    runner: Recording,
) -> None:
    """ep4_1 and epl4_1 both read be4_1, and a chain is deleted with its last user and created
    again later (A -> B -> A): all plain deltas, each reading back exactly as a full render."""
    cluster = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"))])
    local = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80"), cluster=(), local_only=True)])
    two = state([fe("198.18.0.200", endpoints=eps("198.19.1.5:80", "198.19.1.6:80"))])
    dp = Dataplane(runner)
    modes = []
    for s in (cluster, two, cluster, local, cluster, two, local, two):
        res = dp.sync(s)
        assert res.ok, res.error
        assert expected(s).differences(readback(runner)) == []
        modes.append(res.mode)
    assert modes == [SyncMode.FULL] + [SyncMode.PARTIAL] * 7
