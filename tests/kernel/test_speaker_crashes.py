"""Exactly one holder through crash failovers and a healed partition, as the wire shows it.

Speakers run at the priorities ownership gives ranks 0, 1, 2, ... (`priority_for_rank`), one
per node, on one dual-stack VRID at 10 cs adverts; the client captures every VRRP frame on
the segment with kernel timestamps. A crash is the lab's (`crash_speaker`: the node's link
down, its speaker SIGKILLed). After each crash of the holder, the first backup takes over, and
no other node advertises the VRID at priority > 0 once the new Master's first advert has been
on the wire long enough to be heard (a second backup that fires anyway shows up as a second
source). The client's neighbour entries must end on the new holder (moved by its gratuitous
ARP / NA only: the client sends nothing). RFC 5798's 254, 253, 252 put the backups
interval/256 (0.4 ms) apart, and in 8 of 15 crashes a second backup advertised 0.2-0.4 ms
after the first; nodelb's spaced priorities put them 25 ms apart at 10 cs.

A second backup may still advertise first when the first backup's timer fires more than
those 25 ms late (a loaded two-core CI machine did so once in 20 crashes): that is VRRP
working as specified, not a second holder, so the test allows it only when the second
backup's own Master_Down_Interval had run out since the old Master's last advert (it did not
fire early) and it stopped within HEARD_WITHIN_NS of the new Master's first advert. It
counts and prints those crashes; timings themselves are not asserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import pytest

from agent.announce.ownership import priority_for_rank
from agent.announce.settings import AnnounceSettings
from agent.announce.vrrp.machine import master_down_interval
from agent.announce.vrrp.process import SpeakerProcess
from agent.model.net import IPAddress
from lab import netns
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import (
    DualStack,
    Frame,
    Speakers,
    crash_speaker,
    link_local,
    mac_of,
    neighbour_mac,
    parse_capture,
    revive,
    start_capture,
)
from lab.wait import WaitTimeout, wait_until

pytestmark = pytest.mark.kernel

VRRP = DualStack.numbered(vrid=77, host=205, interval_cs=10)
CRASHES = 20
HEALS = 5
TIMEOUT = 20.0
# Adverts of the new holder to wait for after a takeover: 5 intervals, longer than any
# backup's Master_Down_Interval (at most 4 intervals), so a second backup would have fired.
SETTLE_ADVERTS = 5
# After a healed partition both sides' Masters advertise until each hears the other, and a
# second backup that fired before the new Master's first advert reached it advertises until
# it does: a loser's adverts count as overlap once the winner's first advert is this old (one
# hop on a bridge, then the loser's loop turning over).
HEARD_WITHIN_NS = 5_000_000
# Capture timestamps against a speaker's own timer: one hop on a bridge and the capture's
# receive path.
TIMER_START_SLACK_NS = 1_000_000
# The holder's re-announcement reaches the client within its first burst round; seconds of
# margin for a loaded machine, far below the 60 s refresh that would otherwise fix it.
HEAL_ANNOUNCED_S = 3.0
KINDS = {4: "vrrp4", 6: "vrrp6"}


def down_ns(priority: int) -> int:
    """Return the Master_Down_Interval of `priority` at VRRP's interval, in ns."""
    return 1000 * master_down_interval(priority, VRRP.interval_cs)


# The allowance below tells a late first backup from backups too close in priority only when
# ranks 1 and 2 are further apart than the timestamps' slack (25 ms at 10 cs; RFC 5798's 253,
# 252 were 0.4 ms apart).
assert down_ns(priority_for_rank(2)) - down_ns(priority_for_rank(1)) > 10 * TIMER_START_SLACK_NS


def sources(lab: Lab, node: LabNode) -> dict[str, str]:
    """Return `node`'s advert source per capture kind (IPv4 primary, IPv6 link-local)."""
    return {"vrrp4": str(node.ip4), "vrrp6": str(link_local(node))}


def state(sp: SpeakerProcess, family: int) -> str | None:
    status = sp.status()
    inst = None if status is None else status.instance(family, VRRP.vrid)
    return None if inst is None else inst.state


def only_master(running: dict[str, SpeakerProcess], master: str) -> bool:
    return all(
        state(sp, f) == ("Master" if name == master else "Backup")
        for name, sp in running.items()
        for f in (4, 6)
    )


def entries_on(lab: Lab, holder: LabNode) -> bool:
    assert lab.client is not None
    mac = mac_of(holder)
    return all(neighbour_mac(lab.client.ns, vip) == mac for vip in (VRRP.vip4, VRRP.vip6))


def resolve(lab: Lab, vip: IPAddress) -> None:
    assert lab.client is not None
    ping = ["ping", "-c", "1", "-W", "2", str(vip)]
    ns = lab.client.ns
    wait_until(lambda: netns.run(ns, ping, check=False).returncode == 0, TIMEOUT, f"{vip}")


def adverts(frames: list[Frame], kind: str, start_ns: int, end_ns: int) -> list[Frame]:
    """Return the adverts at priority > 0 of `kind` captured in [start_ns, end_ns]."""
    return [f for f in frames if f.kind == kind and f.priority > 0 and start_ns <= f.t_ns <= end_ns]


def adverts_from(lab: Lab, capture: object, src: dict[str, str], since_ns: int, n: int) -> bool:
    """Return True once the capture holds `n` adverts of each family from `src` since then."""
    frames = parse_capture(lab.log_of(capture))  # type: ignore[arg-type]
    return all(
        sum(1 for f in adverts(frames, k, since_ns, time.time_ns()) if f.src == src[k]) >= n
        for k in KINDS.values()
    )


def start_ranked(
    lab: Lab, speakers: Speakers, node: LabNode, rank: int, run: int
) -> SpeakerProcess:
    """Start `node`'s speaker at `rank`'s priority and the agent's real-time priority."""
    return speakers.start(
        lab,
        node,
        VRRP.instances(priority_for_rank(rank)),
        name=f"{node.name}-{run}",
        rt_priority=AnnounceSettings().realtime_priority,
    )


@pytest.mark.parametrize("count", [3, 5], ids=["three nodes", "five nodes"])
def test_after_each_crash_of_the_holder_only_the_first_backup_advertises(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, count: int
) -> None:
    lab = make_lab(LabSpec(nodes=count, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    capture = start_capture(lab, lab.client, name="capture")
    nodes = lab.nodes
    first, second = nodes[0], nodes[1]
    running = {n.name: start_ranked(lab, speakers, n, rank, 0) for rank, n in enumerate(nodes)}
    wait_until(partial(only_master, running, first.name), TIMEOUT, "node-1 the only Master")
    for vip in (VRRP.vip4, VRRP.vip6):
        resolve(lab, vip)
    src1, src2 = sources(lab, first), sources(lab, second)
    windows: list[tuple[int, int]] = []
    late_max_us = 0
    for run in range(1, CRASHES + 1):
        wait_until(partial(only_master, running, first.name), TIMEOUT, "node-1 Master again")
        wait_until(partial(entries_on, lab, first), TIMEOUT, "the client's entries on node-1")
        crashed_at = time.time_ns()
        crash_speaker(lab, first, running.pop(first.name))
        wait_until(partial(only_master, running, second.name), TIMEOUT, "node-2 taking over")
        wait_until(
            partial(adverts_from, lab, capture, src2, crashed_at, SETTLE_ADVERTS),
            TIMEOUT,
            f"{SETTLE_ADVERTS} adverts of node-2 after crash {run}",
        )
        wait_until(partial(entries_on, lab, second), TIMEOUT, "the client's entries on node-2")
        windows.append((crashed_at, time.time_ns()))
        for sp in running.values():
            status = sp.status()
            assert status is not None
            late_max_us = max(late_max_us, status.timer_late_max_us)
        revive(lab, first)
        running[first.name] = start_ranked(lab, speakers, first, 0, run)

    frames = parse_capture(lab.log_of(capture))
    offenders = []
    takeovers_us = []
    late_first_backup = 0
    for start, end in windows:
        for kind in KINDS.values():
            seen = adverts(frames, kind, start, end)
            # node-1's last advert may have been on the wire as its link went down.
            last1 = max(f.t_ns for f in adverts(frames, kind, 0, end) if f.src == src1[kind])
            won_at = min(f.t_ns for f in seen if f.src == src2[kind])
            takeovers_us.append((won_at - start) // 1000)
            others = [f for f in seen if f.src not in (src1[kind], src2[kind])]
            # A second backup may advertise only when the new Master's first advert came
            # after that backup's own Master_Down_Interval had run out (the first backup was
            # late by more than the skew between them; its timer did not fire early), and only
            # until it could have heard that advert.
            bad = [
                (f.src, f.priority, f.t_ns - won_at)
                for f in others
                if f.t_ns > won_at + HEARD_WITHIN_NS
                or min(f.t_ns, won_at) + TIMER_START_SLACK_NS < last1 + down_ns(f.priority)
            ]
            if bad:
                offenders.append((kind, start, bad))
            elif others:
                late_first_backup += 1
    print(
        f"{count} nodes, {CRASHES} crashes: first advert of the new holder "
        f"{min(takeovers_us) / 1000:.0f}-{max(takeovers_us) / 1000:.0f} ms after the crash; "
        f"latest timer {late_max_us / 1000:.1f} ms late; a second backup advertised before "
        f"hearing the first in {late_first_backup} of {2 * CRASHES} takeovers"
    )
    assert not offenders, offenders


def test_after_a_healed_partition_the_holder_alone_advertises(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=3, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    capture = start_capture(lab, lab.client, name="capture")
    nodes = lab.nodes
    first, second = nodes[0], nodes[1]
    running = {n.name: start_ranked(lab, speakers, n, rank, 0) for rank, n in enumerate(nodes)}
    for vip in (VRRP.vip4, VRRP.vip6):
        wait_until(partial(only_master, running, first.name), TIMEOUT, "node-1 the only Master")
        resolve(lab, vip)
    src1, src2 = sources(lab, first), sources(lab, second)
    heals: list[tuple[int, int]] = []
    stale = 0
    for run in range(HEALS):
        wait_until(partial(only_master, running, first.name), TIMEOUT, "node-1 the only Master")
        cut_at = time.time_ns()
        lab.unplug(first)  # node-1 stays Master on its side of the cut
        wait_until(
            partial(adverts_from, lab, capture, src2, cut_at, SETTLE_ADVERTS),
            TIMEOUT,
            f"node-2 taking over during cut {run}",
        )
        healed_at = time.time_ns()
        lab.plug(first)
        wait_until(partial(only_master, running, first.name), TIMEOUT, "one Master after the heal")
        wait_until(
            partial(adverts_from, lab, capture, src1, healed_at, SETTLE_ADVERTS),
            TIMEOUT,
            "node-1 advertising after the heal",
        )
        heals.append((healed_at, time.time_ns()))
        # node-2 may step down on node-1's first advert without one node-1 hears; node-1
        # re-announces because its carrier came back (carrier.py), so the client's entries
        # follow it at once, not at the next refresh (issue #18, finding 7).
        try:
            wait_until(partial(entries_on, lab, first), HEAL_ANNOUNCED_S, "entries on node-1")
        except WaitTimeout:
            stale += 1

    frames = parse_capture(lab.log_of(capture))
    offenders = []
    overlaps_us = []
    for start, end in heals:
        for kind in KINDS.values():
            seen = adverts(frames, kind, start, end)
            won_at = min(f.t_ns for f in seen if f.src == src1[kind])
            losers = [f for f in seen if f.src != src1[kind] and f.t_ns > won_at]
            overlaps_us.append(max((f.t_ns - won_at for f in losers), default=0) // 1000)
            late = [f for f in losers if f.t_ns > won_at + HEARD_WITHIN_NS]
            if late:
                offenders.append((kind, start, [(f.src, f.t_ns - won_at) for f in late]))
    print(
        f"healed partitions: losers advertised up to {max(overlaps_us)} µs after the winner;"
        f" the client's entries still on the loser after {stale} of {HEALS} heals"
    )
    assert not offenders, offenders
    assert stale == 0, f"the client's entries stayed on node-2 after {stale} of {HEALS} heals"
