"""nodelb VRRP speakers in lab nodes: election, crash and graceful failover, preemption, updates.

Every speaker is a real `SpeakerProcess` child exec'd inside its node's namespace; the client
namespace watches the neighbour entries move. Durations are measured on the shared monotonic
clock (the speakers stamp their transitions with it), from the moment the test killed or
stopped the master to the moment the backup's state machine made it Master.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from agent.announce.ownership import startup_delay_cs
from agent.announce.vrrp.config import InstanceConfig, SpeakerConfig, to_json
from agent.announce.vrrp.control import SpeakerStatus
from agent.announce.vrrp.machine import master_down_interval, skew_time
from agent.announce.vrrp.process import SpeakerProcess, read_status
from agent.model.net import IPAddress
from bench.failover import CLIENT_LOOP, answering, replies
from lab import netns
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import (
    DualStack,
    Speakers,
    crash_speaker,
    holds,
    mac_of,
    neighbour_mac,
    speaker_config,
)
from lab.wait import wait_until

pytestmark = pytest.mark.kernel

# 100 ms adverts: fast tests; the timer formulas are the same at any interval.
VRRP = DualStack.numbered(vrid=42, host=200, interval_cs=10)
VIP4, VIP6, VRID, INTERVAL_CS = VRRP.vip4, VRRP.vip6, VRRP.vrid, VRRP.interval_cs
VIP4B = ipaddress.IPv4Address("198.18.0.201")
SLACK_US = 150_000  # scheduling on a busy 2-CPU machine, netlink, status write
TIMEOUT = 20.0
PORT = 8080

Start = Callable[[LabNode, int], SpeakerProcess]


instances = VRRP.instances


def now_us() -> int:
    return time.monotonic_ns() // 1000


def state_of(sp: SpeakerProcess, family: int) -> str | None:
    status = sp.status()
    inst = None if status is None else status.instance(family, VRID)
    return None if inst is None else inst.state


def wait_states(pairs: list[tuple[SpeakerProcess, str]], what: str) -> None:
    wait_until(lambda: all(state_of(sp, f) == s for sp, s in pairs for f in (4, 6)), TIMEOUT, what)


def became_master_at(sp: SpeakerProcess, family: int, after_seq: int) -> int | None:
    """Return when `sp` entered Master for `family` after transition `after_seq`, if it did."""
    status = sp.status()
    if status is None:
        return None
    for t in status.transitions:
        if t.seq > after_seq and t.family == family and t.to_state == "Master":
            return t.time_us
    return None


def master_seen(sp: SpeakerProcess, family: int) -> IPAddress | None:
    status = sp.status()
    inst = None if status is None else status.instance(family, VRID)
    return None if inst is None else inst.master


def master_is(sp: SpeakerProcess, family: int, address: IPAddress) -> bool:
    return master_seen(sp, family) == address


def neighbour_is(ns: str, vip: IPAddress, holder: LabNode) -> bool:
    return neighbour_mac(ns, vip) == mac_of(holder)


def moved(vip: IPAddress, to: LabNode, away: LabNode) -> bool:
    return holds(to, vip) and not holds(away, vip)


def last_seq(sp: SpeakerProcess) -> int:
    status = sp.status()
    assert status is not None
    return max((t.seq for t in status.transitions), default=0)


def resolve(lab: Lab, vip: IPAddress) -> None:
    """Make the client resolve `vip` (one ping) so it has a neighbour entry for it."""
    assert lab.client is not None
    client_ns = lab.client.ns
    ping = ["ping", "-c", "1", "-W", "2", str(vip)]
    wait_until(
        lambda: netns.run(client_ns, ping, check=False).returncode == 0,
        TIMEOUT,
        f"the client reaching {vip}",
    )


def test_the_highest_priority_is_the_only_master_and_a_crash_moves_the_vip_and_the_neighbour(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=3, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    nodes = lab.nodes
    first, second, third = [
        speakers.start(lab, node, instances(prio), name=node.name)
        for node, prio in zip(nodes, (200, 150, 50), strict=True)
    ]
    wait_states([(first, "Master"), (second, "Backup"), (third, "Backup")], "one master")
    for vip in (VIP4, VIP6):
        wait_until(partial(holds, nodes[0], vip), TIMEOUT, f"{vip} on node-1")
        assert [holds(n, vip) for n in nodes] == [True, False, False]
        resolve(lab, vip)
        assert neighbour_mac(lab.client.ns, vip) == mac_of(nodes[0])
    for sp in (second, third):
        wait_until(partial(master_is, sp, 4, nodes[0].ip4), TIMEOUT, "node-1 seen as master")

    seq2, seq3 = last_seq(second), last_seq(third)
    killed_at = now_us()
    crash_speaker(lab, nodes[0], first)  # no priority-0 advert, the VIPs stay on node-1

    for family in (4, 6):
        at = wait_until(
            partial(became_master_at, second, family, seq2),
            TIMEOUT,
            f"node-2 taking over IPv{family}",
        )
        assert at is not None
        took = at - killed_at
        mdi = master_down_interval(150, INTERVAL_CS)
        # The last advert left at most one interval before the kill.
        assert mdi - INTERVAL_CS * 10_000 - SLACK_US < took <= mdi + SLACK_US, (family, took)
    # Skew: node-3 (priority 50) waits 59 ms longer than node-2 and hears it first.
    assert became_master_at(third, 4, seq3) is None and became_master_at(third, 6, seq3) is None
    wait_states([(second, "Master"), (third, "Backup")], "node-2 master, node-3 backup")
    for vip in (VIP4, VIP6):
        # The client has sent nothing since: only the takeover's GARP / NA can move the entry.
        wait_until(
            partial(neighbour_is, lab.client.ns, vip, nodes[1]),
            TIMEOUT,
            f"the client's neighbour entry for {vip} moving to node-2",
        )
        assert holds(nodes[1], vip) and not holds(nodes[2], vip)
        assert holds(nodes[0], vip)  # nobody cleaned up after the crash (as in real life)


def test_graceful_stop_hands_over_after_skew_time_and_the_returning_master_preempts(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    n1, n2 = lab.nodes
    first = speakers.start(lab, n1, instances(150), name="n1")
    second = speakers.start(lab, n2, instances(100), name="n2")
    wait_states([(first, "Master"), (second, "Backup")], "node-1 master")
    for vip in (VIP4, VIP6):
        resolve(lab, vip)
        assert neighbour_mac(lab.client.ns, vip) == mac_of(n1)

    seq = last_seq(second)
    stopped_at = now_us()
    assert first.stop(graceful=True) == 0
    for family in (4, 6):
        at = wait_until(
            partial(became_master_at, second, family, seq),
            TIMEOUT,
            f"node-2 taking over IPv{family}",
        )
        assert at is not None
        # Priority 0 makes the backup wait Skew_Time only, not Master_Down_Interval.
        assert at - stopped_at <= skew_time(100, INTERVAL_CS) + SLACK_US, (family, at - stopped_at)
        assert at - stopped_at < master_down_interval(100, INTERVAL_CS) - INTERVAL_CS * 10_000
    for vip in (VIP4, VIP6):
        assert not holds(n1, vip), f"graceful stop left {vip} on node-1 (it has exited)"
        wait_until(
            partial(neighbour_is, lab.client.ns, vip, n2),
            TIMEOUT,
            f"the client's entry for {vip} moving to node-2",
        )

    seq = last_seq(second)
    back = speakers.start(lab, n1, instances(150), name="n1-back")
    wait_states([(back, "Master"), (second, "Backup")], "node-1 preempting node-2")
    for vip in (VIP4, VIP6):
        wait_until(partial(moved, vip, n1, n2), TIMEOUT, f"{vip} back")
        wait_until(
            partial(neighbour_is, lab.client.ns, vip, n1),
            TIMEOUT,
            f"the client's entry for {vip} back on node-1",
        )
    status = second.status()
    assert status is not None
    assert [t.to_state for t in status.transitions if t.seq > seq] == ["Backup", "Backup"]


def test_without_preempt_a_returning_higher_priority_stays_backup(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    n1, n2 = lab.nodes
    low = speakers.start(lab, n2, instances(100), name="low")
    wait_states([(low, "Master")], "node-2 master alone")
    high = speakers.start(lab, n1, instances(200, preempt=False), name="high")

    def heard(n: int) -> SpeakerStatus | None:
        status = high.status()
        if status is None:
            return None
        got = [status.instance(f, VRID) for f in (4, 6)]
        return status if all(i is not None and i.adverts_received >= n for i in got) else None

    # 20 adverts = 2 s, more than five Master_Down_Intervals of the high-priority node.
    status = wait_until(lambda: heard(20), TIMEOUT, "20 adverts of each family at node-1")
    assert status is not None
    for family in (4, 6):
        inst = status.instance(family, VRID)
        assert inst is not None and inst.state == "Backup" and inst.takeovers == 0, inst
    assert state_of(low, 4) == state_of(low, 6) == "Master"
    assert holds(n2, VIP4) and not holds(n1, VIP4)


def test_update_changes_one_instance_without_disturbing_the_others(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    n1, n2 = lab.nodes
    other = InstanceConfig(
        vrid=VRID + 1, family=4, priority=150, advert_interval_cs=INTERVAL_CS, addresses=(VIP4B,)
    )
    first = speakers.start(lab, n1, [*instances(150), other], name="n1")
    second = speakers.start(lab, n2, [*instances(100), other], name="n2")
    config2 = second.config
    wait_states([(first, "Master"), (second, "Backup")], "node-1 master")
    wait_until(lambda: holds(n1, VIP4B), TIMEOUT, f"{VIP4B} on node-1")

    # Raise node-2's VRID 42 priority above node-1's: node-2 preempts VRID 42 only.
    raised = [
        InstanceConfig(
            vrid=VRID, family=f, priority=200, advert_interval_cs=INTERVAL_CS, addresses=(vip,)
        )
        for f, vip in ((4, VIP4), (6, VIP6))
    ]
    second.update(
        SpeakerConfig(
            interface=config2.interface,
            source4=config2.source4,
            peers=config2.peers,
            instances=(*raised, other),
        )
    )
    wait_states([(second, "Master"), (first, "Backup")], "node-2 preempting VRID 42")
    wait_until(lambda: holds(n2, VIP4) and not holds(n1, VIP4), TIMEOUT, f"{VIP4} on node-2")
    for sp, state in ((first, "Master"), (second, "Backup")):
        status = sp.status()
        assert status is not None
        inst = status.instance(4, VRID + 1)
        assert inst is not None and inst.state == state
        assert dict(inst.transitions) == {
            "Backup": 1,
            **({"Master": 1} if state == "Master" else {}),
        }
    assert holds(n1, VIP4B) and not holds(n2, VIP4B)

    # Remove VRID 43 from node-1: it resigns (priority 0) and node-2 takes that one over.
    config1 = speaker_config(lab, n1, instances(150))
    first.update(config1)
    wait_until(lambda: holds(n2, VIP4B) and not holds(n1, VIP4B), TIMEOUT, f"{VIP4B} moving")
    status = first.status()
    assert status is not None and status.instance(4, VRID + 1) is None
    assert state_of(first, 4) == "Backup" and state_of(second, 4) == "Master"


HELPER = """
import json, signal, sys
from pathlib import Path
from agent.announce.vrrp.config import from_json
from agent.announce.vrrp.process import SpeakerProcess
config = from_json(json.loads(Path(sys.argv[1]).read_text()))
prefix = ("ip", "netns", "exec", sys.argv[3])
sp = SpeakerProcess(config, workdir=Path(sys.argv[2]), argv_prefix=prefix)
sp.start()
print(sp.pid, flush=True)
signal.pause()
"""


def test_killing_the_parent_makes_the_speaker_resign_and_exit(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, tmp_path: Path
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    n1, n2 = lab.nodes
    second = speakers.start(lab, n2, instances(100), name="n2")
    config_file = tmp_path / "n1.json"
    config_file.write_text(json.dumps(to_json(speaker_config(lab, n1, instances(150)))))
    workdir = tmp_path / "n1"
    repo = str(Path(__file__).resolve().parents[2])
    parent = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(config_file), str(workdir), n1.ns],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": repo},
        start_new_session=True,
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        wait_until(
            lambda: state_of_file(workdir, 4) == "Master", TIMEOUT, "node-1 master via the helper"
        )
        wait_states([(second, "Backup")], "node-2 backup")
        seq = last_seq(second)
        killed_at = now_us()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=TIMEOUT)
        for family in (4, 6):
            at = wait_until(
                partial(became_master_at, second, family, seq),
                TIMEOUT,
                f"node-2 taking over IPv{family}",
            )
            assert at is not None
            # The orphaned child resigned (priority 0): Skew_Time, not Master_Down_Interval.
            assert at - killed_at <= skew_time(100, INTERVAL_CS) + SLACK_US, at - killed_at
        wait_until(lambda: not pid_alive(child_pid), TIMEOUT, "the orphaned speaker exiting")
        assert not holds(n1, VIP4) and not holds(n1, VIP6)
    finally:
        for pid in (parent.pid, child_pid):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.wait(timeout=TIMEOUT)


def state_of_file(workdir: Path, family: int) -> str | None:
    status = read_status(workdir / "status.json")
    inst = None if status is None else status.instance(family, VRID)
    return None if inst is None else inst.state


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_graceful_handover_loses_no_request(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    """A client's TCP request loop (every 5 ms, 50 ms timeout) across three graceful stops."""
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    n1, n2 = lab.nodes
    lab.start_servers([n1, n2], tcp_port=PORT, udp_port=PORT + 1)
    speakers.start(lab, n2, instances(100), name="n2")
    argv = [sys.executable, "-c", CLIENT_LOOP, str(VIP4), str(PORT), "0.005", "0.05"]
    loop = lab.spawn(lab.client.ns, argv, log_name="client-loop")
    wait_until(lambda: '"ready"' in lab.log_of(loop), TIMEOUT, "the client loop")
    for round_ in range(3):
        first = speakers.start(lab, n1, instances(150), name=f"n1-{round_}")
        since = time.monotonic()
        wait_until(partial(answering, lab, loop, n1.name, since, 5), TIMEOUT, "node-1 serving")
        event = time.monotonic()
        assert first.stop(graceful=True) == 0
        wait_until(partial(answering, lab, loop, n2.name, event, 5), TIMEOUT, "node-2 serving")
        after = [who for t, who in replies(lab, loop) if t >= event]
        assert None not in after, f"round {round_}: requests lost during the handover: {after}"


def test_a_new_instance_started_late_on_the_preferred_node_is_never_held_by_the_next_rank(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    # As the agent configures them: priorities 254 / 253 (ranks 0 / 1) and the next rank's
    # first Master_Down_Timer one interval longer. The preferred node gets the instance only
    # once the other reports it running, as when its agent saw the new Service later; Skew_Time
    # alone (interval/256 apart) would let the next rank take the IP and be preempted.
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    n1, n2 = lab.nodes
    interval = 100  # 1 s: the preferred node may start up to one interval late

    def new(priority: int) -> list[InstanceConfig]:
        delay = startup_delay_cs(priority, interval)
        return [
            InstanceConfig(
                vrid=VRID,
                family=4,
                priority=priority,
                advert_interval_cs=interval,
                startup_delay_cs=delay,
                addresses=(VIP4,),
            )
        ]

    preferred = speakers.start(lab, n1, [], name="n1")
    second = speakers.start(lab, n2, [], name="n2")
    second.update(speaker_config(lab, n2, new(253)))
    wait_until(lambda: state_of(second, 4) == "Backup", TIMEOUT, "node-2 running the instance")
    preferred.update(speaker_config(lab, n1, new(254)))
    wait_until(lambda: state_of(preferred, 4) == "Master", TIMEOUT, "node-1 taking the IP")
    wait_until(lambda: master_is(second, 4, n1.ip4), TIMEOUT, "node-2 hearing node-1")
    assert holds(n1, VIP4) and not holds(n2, VIP4)
    status = second.status()
    assert status is not None
    inst = status.instance(4, VRID)
    assert inst is not None
    assert dict(inst.transitions) == {"Backup": 1}, inst.transitions
