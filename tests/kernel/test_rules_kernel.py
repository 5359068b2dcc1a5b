"""rules/ against the real kernel: render and delta load in nft 1.0.6, and the DNAT shape works.

Everything runs inside a throwaway network namespace that is deleted in `finally`; nothing is
programmed in the root namespace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from agent.model.desired_state import DesiredState
from lab import netns
from rules import layout as L
from rules.delta import delta
from rules.render import objects_after, render, render_cleanup
from tests.unit.rules_states import eps, fe, ip, state
from tests.unit.rules_states import net as ip_net

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("nft") is None, reason="needs root and nft"
    ),
]


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"nlbchk-{uuid.uuid4().hex[:8]}"
    netns.create(name)
    try:
        yield name
    finally:
        netns.delete(name)


def _nft(ns: str, text: str, *, check_only: bool = False) -> None:
    argv = ["nft", "-c", "-f", "-"] if check_only else ["nft", "-f", "-"]
    netns.run(ns, argv, input=text)


def _listing(ns: str) -> dict[str, dict[str, object]]:
    """Return {kind: {name: object}} from `nft -j list table inet nodelb`."""
    out = netns.run(ns, ["nft", "-j", "list", "table", "inet", "nodelb"]).stdout
    parsed = json.loads(out)["nftables"]
    objects: dict[str, dict[str, object]] = {}
    for item in parsed:
        for kind, obj in item.items():
            if kind in ("chain", "set", "map") and isinstance(obj, dict):
                objects.setdefault(kind, {})[obj["name"]] = obj
    return objects


def _rich() -> DesiredState:
    web = eps("198.19.1.5:8080", "198.19.2.6:8080", "198.19.2.7:8080")
    web6 = eps("[2001:db8:1::5]:8080", "[2001:db8:1::6]:8080")
    return state(
        [
            fe("198.18.0.200", "tcp", 80, endpoints=web, ranges=("203.0.113.0/24", "10.0.0.0/8")),
            fe("198.18.0.200", "udp", 53, endpoints=eps("198.19.1.5:53")),
            fe("198.18.0.200", "sctp", 9000, endpoints=web[:2], affinity=10800),
            fe(
                "198.18.0.201",
                "tcp",
                443,
                endpoints=web[:1],
                cluster=web,
                local_only=True,
                affinity=60,
            ),
            fe("198.18.0.201", "tcp", 80, cluster=web, local_only=True),
            fe("198.18.0.202", "tcp", 80),
            fe("198.18.0.202", "udp", 80, local_only=True),
            fe("2001:db8::200", "tcp", 80, endpoints=web6, ranges=("2001:db8:ffff::/48",)),
            fe("2001:db8::200", "udp", 53, endpoints=web6[:1], cluster=web6, local_only=True),
            fe("2001:db8::200", "sctp", 80, endpoints=web6, affinity=5),
        ],
        held=["198.18.0.200", "2001:db8::200"],
        local=["198.19.1.0/24", "2001:db8:1::/64"],
    )


def test_render_and_delta_load_into_nft(ns: str) -> None:
    rich = _rich()
    _nft(ns, render(rich).text(), check_only=True)
    _nft(ns, render(rich).text())
    listed = _listing(ns)
    assert {
        "nat_prerouting",
        "nat_output",
        "filter_prerouting",
        "ep4_3",
        "epl6_1",
        "epi4_3",
        "epi6_2",
    } <= set(listed["chain"])
    elements = {
        name: len(obj.get("elem", ()))  # type: ignore[attr-defined]
        for kind in ("map", "set")
        for name, obj in listed[kind].items()
    }
    # The dispatch rule must not depend on a protocol (a `tcp dport` in the backend map's
    # typeof would make nft add `meta l4proto tcp` and lose UDP and SCTP).
    dispatch = netns.run(ns, ["nft", "list", "chain", *L.TABLE.split(), "ep4_3"]).stdout
    assert "th dport" in dispatch and "tcp" not in dispatch
    want = {"ext4": 4, "int4": 2, "ext6": 3, "int6": 1, "be4_3": 3, "srok4": 2, "srok6": 1}
    want |= {"noep4": 2, "drop4": 2, "held4": 1, "held6": 1, "local4": 1, "local6": 1}
    want |= {"hpi4": 1, "hpi6": 1, "bi4_3": 3, "bi6_2": 2}
    assert {n: elements.get(n) for n in want} == want

    k = next(iter(rich.frontends))
    changed = dataclasses.replace(
        rich.frontends[k],
        endpoints=eps("198.19.1.5:8080", "198.19.9.9:8080"),
        cluster_endpoints=eps("198.19.1.5:8080", "198.19.9.9:8080"),
    )
    aff_key = list(rich.frontends)[2]
    aff = dataclasses.replace(
        rich.frontends[aff_key], endpoints=eps("198.19.1.5:8080"), cluster_endpoints=()
    )
    v6_key = list(rich.frontends)[7]
    v6 = dataclasses.replace(rich.frontends[v6_key], source_ranges=(ip_net("2001:db8:fff0::/44"),))
    new = DesiredState(
        frontends={**rich.frontends, k: changed, aff_key: aff, v6_key: v6},
        held_ips=frozenset({ip("198.18.0.201")}),
        local_cidrs=(ip_net("198.19.0.0/16"), ip_net("2001:db8:1::/64")),
    )
    tx = delta(rich, new)
    assert 0 < len(tx) < 40
    _nft(ns, tx.text())
    after = _listing(ns)
    assert "ep4_2" in after["chain"]
    srok6 = after["set"]["srok6"]["elem"]  # type: ignore[index]
    assert len(srok6) == 1 and "2001:db8:fff0::" in json.dumps(srok6)
    assert "198.18.0.201" in json.dumps(after["set"]["held4"])
    assert "198.18.0.200" not in json.dumps(after["set"]["held4"])
    # A full render rewrites the existing table in place (or replaces it), atomically, and
    # cleanup removes it.
    held = objects_after(objects_after(None, render(rich)), tx)
    _nft(ns, render(new, existing=held).text())
    assert "ep4_2" in _listing(ns)["chain"]
    _nft(ns, render(rich, replace=True).text())
    _nft(ns, render_cleanup().text())
    _nft(ns, render_cleanup().text())  # idempotent when the table is absent
    gone = netns.run(ns, ["nft", "list", "tables"]).stdout
    assert "nodelb" not in gone


_CLIENT = textwrap.dedent(
    """
    import socket, threading, time, json, collections
    def serve(port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0" if port == 9999 else "127.0.0.1", port)); s.listen(128)
        while True:
            c, _ = s.accept(); c.sendall(str(port).encode()); c.close()
    for p in (8081, 8082, 8083, 9999):
        threading.Thread(target=serve, args=(p,), daemon=True).start()
    time.sleep(0.2)
    hits = collections.Counter()
    for _ in range(300):
        c = socket.create_connection(("198.18.0.200", 80), timeout=2)
        hits[c.recv(8).decode()] += 1; c.close()
    def outcome(addr, port):
        try:
            socket.create_connection((addr, port), timeout=1).close(); return "open"
        except ConnectionRefusedError: return "refused"
        except (TimeoutError, socket.timeout): return "timeout"
    print(json.dumps({"hits": hits, "noep": outcome("198.18.0.201", 80),
                      "held": outcome("198.18.0.1", 9999)}))
    """
)


def test_traffic_split_reject_and_held_ip_drop(ns: str) -> None:
    """Node-originated traffic: exact-ish 1/3 split, RST for no endpoints, held-IP port drop."""
    netns.run(ns, ["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
    netns.run(ns, ["ip", "addr", "add", "198.18.0.1/24", "dev", "v0"])
    for dev in ("v0", "v1"):
        netns.run(ns, ["ip", "link", "set", dev, "up"])
    backends = eps("127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083")
    desired = state(
        [fe("198.18.0.200", endpoints=backends), fe("198.18.0.201")],
        held=["198.18.0.1"],
    )
    _nft(ns, render(desired).text())
    out = netns.run(ns, [sys.executable, "-c", _CLIENT], timeout=60).stdout
    result = json.loads(out)
    hits = result["hits"]
    assert set(hits) == {"8081", "8082", "8083"}
    assert all(60 <= n <= 140 for n in hits.values()), hits
    assert result["noep"] == "refused"
    assert result["held"] == "timeout"
    ping = netns.run(ns, ["ping", "-c", "1", "-W", "2", "198.18.0.1"], check=False)
    assert ping.returncode == 0, "ICMP to a held IP must still be answered"


_POD_SERVER = textwrap.dedent(
    """
    import socket, threading
    def serve(port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen(128)
        while True:
            c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()
    for p in (8080, 8081):
        threading.Thread(target=serve, args=(p,), daemon=True).start()
    threading.Event().wait()
    """
)

_EXTERNAL_CLIENT = textwrap.dedent(
    """
    import socket, json, sys, time
    def outcome(port):
        try:
            c = socket.create_connection(("198.18.0.200", port), timeout=1)
            seen = c.recv(64).decode(); c.close(); return seen or "open"
        except ConnectionRefusedError: return "refused"
        except (TimeoutError, socket.timeout): return "timeout"
    deadline = time.monotonic() + 10
    while outcome(80) == "refused" and time.monotonic() < deadline:
        time.sleep(0.1)  # the pod server is still starting
    print(json.dumps({p: outcome(p) for p in map(int, sys.argv[1:])}))
    """
)


@pytest.fixture
def lab() -> Iterator[tuple[str, str, str]]:
    """client ns <-veth-> node ns <-veth-> pod ns; the node holds 198.18.0.200."""
    tag = uuid.uuid4().hex[:6]
    client, node, pod = f"nlbchk-c{tag}", f"nlbchk-n{tag}", f"nlbchk-p{tag}"
    made: list[str] = []
    try:
        for name in (client, node, pod):
            netns.create(name)
            made.append(name)
        sh = [
            (node, "ip link add c0 type veth peer name c1"),
            (node, f"ip link set c1 netns {client}"),
            (node, "ip link add p0 type veth peer name p1"),
            (node, f"ip link set p1 netns {pod}"),
            (node, "ip addr add 198.18.1.1/24 dev c0"),
            (node, "ip addr add 198.18.0.200/32 dev c0"),
            (node, "ip addr add 198.19.1.1/24 dev p0"),
            (node, "ip link set c0 up"),
            (node, "ip link set p0 up"),
            (node, "sysctl -qw net.ipv4.ip_forward=1"),
            (client, "ip addr add 198.18.1.2/24 dev c1"),
            (client, "ip link set c1 up"),
            (client, "ip route add 198.18.0.0/24 via 198.18.1.1"),
            (pod, "ip addr add 198.19.1.5/24 dev p1"),
            (pod, "ip link set p1 up"),
            (pod, "ip route add default via 198.19.1.1"),
        ]
        for name, cmd in sh:
            netns.run(name, cmd.split())
        yield client, node, pod
    finally:
        for name in made:
            netns.delete(name)


def test_external_traffic_semantics(lab: tuple[str, str, str]) -> None:
    """Masquerade for Cluster, client IP kept for Local, drops, ranges, reject, held IP."""
    client, node, pod = lab
    pod_ep = eps("198.19.1.5:8080")
    desired = state(
        [
            fe("198.18.0.200", "tcp", 80, endpoints=pod_ep),
            fe("198.18.0.200", "tcp", 81, endpoints=pod_ep, local_only=True),
            fe("198.18.0.200", "tcp", 82, cluster=pod_ep, local_only=True),
            fe("198.18.0.200", "tcp", 83, endpoints=pod_ep, ranges=("203.0.113.0/24",)),
            fe("198.18.0.200", "tcp", 84, endpoints=pod_ep, ranges=("198.18.1.0/24",)),
            fe("198.18.0.200", "tcp", 85),
            fe("198.18.0.200", "tcp", 87, endpoints=eps("198.19.1.5:8081"), affinity=60),
        ],
        held=["198.18.0.200"],
        local=["198.19.1.0/24"],
    )
    _nft(node, render(desired).text())
    server = netns.spawn(pod, [sys.executable, "-c", _POD_SERVER])
    try:
        ports = ["80", "81", "82", "83", "84", "85", "86", "87"]
        out = netns.run(client, [sys.executable, "-c", _EXTERNAL_CLIENT, *ports], timeout=60)
        got = json.loads(out.stdout)
        # From the pod itself (internal traffic, hairpin: the DNAT picks the sender): masqueraded
        # for Cluster and for Local (the pod is a local endpoint, @hpi4), or the pod would
        # drop a packet from its own address.
        out = netns.run(pod, [sys.executable, "-c", _EXTERNAL_CLIENT, "80", "81"], timeout=60)
        from_pod = json.loads(out.stdout)
        # From the node, which holds the LB IP and so sends from it: masqueraded (not from
        # @local4), else the pod would see 198.18.0.200.
        out = netns.run(node, [sys.executable, "-c", _EXTERNAL_CLIENT, "81"], timeout=60)
        from_node = json.loads(out.stdout)
    finally:
        netns.stop(server)
    assert from_pod == {"80": "198.19.1.1", "81": "198.19.1.1"}
    assert from_node == {"81": "198.19.1.1"}
    assert got == {
        "80": "198.19.1.1",  # Cluster: masqueraded to the node's address
        "81": "198.18.1.2",  # Local: the pod sees the client
        "82": "timeout",  # Local without a local endpoint: external traffic dropped
        "83": "timeout",  # source not in loadBalancerSourceRanges
        "84": "198.19.1.1",  # source allowed
        "85": "refused",  # no endpoints: TCP reset
        "86": "timeout",  # held IP, undeclared port
        "87": "198.19.1.1",  # session affinity path, masqueraded
    }
    ping = netns.run(client, ["ping", "-c", "1", "-W", "2", "198.18.0.200"], check=False)
    assert ping.returncode == 0, "a held IP must answer ICMP"
