"""Load a lab node the way a busy agent does, and read the master's advert gaps off the wire.

Shared by tests/kernel/test_speaker_load.py (behaviour: no false failover with the agent's
default CPU choice) and bench/advert_load.py (figures: how late adverts get, pinned and not).
The load runs in the calling process: pure-Python threads holding the GIL and, optionally, a
real full sync of N Services × 10 endpoints (bench/dataplane.py's state) into node-1's
namespace through the agent's own Dataplane, i.e. one long nftables commit in the kernel.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
from dataclasses import dataclass

from agent.dataplane.applier import Dataplane
from agent.dataplane.libnft import NetnsNftRunner
from bench.dataplane import build_state
from lab.topology import Lab, LabNode
from lab.vrrp_lab import link_local, parse_capture


class LoadError(RuntimeError):
    """The load did not run as asked (a failed sync, a burner that never ran)."""


@dataclass(frozen=True, slots=True)
class Window:
    """When the load ran, in wall-clock ns (the capture's clock), and how long the sync took."""

    start_ns: int
    end_ns: int
    sync_s: float


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
) -> Window:
    """Burn CPU in `threads` threads (and sync `sync_services` Services into node-1) here.

    `cpus`: run the burners and the sync's libnftables thread on those CPUs only (as an agent
    that leaves the speaker a CPU does). Returns the window the load covered.
    """
    n1 = lab.nodes[0]
    before = os.sched_getaffinity(0)
    if cpus is not None:  # threads started from here on inherit this thread's affinity
        os.sched_setaffinity(0, cpus)
    try:
        return _load(n1, threads, sync_services, seconds)
    finally:
        os.sched_setaffinity(0, before)


def _load(n1: LabNode, threads: int, sync_services: int, seconds: float) -> Window:
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
            if not result.ok:
                raise LoadError(f"the {sync_services}-Service sync failed: {result.error}")
        while time.monotonic() - t0 < seconds:  # keep the threads burning a while
            time.sleep(0.05)
    finally:
        stop.set()
        for t in burners:
            t.join()
        runner.close()
    if len(spins) != threads or not all(n > 0 for n in spins):
        raise LoadError(f"a burner thread did not run: {spins}")
    return Window(start_ns, time.time_ns(), sync_s)


def advert_gaps(
    lab: Lab,
    capture: subprocess.Popen[bytes],
    window: Window,
    *,
    interval_ns: int,
    priority: int,
) -> dict[str, list[tuple[float, float]]]:
    """Return, per family, (seconds into the window, gap / interval) for node-1's adverts.

    Raises LoadError unless node-1's adverts (priority `priority`, TTL / hop limit 255) cover
    the window to within 1.2 intervals of both edges: a master that stopped advertising
    must not pass for one with short gaps.
    """
    n1 = lab.nodes[0]
    out: dict[str, list[tuple[float, float]]] = {}
    frames_all = parse_capture(lab.log_of(capture))
    for kind, src in (("vrrp4", str(n1.ip4)), ("vrrp6", str(link_local(n1)))):
        frames = [
            f
            for f in frames_all
            if f.kind == kind and f.src == src and window.start_ns <= f.t_ns <= window.end_ns
        ]
        if len(frames) <= 2:
            raise LoadError(f"{kind}: {len(frames)} adverts from node-1 in the window")
        edge = 1.2 * interval_ns
        if frames[0].t_ns - window.start_ns > edge or window.end_ns - frames[-1].t_ns > edge:
            raise LoadError(f"{kind}: node-1's adverts do not cover the window")
        wrong = [f for f in frames if f.priority != priority or f.ttl != 255]
        if wrong:
            raise LoadError(f"{kind}: adverts with another priority or TTL: {wrong[:3]}")
        out[kind] = [
            (round((b.t_ns - window.start_ns) / 1e9, 3), (b.t_ns - a.t_ns) / interval_ns)
            for a, b in itertools.pairwise(frames)
        ]
    return out
