"""The speaker on the wire: spoofed adverts are dropped for the right reason, and the gratuitous
ARP / NA burst has the configured count and spacing.

Spoofs are real packets on the lab segment: a higher-priority advert from the client (not a
peer), adverts with TTL / hop limit 254 from a real peer, and a peer's advert with the other
IPv4 checksum mode. Captures use an AF_PACKET socket in another namespace with kernel receive
timestamps (lab.vrrp_lab capture).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from agent.announce.metrics import SpeakerMetrics
from agent.announce.settings import parse_announce
from agent.announce.vrrp.codec import ChecksumMode, DecodeReason
from agent.announce.vrrp.config import DEFAULT_REFRESH_S, GratuitousConfig, SpeakerConfig
from agent.announce.vrrp.control import SpeakerStatus
from agent.announce.vrrp.process import SpeakerProcess
from agent.announce.vrrp.speaker import DropReason
from agent.model.net import IPAddress
from lab import netns
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import (
    DualStack,
    Speakers,
    holds,
    link_local,
    mac_of,
    neighbour_mac,
    parse_capture,
    speaker_config,
    start_capture,
    start_speaker,
)
from lab.wait import wait_until

pytestmark = pytest.mark.kernel

VRRP = DualStack.numbered(vrid=9, host=210, interval_cs=10)
VIP4, VIP6, VRID = VRRP.vip4, VRRP.vip6, VRRP.vrid
TIMEOUT = 20.0
SPOOFS = 20
instances = VRRP.instances


def send(lab: Lab, ns: str, *args: object) -> None:
    argv = [sys.executable, "-m", "lab.vrrp_lab", "send", *map(str, args)]
    netns.run(ns, argv)


def test_spoofed_adverts_are_dropped_with_their_reason_and_the_master_stays(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    n1, n2 = lab.nodes
    master = speakers.start(lab, n1, instances(100), name="n1")
    wait_until(lambda: holds(n1, VIP4) and holds(n1, VIP6), TIMEOUT, "node-1 holding the VIPs")
    before = master.status()
    assert before is not None

    client_ll = link_local(lab.client)
    n2_ll = link_local(n2)
    rfc = ChecksumMode.RFC5798
    # The client is no peer: priority 255 adverts from it must not take the VIPs.
    send(lab, lab.client.ns, 4, lab.client.ip4, VRID, 255, 255, SPOOFS, rfc, VIP4)
    send(lab, lab.client.ns, 6, client_ll, VRID, 255, 255, SPOOFS, rfc, VIP6)
    # node-2 is a peer, but a packet with TTL 254 has crossed a router (RFC 5798 §7.1).
    send(lab, n2.ns, 4, n2.ip4, VRID, 255, 254, SPOOFS, rfc, VIP4)
    send(lab, n2.ns, 6, n2_ll, VRID, 255, 254, SPOOFS, rfc, VIP6)
    # A peer's IPv4 advert checksummed without the pseudo-header fails the codec.
    send(lab, n2.ns, 4, n2.ip4, VRID, 255, 255, SPOOFS, ChecksumMode.VRRPV2_COMPAT, VIP4)
    # A valid advert from a peer for a VRID this node does not run.
    send(lab, n2.ns, 4, n2.ip4, VRID + 1, 255, 255, SPOOFS, rfc, VIP4)

    expected = {
        (4, DropReason.UNKNOWN_SOURCE.value): SPOOFS,
        (6, DropReason.UNKNOWN_SOURCE.value): SPOOFS,
        (4, DropReason.TTL.value): SPOOFS,
        (6, DropReason.TTL.value): SPOOFS,
        (4, DecodeReason.BAD_CHECKSUM.value): SPOOFS,
        (4, DropReason.UNKNOWN_VRID.value): SPOOFS,
    }

    def all_counted() -> SpeakerStatus | None:
        status = master.status()
        if status is None:
            return None
        got = {k: status.dropped_count(*k) for k in expected}
        return status if got == expected else None

    status = wait_until(all_counted, TIMEOUT, f"drop counters reaching {expected}")
    assert status is not None
    assert dict(status.dropped) == expected  # nothing else was dropped, nothing counted twice
    for family in (4, 6):
        inst = status.instance(family, VRID)
        assert inst is not None
        assert (inst.state, inst.adverts_received, inst.takeovers) == ("Master", 0, 1), inst
        assert inst.master == (n1.ip4 if family == 4 else link_local(n1))
    assert [t.to_state for t in status.transitions] == [t.to_state for t in before.transitions]
    assert holds(n1, VIP4) and holds(n1, VIP6)

    # The same figures through the Prometheus metrics, counted once however often updated.
    registry = CollectorRegistry()
    metrics = SpeakerMetrics(registry)
    metrics.update(status)
    metrics.update(status)
    value = registry.get_sample_value
    for (family, reason), n in expected.items():
        labels = {"family": f"IPv{family}", "reason": reason}
        assert value("nodelb_vrrp_adverts_dropped_total", labels) == n, labels
    for family in (4, 6):
        labels = {"vrid": str(VRID), "family": f"IPv{family}"}
        assert value("nodelb_vrrp_state", {**labels, "state": "Master"}) == 1
        assert value("nodelb_vrrp_state", {**labels, "state": "Backup"}) == 0
        assert value("nodelb_vrrp_priority", labels) == 100
        assert value("nodelb_vrrp_takeovers_total", labels) == 1
        assert value("nodelb_vrrp_transitions_total", {**labels, "to": "Master"}) == 1
        assert value("nodelb_vrrp_adverts_received_total", labels) == 0
        sent = value("nodelb_vrrp_adverts_sent_total", labels)
        assert sent is not None and sent >= 1
        assert value("nodelb_held_addresses", {"family": f"IPv{family}"}) == 1
    arp = value("nodelb_gratuitous_sent_total", {"family": "IPv4", "kind": "arp_request"})
    assert arp == GratuitousConfig().count


@pytest.mark.parametrize("spacing_ms", [50, 150])
def test_a_takeover_sends_the_configured_gratuitous_burst(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, spacing_ms: int
) -> None:
    lab = make_lab(LabSpec(nodes=1, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    (n1,) = lab.nodes
    capture = start_capture(lab, lab.client, name="capture")
    count = 4
    burst = GratuitousConfig(count=count, spacing_ms=spacing_ms)
    sp = speakers.start(lab, n1, instances(100), gratuitous=burst, name="n1")

    def burst_seen() -> bool:
        status = sp.status()
        return status is not None and dict(status.gratuitous) == {
            (4, "arp_request"): count,
            (4, "arp_reply"): count,
            (6, "na"): count,
        }

    wait_until(burst_seen, TIMEOUT, "the speaker reporting the whole burst sent")
    mac = mac_of(n1)
    wanted = {("arp", 1), ("arp", 2), ("na", -1)}

    def captured() -> dict[tuple[str, int], list[int]] | None:
        got: dict[tuple[str, int], list[int]] = {k: [] for k in wanted}
        for f in parse_capture(lab.log_of(capture)):
            if (f.kind, f.op) in got and f.target in (str(VIP4), str(VIP6)):
                got[(f.kind, f.op)].append(f.t_ns)
        return got if all(len(v) >= count for v in got.values()) else None

    seen = wait_until(captured, TIMEOUT, "the burst on the wire")
    assert seen is not None
    for key, times in seen.items():
        assert len(times) == count, (key, len(times))  # no more than configured
        gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
        # The first round leaves at once, the others `spacing_ms` apart (timer wake-up jitter
        # of a busy machine allowed for on the late side only).
        assert all(spacing_ms - 2 <= g <= spacing_ms + 40 for g in gaps_ms), (key, gaps_ms)
    frames = [f for f in parse_capture(lab.log_of(capture)) if f.kind == "na"]
    assert all(f.ttl == 255 for f in frames), frames
    assert mac  # the frames' link-layer source is checked by the neighbour tests in failover


def test_a_master_refreshes_its_announcements_periodically(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=1, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    (n1,) = lab.nodes
    capture = start_capture(lab, lab.client, name="capture")
    refresh = GratuitousConfig(count=2, spacing_ms=50, refresh_s=0.3, arp_reply=False)
    sp = speakers.start(lab, n1, instances(100), gratuitous=refresh, name="n1")

    def requests_seen() -> list[int] | None:
        times = [
            f.t_ns
            for f in parse_capture(lab.log_of(capture))
            if f.kind == "arp" and f.target == str(VIP4)
        ]
        return times if len(times) >= 5 else None

    times = wait_until(requests_seen, TIMEOUT, "a burst of 2 and three refreshes")
    assert times is not None
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(times[:5])]
    # The burst (50 ms), then a refresh every 300 ms, for as long as it is Master.
    assert 48 <= gaps_ms[0] <= 90, gaps_ms
    assert all(298 <= g <= 340 for g in gaps_ms[1:]), gaps_ms
    assert all(f.op == 1 for f in parse_capture(lab.log_of(capture)) if f.kind == "arp")
    status = sp.status()
    assert status is not None
    assert dict(status.gratuitous).get((4, "arp_reply"), 0) == 0


def test_a_default_install_refreshes_its_announcements_after_the_default_interval(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    """Issue #18 item 7: with the `announce` settings an install gets by default, a Master
    sends one more gratuitous round `DEFAULT_REFRESH_S` after its takeover burst."""
    lab = make_lab(LabSpec(nodes=1, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    (n1,) = lab.nodes
    gratuitous = parse_announce({}).gratuitous
    assert gratuitous.refresh_s == DEFAULT_REFRESH_S
    capture = start_capture(lab, lab.client, name="capture")
    speakers.start(lab, n1, instances(100), gratuitous=gratuitous, name="n1")

    def rounds(kind: str, target: str, op: int) -> list[int]:
        return [
            f.t_ns
            for f in parse_capture(lab.log_of(capture))
            if f.kind == kind and f.target == target and f.op == op
        ]

    wanted = [("arp", str(VIP4), 1), ("arp", str(VIP4), 2), ("na", str(VIP6), -1)]

    def refreshed() -> dict[tuple[str, str, int], list[int]] | None:
        got = {w: rounds(*w) for w in wanted}
        return got if all(len(t) > gratuitous.count for t in got.values()) else None

    seen = wait_until(
        refreshed, DEFAULT_REFRESH_S + TIMEOUT, "a refresh round after the takeover burst"
    )
    assert seen is not None
    for key, times in seen.items():
        burst_end, refresh = times[gratuitous.count - 1], times[gratuitous.count]
        gap_s = (refresh - burst_end) / 1e9
        print(f"{key}: refresh {gap_s:.3f}s after the burst")
        # The refresh comes one interval after the last burst round, not before.
        assert gap_s >= DEFAULT_REFRESH_S - 0.01, (key, gap_s)


def forge(lab: Lab, ns: str, *args: object) -> None:
    """Send adverts as frames from `ns`'s own MAC with any source address (lab.vrrp_lab forge)."""
    argv = [sys.executable, "-m", "lab.vrrp_lab", "forge", *map(str, args)]
    netns.run(ns, argv)


def guarded(lab: Lab, node: LabNode, other: LabNode, priority: int) -> SpeakerConfig:
    """Return `node`'s speaker config as the agent builds it: the peer's published MAC for
    both of its addresses, and the priority range of a plan of two ranks (with slack)."""
    base = speaker_config(lab, node, instances(priority))
    mac = mac_of(other)
    return dataclasses.replace(
        base, peer_macs={other.ip4: mac, link_local(other): mac}, peer_priorities=(252, 254)
    )


def fresh_client_reaches(lab: Lab, ip: IPAddress, holder: LabNode) -> bool:
    """Return True when the client, its neighbour entry for `ip` flushed, resolves it to
    `holder`'s MAC and gets a ping answer."""
    assert lab.client is not None
    ns = lab.client.ns
    netns.run(ns, ["ip", "neigh", "flush", "to", str(ip)], check=False)
    family = "-4" if ip.version == 4 else "-6"
    ping = netns.run(ns, ["ping", family, "-c", "1", "-W", "1", str(ip)], check=False)
    return ping.returncode == 0 and neighbour_mac(ns, ip) == mac_of(holder)


def test_forged_adverts_from_the_peers_addresses_leave_the_holder_holding(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    """Issue #18 item 6: a host on the segment sends priority-255 adverts alternating both
    peers' addresses (before: no node held the VIPs for the whole attack), and a forged
    advert at a rank's priority from the backup's address. The frames carry the forger's MAC:
    both speakers drop them as wrong_mac; a real peer's 255 is dropped as priority."""
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    n1, n2 = lab.nodes
    for node, other, prio in ((n1, n2, 254), (n2, n1, 253)):
        sp = start_speaker(lab, node, guarded(lab, node, other, prio), name=node.name)
        speakers.append(sp)
    master, backup = speakers.started
    wait_until(lambda: holds(n1, VIP4) and holds(n1, VIP6), TIMEOUT, "node-1 holding the VIPs")
    for ip in (VIP4, VIP6):
        assert fresh_client_reaches(lab, ip, n1)

    client_ns, rfc = lab.client.ns, ChecksumMode.RFC5798
    lls = {n.name: link_local(n) for n in (n1, n2)}
    for _ in range(3):  # alternating the two peers' addresses, as in the issue
        for node in (n2, n1):
            forge(lab, client_ns, 4, node.ip4, VRID, 255, 255, SPOOFS, rfc, VIP4)
            forge(lab, client_ns, 6, lls[node.name], VRID, 255, 255, SPOOFS, rfc, VIP6)
            assert holds(n1, VIP4) and holds(n1, VIP6), "the holder let go during the attack"
            assert not holds(n2, VIP4) and not holds(n2, VIP6)
    # A rank's priority is let through by the priority check: the MAC check stops it.
    forge(lab, client_ns, 4, n2.ip4, VRID, 254, 255, SPOOFS, rfc, VIP4)
    # The real backup sending 255 (a compromised or misconfigured peer): refused too.
    send(lab, n2.ns, 4, n2.ip4, VRID, 255, 255, SPOOFS, rfc, VIP4)

    def drops(sp: SpeakerProcess, family: int, reason: DropReason) -> int:
        status = sp.status()
        return 0 if status is None else status.dropped_count(family, reason.value)

    def counted() -> bool:
        return (
            drops(master, 4, DropReason.WRONG_MAC) >= 4 * SPOOFS
            and drops(master, 6, DropReason.WRONG_MAC) >= 3 * SPOOFS
            and drops(master, 4, DropReason.PRIORITY) >= SPOOFS
            and drops(backup, 4, DropReason.WRONG_MAC) >= 3 * SPOOFS
            and drops(backup, 6, DropReason.WRONG_MAC) >= 3 * SPOOFS
        )

    wait_until(counted, TIMEOUT, "every forged advert dropped with its reason")
    assert holds(n1, VIP4) and holds(n1, VIP6) and not holds(n2, VIP4)
    for ip in (VIP4, VIP6):
        assert fresh_client_reaches(lab, ip, n1), f"a fresh client cannot reach {ip} on node-1"
