"""Benchmark VIP failover as a client sees it: nodelb's VRRP speaker vs keepalived, same timers.

Lab: two nodes and a client on one segment. Each node runs a TCP server (lab.servers,
port 8080) that answers with its node name, and either a nodelb speaker or keepalived 2.2.x
holding 198.18.0.230/32 on VRID 61: node-1 at priority 150, node-2 at 100, VRRPv3, advert
interval 10 cs, preempt on, three gratuitous ARPs on takeover (keepalived:
`vrrp_garp_master_repeat 3`; nodelb: count 3, spacing 0). The client runs a request loop
(one TCP connection every 5 ms, 50 ms timeout, each result stamped with CLOCK_MONOTONIC).

Per repetition, with node-1 holding the VIP:
- crash: node-1 is crashed as the lab crashes a node (lab.vrrp_lab.crash: its switch port goes
  down, then its speaker / keepalived is SIGKILLed by PID; no priority-0 advert), so node-2
  takes over after Master_Down_Interval;
- graceful: the speaker is stopped gracefully / keepalived gets SIGTERM (priority 0), so node-2
  takes over after Skew_Time.
The outage is the longest time between two consecutive successful replies around the event,
minus the 5 ms loop period, and the number of requests that failed in between ("lost").
Then node-1 is restored (lab.vrrp_lab.revive: the stale VIP gone as after a reboot, link up;
daemon restarted) and takes the VIP back
by preemption before the next run. The event comes at a random phase of the advert interval
(a seeded random wait of 200 ms plus 0-1 interval once node-1 answers): without it every run
would hit the same phase, just after node-1's first adverts, and bias the crash figures.

Prints a table (p50 and max per implementation and scenario, and nodelb / keepalived ratios),
then as its last line one JSON object with every figure.

    .venv/bin/python -m bench.failover [--reps 10] [--interval-cs 10] [--request-timeout-ms 50]
        [--workdir DIR (keep logs)]
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.announce.vrrp.config import GratuitousConfig, InstanceConfig
from agent.announce.vrrp.process import SpeakerProcess
from bench.measure import percentile
from lab.keepalived import KEEPALIVED, Keepalived, config_text, start_keepalived
from lab.topology import Lab, LabNode, LabSpec
from lab.vrrp_lab import crash, crash_speaker, revive, speaker_config, start_speaker
from lab.wait import GiveUp, wait_until

VIP = ipaddress.IPv4Address("198.18.0.230")
VRID = 61
INTERVAL_CS = 10
PRIORITIES = (150, 100)
PORT = 8080
PERIOD = 0.005
REQUEST_TIMEOUT = 0.05
TIMEOUT = 30.0

CLIENT_LOOP = """
import json, socket, sys, time
vip, port, period, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(json.dumps({"ready": True}), flush=True)
while True:
    t = time.monotonic()
    node = None
    try:
        with socket.create_connection((vip, port), timeout=limit) as s:
            s.settimeout(limit)
            node = s.recv(200).decode().split()[0]
    except OSError:
        pass
    print(json.dumps({"t": t, "node": node}), flush=True)
    left = period - (time.monotonic() - t)
    if left > 0:
        time.sleep(left)
"""


class Daemon:
    """One VRRP implementation on one node: start, crash, graceful stop."""

    def __init__(
        self, lab: Lab, node: LabNode, priority: int, impl: str, run: int, *, interval_cs: int
    ) -> None:
        self.lab, self.node, self.priority, self.impl, self.run = lab, node, priority, impl, run
        self.interval_cs = interval_cs
        self.speaker: SpeakerProcess | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.keepalived: Keepalived | None = None

    def start(self) -> None:
        name = f"{self.impl}-{self.node.name}-{self.run}"
        if self.impl == "nodelb":
            inst = InstanceConfig(
                vrid=VRID,
                family=4,
                priority=self.priority,
                advert_interval_cs=self.interval_cs,
                addresses=(VIP,),
            )
            burst = GratuitousConfig(count=3, spacing_ms=0, arp_reply=False)
            config = speaker_config(self.lab, self.node, [inst], gratuitous=burst)
            self.speaker = start_speaker(self.lab, self.node, config, name=name, rt_priority=10)
            return
        text = config_text(
            router_id=self.node.name,
            vrid=VRID,
            priority=self.priority,
            advert_int=self.interval_cs / 100,
            vips=(VIP,),
        )
        self.keepalived = start_keepalived(
            self.lab, self.node, config=text, workdir=self.lab.workdir, name=name
        )
        self.proc = self.keepalived.proc

    def _vrrp_pid(self) -> int:
        assert self.keepalived is not None
        return self.keepalived.vrrp_pid()

    def crash(self) -> None:
        """Crash the node: link down, the daemon SIGKILLed; the VIP stays configured."""
        if self.speaker is not None:
            crash_speaker(self.lab, self.node, self.speaker)
        elif self.proc is not None:
            crash(self.lab, self.node, [self._vrrp_pid(), self.proc.pid])
            self.lab.stop(self.proc)

    def graceful(self) -> None:
        """Stop the daemon the way an operator would: it resigns with priority 0."""
        if self.speaker is not None:
            self.speaker.stop(graceful=True)
        elif self.proc is not None:
            self.lab.stop(self.proc)  # SIGTERM by PID

    def close(self) -> None:
        if self.speaker is not None:
            self.speaker.stop(graceful=False)
        elif self.proc is not None:
            self.lab.stop(self.proc)


@dataclass(frozen=True, slots=True)
class Sample:
    impl: str
    scenario: str
    outage_ms: float
    lost: int


def replies(lab: Lab, loop: subprocess.Popen[bytes]) -> list[tuple[float, str | None]]:
    out = []
    for line in lab.log_of(loop).splitlines():
        with contextlib.suppress(ValueError):
            raw = json.loads(line)
            if "t" in raw:
                out.append((float(raw["t"]), raw["node"]))
    return out


def answering(lab: Lab, loop: subprocess.Popen[bytes], node: str, since: float, n: int) -> bool:
    """Return True when the last `n` requests after `since` were all answered by `node`."""
    got = [who for t, who in replies(lab, loop) if t > since]
    return len(got) >= n and all(who == node for who in got[-n:])


def outage(
    lab: Lab, loop: subprocess.Popen[bytes], event: float, until: float
) -> tuple[float, int]:
    """Return (outage in ms, failed requests) between `event` and `until`."""
    window = [(t, who) for t, who in replies(lab, loop) if event - 1.0 <= t <= until]
    lost = sum(1 for t, who in window if who is None and t >= event)
    ok = [t for t, who in window if who is not None]
    after = [t for t in ok if t > event]
    if not after:
        raise GiveUp("no successful reply after the event")
    gaps = [b - a for a, b in itertools.pairwise(ok) if b > event]
    return max(0.0, (max(gaps) - PERIOD) * 1000), lost


def run_impl(
    lab: Lab, loop: subprocess.Popen[bytes], impl: str, reps: int, interval_cs: int
) -> list[Sample]:
    n1, n2 = lab.nodes
    samples: list[Sample] = []
    rng = random.Random(61)
    run = 0
    first = Daemon(lab, n1, PRIORITIES[0], impl, run, interval_cs=interval_cs)
    second = Daemon(lab, n2, PRIORITIES[1], impl, run, interval_cs=interval_cs)
    first.start()
    second.start()
    try:
        for scenario in ("crash", "graceful"):
            for _ in range(reps):
                since = time.monotonic()
                wait_until(lambda s=since: answering(lab, loop, n1.name, s, 5), TIMEOUT, "node-1")  # type: ignore[misc]
                time.sleep(0.2 + rng.uniform(0, interval_cs / 100))  # phase, see above
                event = time.monotonic()
                if scenario == "crash":
                    first.crash()
                else:
                    first.graceful()
                wait_until(lambda e=event: answering(lab, loop, n2.name, e, 5), TIMEOUT, "node-2")  # type: ignore[misc]
                ms, lost = outage(lab, loop, event, time.monotonic())
                samples.append(Sample(impl, scenario, ms, lost))
                # Restore node-1 and let it preempt the VIP back.
                revive(lab, n1)
                run += 1
                first = Daemon(lab, n1, PRIORITIES[0], impl, run, interval_cs=interval_cs)
                first.start()
    finally:
        first.close()
        second.close()
    return samples


def table(samples: list[Sample]) -> tuple[str, dict[str, Any]]:
    figures: dict[str, Any] = {}
    lines = [
        f"{'impl':<11}{'scenario':<10}{'n':>4}{'p50 ms':>10}{'max ms':>10}{'lost p50':>10}"
        f"{'lost max':>10}"
    ]
    for impl in ("nodelb", "keepalived"):
        for scenario in ("crash", "graceful"):
            mine = [s for s in samples if (s.impl, s.scenario) == (impl, scenario)]
            values = [s.outage_ms for s in mine]
            lost = [float(s.lost) for s in mine]
            p50, worst = percentile(values, 0.5), max(values, default=float("nan"))
            lost50, lostmax = percentile(lost, 0.5), max(lost, default=float("nan"))
            figures[f"{impl}_{scenario}_lost_p50"] = lost50
            figures[f"{impl}_{scenario}_lost_max"] = lostmax
            figures[f"{impl}_{scenario}_p50_ms"] = round(p50, 1)
            figures[f"{impl}_{scenario}_max_ms"] = round(worst, 1)
            figures[f"{impl}_{scenario}_n"] = len(values)
            lines.append(
                f"{impl:<11}{scenario:<10}{len(values):>4}{p50:>10.1f}{worst:>10.1f}"
                f"{lost50:>10.0f}{lostmax:>10.0f}"
            )
    for scenario in ("crash", "graceful"):
        for stat in ("p50", "max"):
            k = figures[f"keepalived_{scenario}_{stat}_ms"]
            n = figures[f"nodelb_{scenario}_{stat}_ms"]
            ratio = n / k if k else float("nan")
            figures[f"ratio_{scenario}_{stat}"] = round(ratio, 3)
            lines.append(f"nodelb / keepalived {scenario} {stat}: {ratio:.2f}")
    return "\n".join(lines), figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--interval-cs", type=int, default=INTERVAL_CS, help="advert interval")
    parser.add_argument(
        "--request-timeout-ms",
        type=float,
        default=REQUEST_TIMEOUT * 1000,
        help="the client's per-request timeout: a request sent into the outage costs up to"
        " this much of the measured figure, so keep it below the advert interval",
    )
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    if not os.access(KEEPALIVED, os.X_OK):
        print(f"{KEEPALIVED} is not installed", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nodelb-failover-"))
    lab = Lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False), workdir)
    lab.up()
    try:
        assert lab.client is not None
        lab.start_servers(lab.nodes, tcp_port=PORT, udp_port=PORT + 1)
        loop = lab.spawn(
            lab.client.ns,
            [
                sys.executable,
                "-c",
                CLIENT_LOOP,
                str(VIP),
                str(PORT),
                str(PERIOD),
                str(args.request_timeout_ms / 1000),
            ],
            log_name="client-loop",
        )
        wait_until(lambda: '"ready"' in lab.log_of(loop), TIMEOUT, "the client loop")
        samples: list[Sample] = []
        for impl in ("nodelb", "keepalived"):
            samples += run_impl(lab, loop, impl, args.reps, args.interval_cs)
        text, figures = table(samples)
    finally:
        lab.down()
    figures |= {
        "reps": args.reps,
        "advert_interval_cs": args.interval_cs,
        "request_timeout_ms": args.request_timeout_ms,
        "priorities": PRIORITIES,
    }
    figures["samples"] = [[s.impl, s.scenario, round(s.outage_ms, 1), s.lost] for s in samples]
    print(text)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
