"""eTP=Local spread with real traffic: the holder sends flows through the VXLAN tunnel to every
node with local endpoints, which serve them and reply straight to the client (issue #15).

One lab (3 nodes x 2 pods, a client) for the module. Each node gets its `inet nodelb` table from
a Dataplane exactly as the agent programs it, and the tunnel device from
agent/dataplane/tunnel.py; the holder also gets the `netdev nodelb` spread table
(rules/spread.py) computed from the pure bucket table (agent/node/spread.py). The holder holds
the LB IP on its segment interface (so the test would catch traffic delivered to it locally
instead of spread), and the client routes the LB IP via the holder as the announcer's ARP
would make it. Nothing is programmed in the root namespace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from agent import netns as agent_netns
from agent.dataplane.applier import SyncMode
from agent.dataplane.libnft import NetnsNftRunner
from agent.dataplane.spread_plane import SpreadPlane
from agent.model import tunnel as T
from agent.model.desired_state import FrontendKey
from agent.model.net import IPAddress, Protocol
from agent.node.spread import bucket_table, peer_buckets
from lab import netns
from lab.client import Reply
from lab.topology import Lab, LabNode, LabSpec, Pod
from lab.wait import wait_until
from tests.kernel.test_dataplane_traffic import (
    TCP_PORT,
    UDP_PORT,
    Planes,
    address,
    answered,
    applied,
    client_of,
    desired,
    eps,
    frontend,
    probe,
    routes,
)

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("conntrack") is None,
        reason="needs root, nft and conntrack",
    ),
]

WAIT = 30.0


@pytest.fixture(scope="module")
def slab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Yield one running lab: 3 nodes x 2 pods, a client, pod servers."""
    lab = Lab(
        LabSpec(nodes=3, pods_per_node=2, with_controlplane=False),
        tmp_path_factory.mktemp("spread"),
    )
    try:
        lab.up()
        lab.start_pod_servers(tcp_port=TCP_PORT, udp_port=UDP_PORT)
        yield lab
    finally:
        lab.down()


class Spreaders:
    """One SpreadPlane per lab node, as the agent would hold one, over the node's namespace."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.runners = {n.name: NetnsNftRunner(n.ns) for n in lab.nodes}
        self.planes = {
            n.name: SpreadPlane(self.runners[n.name], in_netns=in_netns_of(n)) for n in lab.nodes
        }

    def idle(self, node: LabNode) -> T.SpreadState:
        """Return `node`'s state with every other node as a peer and nothing spread."""
        peers = frozenset(n.ip4 for n in self.lab.nodes if n is not node)
        return T.SpreadState(device=node.ifname, node=node.ip4, peers=peers)

    def sync(self, node: LabNode, state: T.SpreadState | None) -> bool:
        return self.planes[node.name].sync(state)

    def close(self) -> None:
        for r in self.runners.values():
            r.close()


def in_netns_of(node: LabNode) -> Callable[[Callable[[], None]], None]:
    def run(fn: Callable[[], None]) -> None:
        agent_netns.call_in(node.ns, fn)

    return run


@pytest.fixture(scope="module")
def spreaders(slab: Lab) -> Iterator[Spreaders]:
    """Yield the lab's SpreadPlanes, every node with its tunnel and an idle spread table."""
    s = Spreaders(slab)
    try:
        for node in slab.nodes:
            assert s.sync(node, s.idle(node))
        yield s
    finally:
        for node in slab.nodes:
            with contextlib.suppress(Exception):
                s.sync(node, None)
        s.close()


@pytest.fixture
def planes() -> Iterator[Planes]:
    p = Planes()
    try:
        yield p
    finally:
        p.close()


def nft(node: LabNode, script: str) -> None:
    netns.run(node.ns, ["nft", "-f", "-"], input=script)


@contextlib.contextmanager
def spread(
    lab: Lab,
    planes: Planes,
    spreaders: Spreaders,
    holder: LabNode,
    *,
    key: FrontendKey,
    serving: Mapping[str, Sequence[Pod]],
    target: int | None = None,
) -> Iterator[dict[str, int]]:
    """Program a Local frontend `lb` served by `serving` (node name -> its endpoints) and the
    holder's spread table; yield the weights. Removes the spread table afterwards."""
    lb, protocol, port = key.ip, key.protocol, key.port
    if target is None:
        target = TCP_PORT if protocol is Protocol.TCP else UDP_PORT
    fam = lb.version
    for node in lab.nodes:
        local = eps(serving.get(node.name, ()), target, fam)
        cluster = eps([p for pods in serving.values() for p in pods], target, fam)
        fe = frontend(lb, protocol, port, local, cluster=cluster, local_only=True)
        held = [lb] if node is holder else []
        applied(planes.make(node).sync(desired(node, fe, held=held), full=True), SyncMode.FULL)
    weights = {name: len(pods) for name, pods in serving.items()}
    ip4 = {n.name: n.ip4 for n in lab.nodes}
    table = bucket_table(weights)
    hops = tuple((b, ip4[name]) for b, name in peer_buckets(table, holder.name))
    idle = spreaders.idle(holder)
    assert spreaders.sync(holder, dataclasses.replace(idle, buckets={key: hops}))
    try:
        with address(holder.ns, "eth0", lb), routes(lab, holder, lb):
            yield weights
    finally:
        spreaders.sync(holder, idle)


def node_counts(lab: Lab, replies: Sequence[Reply]) -> Counter[str]:
    return Counter(lab.pod(r.pod).node for r in replies)


def assert_proportional(counts: Counter[str], weights: dict[str, int], n: int) -> None:
    """Assert each node's share is within 0.1 of its weight's share (n >= 200: ~3 sigma)."""
    total = sum(weights.values())
    off = {
        node: (counts[node] / n, w / total)
        for node, w in weights.items()
        if abs(counts[node] / n - w / total) > 0.1
    }
    assert not off, f"share served vs weight share: {off}; counts {dict(counts)}"
    assert set(counts) <= set(weights), f"a node without endpoints served: {dict(counts)}"


def mac_of(node: LabNode) -> str:
    out = netns.run(node.ns, ["cat", f"/sys/class/net/{node.ifname}/address"]).stdout
    return out.strip()


@contextlib.contextmanager
def reply_macs(lab: Lab, lb: IPAddress) -> Iterator[Counter[str]]:
    """Yield a Counter, filled on exit with the source MACs of the client's frames from `lb`."""
    client = client_of(lab)
    ip = "ip" if lb.version == 4 else "ip6"
    nft(
        client,  # type: ignore[arg-type]
        "table netdev capture {\n"
        "  set seen { type ether_addr; flags dynamic; }\n"
        f'  chain in {{ type filter hook ingress device "{client.ifname}" priority 0;\n'
        f"    {ip} saddr {lb} add @seen {{ ether saddr }}\n  }}\n}}\n",
    )
    seen: Counter[str] = Counter()
    try:
        yield seen
        out = netns.run(client.ns, ["nft", "-j", "list", "set", "netdev", "capture", "seen"])
        for item in json.loads(out.stdout)["nftables"]:
            for e in item.get("set", {}).get("elem", ()):
                seen[str(e)] += 1
    finally:
        netns.run(client.ns, ["nft", "delete", "table", "netdev", "capture"], check=False)


@pytest.mark.parametrize(
    ("lb", "protocol"),
    [
        pytest.param(ipaddress.ip_address("198.18.0.210"), Protocol.TCP, id="IPv4 TCP"),
        pytest.param(ipaddress.ip_address("198.18.0.211"), Protocol.UDP, id="IPv4 UDP"),
        pytest.param(ipaddress.ip_address("2001:db8::210"), Protocol.TCP, id="IPv6 TCP"),
        pytest.param(ipaddress.ip_address("2001:db8::211"), Protocol.UDP, id="IPv6 UDP"),
    ],
)
def test_flows_reach_every_node_with_endpoints_in_proportion_keeping_the_client_address(
    slab: Lab, planes: Planes, spreaders: Spreaders, lb: IPAddress, protocol: Protocol
) -> None:
    n1, n2, n3 = slab.nodes
    serving = {
        n1.name: slab.pods_on(n1.name)[:1],
        n2.name: slab.pods_on(n2.name),
        n3.name: slab.pods_on(n3.name),
    }
    client = client_of(slab)
    count = 300
    with (
        reply_macs(slab, lb) as macs,
        spread(
            slab, planes, spreaders, n1, key=FrontendKey(lb, protocol, 80), serving=serving
        ) as w,
    ):
        replies = answered(probe(client.ns, protocol, lb, 80, count=count))
    assert_proportional(node_counts(slab, replies), w, count)
    client_ip = client.ip4 if lb.version == 4 else client.ip6
    wrong = [r for r in replies if r.client_ip != client_ip]
    assert not wrong, f"a pod saw another source than the client: {wrong[:5]}"
    # Direct server return: the replies come from each serving node's own MAC.
    node_macs = {mac_of(n) for n in slab.nodes}
    assert set(macs) == node_macs, (dict(macs), node_macs)


def test_a_node_that_loses_its_last_endpoint_gets_no_new_flows_after_one_sync(
    slab: Lab, planes: Planes, spreaders: Spreaders
) -> None:
    n1, n2, n3 = slab.nodes
    lb = ipaddress.ip_address("198.18.0.212")
    client = client_of(slab)
    every = {n.name: slab.pods_on(n.name) for n in slab.nodes}
    with spread(slab, planes, spreaders, n1, key=FrontendKey(lb, Protocol.TCP, 80), serving=every):
        before = node_counts(slab, answered(probe(client.ns, Protocol.TCP, lb, 80, count=60)))
    assert n3.name in before
    rest = {n1.name: every[n1.name], n2.name: every[n2.name]}
    with spread(
        slab, planes, spreaders, n1, key=FrontendKey(lb, Protocol.TCP, 80), serving=rest
    ) as w:
        after = node_counts(slab, answered(probe(client.ns, Protocol.TCP, lb, 80, count=200)))
    assert n3.name not in after, dict(after)
    assert_proportional(after, w, 200)


_INJECT = r"""
import socket, struct, sys
node, vtep_mac, lb, port, client, reply_port = sys.argv[1:7]
payload = b"injected\n"
udp = struct.pack("!HHHH", int(reply_port), int(port), 8 + len(payload), 0) + payload
hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                  socket.inet_aton(client), socket.inet_aton(lb))
s = sum(struct.unpack("!10H", hdr))
s = (s & 0xFFFF) + (s >> 16); s = (s & 0xFFFF) + (s >> 16)
hdr = hdr[:10] + struct.pack("!H", ~s & 0xFFFF) + hdr[12:]
eth = bytes.fromhex(vtep_mac.replace(":", "")) + bytes.fromhex("02aabbccddee") + b"\x08\x00"
vxlan = struct.pack("!II", 0x08000000, 0x4E4C42 << 8)
out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    out.sendto(vxlan + eth + hdr + udp, (node, 4789))
"""


def _listen_and_inject(slab: Lab, sender_ns: str, target: LabNode, lb: IPAddress) -> bool:
    """Return True if a pod answered a VXLAN-wrapped UDP request sent from `sender_ns`."""
    client = client_of(slab)
    listener = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.bind(('0.0.0.0', 40123)); s.settimeout(float(sys.argv[1]))\n"
        "print('READY', flush=True)\n"
        "try:\n    print(s.recv(200).decode().strip())\nexcept OSError:\n    print('NONE')\n"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", client.ns, sys.executable, "-c", listener, "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        argv = [str(target.ip4), T.vtep_mac(target.ip4), str(lb), "80", str(client.ip4), "40123"]
        netns.run(sender_ns, [sys.executable, "-c", _INJECT, *argv])
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out.strip() != "NONE"


def test_vxlan_from_a_host_that_is_not_a_peer_is_dropped_and_from_a_peer_served(
    slab: Lab, planes: Planes, spreaders: Spreaders
) -> None:
    n1, n2, n3 = slab.nodes
    lb = ipaddress.ip_address("198.18.0.213")
    every = {n.name: slab.pods_on(n.name) for n in slab.nodes}
    with spread(slab, planes, spreaders, n1, key=FrontendKey(lb, Protocol.UDP, 80), serving=every):
        # Positive control: the same bytes from a peer reach a pod of n2, which answers.
        assert _listen_and_inject(slab, n3.ns, n2, lb)
        assert not _listen_and_inject(slab, client_of(slab).ns, n2, lb)


_BIG_TCP = r"""
import fcntl, socket, struct, sys, time
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.create_connection((sys.argv[1], 80), timeout=5)
mss = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
s.sendall(b"x" * 200000)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    queued = struct.unpack("i", fcntl.ioctl(s.fileno(), 0x5411, b"\0" * 4))[0]
    if queued == 0:
        print("ACKED", mss); break
    time.sleep(0.02)
else:
    print("STUCK", queued)
"""

_BIG_UDP = r"""
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
size = 1472 if fam == socket.AF_INET else 1452
got = 0
for i in range(int(sys.argv[2])):
    s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2)
    s.sendto(b"y" * size, (sys.argv[1], 80))
    try:
        s.recv(200); got += 1
    except OSError:
        pass
    s.close()
print(got)
"""


@pytest.mark.parametrize(
    "lb",
    [
        pytest.param(ipaddress.ip_address("198.18.0.214"), id="IPv4"),
        pytest.param(ipaddress.ip_address("2001:db8::214"), id="IPv6"),
    ],
)
def test_full_size_packets_cross_the_tunnel(
    slab: Lab, planes: Planes, spreaders: Spreaders, lb: IPAddress
) -> None:
    """200 kB over TCP connections served through the tunnel are all acknowledged (the MSS is
    clamped), and 1500-byte UDP datagrams through it are answered."""
    n1, n2, n3 = slab.nodes
    serving = {n2.name: slab.pods_on(n2.name), n3.name: slab.pods_on(n3.name)}
    client = client_of(slab)
    clamp = T.MSS4 if lb.version == 4 else T.MSS6
    with spread(
        slab, planes, spreaders, n1, key=FrontendKey(lb, Protocol.TCP, 80), serving=serving
    ):
        for _ in range(4):
            out = netns.run(client.ns, [sys.executable, "-c", _BIG_TCP, str(lb)]).stdout.split()
            assert out[0] == "ACKED", out
            # The pod's SYN-ACK was clamped on the serving node: the client's segments fit.
            assert int(out[1]) <= clamp, f"client MSS {out[1]} above the tunnel's {clamp}"
    with spread(
        slab, planes, spreaders, n1, key=FrontendKey(lb, Protocol.UDP, 80), serving=serving
    ):
        got = netns.run(client.ns, [sys.executable, "-c", _BIG_UDP, str(lb), "20"]).stdout
    assert int(got) == 20, f"{got.strip()} of 20 full-size datagrams answered"


def test_holder_mode_serves_only_the_holders_own_endpoints(
    slab: Lab, planes: Planes, spreaders: Spreaders
) -> None:
    n1 = slab.nodes[0]
    lb = ipaddress.ip_address("198.18.0.215")
    client = client_of(slab)
    for node in slab.nodes:
        fe = frontend(
            lb,
            Protocol.TCP,
            80,
            eps(slab.pods_on(node.name), TCP_PORT),
            cluster=eps(slab.pods, TCP_PORT),
            local_only=True,
        )
        held = [lb] if node is n1 else []
        applied(planes.make(node).sync(desired(node, fe, held=held), full=True), SyncMode.FULL)
    with address(n1.ns, "eth0", lb), routes(slab, n1, lb):
        replies = answered(probe(client.ns, Protocol.TCP, lb, 80, count=40))
    assert node_counts(slab, replies) == Counter({n1.name: 40})


def test_removing_spreading_removes_the_table_and_device_and_it_comes_back(
    slab: Lab, spreaders: Spreaders
) -> None:
    n3 = slab.nodes[2]
    idle = spreaders.idle(n3)
    assert not spreaders.sync(n3, idle), "an unchanged state is not sent again"
    assert spreaders.sync(n3, None)
    links = netns.run(n3.ns, ["ip", "-o", "link"]).stdout
    tables = netns.run(n3.ns, ["nft", "list", "tables"]).stdout
    assert T.IFNAME not in links
    assert "netdev nodelb" not in tables
    assert spreaders.sync(n3, idle)
    assert T.IFNAME in netns.run(n3.ns, ["ip", "-o", "link"]).stdout
    fdb = netns.run(n3.ns, ["bridge", "fdb", "show", "dev", T.IFNAME]).stdout
    for peer in idle.peers:
        assert f"{T.vtep_mac(peer)} dst {peer} self permanent" in fdb


def test_a_new_plane_removes_what_a_previous_agent_left_on_its_first_idle_sync(
    slab: Lab, spreaders: Spreaders
) -> None:
    n3 = slab.nodes[2]
    assert T.IFNAME in netns.run(n3.ns, ["ip", "-o", "link"]).stdout
    with NetnsNftRunner(n3.ns) as runner:
        fresh = SpreadPlane(runner, in_netns=in_netns_of(n3))
        assert fresh.sync(None)
        assert not fresh.sync(None), "known to be absent now: nothing sent"
    assert T.IFNAME not in netns.run(n3.ns, ["ip", "-o", "link"]).stdout
    assert "netdev nodelb" not in netns.run(n3.ns, ["nft", "list", "tables"]).stdout
    # Give n3 back its tunnel for the tests after this one.
    spreaders.planes[n3.name].remove()
    assert spreaders.sync(n3, spreaders.idle(n3))


ECHO_PORT = 8090
_ECHO = r"""
import socket, sys, threading
name, port = sys.argv[1].encode(), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(64)
def serve(c):
    with c:
        while True:
            d = c.recv(4096)
            if not d:
                return
            c.sendall(name + b" " + d)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def echo_ready(lab: Lab, pod: Pod) -> bool:
    """Return True once `pod`'s echo server accepts a connection from its node."""

    def reach() -> bool:
        with socket.create_connection((str(pod.ip4), ECHO_PORT), timeout=1):
            return True

    return agent_netns.call_in(lab.node(pod.node).ns, reach)


def spread_to(
    lab: Lab, spreaders: Spreaders, node: LabNode, key: FrontendKey, weights: dict[str, int]
) -> None:
    """Give `node` the spread table of `key` for `weights`, as its agent would compute it."""
    ip4 = {n.name: n.ip4 for n in lab.nodes}
    hops = tuple((b, ip4[m]) for b, m in peer_buckets(bucket_table(weights), node.name))
    spreaders.sync(node, dataclasses.replace(spreaders.idle(node), buckets={key: hops}))


def echo(conn: socket.socket, text: str) -> str:
    """Send `text` on `conn` and return the serving pod's name from its echo."""
    conn.sendall(text.encode())
    answer = conn.recv(4096).decode()
    pod, _, body = answer.partition(" ")
    assert body == text, answer
    return pod


def test_a_new_holder_keeps_the_flows_other_nodes_serve(
    slab: Lab, planes: Planes, spreaders: Spreaders
) -> None:
    """The holder's cable is pulled and another node takes the IP (as the speaker would after
    a kill -9): a long-lived connection served by a third node goes on, because the new
    holder maps it to the same bucket and node (dataplane level; no agent or speaker here)."""
    n1, n2, n3 = slab.nodes
    lb = ipaddress.ip_address("198.18.0.216")
    client = client_of(slab)
    every = {n.name: slab.pods_on(n.name) for n in slab.nodes}
    servers = [
        slab.spawn(
            p.ns, [sys.executable, "-c", _ECHO, p.name, str(ECHO_PORT)], log_name=f"echo-{p.name}"
        )
        for p in slab.pods
    ]
    key = FrontendKey(lb, Protocol.TCP, 80)
    conns: list[socket.socket] = []
    try:
        for p in slab.pods:
            wait_until(functools.partial(echo_ready, slab, p), WAIT, f"{p.name}'s echo server")
        with spread(slab, planes, spreaders, n1, key=key, serving=every, target=ECHO_PORT) as w:
            spread_to(slab, spreaders, n2, key, w)

            def connect() -> socket.socket:
                return socket.create_connection((str(lb), 80), timeout=5)

            by_node: dict[str, socket.socket] = {}
            for _ in range(60):
                conn = agent_netns.call_in(client.ns, connect)
                conns.append(conn)
                by_node.setdefault(slab.pod(echo(conn, "hello")).node, conn)
                if n3.name in by_node and n1.name in by_node:
                    break
            assert n3.name in by_node, "no connection was served by node-3 in 60 tries"
            slab.unplug(n1)
            try:
                with address(n2.ns, "eth0", lb):
                    netns.run(client.ns, ["ip", "route", "replace", f"{lb}/32", "via", str(n2.ip4)])
                    survivor = by_node[n3.name]
                    assert slab.pod(echo(survivor, "still there")).node == n3.name
                    # The agent would then see node-1's endpoints go: new flows avoid it.
                    spread_to(slab, spreaders, n2, key, {n2.name: 2, n3.name: 2})
                    for _ in range(10):
                        fresh = agent_netns.call_in(client.ns, connect)
                        conns.append(fresh)
                        assert slab.pod(echo(fresh, "new")).node in (n2.name, n3.name)
            finally:
                slab.plug(n1)
                spreaders.sync(n2, spreaders.idle(n2))
    finally:
        for c in conns:
            c.close()
        for proc in servers:
            slab.stop(proc)
