"""Growing from 200 to 300 to 1,000 LoadBalancer IPs moves no IP that stays, on the wire.

Issue #18 item 3: adding the 256th IP moved a fixed Service's IP to another VRID; two nodes
held it for ~0.6 s and a long-lived TCP connection through it broke. Here three speakers run
exactly the instances `ownership.plan` gives each node (VRIDs, addresses, rank priorities,
startup delays), at the product's default 1 s interval, for 200 Cluster-policy IPs, then
300, then 1,000, each step sent to the running speakers as a new configuration. A client
keeps one TCP connection open through a fixed IP to an echo server on its holder and echoes
a byte every 20 ms throughout. Checked: the connection never breaks; the fixed IP is never
on two nodes or on another node (sampled every 50 ms); after each step every IP that was
already there is on the same node as before, and every IP on its planned holder only.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agent.announce.ownership import (
    IPUse,
    NodeState,
    OwnershipConfig,
    Plan,
    ServiceUse,
    instances_for,
    plan,
    startup_delay_cs,
)
from agent.announce.vrrp.config import InstanceConfig
from agent.announce.vrrp.process import SpeakerProcess
from agent.model.net import IPAddress
from lab import netns
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import Speakers, holds, speaker_config
from lab.wait import wait_until

pytestmark = pytest.mark.kernel

INTERVAL_CS = 100
FIXED = ipaddress.IPv4Address("198.18.0.230")  # on the client's segment: reached by ARP
OTHERS = ipaddress.IPv4Address("198.19.0.0")  # the rest need no route: only held, not used
STEPS = (200, 300, 1000)
PORT = 9000
SETTLE = 90.0  # new instances wait up to Master_Down + 3 intervals at 1 s adverts
TIMEOUT = 30.0

ECHO_SERVER = """
import json, socket, sys, threading
srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
srv.bind(("::", int(sys.argv[1])))
srv.listen(16)
print(json.dumps({"ready": True}), flush=True)
def serve(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

ECHO_CLIENT = """
import json, socket, sys, time
ip, port, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.create_connection((ip, port), timeout=5)
sock.settimeout(2)
print(json.dumps({"connected": True}), flush=True)
n = 0
while True:
    try:
        sock.sendall(b"x")
        if sock.recv(1) != b"x":
            raise OSError("closed by the peer")
    except OSError as exc:
        print(json.dumps({"broken": str(exc), "echoes": n}), flush=True)
        break
    n += 1
    if n % 25 == 0:
        print(json.dumps({"echoes": n}), flush=True)
    time.sleep(period)
"""


def ips(count: int) -> list[IPAddress]:
    return [FIXED, *(OTHERS + i for i in range(count - 1))]


def ownership(lab: Lab, count: int) -> Plan:
    nodes = [NodeState(n.name, ready=True) for n in lab.nodes]
    uses = [IPUse(ip, (ServiceUse(f"ns/svc-{ip}", local=False),)) for ip in ips(count)]
    return plan(nodes=nodes, ips=uses, config=OwnershipConfig())


def instances(result: Plan, node: LabNode) -> list[InstanceConfig]:
    return [
        InstanceConfig(
            vrid=i.vrid,
            family=i.version,
            priority=i.priority,
            advert_interval_cs=INTERVAL_CS,
            addresses=i.addresses,
            startup_delay_cs=startup_delay_cs(i.priority, INTERVAL_CS),
        )
        for i in instances_for(node.name, result)
    ]


def held_by(lab: Lab) -> dict[IPAddress, list[str]]:
    """Return, per address held on a node's segment interface, the nodes holding it."""
    out: dict[IPAddress, list[str]] = {}
    for node in lab.nodes:
        raw = netns.run(node.ns, ["ip", "-j", "-4", "addr", "show", "dev", node.ifname]).stdout
        for link in json.loads(raw):
            for a in link["addr_info"]:
                address = ipaddress.ip_address(a["local"])
                if address != node.ip4:
                    out.setdefault(address, []).append(node.name)
    return out


def as_planned(lab: Lab, result: Plan) -> dict[IPAddress, list[str]] | None:
    """Return who holds what once every IP is on its planned holder alone, else None."""
    now = held_by(lab)
    want = {d.ip: [d.holder] for d in result.ips}
    return now if now == want else None


def echoes(lab: Lab, client: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lab.log_of(client).splitlines() if line.startswith("{")]


def test_growing_to_1000_ips_moves_no_ip_and_keeps_a_long_lived_connection(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=3, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    for node in lab.nodes:
        server = lab.spawn(
            node.ns, [sys.executable, "-c", ECHO_SERVER, str(PORT)], log_name=f"echo-{node.name}"
        )
        wait_until(lambda s=server: '"ready"' in lab.log_of(s), TIMEOUT, "echo server")  # type: ignore[misc]
    first = ownership(lab, STEPS[0])
    running: dict[str, SpeakerProcess] = {
        n.name: speakers.start(lab, n, instances(first, n), name=n.name) for n in lab.nodes
    }
    before = wait_until(lambda: as_planned(lab, first), SETTLE, f"{STEPS[0]} IPs as planned")
    assert before is not None
    holder = before[FIXED][0]

    client = lab.spawn(
        lab.client.ns,
        [sys.executable, "-c", ECHO_CLIENT, str(FIXED), str(PORT), "0.02"],
        log_name="echo-client",
    )
    wait_until(lambda: '"connected"' in lab.log_of(client), TIMEOUT, "the long-lived connection")
    seen: list[list[str]] = []
    stop = threading.Event()

    def sample() -> None:  # who holds the fixed IP, every 50 ms
        while not stop.is_set():
            seen.append([n.name for n in lab.nodes if holds(n, FIXED)])
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    moved: dict[int, dict[IPAddress, tuple[list[str], list[str]]]] = {}
    try:
        for count in STEPS[1:]:
            result = ownership(lab, count)
            for node in lab.nodes:
                sp = running[node.name]
                sp.update(speaker_config(lab, node, instances(result, node)))
            after = wait_until(lambda r=result: as_planned(lab, r), SETTLE, f"{count} IPs")  # type: ignore[misc]
            assert after is not None
            moved[count] = {ip: (was, after[ip]) for ip, was in before.items() if after[ip] != was}
            before = after
        done = len(echoes(lab, client))
        wait_until(lambda: len(echoes(lab, client)) >= done + 2, TIMEOUT, "echoes after 1,000")
    finally:
        stop.set()
        sampler.join()
    lines = echoes(lab, client)
    broken = [line for line in lines if "broken" in line]
    print(
        f"200 -> 300 -> 1000 IPs: {sum(map(len, moved.values()))} moves, "
        f"{max(e.get('echoes', 0) for e in lines)} echoes, {len(seen)} samples of {FIXED}"
    )
    assert not broken, broken
    assert not any(moved.values()), moved
    assert all(s == [holder] for s in seen), [s for s in seen if s != [holder]][:5]
