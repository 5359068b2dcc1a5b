"""Interop with keepalived 2.2.x (Debian): one VRID shared by a nodelb speaker and keepalived.

keepalived runs exactly as in test_keepalived_smoke (VRRPv3, `advert_int 0.1`, preempt on,
VRID 51, 198.18.0.200/32 and 2001:db8::200/128 on eth0), started and stopped through the lab
by PID. The nodelb speaker uses the same VRID, interval and addresses with the default
checksum mode. Both directions: nodelb master with keepalived backup, and the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.announce.vrrp.process import SpeakerProcess
from lab.keepalived import KEEPALIVED, Keepalived
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import DualStack, Speakers, crash, crash_speaker, holds, link_local, revive
from lab.wait import wait_until
from tests.kernel.test_keepalived_smoke import VIP4, VIP6, VRID, start_peer

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(not os.access(KEEPALIVED, os.X_OK), reason="keepalived is not installed"),
]

TIMEOUT = 20.0


VRRP = DualStack(vrid=VRID, vip4=VIP4, vip6=VIP6, interval_cs=10)


def nodelb_state(sp: SpeakerProcess) -> tuple[str | None, str | None]:
    status = sp.status()
    if status is None:
        return (None, None)
    got = [status.instance(f, VRID) for f in (4, 6)]
    return (got[0].state if got[0] else None, got[1].state if got[1] else None)


def holds_both(node: LabNode) -> bool:
    return holds(node, VIP4) and holds(node, VIP6)


def holds_none(node: LabNode) -> bool:
    return not holds(node, VIP4) and not holds(node, VIP6)


def crash_keepalived(lab: Lab, node: LabNode, ka: Keepalived) -> None:
    """Crash `node` (link down, then SIGKILL of keepalived's VRRP process and its parent):
    no priority-0 advert is sent."""
    crash(lab, node, [ka.vrrp_pid(), ka.proc.pid])
    ka.proc.wait(timeout=TIMEOUT)
    lab.stop(ka.proc)


def test_keepalived_backs_up_a_nodelb_master_and_yields_back_when_it_returns(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, tmp_path: Path
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    n1, n2 = lab.nodes
    master = speakers.start(lab, n1, VRRP.instances(150), name="nodelb-1")
    wait_until(lambda: nodelb_state(master) == ("Master", "Master"), TIMEOUT, "nodelb master")
    ka = start_peer(lab, n2, priority=100, workdir=tmp_path)
    # keepalived hears nodelb's adverts and stays backup: it never adds the VIPs.
    wait_until(
        lambda: lab.log_of(ka.proc).count("Entering BACKUP STATE") >= 2,
        TIMEOUT,
        "keepalived entering BACKUP for both instances",
    )
    status = master.status()
    assert status is not None
    assert status.dropped == (), status.dropped
    assert holds_both(n1) and holds_none(n2)
    assert "Entering MASTER STATE" not in lab.log_of(ka.proc)

    crash_speaker(lab, n1, master)
    wait_until(lambda: holds_both(n2), TIMEOUT, "keepalived taking over after nodelb's crash")
    assert lab.log_of(ka.proc).count("Entering MASTER STATE") == 2

    revive(lab, n1)
    back = speakers.start(lab, n1, VRRP.instances(150), name="nodelb-1-back")
    # node-1 comes back without the VIPs (rebooted) and adds them as it preempts.
    wait_until(lambda: nodelb_state(back) == ("Master", "Master"), TIMEOUT, "nodelb preempting")
    wait_until(lambda: holds_none(n2), TIMEOUT, "keepalived yielding the VIPs")
    assert holds_both(n1)
    status = back.status()
    assert status is not None
    # Every advert keepalived sent was accepted: nothing was dropped.
    assert status.dropped == (), status.dropped


def test_a_nodelb_backup_follows_keepalived_takes_over_and_is_preempted_back(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, tmp_path: Path
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    n1, n2 = lab.nodes
    ka = start_peer(lab, n1, priority=150, workdir=tmp_path / "first")
    wait_until(lambda: holds_both(n1), TIMEOUT, "keepalived master on node-1")
    backup = speakers.start(lab, n2, VRRP.instances(100), name="nodelb-2")

    def follows_keepalived() -> bool:
        status = backup.status()
        if status is None:
            return False
        got = [status.instance(f, VRID) for f in (4, 6)]
        masters = (n1.ip4, link_local(n1))
        return all(
            i is not None and i.state == "Backup" and i.adverts_received >= 5 and i.master == m
            for i, m in zip(got, masters, strict=True)
        )

    wait_until(follows_keepalived, TIMEOUT, "nodelb following keepalived's adverts")
    status = backup.status()
    assert status is not None
    assert status.dropped == (), status.dropped
    assert holds_none(n2)

    crash_keepalived(lab, n1, ka)
    wait_until(lambda: nodelb_state(backup) == ("Master", "Master"), TIMEOUT, "nodelb takeover")
    wait_until(lambda: holds_both(n2), TIMEOUT, "nodelb holding the VIPs")

    revive(lab, n1)
    ka2 = start_peer(lab, n1, priority=150, workdir=tmp_path / "second")
    wait_until(lambda: nodelb_state(backup) == ("Backup", "Backup"), TIMEOUT, "keepalived back")
    wait_until(lambda: holds_none(n2), TIMEOUT, "nodelb removing the VIPs")
    wait_until(lambda: holds_both(n1), TIMEOUT, "keepalived holding the VIPs again")
    assert "Entering MASTER STATE" in lab.log_of(ka2.proc)
