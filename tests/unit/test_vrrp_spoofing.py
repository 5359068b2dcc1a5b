"""Spoofing resistance (issue #18 item 6), as pure rules and on the speaker's receive path.

A host on the segment forging a peer's source address, a priority nodelb never sends, or a
report Lease speaking for another node: each is refused with its reason, and the holder keeps
holding. The kernel tier (tests/kernel/test_speaker_wire.py) replays the same attacks on the
wire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any

import pytest

from agent.announce.inputs import (
    node_states,
    peer_macs,
    peer_priority_range,
    peer_sources,
    speaker_config,
)
from agent.announce.ownership import IPUse, OwnershipConfig, ServiceUse, plan
from agent.announce.settings import AnnounceConfigError, parse_announce
from agent.announce.vrrp.codec import Advert, encode
from agent.announce.vrrp.config import SpeakerConfig, from_json, to_json
from agent.announce.vrrp.sockets import GROUP4, GROUP6, Received, parse_ipv4, parse_ipv6
from agent.announce.vrrp.speaker import DropReason
from agent.kube.node_report import (
    MAC_ANNOTATION,
    SOURCES_ANNOTATION,
    PeerReport,
    parse_mac,
    report_sources,
)
from agent.kube.store import EventType
from agent.model.net import IPAddress
from agent.model.node import Node
from agent.node.cluster_state import Changes
from tests.unit.test_cluster_state import Cluster
from tests.unit.test_vrrp_speaker import (
    INTERVAL,
    PEER4,
    PEER6,
    SRC4,
    VIP6,
    VIP_A,
    VRID,
    Harness,
    harness_on,
    instance,
)

PEER_MAC = "02:00:00:00:00:0c"
FORGER_MAC = "02:00:00:00:00:99"


def lease(name: str, holder: str | None, sources: str, mac: str | None = None) -> dict[str, Any]:
    annotations = {SOURCES_ANNOTATION: sources}
    if mac is not None:
        annotations[MAC_ANNOTATION] = mac
    spec = {} if holder is None else {"holderIdentity": holder}
    return {"metadata": {"name": name, "annotations": annotations}, "spec": spec}


def test_a_report_speaks_only_for_the_node_it_is_named_for() -> None:
    own = report_sources(lease("nodelb-node-n2", "n2", "198.18.0.12,fe80::2", PEER_MAC))
    assert own == PeerReport("n2", (IPv4Address("198.18.0.12"), IPv6Address("fe80::2")), PEER_MAC)
    # A Lease claiming to be another node's report is refused whole.
    forged = report_sources(lease("nodelb-node-n3", "n2", "fe80::66", FORGER_MAC))
    assert forged.node == "n3" and forged.sources == () and forged.mac is None
    assert forged.problem is not None and "n2" in forged.problem
    # A Lease not named for a node speaks for nobody.
    stray = report_sources(lease("evil", "n2", "fe80::66"))
    assert stray.problem is not None and stray.sources == ()
    # Nor does one without a holderIdentity (the agent always writes it).
    headless = report_sources(lease("nodelb-node-n2", None, "fe80::2"))
    assert headless.problem is not None and headless.sources == ()
    # Extra entries (a second link-local, a global IPv6 address) are dropped.
    padded = report_sources(lease("nodelb-node-n2", "n2", "fe80::2,fe80::66,2001:db8::66"))
    assert padded.sources == (IPv6Address("fe80::2"),)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("02:00:00:00:00:0C", "02:00:00:00:00:0c", id="a unicast MAC, lowercased"),
        pytest.param("ff:ff:ff:ff:ff:ff", None, id="broadcast is refused"),
        pytest.param("01:00:5e:00:00:12", None, id="multicast is refused"),
        pytest.param("00:00:00:00:00:00", None, id="all zeros is refused"),
        pytest.param("02:00:00:00:0c", None, id="five octets are refused"),
        pytest.param("zz:00:00:00:00:0c", None, id="non-hex is refused"),
    ],
)
def test_only_a_unicast_mac_is_taken_from_a_report(text: str, want: str | None) -> None:
    assert parse_mac(text) == want


def test_cluster_state_drops_a_report_for_another_node() -> None:
    cluster = Cluster(announcing=True)
    store = cluster.reports
    changes = [
        c
        for raw in (
            lease("nodelb-node-node-2", "node-2", "fe80::2", PEER_MAC),
            lease("nodelb-node-node-3", "node-2", "fe80::66", FORGER_MAC),
        )
        if (c := store.apply(EventType.ADDED, {**raw, "metadata": {**raw["metadata"]}}))
    ]
    dirty = cluster.state.apply(Changes(reports=changes))
    assert dirty.reported == {
        "node-2": PeerReport("node-2", (IPv6Address("fe80::2"),), PEER_MAC),
    }


def test_peer_macs_come_from_each_nodes_own_report() -> None:
    nodes = [
        Node("me", None, True, (IPv4Address("198.18.0.11"),), ()),
        Node("n2", None, True, (IPv4Address("198.18.0.12"),), ()),
        Node("n3", None, True, (IPv4Address("198.18.0.13"),), ()),
    ]
    reported = {
        "me": PeerReport("me", (IPv6Address("fe80::1"),), "02:00:00:00:00:0b"),
        "n2": PeerReport("n2", (IPv6Address("fe80::2"),), PEER_MAC),
        "n3": PeerReport("n3", (IPv6Address("fe80::3"),), None),  # an older agent: no MAC
        "ghost": PeerReport("ghost", (IPv6Address("fe80::66"),), FORGER_MAC),
    }
    assert peer_macs(nodes, reported, "me") == {
        IPv4Address("198.18.0.12"): PEER_MAC,
        IPv6Address("fe80::2"): PEER_MAC,
    }
    assert IPv6Address("fe80::66") not in peer_sources(nodes, reported, "me")


def test_the_priority_range_is_the_plans_ranks_with_one_of_slack() -> None:
    nodes = node_states([Node(n, None, True, (), ()) for n in ("n1", "n2", "n3")])
    uses = frozenset({IPUse(ip_address("198.18.72.1"), (ServiceUse("ns/a", False, frozenset()),))})
    p = plan(nodes=nodes, ips=uses, config=OwnershipConfig())
    assert peer_priority_range(p) == (125, 254)  # ranks 254, 253, 189 and one more (125)
    assert peer_priority_range(None) is None


def test_keepalived_peers_are_peers_with_no_mac_or_priority_check() -> None:
    settings = parse_announce({"keepalivedPeers": ["198.18.0.50"]})
    ka = IPv4Address("198.18.0.50")
    config = speaker_config(
        node="n1",
        plan=None,
        settings=settings,
        source4=SRC4,
        peers=frozenset({PEER4}),
        peer_macs={PEER4: PEER_MAC, ka: FORGER_MAC},
    )
    assert config.peers == {PEER4, ka}
    assert config.keepalived_peers == {ka}
    assert config.peer_macs == {PEER4: PEER_MAC}
    assert from_json(to_json(config)) == config
    with pytest.raises(AnnounceConfigError, match=r"keepalivedPeers\[0\]"):
        parse_announce({"keepalivedPeers": ["nope"]})


def test_parse_keeps_only_vrrp_packets() -> None:
    advert = Advert(vrid=VRID, priority=100, max_adver_int=INTERVAL, addresses=(VIP_A,))
    payload = encode(advert, src=PEER4, dst=GROUP4)
    header = bytearray(20)
    header[0], header[8], header[9] = 0x45, 255, 112
    header[2:4] = (20 + len(payload)).to_bytes(2, "big")
    header[12:16], header[16:20] = PEER4.packed, GROUP4.packed
    got = parse_ipv4(bytes(header) + payload)
    assert got is not None and got.src == PEER4 and got.ttl == 255 and got.payload == payload
    header[9] = 6  # TCP
    assert parse_ipv4(bytes(header) + payload) is None
    advert6 = dataclasses.replace(advert, addresses=(VIP6,))
    payload6 = encode(advert6, src=PEER6, dst=GROUP6)
    h6 = bytearray(40)
    h6[0], h6[6], h6[7] = 0x60, 112, 255
    h6[4:6] = len(payload6).to_bytes(2, "big")
    h6[8:24], h6[24:40] = PEER6.packed, GROUP6.packed
    got6 = parse_ipv6(bytes(h6) + payload6)
    assert got6 is not None and (got6.src, got6.dst, got6.ttl) == (PEER6, GROUP6, 255)
    h6[6] = 0  # a hop-by-hop header first: not an advert we read
    assert parse_ipv6(bytes(h6) + payload6) is None


# --- the speaker's receive path -------------------------------------------------------------


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Harness]:
    """A Master for VIP_A (VRID 5) whose peer PEER4 / PEER6 published PEER_MAC, under a plan of
    three ranks (priorities 251..254 accepted)."""
    with harness_on(tmp_path) as h:
        config = SpeakerConfig(
            interface="eth0",
            source4=SRC4,
            peers=frozenset({PEER4, PEER6}),
            peer_macs={PEER4: PEER_MAC, PEER6: PEER_MAC},
            peer_priorities=(251, 254),
            instances=(instance(VIP_A, priority=254), instance(VIP6, family=6, priority=254)),
        )
        h.speaker.apply(config)
        h.run_until(h.clock.now + 10 * INTERVAL * 10_000)
        assert h.state() == "Master" and h.state(family=6) == "Master"
        yield h


def hear(h: Harness, priority: int, *, family: int = 4, mac: str | None = PEER_MAC) -> None:
    src: IPAddress = PEER4 if family == 4 else PEER6
    dst: IPAddress = GROUP4 if family == 4 else GROUP6
    addresses: tuple[IPAddress, ...] = (VIP_A,) if family == 4 else (VIP6,)
    advert = Advert(vrid=VRID, priority=priority, max_adver_int=INTERVAL, addresses=addresses)
    packet = Received(family, src, dst, 255, encode(advert, src=src, dst=dst))
    if mac is not None:
        packet = dataclasses.replace(packet, src_mac=bytes.fromhex(mac.replace(":", "")))
    h.speaker.accept(family, packet)


def dropped(h: Harness, family: int, reason: DropReason) -> int:
    return h.speaker.dropped[family].get(reason.value, 0)


@pytest.mark.parametrize("family", [4, 6])
def test_a_peers_address_from_another_mac_is_dropped_and_the_master_stays(
    guarded: Harness, family: int
) -> None:
    for _ in range(5):
        hear(guarded, 254, family=family, mac=FORGER_MAC)  # would win the tie on address
    assert dropped(guarded, family, DropReason.WRONG_MAC) == 5
    assert guarded.state(family=family) == "Master"
    hear(guarded, 254, family=family, mac=None)  # no MAC known: refused as well
    assert dropped(guarded, family, DropReason.WRONG_MAC) == 6


@pytest.mark.parametrize("priority", [255, 250, 1])
def test_a_priority_nodelb_never_sends_is_dropped_and_the_master_stays(
    guarded: Harness, priority: int
) -> None:
    for family in (4, 6):
        for _ in range(3):
            hear(guarded, priority, family=family)
        assert dropped(guarded, family, DropReason.PRIORITY) == 3
        assert guarded.state(family=family) == "Master"


def test_a_rank_priority_and_a_resignation_from_the_real_peer_are_accepted(
    guarded: Harness,
) -> None:
    hear(guarded, 253)
    assert dropped(guarded, 4, DropReason.PRIORITY) == 0
    assert dropped(guarded, 4, DropReason.WRONG_MAC) == 0
    hear(guarded, 0)
    assert dropped(guarded, 4, DropReason.PRIORITY) == 0


def test_a_keepalived_peer_may_send_255(tmp_path: Path) -> None:
    with harness_on(tmp_path) as h:
        config = SpeakerConfig(
            interface="eth0",
            source4=SRC4,
            peers=frozenset({PEER4}),
            keepalived_peers=frozenset({PEER4}),
            peer_priorities=(251, 254),
            instances=(instance(VIP_A, priority=254),),
        )
        h.speaker.apply(config)
        h.run_until(h.clock.now + 10 * INTERVAL * 10_000)
        assert h.state() == "Master"
        hear(h, 255, mac=None)
        assert dropped(h, 4, DropReason.PRIORITY) == 0
        assert h.state() == "Backup"
