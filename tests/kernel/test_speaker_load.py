"""Advert timing holds while the parent (the agent's process) is saturated with CPU work.

The master's SpeakerProcess is a child of this test process. While its adverts are captured
on the wire in the client namespace (kernel receive timestamps), this process runs four
threads of pure-Python CPU work and, at the same time, a real full sync of 10k Services
(10 endpoints each, bench/dataplane.py's state) into node-1's namespace through the agent's
own Dataplane. Every gap between consecutive adverts must stay within 20 % of the interval,
and the backup on node-2 must never take over.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

import pytest

from agent.announce.settings import AnnounceSettings
from agent.announce.vrrp.machine import master_down_interval
from agent.announce.vrrp.process import SpeakerProcess
from agent.dataplane.applier import Dataplane
from agent.dataplane.libnft import NetnsNftRunner
from bench.dataplane import build_state
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import DualStack, Speakers, holds, link_local, parse_capture, start_capture
from lab.wait import wait_until

pytestmark = pytest.mark.kernel

VRRP = DualStack.numbered(vrid=77, host=220, interval_cs=10)
VIP4, VIP6, VRID, INTERVAL_CS = VRRP.vip4, VRRP.vip6, VRRP.vrid, VRRP.interval_cs
INTERVAL_NS = INTERVAL_CS * 10_000_000
TOLERANCE = 0.2
LATE_GAP = 1.5  # intervals: the most a gap may last with both CPUs loaded
LOAD_SECONDS = 4.0
TIMEOUT = 30.0
RT_PRIORITY = 10  # as the agent runs it (SpeakerProcess rt_priority, CAP_SYS_NICE)
instances = VRRP.instances


def burn(stop: threading.Event, spins: list[int]) -> None:
    """Spin pure-Python arithmetic (holding the GIL) until `stop` is set."""
    n = 0
    while not stop.is_set():
        x = 0
        for i in range(10_000):
            x += i * i
        n += 1
    spins.append(n)


def run_load(
    lab: Lab, *, threads: int, sync_services: int, seconds: float, cpus: set[int] | None = None
) -> tuple[int, int, float]:
    """Burn CPU in `threads` threads (and sync `sync_services` Services into node-1) here.

    `cpus`: run the burners and the sync's libnftables thread on those CPUs only (as an agent
    that leaves the speaker a CPU would). Returns (start, end) of the window in wall-clock ns
    (the capture's clock) and the sync's duration in seconds (0 when none ran).
    """
    n1 = lab.nodes[0]
    before = os.sched_getaffinity(0)
    if cpus is not None:  # threads started from here on inherit this thread's affinity
        os.sched_setaffinity(0, cpus)
    try:
        return _load(lab, n1, threads, sync_services, seconds)
    finally:
        os.sched_setaffinity(0, before)


def _load(
    lab: Lab, n1: LabNode, threads: int, sync_services: int, seconds: float
) -> tuple[int, int, float]:
    state = build_state(sync_services, 10) if sync_services else None  # built outside
    stop = threading.Event()
    spins: list[int] = []
    burners = [threading.Thread(target=burn, args=(stop, spins)) for _ in range(threads)]
    runner = NetnsNftRunner(n1.ns)
    sync_s = 0.0
    start_ns = time.time_ns()
    for t in burners:
        t.start()
    try:
        t0 = time.monotonic()
        if state is not None:
            result = Dataplane(runner).sync(state)
            sync_s = time.monotonic() - t0
            assert result.ok, result.error
        while time.monotonic() - t0 < seconds:  # keep the threads burning a while
            time.sleep(0.05)
    finally:
        stop.set()
        for t in burners:
            t.join()
        runner.close()
    assert len(spins) == threads and all(n > 0 for n in spins), spins
    return start_ns, time.time_ns(), sync_s


def advert_gaps(
    lab: Lab, capture: subprocess.Popen[bytes], start_ns: int, end_ns: int
) -> dict[str, list[tuple[float, float]]]:
    """Return, per family, (seconds into the window, gap / interval) for node-1's adverts.

    Also checks that the adverts cover the window to both edges and carry priority 200 and
    TTL / hop limit 255.
    """
    n1 = lab.nodes[0]
    out: dict[str, list[tuple[float, float]]] = {}
    for kind, src in (("vrrp4", str(n1.ip4)), ("vrrp6", str(link_local(n1)))):
        frames = [
            f
            for f in parse_capture(lab.log_of(capture))
            if f.kind == kind and f.src == src and start_ns <= f.t_ns <= end_ns
        ]
        assert len(frames) > 2, (kind, frames)
        limit = (1 + TOLERANCE) * INTERVAL_NS
        assert frames[0].t_ns - start_ns <= limit and end_ns - frames[-1].t_ns <= limit, kind
        assert all(f.priority == 200 and f.ttl == 255 for f in frames)
        out[kind] = [
            (round((b.t_ns - start_ns) / 1e9, 3), (b.t_ns - a.t_ns) / INTERVAL_NS)
            for a, b in itertools.pairwise(frames)
        ]
    return out


def backup_never_took_over(backup: SpeakerProcess) -> None:
    status = backup.status()
    assert status is not None
    for family in (4, 6):
        inst = status.instance(family, VRID)
        assert inst is not None and inst.state == "Backup" and inst.takeovers == 0, inst


def two_speakers(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, cpus: Iterable[int] = ()
) -> tuple[Lab, subprocess.Popen[bytes], SpeakerProcess, SpeakerProcess]:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    n1, n2 = lab.nodes
    capture = start_capture(lab, lab.client, name="capture")
    master = speakers.start(lab, n1, instances(200), name="n1", rt_priority=RT_PRIORITY, cpus=cpus)
    backup = speakers.start(lab, n2, instances(100), name="n2", rt_priority=RT_PRIORITY)
    wait_until(lambda: holds(n1, VIP4) and holds(n1, VIP6), TIMEOUT, "node-1 master")
    return lab, capture, master, backup


def test_adverts_stay_within_20_percent_while_the_parent_burns_cpu_in_four_threads(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    lab, capture, _master, backup = two_speakers(make_lab, speakers)
    start_ns, end_ns, _ = run_load(lab, threads=4, sync_services=0, seconds=LOAD_SECONDS)
    for kind, gaps in advert_gaps(lab, capture, start_ns, end_ns).items():
        worst = max(abs(g - 1) for _, g in gaps)
        print(f"{kind}: {len(gaps)} gaps, worst deviation {worst:.1%}")
        late = [(t, round(g, 3)) for t, g in gaps if abs(g - 1) > TOLERANCE]
        assert not late, f"{kind}: (seconds into the window, gap / interval) off by > 20 %: {late}"
    backup_never_took_over(backup)


def test_with_a_cpu_of_its_own_adverts_stay_within_20_percent_during_a_10k_service_sync(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    """The 10k-Service full sync plus four CPU threads in the parent, the speaker pinned.

    The master's speaker runs on the last CPU, and this process's load on the others, as the
    agent does on a kernel without full preemption (see the next test and SpeakerProcess).
    """
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        pytest.skip("pinning needs at least two CPUs")
    speaker_cpu = max(every)
    lab, capture, master, backup = two_speakers(make_lab, speakers, cpus=(speaker_cpu,))
    start_ns, end_ns, sync_s = run_load(
        lab, threads=4, sync_services=10_000, seconds=LOAD_SECONDS, cpus=every - {speaker_cpu}
    )
    status = master.status()
    assert status is not None
    for kind, gaps in advert_gaps(lab, capture, start_ns, end_ns).items():
        worst = max(abs(g - 1) for _, g in gaps)
        print(
            f"{kind}: {len(gaps)} gaps, 10k-Service sync {sync_s:.2f} s, worst deviation"
            f" {worst:.1%}; speaker timers late > 10 ms: {status.timers_late}"
        )
        late = [(t, round(g, 3)) for t, g in gaps if abs(g - 1) > TOLERANCE]
        assert not late, f"{kind}: (seconds into the window, gap / interval) off by > 20 %: {late}"
    backup_never_took_over(backup)


def test_a_10k_service_sync_in_the_parent_never_delays_adverts_into_a_failover(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers
) -> None:
    """The same load with the speaker free to run on any CPU (no pinning).

    On this 2-vCPU lab VM (kernel PREEMPT_NONE) about half the runs show one stall of
    50-200 ms near the end of the sync, in both families at once, with the speaker under
    SCHED_RR: the speaker wakes on the CPU where this process is inside a long,
    non-preemptible nftables commit and waits for it (pinned apart, as in the test above,
    the stalls are gone). So the hard assertion here is the one users need in any case: no gap
    reaches the backup's Master_Down_Interval and the backup never takes over. The 20 %
    figure is printed for each run.
    """
    lab, capture, master, backup = two_speakers(make_lab, speakers)
    start_ns, end_ns, sync_s = run_load(lab, threads=4, sync_services=10_000, seconds=LOAD_SECONDS)
    mdi = master_down_interval(100, INTERVAL_CS) * 1000 / INTERVAL_NS  # in intervals
    status = master.status()
    assert status is not None
    for kind, gaps in advert_gaps(lab, capture, start_ns, end_ns).items():
        worst = max(abs(g - 1) for _, g in gaps)
        late = [(t, round(g, 3)) for t, g in gaps if abs(g - 1) > TOLERANCE]
        print(
            f"{kind}: {len(gaps)} gaps, 10k-Service sync {sync_s:.2f} s, worst deviation"
            f" {worst:.1%}, beyond 20 %: {late}; speaker timers late > 10 ms:"
            f" {status.timers_late} (max {status.timer_late_max_us} µs)"
        )
        assert all(g < mdi for _, g in gaps), (kind, late)
    backup_never_took_over(backup)


BUSY_LOOP = "while True: pass"


@pytest.mark.parametrize("pinned", [True, False], ids=["speaker on a CPU of its own", "unpinned"])
def test_with_both_cpus_busy_and_a_10k_sync_no_advert_is_late_and_no_backup_takes_over(
    make_lab: Callable[[LabSpec], Lab], speakers: Speakers, pinned: bool
) -> None:
    """Both CPUs loaded (a busy loop per CPU in its own process, four threads and a real
    10k-Service full sync in this one), the speakers at the agent's default real-time
    priority: no gap between the master's adverts exceeds 1.5 intervals, the backup never
    takes over, and no sample finds the VIP on both nodes.

    Pinned: the master's speaker on the last CPU and this process's load on the others, as
    the agent does with `announce.speakerCPU`; the busy loops run everywhere.
    """
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        pytest.skip("loading both CPUs needs two")
    speaker_cpu = max(every)
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False))
    assert lab.client is not None
    n1, n2 = lab.nodes
    capture = start_capture(lab, lab.client, name="capture")
    rt = AnnounceSettings().realtime_priority
    master = speakers.start(
        lab, n1, instances(200), name="n1", rt_priority=rt, cpus=(speaker_cpu,) if pinned else ()
    )
    backup = speakers.start(lab, n2, instances(100), name="n2", rt_priority=rt)
    wait_until(lambda: holds(n1, VIP4) and holds(n1, VIP6), TIMEOUT, "node-1 master")
    busy = [
        lab.spawn(n2.ns, [sys.executable, "-c", BUSY_LOOP], log_name=f"busy-{i}")
        for i in range(len(every))
    ]
    both: list[float] = []
    stop = threading.Event()

    def sample() -> None:  # the VIP on both nodes at once, seen from the kernels
        while not stop.is_set():
            if holds(n1, VIP4) and holds(n2, VIP4):
                both.append(time.monotonic())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        start_ns, end_ns, sync_s = run_load(
            lab,
            threads=4,
            sync_services=10_000,
            seconds=LOAD_SECONDS,
            cpus=every - {speaker_cpu} if pinned else None,
        )
    finally:
        stop.set()
        sampler.join()
        for proc in busy:
            lab.stop(proc)
    status = master.status()
    assert status is not None and status.realtime_priority == rt, status
    for kind, gaps in advert_gaps(lab, capture, start_ns, end_ns).items():
        worst = max(g for _, g in gaps)
        print(
            f"{kind} ({'pinned' if pinned else 'unpinned'}): {len(gaps)} gaps, 10k-Service sync"
            f" {sync_s:.2f} s, longest gap {worst:.2f} intervals; speaker timers late > 10 ms:"
            f" {status.timers_late} (max {status.timer_late_max_us} µs)"
        )
        late = [(t, round(g, 3)) for t, g in gaps if g > LATE_GAP]
        assert not late, f"{kind}: (seconds into the window, gap / interval) over 1.5: {late}"
    backup_never_took_over(backup)
    assert not both, f"the VIP on both nodes at {both}"
