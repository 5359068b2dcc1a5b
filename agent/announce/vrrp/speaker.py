"""The VRRPv3 speaker: the I/O shell around vrrp.codec and vrrp.machine, in its own process.

One thread, one `selectors` loop, one monotonic-clock timer heap. The loop waits for the
earliest timer or for input (a VRRP socket per family, the control pipe, a signal), turns what
happened into a `machine` event with `now` in microseconds (a new configuration is Startup,
Reconfigured or Resign per instance; a sent gratuitous round is GratuitousSent), and performs
the actions `step` returns: send an advert or one gratuitous round, (re)start a timer, add or
remove addresses. Nothing here decides what the state machine decides: when a takeover
happens, what a reconfigured Master announces, how long a resigned Master keeps its addresses,
when the next round of a burst leaves. What the shell adds is bookkeeping over instances: it
keeps resigned Masters in `releasing` until their release is over, and an address given up is
removed only when no instance holds it any more (`machine.interface_addresses`).

Why a process of its own: the agent's Python process does CPU-heavy work (a full sync of 10k
Services), and adverts must leave on time whatever it does (a late advert is a false failover
and a split brain). Here no other Python thread competes for the GIL.

Receive-side checks (RFC 5798 §7.1) in order, each drop counted by family and `DropReason`:
IP header malformed, TTL / hop limit not 255, source not a configured peer, the frame's source
MAC not the one that peer published (when it published one), then the codec's checks (its
`DecodeReason`), then a VRID this node does not run, then a priority nodelb never sends (255,
or outside the plan's rank range) from a peer not configured as keepalived. An advert from
this node's own address is ignored without counting (multicast loopback is off; this is a
safety net).

Control and status: the parent writes commands to stdin, one JSON line each (control.py's
`Configure` and `Stop`, encoded and decoded there); EOF on stdin (the parent died or closed
it) is a graceful stop. The speaker writes a JSON status snapshot to `--status` (write to a
temporary file, then rename), at once after a state change and at most every 100 ms
otherwise, so the parent can poll it without ever blocking this loop. SIGTERM / SIGINT are a
graceful stop: every Master resigns with a priority-0 advert (RFC 5798 §6.4.3) and removes
its addresses once a backup has taken over (the state machine's `Resign`); then it exits.

Run: `python -m agent.announce.vrrp.speaker --config FILE --status FILE [--control-stdin]
[--parent-pid PID]`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import enum
import heapq
import ipaddress
import json
import logging
import logging.handlers
import os
import queue
import selectors
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent import logs
from agent.announce.vrrp import machine as vs
from agent.announce.vrrp.addresses import AddressTable
from agent.announce.vrrp.carrier import CarrierWatch
from agent.announce.vrrp.codec import Advert, VrrpDecodeError, decode, encode
from agent.announce.vrrp.config import InstanceConfig, SpeakerConfig, from_json
from agent.announce.vrrp.control import Stop, decode_command
from agent.announce.vrrp.gratuitous import ArpSender, Kind, NaSender, arp_frame, unsolicited_na
from agent.announce.vrrp.sockets import GROUP4, GROUP6, VRRP_TTL, Received, VrrpSocket
from agent.model.net import IPAddress

log = logging.getLogger("nodelb.speaker")

STATUS_INTERVAL_US = 100_000
LATE_US = 10_000  # a timer this late is counted (10 % of the fastest usual interval)
EVENT_HISTORY = 64
PR_SET_PDEATHSIG = 1


class DropReason(enum.StrEnum):
    """Why an incoming packet was dropped before the codec (the codec adds its DecodeReason)."""

    MALFORMED = "malformed"  # the IP header could not be parsed
    TTL = "ttl"  # TTL / hop limit is not 255 (RFC 5798 §7.1)
    UNKNOWN_SOURCE = "unknown_source"  # the source is not a configured peer
    WRONG_MAC = "wrong_mac"  # a peer's address in a frame from a MAC that is not that peer's
    UNKNOWN_VRID = "unknown_vrid"  # a valid advert for a VRID this node does not run
    PRIORITY = "priority"  # a priority nodelb never sends, from a peer that is not keepalived


class TimerKind(enum.IntEnum):
    """Which timer a heap entry is; one of each may be pending per instance."""

    ADVER = 1
    MASTER_DOWN = 2
    GRATUITOUS = 3
    RELEASE = 4


@dataclass(slots=True)
class Running:
    """One instance as the shell runs it: configuration, protocol state, counters."""

    config: InstanceConfig
    instance: vs.VrrpInstance
    adverts_sent: int = 0
    adverts_received: int = 0
    takeovers: int = 0
    transitions: dict[str, int] = field(default_factory=dict)


class Addresses(Protocol):
    """The held addresses of the interface (addresses.AddressTable)."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def mac(self) -> bytes: ...
    def link_local(self) -> ipaddress.IPv6Address | None: ...
    def add(self, address: IPAddress) -> bool: ...
    def remove(self, address: IPAddress) -> bool: ...
    def remove_stale(self, keep: Iterable[IPAddress] = ()) -> frozenset[IPAddress]: ...


class FrameSender(Protocol):
    """Sends ready-made Ethernet frames: gratuitous ARP (gratuitous.ArpSender)."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def send(self, frame: bytes) -> None: ...


class NeighborSender(Protocol):
    """Sends ICMPv6 messages to ff02::1: unsolicited NA (gratuitous.NaSender)."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def send(self, message: bytes, *, src: ipaddress.IPv6Address) -> None: ...


class AdvertSocket(Protocol):
    """One family's VRRP socket on the interface (sockets.VrrpSocket)."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def fileno(self) -> int: ...
    def send(self, message: bytes, *, src: IPAddress) -> None: ...
    def recv(self) -> Received | None: ...


class Carrier(Protocol):
    """The interface's link notifications (carrier.CarrierWatch)."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def fileno(self) -> int: ...
    def read(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SpeakerIO:
    """What the speaker touches in the kernel; `real()` in production, fakes in unit tests.

    `open_socket(family)` returns a VRRP socket not opened yet (the speaker opens a family's
    socket when its first instance of that family starts). `carrier` tells when the link comes
    back (None: not watched).
    """

    table: Addresses
    arp: FrameSender
    na: NeighborSender
    open_socket: Callable[[int], AdvertSocket]
    carrier: Carrier | None = None

    @classmethod
    def real(cls, ifname: str) -> SpeakerIO:
        """Return the netlink table, packet senders and raw sockets of interface `ifname`."""
        return cls(
            table=AddressTable(ifname),
            arp=ArpSender(ifname),
            na=NaSender(ifname),
            open_socket=lambda family: VrrpSocket(family, ifname),
            carrier=CarrierWatch(ifname),
        )


def now_us() -> int:
    """Return the monotonic clock in integer microseconds (the clock every deadline uses)."""
    return time.monotonic_ns() // 1000


class Speaker:
    """The speaker loop for one interface. `run()` blocks until stopped; returns an exit code.

    The constructor only stores its arguments; sockets open in `run()` and close before it
    returns. `control` is a readable file descriptor carrying JSON lines (None: no control
    channel; stop with a signal). `io` is what it touches in the kernel (None: the real
    interface). `open`, `apply`, `accept`, `read_carrier`, `fire_due_timers` and `close` are
    the steps `run()` takes, public so that a test with a fake `io` and clock can take them one
    by one.
    """

    def __init__(
        self,
        config: SpeakerConfig,
        *,
        status_path: Path,
        control: int | None = None,
        clock: Callable[[], int] = now_us,
        io: SpeakerIO | None = None,
    ) -> None:
        io = io if io is not None else SpeakerIO.real(config.interface)
        self.config = config
        self.status_path = status_path
        self.control = control
        self.clock = clock
        self.running: dict[tuple[int, int], Running] = {}
        self.sockets: dict[int, AdvertSocket] = {}
        self.table = io.table
        self.arp = io.arp
        self.na = io.na
        self._open_socket = io.open_socket
        self.carrier = io.carrier
        self.link_local: ipaddress.IPv6Address | None = None
        self.mac = b""
        self.dropped: dict[int, dict[str, int]] = {4: {}, 6: {}}
        self.gratuitous_sent: dict[int, dict[str, int]] = {4: {}, 6: {}}
        self.send_errors = 0
        self.timer_late_max_us = 0  # the latest a timer fired after its deadline
        self.timers_late = 0  # timers that fired more than LATE_US late
        self.late_log: deque[tuple[int, int]] = deque(maxlen=16)  # (deadline, lateness) µs
        self.realtime_priority = 0  # the SCHED_RR priority granted (0: normal scheduling)
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENT_HISTORY)
        self.event_seq = 0
        self.errors: deque[str] = deque(maxlen=8)
        self._heap: list[tuple[int, int, TimerKind, tuple[int, int]]] = []
        self._heap_seq = 0
        self._selector = selectors.DefaultSelector()
        self._stop: bool | None = None  # None: keep running; True/False: graceful or not
        self._control_buffer = b""
        self._status_dirty = True
        self._status_written_at = -STATUS_INTERVAL_US
        self._status_seq = 0
        self._state = "starting"
        self._wake_r, self._wake_w = socket.socketpair()
        # Resigned Masters that still keep their addresses until a backup has taken over
        # (the state machine's release); no longer configured, so not in `running`.
        self.releasing: dict[tuple[int, int], Running] = {}
        # Addresses instances gave up during the event at hand; see _settle_addresses.
        self._unheld: set[IPAddress] = set()
        self._writer = StatusWriter(status_path, config.interface)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until a stop request, SIGTERM/SIGINT or EOF on control; return the exit code."""
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        old_wakeup = signal.set_wakeup_fd(self._wake_w.fileno())
        old_handlers = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
        }
        self._writer.start()
        try:
            self.open()
            self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            if self.control is not None:
                os.set_blocking(self.control, False)
                self._selector.register(self.control, selectors.EVENT_READ, "control")
            self.apply(self.config, initial=True)
            self._state = "running"
            self._write_status(self.clock())
            while self._stop is None:
                self._once()
            self._shutdown(graceful=self._stop)
            return 0
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old_handlers.items():
                signal.signal(s, h)
            self.close()

    def _once(self) -> None:
        now = self.clock()
        timeout = None
        due = self.next_timer()
        if due is not None:
            timeout = max(0.0, (due - now) / 1_000_000)
        if self._status_dirty:
            flush_in = max(0.0, (self._status_written_at + STATUS_INTERVAL_US - now) / 1e6)
            timeout = flush_in if timeout is None else min(timeout, flush_in)
        for key, _ in self._selector.select(timeout):
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    self._wake_r.recv(4096)
            elif key.data == "control":
                self._read_control()
            elif key.data == "carrier":
                self.read_carrier()
            else:
                self._receive(int(key.data))
        self.fire_due_timers()
        now = self.clock()
        if self._status_dirty and now - self._status_written_at >= STATUS_INTERVAL_US:
            self._write_status(now)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._stop is None:
            self._stop = True

    # -- setup and teardown -------------------------------------------------------------------

    def open(self) -> None:
        """Open the interface's table and senders; remove addresses a crashed speaker left."""
        self.table.open()
        self.mac = self.table.mac()
        self.link_local = self.table.link_local()
        # Addresses a crashed speaker left behind: nobody here holds anything yet.
        stale = self.table.remove_stale()
        if stale:
            log.info("removed stale addresses", extra={"addresses": sorted(map(str, stale))})
        self.arp.open()
        self.na.open()
        if self.carrier is not None:
            self.carrier.open()
            self._selector.register(self.carrier.fileno(), selectors.EVENT_READ, "carrier")

    def _socket(self, family: int) -> AdvertSocket:
        sock = self.sockets.get(family)
        if sock is None:
            sock = self._open_socket(family)
            sock.open()
            self.sockets[family] = sock
            self._selector.register(sock.fileno(), selectors.EVENT_READ, str(family))
        return sock

    def close(self) -> None:
        """Close every socket, the table, the selector and the status writer."""
        self._writer.close()
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()
        self.arp.close()
        self.na.close()
        if self.carrier is not None:
            self.carrier.close()
        self.table.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _shutdown(self, *, graceful: bool) -> None:
        now = self.clock()
        if graceful:
            for run in list(self.running.values()):
                self._resign(run, now)
            self.running.clear()
            while self.releasing:  # bounded: every release has a deadline
                self._once()
        # Whatever the instances did, leave no marked address behind.
        with contextlib.suppress(Exception):
            self.table.remove_stale()
        self.running.clear()
        self._state = "stopped"
        self._write_status(self.clock())

    # -- configuration ------------------------------------------------------------------------

    def _read_control(self) -> None:
        assert self.control is not None
        try:
            chunk = os.read(self.control, 65536)
        except BlockingIOError:
            return
        if not chunk:  # the parent closed the pipe or died: resign and go
            self._selector.unregister(self.control)
            self.control = None
            if self._stop is None:
                self._stop = True
            return
        self._control_buffer += chunk
        while b"\n" in self._control_buffer:
            line, self._control_buffer = self._control_buffer.split(b"\n", 1)
            if line.strip():
                self._command(line)

    def _command(self, line: bytes) -> None:
        try:
            command = decode_command(line)
            if isinstance(command, Stop):
                self._stop = command.graceful
            else:
                self.apply(command.config)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            # The instances applied before the failure keep running; the parent sees the
            # error in the status and can send the configuration again.
            log.error("refused control message", extra={"error": str(exc)})
            self.errors.append(f"control: {exc}")
            self._status_dirty = True

    def _primary(self, family: int) -> IPAddress:
        if family == 4:
            if self.config.source4 is None:
                raise ValueError("no IPv4 source address configured")
            return self.config.source4
        if self.link_local is None:
            raise ValueError(f"{self.config.interface} has no IPv6 link-local address")
        return self.link_local

    def apply(self, config: SpeakerConfig, *, initial: bool = False) -> None:
        """Move from the running instances to `config`'s, leaving unchanged ones alone.

        A new instance gets Startup, a kept one Reconfigured, a removed one Resign. Raises
        ValueError when `config` cannot run here (another interface, no source address).
        """
        if config.interface != self.config.interface:
            raise ValueError("the interface cannot change; restart the speaker")
        self.config = config
        now = self.clock()
        wanted = {i.key: i for i in config.instances}
        try:
            for key in [k for k in self.running if k not in wanted]:
                self._resign(self.running.pop(key), now)
            for key, cfg in wanted.items():
                run_or_none = self.running.get(key)
                if run_or_none is None:
                    self._socket(cfg.family)
                    run = Running(config=cfg, instance=self._instance(cfg))
                    self.running[key] = run
                    self._step(run, vs.Startup(now))
                else:
                    run_or_none.config = cfg
                    self._step(run_or_none, vs.Reconfigured(now, self._instance(cfg)))
        finally:
            # Once for the whole update: an address moving from one instance to another
            # (both Master) is added by one and given up by the other, in either order.
            self._settle_addresses()
        self._status_dirty = True
        if not initial:
            log.info("configuration applied", extra={"instances": len(self.running)})

    def _instance(self, cfg: InstanceConfig) -> vs.VrrpInstance:
        """Return `cfg` as a state machine instance (in Initialize, not yet started)."""
        return vs.VrrpInstance(
            vrid=cfg.vrid,
            priority=cfg.priority,
            primary_ip=self._primary(cfg.family),
            advertisement_interval=cfg.advert_interval_cs,
            preempt=cfg.preempt,
            preempt_delay=cfg.preempt_delay_cs,
            startup_delay=cfg.startup_delay_cs,
            addresses=cfg.addresses,
            burst=self.config.gratuitous.burst(),
        )

    # -- resigning ----------------------------------------------------------------------------

    def _resign(self, run: Running, now: int) -> None:
        """Shut `run` down gracefully; a resigned Master is kept while it releases.

        The state machine decides how long a resigned Master keeps its addresses (`Resign`,
        `ReleaseTimerFired`); until then it stays in `releasing`, where adverts and its
        release timer still reach it.
        """
        self._step(run, vs.Resign(now))
        if run.instance.release_at is not None:
            earlier = self.releasing.get(run.config.key)
            if earlier is not None:  # resigned twice: the new release replaces the old one
                self._unheld.update(earlier.instance.holding)
            self.releasing[run.config.key] = run

    # -- the state machine and its actions ----------------------------------------------------

    def read_carrier(self) -> None:
        """Feed every instance CarrierUp when the link has just come back (a Master then
        advertises and re-announces: see carrier.py)."""
        assert self.carrier is not None
        if not self.carrier.read():
            return
        now = self.clock()
        log.info("carrier back on %s: Masters re-announce", self.config.interface)
        for run in list(self.running.values()):
            self._step(run, vs.CarrierUp(now))

    def _step(self, run: Running, event: vs.Event) -> None:
        before = run.instance.state
        run.instance, actions = vs.step(run.instance, event)
        after = run.instance.state
        if after is not before:
            run.transitions[after.value] = run.transitions.get(after.value, 0) + 1
            if after is vs.State.MASTER:
                run.takeovers += 1
            self.event_seq += 1
            self.events.append(
                {
                    "seq": self.event_seq,
                    "time_us": event.now,
                    "vrid": run.config.vrid,
                    "family": run.config.family,
                    "from": before.value,
                    "to": after.value,
                    "event": type(event).__name__,
                }
            )
            log.info(
                "state change",
                extra={
                    "vrid": run.config.vrid,
                    "family": run.config.family,
                    "from": before.value,
                    "to": after.value,
                },
            )
            self._status_dirty = True
            self._status_written_at = -STATUS_INTERVAL_US  # tell the parent at once
        sent_at = None
        for action in actions:
            sent = self._perform(run, action)
            sent_at = sent if sent is not None else sent_at
        if sent_at is not None:  # the burst goes on from when its round actually left
            self._step(run, vs.GratuitousSent(sent_at))

    def _perform(self, run: Running, action: vs.Action) -> int | None:
        """Perform `action`; return when a gratuitous round finished sending, else None."""
        key = run.config.key
        if isinstance(action, vs.SendAdvert):
            self._send_advert(run, action.priority)
        elif isinstance(action, vs.StartAdverTimer):
            self._push(action.at, TimerKind.ADVER, key)
        elif isinstance(action, vs.StartMasterDownTimer):
            self._push(action.at, TimerKind.MASTER_DOWN, key)
        elif isinstance(action, vs.CancelTimers):
            pass  # heap entries whose deadline no longer matches the instance are skipped
        elif isinstance(action, vs.AddAddresses):
            for address in action.addresses:
                try:
                    self.table.add(address)
                except Exception as exc:
                    self._error(f"add {address}: {exc}")
            self._status_dirty = True
        elif isinstance(action, vs.RemoveAddresses):
            self._unheld.update(action.addresses)  # see _settle_addresses
        elif isinstance(action, vs.SendGratuitous):
            return self._gratuitous_round(action.addresses)
        elif isinstance(action, vs.StartGratuitousTimer):
            self._push(action.at, TimerKind.GRATUITOUS, key)
        elif isinstance(action, vs.StartReleaseTimer):
            self._push(action.at, TimerKind.RELEASE, key)
        return None

    def _settle_addresses(self) -> None:
        """Remove the addresses instances gave up that no instance, running or releasing, holds.

        So the interface carries exactly `machine.interface_addresses` of every instance. Called
        once the event at hand has been stepped everywhere it goes (a whole
        configuration update, a packet, a timer), so that no address some instance holds is
        removed even for a moment, whatever the order the instances were stepped in.
        """
        if not self._unheld:
            return
        held = vs.interface_addresses(
            r.instance for r in (*self.running.values(), *self.releasing.values())
        )
        gone = sorted(self._unheld - held, key=lambda a: (a.version, int(a)))
        self._unheld.clear()
        self._remove_addresses(gone)

    def _remove_addresses(self, addresses: tuple[IPAddress, ...] | list[IPAddress]) -> None:
        for address in addresses:
            try:
                self.table.remove(address)
            except Exception as exc:
                self._error(f"remove {address}: {exc}")
        self._status_dirty = True

    def _send_advert(self, run: Running, priority: int) -> None:
        cfg, inst = run.config, run.instance
        src = self._primary(cfg.family)
        dst: IPAddress = GROUP4 if cfg.family == 4 else GROUP6
        advert = Advert(
            vrid=inst.vrid,
            priority=priority,
            max_adver_int=inst.advertisement_interval,
            addresses=inst.addresses,
        )
        message = encode(advert, src=src, dst=dst, checksum_mode=self.config.checksum_mode)
        try:
            self._socket(cfg.family).send(message, src=src)
        except OSError as exc:
            self.send_errors += 1
            self._error(f"send advert VRID {cfg.vrid} IPv{cfg.family}: {exc}")
            return
        run.adverts_sent += 1
        self._status_dirty = True

    def _gratuitous_round(self, addresses: tuple[IPAddress, ...]) -> int:
        """Send one round for `addresses`; return the time (µs) it finished leaving."""
        g = self.config.gratuitous
        forms = [(Kind.ARP_REQUEST, g.arp_request), (Kind.ARP_REPLY, g.arp_reply)]
        for address in addresses:
            if isinstance(address, ipaddress.IPv4Address):
                for kind in [k for k, on in forms if on]:
                    frame = arp_frame(kind, mac=self.mac, address=address)
                    self._send_gratuitous(4, kind, frame, None)
            else:
                src = self._primary(6)
                assert isinstance(src, ipaddress.IPv6Address)
                message = unsolicited_na(target=address, mac=self.mac, src=src)
                self._send_gratuitous(6, Kind.NA, message, src)
        return self.clock()

    def _send_gratuitous(
        self, family: int, kind: Kind, packet: bytes, src: ipaddress.IPv6Address | None
    ) -> None:
        try:
            if src is None:
                self.arp.send(packet)
            else:
                self.na.send(packet, src=src)
        except OSError as exc:
            self._error(f"send {kind}: {exc}")
            return
        counts = self.gratuitous_sent[family]
        counts[kind.value] = counts.get(kind.value, 0) + 1
        self._status_dirty = True

    def _error(self, message: str) -> None:
        log.warning(message)
        self.errors.append(message)
        self._status_dirty = True

    # -- timers -------------------------------------------------------------------------------

    def _push(self, at: int, kind: TimerKind, key: tuple[int, int]) -> None:
        self._heap_seq += 1
        heapq.heappush(self._heap, (at, self._heap_seq, kind, key))

    def next_timer(self) -> int | None:
        """Return the earliest pending timer deadline (µs), None when no timer is pending."""
        return self._heap[0][0] if self._heap else None

    def fire_due_timers(self) -> None:
        """Step every instance whose timer is due now (stale heap entries are dropped)."""
        while self._heap and self._heap[0][0] <= self.clock():
            at, _, kind, key = heapq.heappop(self._heap)
            if kind is TimerKind.RELEASE:
                resigned = self.releasing.get(key)
                if resigned is not None and resigned.instance.release_at == at:
                    self._step(resigned, vs.ReleaseTimerFired(self.clock()))
                    if resigned.instance.release_at is None:
                        del self.releasing[key]
                    self._settle_addresses()
                continue
            run = self.running.get(key)
            if run is None:
                continue
            now = self.clock()
            late = now - at
            self.timer_late_max_us = max(self.timer_late_max_us, late)
            if late > LATE_US:
                self.timers_late += 1
                self.late_log.append((at, late))
            if kind is TimerKind.ADVER and run.instance.adver_timer_at == at:
                self._step(run, vs.AdverTimerFired(now))
            elif kind is TimerKind.MASTER_DOWN and run.instance.master_down_at == at:
                self._step(run, vs.MasterDownTimerFired(now))
            elif kind is TimerKind.GRATUITOUS and run.instance.gratuitous_at == at:
                self._step(run, vs.GratuitousTimerFired(now))
            self._settle_addresses()

    # -- receiving ----------------------------------------------------------------------------

    def _drop(self, family: int, reason: str) -> None:
        counts = self.dropped[family]
        counts[reason] = counts.get(reason, 0) + 1
        self._status_dirty = True

    def _receive(self, family: int) -> None:
        sock = self.sockets[family]
        for _ in range(64):  # bounded: timers must not starve behind a flood
            try:
                packet = sock.recv()
            except OSError as exc:
                self._error(f"receive IPv{family}: {exc}")
                return
            if packet is None:
                return
            self.accept(family, packet)

    def accept(self, family: int, packet: Received) -> None:
        """Check one received packet (RFC 5798 §7.1) and step its instances, or count a drop."""
        now = self.clock()
        own = self.config.source4 if family == 4 else self.link_local
        if packet.src == own:
            return
        if packet.ttl != VRRP_TTL:
            self._drop(family, DropReason.TTL)
            return
        if packet.src not in self.config.peers:
            self._drop(family, DropReason.UNKNOWN_SOURCE)
            return
        mac = self.config.peer_macs.get(packet.src)
        if mac is not None and (packet.src_mac is None or packet.src_mac.hex(":") != mac):
            self._drop(family, DropReason.WRONG_MAC)
            return
        try:
            advert = decode(
                packet.payload,
                src=packet.src,
                dst=packet.dst,
                family=family,
                checksum_mode=self.config.checksum_mode,
            )
        except VrrpDecodeError as exc:
            self._drop(family, exc.reason)
            return
        key = (family, advert.vrid)
        if key not in self.running and key not in self.releasing:
            self._drop(family, DropReason.UNKNOWN_VRID)
            return
        if not self._priority_allowed(packet.src, advert.priority):
            self._drop(family, DropReason.PRIORITY)
            return
        event = vs.AdvertReceived(
            now=now, src=packet.src, priority=advert.priority, max_adver_int=advert.max_adver_int
        )
        resigned = self.releasing.get(key)
        if resigned is not None:  # its successor's first advert sets the release deadline
            self._step(resigned, event)
        run = self.running.get(key)
        if run is not None:
            run.adverts_received += 1
            self._status_dirty = True
            self._step(run, event)
        elif resigned is None:
            self._drop(family, DropReason.UNKNOWN_VRID)
        self._settle_addresses()

    def _priority_allowed(self, src: IPAddress, priority: int) -> bool:
        """Return False for a priority nodelb never advertises from a nodelb peer: 255 (the
        address owner: nodelb owns no address) or outside the plan's rank range. A forged 255
        made every node step down at once (issue #18)."""
        if priority == 0 or src in self.config.keepalived_peers:
            return True
        if priority == 255:
            return False
        ranks = self.config.peer_priorities
        return ranks is None or ranks[0] <= priority <= ranks[1]

    # -- status -------------------------------------------------------------------------------

    def status(self, now: int) -> dict[str, Any]:
        """Return the JSON status snapshot (control.SpeakerStatus reads it)."""
        return {
            "pid": os.getpid(),
            "seq": self._status_seq,
            "time_us": now,
            "state": self._state,
            "interface": self.config.interface,
            "link_local": None if self.link_local is None else str(self.link_local),
            "instances": [
                {
                    "vrid": run.config.vrid,
                    "family": run.config.family,
                    "state": run.instance.state.value,
                    "priority": run.instance.priority,
                    "addresses": [str(a) for a in run.instance.addresses],
                    "master": None if run.instance.master is None else str(run.instance.master),
                    "adverts_sent": run.adverts_sent,
                    "adverts_received": run.adverts_received,
                    "takeovers": run.takeovers,
                    "transitions": dict(run.transitions),
                }
                for run in sorted(self.running.values(), key=lambda r: r.config.key)
            ],
            "dropped": {str(f): dict(c) for f, c in self.dropped.items()},
            "gratuitous": {str(f): dict(c) for f, c in self.gratuitous_sent.items()},
            "held": {"4": [], "6": []},  # filled in by the StatusWriter thread
            "send_errors": self.send_errors,
            "timer_late_max_us": self.timer_late_max_us,
            "timers_late": self.timers_late,
            "realtime_priority": self.realtime_priority,
            "late_timers": [list(x) for x in self.late_log],
            "events": list(self.events),
            "errors": list(self.errors),
        }

    def _write_status(self, now: int) -> None:
        self._status_seq += 1
        self._writer.submit(self.status(now))
        self._status_dirty = False
        self._status_written_at = now


class StatusWriter:
    """A thread that writes status snapshots to a file, so the loop never waits on a disk.

    `submit` only swaps the pending snapshot (the newest wins: a slow disk loses nothing but
    intermediate snapshots, whose counters are totals anyway). The thread adds the held
    addresses from its own netlink socket (an address dump can wait on kernel locks), then
    writes a temporary file and renames it over the status file. `close()` writes what is
    pending and stops the thread.
    """

    def __init__(self, path: Path, ifname: str) -> None:
        self.path = path
        self.ifname = ifname
        self._pending: dict[str, Any] | None = None
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="status-writer", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, snapshot: dict[str, Any]) -> None:
        """Queue `snapshot` for writing, replacing any snapshot not yet written."""
        with self._cond:
            self._pending = snapshot
            self._cond.notify()

    def close(self) -> None:
        """Write the pending snapshot, if any, and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)

    def _run(self) -> None:
        # This thread keeps the SCHED_RR class it inherits: were it demoted, a busy node could
        # preempt it while it holds the GIL, and the loop would wait for it (priority
        # inversion). It blocks on the disk and netlink, so it costs the node no CPU.
        table = AddressTable(self.ifname)
        try:
            table.open()
        except Exception as exc:
            log.warning("status writer cannot read addresses", extra={"error": str(exc)})
            table.close()
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                snapshot, self._pending = self._pending, None
                closing = self._closing
            if snapshot is not None:
                self._write(table, snapshot)
            if closing:
                with self._cond:
                    if self._pending is None:
                        break
        table.close()

    def _write(self, table: AddressTable, snapshot: dict[str, Any]) -> None:
        held: dict[str, list[str]] = {"4": [], "6": []}
        try:
            for a in sorted(table.held(), key=lambda a: (a.version, int(a))):
                held[str(a.version)].append(str(a))
        except Exception as exc:
            snapshot["errors"] = [*snapshot["errors"], f"list addresses: {exc}"]
        snapshot["held"] = held
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(snapshot))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write status", extra={"error": str(exc)})


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies; exit now if it is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent_pid:  # it died before prctl took effect
        raise SystemExit(3)


def _realtime(priority: int) -> tuple[int, str | None]:
    """Run this process under SCHED_RR at `priority`; return (the priority granted, 0 when
    refused; why it was refused, None when it was not).

    Why: on a busy node a normal-priority process waits for a CPU behind everything else
    (measured on a loaded 2-CPU node: timers up to 2.3 s late, the IP on two or three nodes;
    at SCHED_RR at most 132 ms). The loop sleeps almost all the time, so a real-time class
    costs the node nothing. Needs CAP_SYS_NICE (or an RLIMIT_RTPRIO that allows it) and, on
    a kernel with RT group scheduling under cgroup v1, a real-time runtime budget in the
    process's cpu cgroup (container runtimes give containers none: EPERM).
    """
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
    except OSError as exc:
        return 0, str(exc)
    return priority, None


def main(argv: list[str] | None = None) -> int:
    """Run the speaker from the command line; return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m agent.announce.vrrp.speaker")
    parser.add_argument("--config", type=Path, required=True, help="JSON SpeakerConfig file")
    parser.add_argument("--status", type=Path, required=True, help="status snapshot file")
    parser.add_argument("--control-stdin", action="store_true", help="read commands on stdin")
    parser.add_argument("--parent-pid", type=int, help="die (gracefully) when this parent does")
    parser.add_argument("--log-format", default="json", choices=("json", "text"))
    parser.add_argument(
        "--rt-priority",
        type=int,
        default=0,
        help="SCHED_RR priority (1..99; 0 = normal scheduling), as keepalived's vrrp_rt_priority",
    )
    parser.add_argument(
        "--cpus",
        default="",
        help="comma-separated CPUs to run on (empty: any); see agent.announce.vrrp.process",
    )
    args = parser.parse_args(argv)
    if args.cpus:  # first, so that every thread inherits it
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    granted, refused = 0, None
    if args.rt_priority:  # first, so that every thread (log listener too) inherits it
        granted, refused = _realtime(args.rt_priority)
    logs.setup("info", args.log_format)
    # Log lines go through a queue to a thread: stderr may be a pipe or a disk that stalls,
    # and the loop must not wait on it.
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    log_queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(log_queue, *root.handlers)
    root.handlers[:] = [logging.handlers.QueueHandler(log_queue)]
    listener.start()
    if refused is not None:
        log.warning(
            "speaker runs at normal priority: the node refused real-time scheduling, so"
            " adverts can run late when the CPUs are busy (grant CAP_SYS_NICE; on cgroup v1"
            " with RT group scheduling the container also needs a real-time runtime budget)",
            extra={"asked": args.rt_priority, "error": refused},
        )
    elif granted:
        log.info("speaker runs at real-time priority", extra={"policy": "RR", "priority": granted})
    try:
        return _run(args, granted)
    finally:
        listener.stop()


def _run(args: argparse.Namespace, realtime_priority: int) -> int:
    if args.parent_pid is not None:
        _die_with_parent(args.parent_pid)
    config = from_json(json.loads(args.config.read_text()))
    speaker = Speaker(
        config,
        status_path=args.status,
        control=sys.stdin.fileno() if args.control_stdin else None,
    )
    speaker.realtime_priority = realtime_priority
    return speaker.run()


if __name__ == "__main__":
    sys.exit(main())
