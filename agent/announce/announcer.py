"""The agent's announcer: plans ownership, drives the VRRP speaker, reports what it holds.

The shell between the agent loop and the speaker child (agent/announce/vrrp/process.py):

- the agent `submit`s the ownership input after every recompute; the announcer's own thread
  plans (agent/announce/ownership.py, which costs tens of ms per thousand IPs) and sends the
  speaker its new instances only when they differ, so planning never delays a sync;
- the thread polls the speaker's status every `poll_interval`: the addresses on the interface
  are what this node holds; when they change the agent is told (`on_held_change`), so its
  next sync programs them as held; metrics follow every snapshot; a takeover is an Event on
  each Service using the addresses, naming this node;
- after each sync that reached the kernel, `report(programmed)` hands the held addresses
  whose frontends are programmed to the node report Lease (LoadBalancerServing).

The speaker keeps running when the API server is away: its instances stay as last planned.
While the agent is cut off from the API (`set_cut_off`, from agent/kube/contact_probe.py) the
announcer sends the speaker nothing new: it keeps what it held and was asked to hold, and takes
on no new address, since whatever it would plan from is what it last heard. Once the API
answers again it plans from the latest input at once (docs/ownership.md).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pyroute2 import IPRoute

from agent.announce.inputs import OwnershipInput, peer_macs, peer_sources, speaker_config
from agent.announce.metrics import SpeakerMetrics
from agent.announce.ownership import Plan, plan
from agent.announce.settings import AnnounceSettings
from agent.announce.speaker_cpu import CpuReason, choose_speaker_cpu
from agent.announce.vrrp.config import SpeakerConfig
from agent.announce.vrrp.control import InstanceStatus, SpeakerStatus
from agent.announce.vrrp.process import SpeakerProcess
from agent.kube import metrics as kube_metrics
from agent.kube.events import Event, EventGate, EventSink, ObjectRef
from agent.kube.node_report import PeerReport
from agent.model.net import IPAddress
from agent.model.node import Node

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """Where the served IPs go (agent.kube.node_report.NodeReporter)."""

    def update(self, ips: Any) -> None: ...


def interface_mac(ifname: str) -> str | None:
    """Return the interface's MAC as `aa:bb:cc:dd:ee:ff` (None: it has none)."""
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise LookupError(f"announce.interface: no interface {ifname!r} on this node")
        mac = ipr.get_links(found[0])[0].get_attr("IFLA_ADDRESS")
    return str(mac).lower() if mac else None


def interface_sources(ifname: str) -> tuple[ipaddress.IPv4Address | None, IPAddress | None]:
    """Return the interface's own IPv4 address (not a /32 VIP) and its IPv6 link-local one."""
    v4: ipaddress.IPv4Address | None = None
    ll: IPAddress | None = None
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise LookupError(f"announce.interface: no interface {ifname!r} on this node")
        for msg in ipr.get_addr(index=found[0]):
            addr = ipaddress.ip_address(msg.get_attr("IFA_ADDRESS"))
            prefix = int(msg["prefixlen"])
            if addr.version == 4 and v4 is None and prefix < 32:
                assert isinstance(addr, ipaddress.IPv4Address)
                v4 = addr
            elif addr.version == 6 and addr.is_link_local and ll is None:
                ll = addr
    return v4, ll


class Announcer:
    """See the module docstring. `start()` from the main thread, `run(stop)` in a thread."""

    def __init__(
        self,
        settings: AnnounceSettings,
        node: str,
        *,
        events: EventSink,
        on_held_change: Callable[[], None],
        reporter: Reporter | None = None,
        workdir: Path | None = None,
        poll_interval: float = 0.1,
    ) -> None:
        self.settings = settings
        self.node = node
        self._events = events
        self._on_held_change = on_held_change
        self.reporter = reporter  # set after start() when it publishes our sources
        self._workdir = workdir
        self._poll = poll_interval
        self._cond = threading.Condition()
        self._input: OwnershipInput | None = None
        self._planned: OwnershipInput | None = None
        self._nodes: tuple[Node, ...] = ()
        self._reported: dict[str, PeerReport] = {}
        self._peers_dirty = True
        self._cut_off = False
        self._plan: Plan | None = None
        self._held: frozenset[IPAddress] = frozenset()
        self._last_seq = 0
        self._gate = EventGate(window=60.0)  # a flapping holder: metrics, not Event floods
        self._metrics = SpeakerMetrics()
        self._speaker: SpeakerProcess | None = None
        self.source4: ipaddress.IPv4Address | None = None
        self.link_local: IPAddress | None = None
        self.mac: str | None = None  # the interface's, published in the node report
        self.status: SpeakerStatus | None = None

    # -- agent side ------------------------------------------------------------------------

    def start(self) -> None:
        """Find the interface's addresses and start the speaker with no instance yet."""
        self.source4, self.link_local = interface_sources(self.settings.interface)
        self.mac = interface_mac(self.settings.interface)
        config = self._config(frozenset())
        allowed = frozenset(os.sched_getaffinity(0))
        where = choose_speaker_cpu(self.settings.speaker_cpu, allowed)
        self._speaker = SpeakerProcess(
            config,
            workdir=self._workdir,
            rt_priority=self.settings.realtime_priority,
            cpus=() if where.cpu is None else (where.cpu,),
        )
        self._speaker.start()
        if where.agent_cpus:
            # Called from the main thread before the agent's other threads exist, so they
            # all inherit it: the agent's CPU work stays off the speaker's CPU.
            os.sched_setaffinity(0, where.agent_cpus)
        self._metrics.pinned_cpu.set(-1 if where.cpu is None else where.cpu)
        log.info(
            "speaker started",
            extra={
                "pid": self._speaker.pid,
                "interface": self.settings.interface,
                "cpu": where.cpu,
                "cpu_reason": str(where.reason),
            },
        )
        if where.reason is CpuReason.NOT_ALLOWED:
            log.warning(
                "announce.speakerCPU is not among the CPUs this agent may use; pinned to"
                " the automatic choice instead",
                extra={
                    "configured": self.settings.speaker_cpu,
                    "allowed": sorted(allowed),
                    "cpu": where.cpu,
                },
            )

    def submit(self, inp: OwnershipInput, nodes: tuple[Node, ...]) -> None:
        """Hand over the latest ownership input (cheap; the thread plans)."""
        with self._cond:
            self._input = inp
            if nodes != self._nodes:
                self._nodes = nodes
                self._peers_dirty = True
            self._cond.notify()

    def set_reported_sources(self, reported: Mapping[str, PeerReport]) -> None:
        """Record what other nodes report of their adverts (IPv6 link-local source, MAC)."""
        with self._cond:
            if dict(reported) != self._reported:
                self._reported = dict(reported)
                self._peers_dirty = True
                self._cond.notify()

    def set_cut_off(self, cut_off: bool) -> None:
        """Record whether the agent is cut off from the API server (no new plan meanwhile)."""
        with self._cond:
            if cut_off == self._cut_off:
                return
            self._cut_off = cut_off
            self._peers_dirty = True  # plan again on return, even if the input is the same
            held = len(self._held)
            self._cond.notify()
        if cut_off:
            log.warning(
                "cut off from the API: the speaker keeps its instances; no new address is taken",
                extra={"held": held},
            )
        else:
            log.info("API reachable again: planning from the latest input")

    def cut_off(self) -> bool:
        """Return True while the agent is cut off from the API server."""
        with self._cond:
            return self._cut_off

    def held(self) -> frozenset[IPAddress]:
        """Return the addresses this node holds now (on the interface, by the speaker)."""
        with self._cond:
            return self._held

    def report(self, programmed: frozenset[IPAddress]) -> None:
        """Report the held addresses whose frontends the last sync put in the kernel."""
        if self.reporter is not None:
            self.reporter.update(self.held() & programmed)

    def sources(self) -> tuple[IPAddress, ...]:
        """Return this node's advert sources (published in its report Lease)."""
        return tuple(a for a in (self.source4, self.link_local) if a is not None)

    def instances(self) -> tuple[InstanceStatus, ...]:
        """Return the VRRP instances as the speaker last reported them (empty before its first
        snapshot); `GET /status` shows them (agent/node/status_document.py)."""
        status = self.status
        return () if status is None else status.instances

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the speaker: graceful resigns with priority 0 first, then removes addresses."""
        if self._speaker is not None:
            self._speaker.stop(graceful=graceful)
            self._speaker.cleanup()

    # -- the thread ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Plan on new input and poll the speaker until `stop` is set."""
        while not stop.is_set():
            self.step(self._poll)

    def step(self, wait: float = 0.0) -> None:
        """Wait up to `wait` seconds for new input, then plan if it moved and poll the speaker."""
        with self._cond:
            self._cond.wait(timeout=wait)
            inp = self._input
            frozen, peers_dirty = self._cut_off, False
            if not frozen:  # cut off: nothing new reaches the speaker (module docstring)
                peers_dirty, self._peers_dirty = self._peers_dirty, False
        try:
            if not frozen and inp is not None and (inp != self._planned or peers_dirty):
                self._replan(inp)
            self._observe()
        except Exception:
            log.exception("announcer step failed")

    def _replan(self, inp: OwnershipInput) -> None:
        if inp != self._planned:
            self._plan = plan(nodes=inp.nodes, ips=inp.ips, config=self.settings.ownership)
            self._planned = inp
        with self._cond:
            peers = peer_sources(self._nodes, self._reported, self.node)
            macs = peer_macs(self._nodes, self._reported, self.node)
        config = self._config(peers, macs)
        assert self._speaker is not None
        if config != self._speaker.config:
            self._speaker.update(config)
            log.info(
                "speaker instances updated",
                extra={"instances": len(config.instances), "peers": len(peers)},
            )

    def _config(
        self, peers: frozenset[IPAddress], macs: Mapping[IPAddress, str] | None = None
    ) -> SpeakerConfig:
        return speaker_config(
            node=self.node,
            plan=self._plan,
            settings=self.settings,
            source4=self.source4,
            peers=peers,
            peer_macs=macs or {},
        )

    def _observe(self) -> None:
        assert self._speaker is not None
        status = self._speaker.status()
        if status is None:
            return
        self.status = status
        self._metrics.update(status)
        held = frozenset(status.held)
        with self._cond:
            changed = held != self._held
            self._held = held
        if changed:
            log.info("held addresses changed", extra={"held": sorted(map(str, held))})
            self._on_held_change()
        for t in status.transitions:
            if t.seq <= self._last_seq:
                continue
            self._last_seq = t.seq
            if t.to_state == "Master":
                self._announce(t.family, t.vrid, status)

    def _announce(self, family: int, vrid: int, status: SpeakerStatus) -> None:
        inst = status.instance(family, vrid)
        inp = self._planned
        if inst is None or inp is None:
            return
        users = {u.ip: u.services for u in inp.ips}
        for ip in inst.addresses:
            for use in users.get(ip, ()):
                ns, _, name = use.service.partition("/")
                message = f"{self.node} now announces {ip} (VRRP IPv{family} VRID {vrid})"
                event = Event(ObjectRef("Service", ns, name), "Normal", "IPAnnounced", message)
                if self._gate.admit(event, time.monotonic()):
                    self._events.record(event)
                else:
                    kube_metrics.EVENTS_REPEATS_SUPPRESSED.labels(event.reason).inc()
