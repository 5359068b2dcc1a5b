"""The speaker shell, with fake kernel interfaces and a fake clock: it performs what `step` says.

A `Harness` runs one `Speaker` on a fake interface (a set of addresses, recorded ARP frames and
adverts) and moves a fake clock from timer to timer, so a burst, a takeover or a handover
plays out in microseconds of test time and every deadline is exact. The kernel tier
(tests/kernel/test_speaker_*.py) runs the same code on real sockets; these tests pin what the
shell does with the state machine's actions.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from agent.announce.metrics import SpeakerMetrics
from agent.announce.vrrp.codec import Advert, decode, encode
from agent.announce.vrrp.config import GratuitousConfig, InstanceConfig, SpeakerConfig
from agent.announce.vrrp.control import parse_status
from agent.announce.vrrp.machine import interface_addresses, master_down_interval
from agent.announce.vrrp.sockets import GROUP4, GROUP6, Received
from agent.announce.vrrp.speaker import AdvertSocket, Speaker, SpeakerIO, _realtime
from agent.model.net import IPAddress

SRC4, PEER4 = IPv4Address("198.18.0.11"), IPv4Address("198.18.0.12")
LINK_LOCAL, PEER6 = IPv6Address("fe80::11"), IPv6Address("fe80::12")
MAC = bytes.fromhex("02000000000b")
VIP_A, VIP_B, VIP_C = (IPv4Address(f"198.18.0.{n}") for n in (200, 201, 202))
VIP6 = IPv6Address("2001:db8::200")
VRID = 5
INTERVAL = 10  # cs: 100 ms
INTERVAL_US = 100_000
START = 1_000_000
BURST = GratuitousConfig(count=3, spacing_ms=50, arp_reply=False)


class Clock:
    """A monotonic clock in µs that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> int:
        return self.now


class NothingToOpen:
    """A fake kernel interface: opening and closing it does nothing."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeTable(NothingToOpen):
    """The interface's nodelb addresses, as a set."""

    def __init__(self) -> None:
        self.addresses: set[IPAddress] = set()
        self.removals: list[IPAddress] = []  # every address removed, in order

    def mac(self) -> bytes:
        return MAC

    def link_local(self) -> IPv6Address | None:
        return LINK_LOCAL

    def add(self, address: IPAddress) -> bool:
        new = address not in self.addresses
        self.addresses.add(address)
        return new

    def remove(self, address: IPAddress) -> bool:
        self.removals.append(address)
        present = address in self.addresses
        self.addresses.discard(address)
        return present

    def remove_stale(self, keep: object = ()) -> frozenset[IPAddress]:
        gone = frozenset(self.addresses)
        self.addresses.clear()
        return gone


@dataclass
class Sent:
    """What left the fake interface, stamped with the fake clock."""

    clock: Clock
    arp: list[tuple[int, IPv4Address]] = field(default_factory=list)  # (µs, target)
    na: list[tuple[int, IPv6Address]] = field(default_factory=list)
    adverts: list[tuple[int, int, Advert]] = field(default_factory=list)  # (µs, family, advert)


@dataclass
class FakeArp(NothingToOpen):
    """Records the target of every gratuitous ARP frame."""

    sent: Sent

    def send(self, frame: bytes) -> None:
        self.sent.arp.append((self.sent.clock(), IPv4Address(frame[38:42])))


@dataclass
class FakeNa(NothingToOpen):
    """Records the target of every unsolicited NA."""

    sent: Sent

    def send(self, message: bytes, *, src: IPv6Address) -> None:
        self.sent.na.append((self.sent.clock(), IPv6Address(message[8:24])))


class FakeSocket:
    """A family's VRRP socket: what is sent is decoded and recorded; nothing arrives by itself."""

    def __init__(self, family: int, sent: Sent) -> None:
        self.family = family
        self.sent = sent
        self._pair: tuple[socket.socket, socket.socket] | None = None

    def open(self) -> None:
        self._pair = socket.socketpair()  # a real descriptor, for the speaker's selector

    def close(self) -> None:
        if self._pair is not None:
            for end in self._pair:
                end.close()
            self._pair = None

    def fileno(self) -> int:
        assert self._pair is not None
        return self._pair[0].fileno()

    def send(self, message: bytes, *, src: IPAddress) -> None:
        dst = GROUP4 if self.family == 4 else GROUP6
        advert = decode(message, src=src, dst=dst, family=self.family)
        self.sent.adverts.append((self.sent.clock(), self.family, advert))

    def recv(self) -> Received | None:
        return None


def instance(
    *addresses: IPAddress, vrid: int = VRID, priority: int = 100, family: int = 4
) -> InstanceConfig:
    return InstanceConfig(
        vrid=vrid,
        family=family,
        priority=priority,
        advert_interval_cs=INTERVAL,
        addresses=addresses,
    )


def speaker_config(*instances: InstanceConfig) -> SpeakerConfig:
    return SpeakerConfig(
        interface="eth0",
        source4=SRC4,
        peers=frozenset({PEER4, PEER6}),
        instances=instances,
        gratuitous=BURST,
    )


@dataclass
class Harness:
    speaker: Speaker
    clock: Clock
    table: FakeTable
    sent: Sent

    def run_until(self, until: int, *, after_each: Callable[[], None] = lambda: None) -> None:
        """Fire every timer due up to `until` at its deadline, then set the clock to `until`.

        `after_each` runs after every deadline's timers have fired.
        """
        while (due := self.speaker.next_timer()) is not None and due <= until:
            self.clock.now = max(self.clock.now, due)
            self.speaker.fire_due_timers()
            after_each()
        self.clock.now = until

    def hear(self, priority: int, *, vrid: int = VRID, family: int = 4) -> None:
        """Deliver a valid advert from the peer, now."""
        src: IPAddress = PEER4 if family == 4 else PEER6
        dst: IPAddress = GROUP4 if family == 4 else GROUP6
        addresses: tuple[IPAddress, ...] = (VIP_A,) if family == 4 else (VIP6,)
        advert = Advert(vrid=vrid, priority=priority, max_adver_int=INTERVAL, addresses=addresses)
        payload = encode(advert, src=src, dst=dst)
        self.speaker.accept(
            family, Received(family=family, src=src, dst=dst, ttl=255, payload=payload)
        )

    def state(self, vrid: int = VRID, family: int = 4) -> str | None:
        status = parse_status(self.speaker.status(self.clock.now))
        inst = status.instance(family, vrid)
        return None if inst is None else inst.state

    def take_over(self) -> int:
        """Let the first Master_Down_Timer run out (nobody else advertises); return when."""
        at = self.clock.now + master_down_interval(100, INTERVAL)
        self.run_until(at)
        assert self.state() == "Master"
        return at


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with harness_on(tmp_path) as h:
        yield h


@contextlib.contextmanager
def harness_on(tmp_path: Path) -> Iterator[Harness]:
    """Yield a Harness with an open speaker and no instance yet; close the speaker after."""
    clock = Clock()
    sent = Sent(clock)
    table = FakeTable()

    def open_socket(family: int) -> AdvertSocket:
        return FakeSocket(family, sent)

    io = SpeakerIO(table=table, arp=FakeArp(sent), na=FakeNa(sent), open_socket=open_socket)
    speaker = Speaker(speaker_config(), status_path=tmp_path / "status.json", clock=clock, io=io)
    speaker.open()
    try:
        yield Harness(speaker, clock, table, sent)
    finally:
        speaker.close()


def test_a_takeover_adds_the_addresses_and_spaces_its_burst_from_when_each_round_left(
    harness: Harness,
) -> None:
    harness.speaker.apply(speaker_config(instance(VIP_A, VIP_B)))
    assert harness.state() == "Backup" and harness.table.addresses == set()
    took_over = harness.take_over()
    assert harness.table.addresses == {VIP_A, VIP_B}
    assert [(t, a.priority) for t, _, a in harness.sent.adverts] == [(took_over, 100)]
    harness.run_until(took_over + 10 * INTERVAL_US)
    rounds = [took_over, took_over + 50_000, took_over + 100_000]  # count 3, 50 ms apart
    assert harness.sent.arp == [(t, vip) for t in rounds for vip in (VIP_A, VIP_B)]


@dataclass
class FakeCarrier(NothingToOpen):
    """Link notifications that say the carrier came back (`back`) the next time they are read."""

    back: bool = True

    def fileno(self) -> int:
        return -1

    def read(self) -> bool:
        back, self.back = self.back, False
        return back


def test_a_master_whose_link_comes_back_advertises_and_re_announces_at_once(
    harness: Harness,
) -> None:
    # Issue #18, finding 7: the backup that held the address while our link was down may
    # step down on our first advert without one we hear; the neighbours must follow us back.
    harness.speaker.apply(speaker_config(instance(VIP_A, VIP_B)))
    took_over = harness.take_over()
    harness.run_until(took_over + 10 * INTERVAL_US)  # the takeover's burst is over
    adverts, arps = len(harness.sent.adverts), len(harness.sent.arp)
    harness.speaker.carrier = FakeCarrier()
    harness.clock.now += 1234
    harness.speaker.read_carrier()
    now = harness.clock.now
    assert [(t, a.priority) for t, _, a in harness.sent.adverts[adverts:]] == [(now, 100)]
    assert harness.sent.arp[arps:] == [(now, VIP_A), (now, VIP_B)]
    harness.speaker.read_carrier()  # read again: nothing came back, nothing is sent
    assert len(harness.sent.adverts) == adverts + 1


def test_a_backup_whose_link_comes_back_sends_nothing(harness: Harness) -> None:
    harness.speaker.apply(speaker_config(instance(VIP_A)))
    assert harness.state() == "Backup"
    harness.speaker.carrier = FakeCarrier()
    harness.speaker.read_carrier()
    assert harness.sent.adverts == [] and harness.sent.arp == []


def test_a_removed_master_keeps_its_addresses_until_its_successor_advertised_an_interval(
    harness: Harness,
) -> None:
    harness.speaker.apply(speaker_config(instance(VIP_A)))
    harness.take_over()
    resigned = harness.clock.now = harness.clock.now + 5_000
    harness.speaker.apply(speaker_config())
    assert harness.sent.adverts[-1][2].priority == 0  # RFC 5798 §6.4.3
    assert harness.state() is None, "a resigned instance is no longer reported"
    assert harness.table.addresses == {VIP_A}
    heard = harness.clock.now = resigned + 30_000
    harness.hear(100)  # the backup took over: one more of its intervals, then let go
    harness.run_until(heard + INTERVAL_US - 1)
    assert harness.table.addresses == {VIP_A}
    harness.run_until(heard + INTERVAL_US)
    assert harness.table.addresses == set()
    assert not harness.speaker.releasing


def test_a_resigned_master_nobody_replaces_lets_go_after_master_down_interval_at_priority_1(
    harness: Harness,
) -> None:
    harness.speaker.apply(speaker_config(instance(VIP_A)))
    harness.take_over()
    resigned = harness.clock.now
    harness.speaker.apply(speaker_config())
    harness.hear(0)  # another router resigning is no successor
    deadline = resigned + master_down_interval(1, INTERVAL)
    harness.run_until(deadline - 1)
    assert harness.table.addresses == {VIP_A}
    harness.run_until(deadline)
    assert harness.table.addresses == set()


def test_a_higher_priority_advert_makes_the_master_remove_its_addresses_at_once(
    harness: Harness,
) -> None:
    harness.speaker.apply(speaker_config(instance(VIP_A)))
    harness.take_over()
    harness.hear(200)
    assert harness.state() == "Backup" and harness.table.addresses == set()
    arp_before = len(harness.sent.arp)
    # The rest of the burst was due within 100 ms; the new Master_Down_Timer runs ~340 ms.
    harness.run_until(harness.clock.now + 3 * INTERVAL_US)
    assert harness.state() == "Backup"
    assert len(harness.sent.arp) == arp_before, "the burst ended with Master"


def test_a_reconfigured_master_swaps_its_addresses_and_announces_the_new_set(
    harness: Harness,
) -> None:
    harness.speaker.apply(speaker_config(instance(VIP_A, VIP_B)))
    harness.take_over()
    harness.run_until(harness.clock.now + 10 * INTERVAL_US)  # the takeover's burst is over
    changed = harness.clock.now
    arp_before = len(harness.sent.arp)
    harness.speaker.apply(speaker_config(instance(VIP_B, VIP_C, priority=150)))
    assert harness.table.addresses == {VIP_B, VIP_C}
    assert harness.sent.arp[arp_before:] == [(changed, VIP_B), (changed, VIP_C)]
    assert harness.sent.adverts[-1][0] == changed and harness.sent.adverts[-1][2].priority == 150
    assert harness.state() == "Master"


def test_an_ipv6_takeover_announces_with_unsolicited_neighbor_advertisements(
    harness: Harness,
) -> None:
    harness.speaker.apply(speaker_config(instance(VIP6, family=6)))
    took_over = harness.clock.now + master_down_interval(100, INTERVAL)
    harness.run_until(took_over)
    assert harness.state(family=6) == "Master" and harness.table.addresses == {VIP6}
    harness.run_until(took_over + 10 * INTERVAL_US)
    assert harness.sent.na == [(took_over + n * 50_000, VIP6) for n in range(3)]


# -- the interface carries exactly what the instances hold (issue #18, item 2) -------------


def test_two_masters_swapping_their_addresses_in_one_update_never_drop_one(
    harness: Harness,
) -> None:
    # Each instance gives one address up and takes the other's: whichever is stepped first,
    # the address it gives up is held by the other once the update is done.
    harness.speaker.apply(speaker_config(instance(VIP_A, vrid=1), instance(VIP_B, vrid=2)))
    harness.run_until(harness.clock.now + master_down_interval(100, INTERVAL))
    assert harness.state(1) == harness.state(2) == "Master"
    harness.speaker.apply(speaker_config(instance(VIP_B, vrid=1), instance(VIP_A, vrid=2)))
    assert harness.table.addresses == {VIP_A, VIP_B}
    assert harness.table.removals == []


POOL = tuple(IPv4Address(f"198.18.0.{n}") for n in range(200, 206))
VRIDS = (1, 2, 3, 4)


@dataclass(frozen=True, slots=True)
class Configure:
    """Apply a configuration: POOL[i] goes to VRID owners[i] (0: to no instance)."""

    owners: tuple[int, ...]
    priorities: tuple[int, ...]  # per VRID


@dataclass(frozen=True, slots=True)
class Hear:
    """The peer advertises `vrid` at `priority` now."""

    vrid: int
    priority: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Let `us` pass, firing every timer due."""

    us: int


Op = Configure | Hear | Wait

ops = st.lists(
    st.one_of(
        st.builds(
            Configure,
            owners=st.tuples(*[st.sampled_from((0, *VRIDS)) for _ in POOL]),
            priorities=st.tuples(*[st.integers(1, 254) for _ in VRIDS]),
        ),
        st.builds(Hear, vrid=st.sampled_from(VRIDS), priority=st.integers(0, 255)),
        st.builds(Wait, us=st.integers(0, 1_000_000)),
    ),
    max_size=40,
)


def configure(op: Configure) -> SpeakerConfig:
    return speaker_config(
        *[
            instance(*held, vrid=vrid, priority=op.priorities[vrid - 1])
            for vrid in VRIDS
            if (held := tuple(a for a, owner in zip(POOL, op.owners, strict=True) if owner == vrid))
        ]
    )


def held_by_instances(speaker: Speaker) -> frozenset[IPAddress]:
    runs = [*speaker.running.values(), *speaker.releasing.values()]
    return interface_addresses(run.instance for run in runs)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=ops)
def test_the_interface_always_carries_exactly_what_the_instances_hold(
    tmp_path: Path, sequence: list[Op]
) -> None:
    with harness_on(tmp_path) as h:
        removals = 0

        def check(op: Op) -> None:
            # Not even for a moment: nothing removed while stepping one event is held after it.
            nonlocal removals
            held = held_by_instances(h.speaker)
            assert h.table.addresses == held, (op, h.table.addresses, held)
            removed = set(h.table.removals[removals:])
            assert not removed & held, f"{op}: removed {removed & held}, which is held"
            removals = len(h.table.removals)

        for op in sequence:
            if isinstance(op, Configure):
                h.speaker.apply(configure(op))
            elif isinstance(op, Hear):
                h.hear(op.priority, vrid=op.vrid)
            else:
                h.run_until(h.clock.now + op.us, after_each=functools.partial(check, op))
            check(op)


def test_a_refused_real_time_priority_falls_back_and_is_reported(harness: Harness) -> None:
    # Priority 100 is outside SCHED_RR's 1..99, so the kernel refuses it whatever the
    # process may do, and this process's own scheduling is left as it was.
    granted, refused = _realtime(100)
    assert granted == 0 and refused is not None and "Invalid argument" in refused
    registry = CollectorRegistry()
    metrics = SpeakerMetrics(registry=registry)
    assert parse_status(harness.speaker.status(harness.clock.now)).realtime_priority == 0
    harness.speaker.realtime_priority = 10  # what main() records when SCHED_RR took effect
    metrics.update(parse_status(harness.speaker.status(harness.clock.now)))
    assert registry.get_sample_value("nodelb_speaker_realtime_priority") == 10
    harness.speaker.realtime_priority = 0
    metrics.update(parse_status(harness.speaker.status(harness.clock.now)))
    assert registry.get_sample_value("nodelb_speaker_realtime_priority") == 0
