"""The VRRPv3 state machine of RFC 5798 §6.4 (RFC 9568 §6.4) as data and one pure function.

`step(instance, event) -> (instance, actions)`: states are an Enum, events and actions are
frozen dataclasses, and time arrives inside every event (`now`, integer microseconds on a
monotonic clock, the resolution keepalived uses). Intervals configured or carried on the wire
are centiseconds; deadlines in actions are absolute microseconds on the same clock as `now`.
The I/O layer owns the timers, the socket and the addresses, and performs the returned
actions in order. Of the two protocol timers (Adver_Timer, Master_Down_Timer) at most one
runs at any time: every transition cancels or lets expire the one it leaves behind. The
gratuitous timer (the next round of a burst) runs only in Master, the release timer only in
a resigned instance (Initialize).

Timers (§6.1, §6.2)::

    Skew_Time            = ((256 - Priority) * Master_Adver_Interval) / 256
    Master_Down_Interval = 3 * Master_Adver_Interval + Skew_Time

computed exactly in microseconds (floor). A Backup learns Master_Adver_Interval from every
advert it accepts (§6.4.2). Timer events are honoured only when they are due (`now` at or
past the deadline this instance recorded); an event for a timer that was restarted or
cancelled meanwhile is stale and ignored, so a racing I/O layer cannot cause a takeover.

Beyond the RFC table:

- a Master hearing a lower-ranked Master (a healed partition) advertises at once and re-sends
  its gratuitous announcements instead of discarding the advert silently, and so does a
  Master whose link comes back (`CarrierUp`: the other side may have stepped down unheard);
- `PriorityChanged`: a Master re-advertises at once; Backups just take the new value;
- `Reconfigured`: the configuration changed. A Master removes the addresses it no longer
  has, adds the new ones and announces them, then treats a new priority as `PriorityChanged`;
  every other change takes effect where the RFC next reads it;
- `preempt_delay` (keepalived's meaning: for that long after Startup a Backup does not
  preempt a lower-priority Master);
- `startup_delay` (added to the first Master_Down_Timer after Startup only, so that the
  preferred router wins the first election of a new instance even when it started it a little
  later; nodelb sets it by rank);
- the addresses, which are part of the instance: `AddAddresses(addresses)` on becoming
  Master, `RemoveAddresses(addresses)` on leaving it;
- the gratuitous burst (`Burst`): on becoming Master, on re-announcing after a healed
  partition and when a Master gains addresses, one round at once (`SendGratuitous`), then
  `count - 1` more `spacing_us` apart, each counted from when the I/O layer reports the
  previous round sent (`GratuitousSent`), then one round every `refresh_us` if set
  (`StartGratuitousTimer`, `GratuitousTimerFired`); leaving Master ends it;
- `Resign`, the graceful shutdown: a Master sends the priority-0 advert (§6.4.3) but keeps its
  addresses (`released`) until another router's first non-zero-priority advert for the VRID
  plus one of that router's advert intervals, or, if none comes, one Master_Down_Interval at
  the lowest priority (`StartReleaseTimer`, `ReleaseTimerFired`, then `RemoveAddresses`).
  Removing them with the advert would leave the addresses unheld for Skew_Time plus the time
  the new Master's announcements take to reach the clients. A release runs in Initialize only:
  Startup or Shutdown of a releasing instance ends it first (its addresses go at once).

Every action names what it acts on, so the I/O layer performs it without looking anything
up. Accept_Mode is not modelled (nodelb's rules decide what a held address accepts).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from agent.model.net import IPAddress

OWNER_PRIORITY = 255  # the IP address owner (§5.2.4)
DEFAULT_PRIORITY = 100
DEFAULT_ADVER_INT_CS = 100  # 1 s (§5.2.7's default)
US_PER_CS = 10_000


class State(enum.Enum):
    """The three states of §6.4."""

    INITIALIZE = "Initialize"
    BACKUP = "Backup"
    MASTER = "Master"


# -- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Startup:
    """The instance is enabled (§6.4.1)."""

    now: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The instance is disabled; a Master resigns with a priority-0 advert (§6.4.3)."""

    now: int


@dataclass(frozen=True, slots=True)
class MasterDownTimerFired:
    """The Master_Down_Timer set by the last StartMasterDownTimer expired."""

    now: int


@dataclass(frozen=True, slots=True)
class AdverTimerFired:
    """The Adver_Timer set by the last StartAdverTimer expired."""

    now: int


@dataclass(frozen=True, slots=True)
class AdvertReceived:
    """A valid advert for this VRID arrived from `src` (the sender's primary address).

    The I/O layer has already checked TTL 255, the codec's checks, the VRID, and that `src`
    is a known peer and not this node; `max_adver_int` is in centiseconds.
    """

    now: int
    src: IPAddress
    priority: int
    max_adver_int: int


@dataclass(frozen=True, slots=True)
class PriorityChanged:
    """This router's priority for the VRID is now `priority` (1..255)."""

    now: int
    priority: int

    def __post_init__(self) -> None:
        if not 1 <= self.priority <= OWNER_PRIORITY:
            raise ValueError(f"a router's own priority is 1..255, got {self.priority}")


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """This router's configuration for the VRID is now `config`'s.

    Only `config`'s configuration fields count (everything `VrrpInstance` lists under
    Configuration except `vrid`, the instance's identity); its protocol state is ignored, so
    the I/O layer builds `config` the same way as the instance it starts.
    """

    now: int
    config: VrrpInstance


@dataclass(frozen=True, slots=True)
class GratuitousSent:
    """The I/O layer finished sending the round a SendGratuitous asked for, at `now`.

    The next round is spaced from here, not from when it was asked for: a round that left late
    (a busy CPU, a slow socket) moves the rest of the burst back instead of bunching it up.
    """

    now: int


@dataclass(frozen=True, slots=True)
class GratuitousTimerFired:
    """The timer set by the last StartGratuitousTimer expired: the next round is due."""

    now: int


@dataclass(frozen=True, slots=True)
class Resign:
    """Shut down gracefully: as Shutdown, but a Master keeps its addresses until it is replaced.

    See the module docstring for when a resigned Master releases them.
    """

    now: int


@dataclass(frozen=True, slots=True)
class CarrierUp:
    """The interface's link came back up after it was down (the kernel lost, then regained,
    the carrier). While it was down the segment may have elected another Master, and the
    neighbours followed that one's gratuitous burst."""

    now: int


@dataclass(frozen=True, slots=True)
class ReleaseTimerFired:
    """The timer set by the last StartReleaseTimer expired: a resigned Master lets go."""

    now: int


Event = (
    Startup
    | Shutdown
    | Resign
    | MasterDownTimerFired
    | AdverTimerFired
    | AdvertReceived
    | PriorityChanged
    | Reconfigured
    | GratuitousSent
    | GratuitousTimerFired
    | ReleaseTimerFired
    | CarrierUp
)
EVENT_TYPES: tuple[type[Event], ...] = (
    Startup,
    Shutdown,
    Resign,
    MasterDownTimerFired,
    AdverTimerFired,
    AdvertReceived,
    PriorityChanged,
    Reconfigured,
    GratuitousSent,
    GratuitousTimerFired,
    ReleaseTimerFired,
    CarrierUp,
)

# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendAdvert:
    """Multicast an advert with this priority (0 = resign) and this instance's interval."""

    priority: int


@dataclass(frozen=True, slots=True)
class StartAdverTimer:
    """(Re)start the Adver_Timer to fire at `at` (µs)."""

    at: int


@dataclass(frozen=True, slots=True)
class StartMasterDownTimer:
    """(Re)start the Master_Down_Timer to fire at `at` (µs)."""

    at: int


@dataclass(frozen=True, slots=True)
class CancelTimers:
    """Cancel both timers."""


@dataclass(frozen=True, slots=True)
class AddAddresses:
    """Bind `addresses` to the interface (becoming Master)."""

    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True, slots=True)
class RemoveAddresses:
    """Remove `addresses` from the interface (leaving Master)."""

    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True, slots=True)
class SendGratuitous:
    """Send one round of gratuitous ARP (IPv4) / unsolicited NA (IPv6) for `addresses`.

    When the round has left, the I/O layer steps `GratuitousSent` with the time it did.
    """

    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True, slots=True)
class StartGratuitousTimer:
    """(Re)start the gratuitous timer (the next round of the burst) to fire at `at` (µs)."""

    at: int


@dataclass(frozen=True, slots=True)
class StartReleaseTimer:
    """(Re)start the release timer of a resigned Master to fire at `at` (µs)."""

    at: int


Action = (
    SendAdvert
    | StartAdverTimer
    | StartMasterDownTimer
    | CancelTimers
    | AddAddresses
    | RemoveAddresses
    | SendGratuitous
    | StartGratuitousTimer
    | StartReleaseTimer
)

# -- the instance -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Burst:
    """How a Master announces its addresses (gratuitous ARP / unsolicited NA).

    `count` rounds (at least 1): the first at once, the others `spacing_us` apart, each
    counted from when the previous round left; then, if `refresh_us` is not None, one round
    every `refresh_us` for as long as the instance is Master (switches' FDB and neighbours'
    caches age out).
    """

    count: int = 5
    spacing_us: int = 200_000
    refresh_us: int | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"a burst has at least 1 round, got {self.count}")
        if self.spacing_us < 0:
            raise ValueError(f"burst spacing must be >= 0 µs, got {self.spacing_us}")
        if self.refresh_us is not None and self.refresh_us <= 0:
            raise ValueError(f"refresh must be > 0 µs or None, got {self.refresh_us}")


@dataclass(frozen=True, slots=True)
class VrrpInstance:
    """One virtual router as this node runs it: configuration plus protocol state.

    Configuration: `vrid`, `priority` (1..255; 255 = address owner, which starts as Master),
    `primary_ip` (this node's address on the segment, used for the §6.4.3 tie-break),
    `advertisement_interval` (cs), `preempt`, `preempt_delay` (cs after Startup),
    `startup_delay` (cs added to the first Master_Down_Timer after Startup), `addresses` (the
    virtual addresses, at most 255 and all of one IP version; empty is allowed here),
    `burst` (how a Master announces them).
    State: `state`; `master_adver_interval` (cs; learned from the Master's adverts);
    `adver_timer_at` / `master_down_at` (µs deadlines, None when that timer is not running);
    `started_at` (µs, None before Startup); `master` (the current Master's address as last
    learned, None when unknown; this node's own when it is Master); the burst in progress:
    `gratuitous_left` (rounds of it not yet reported sent, 0 when none) and `gratuitous_at`
    (µs, when the next round is due; None while a round is being sent or none is left); the
    release of a resigned Master: `released` (the addresses it still holds), `release_at` (µs,
    when it lets them go; None when no release runs) and `successor_heard` (another router
    has advertised since the resignation, so the deadline is final).
    """

    vrid: int
    priority: int
    primary_ip: IPAddress
    advertisement_interval: int = DEFAULT_ADVER_INT_CS
    preempt: bool = True
    preempt_delay: int = 0
    startup_delay: int = 0
    addresses: tuple[IPAddress, ...] = ()
    burst: Burst = Burst()
    state: State = State.INITIALIZE
    master_adver_interval: int = DEFAULT_ADVER_INT_CS
    adver_timer_at: int | None = None
    master_down_at: int | None = None
    started_at: int | None = None
    master: IPAddress | None = None
    gratuitous_left: int = 0
    gratuitous_at: int | None = None
    released: tuple[IPAddress, ...] = ()
    release_at: int | None = None
    successor_heard: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.vrid <= 255:
            raise ValueError(f"vrid must be 1..255, got {self.vrid}")
        if not 1 <= self.priority <= OWNER_PRIORITY:
            raise ValueError(f"a router's own priority is 1..255, got {self.priority}")
        if not 1 <= self.advertisement_interval <= 0x0FFF:
            raise ValueError(
                f"advertisement_interval must be 1..4095 cs, got {self.advertisement_interval}"
            )
        if self.preempt_delay < 0:
            raise ValueError(f"preempt_delay must be >= 0, got {self.preempt_delay}")
        if self.startup_delay < 0:
            raise ValueError(f"startup_delay must be >= 0, got {self.startup_delay}")
        # By type, not .version: every replace() runs this, and Masters replace per advert.
        if len(self.addresses) > 255 or len(set(map(type, self.addresses))) > 1:
            raise ValueError(f"at most 255 addresses of one IP version, got {self.addresses}")

    @property
    def skew_time(self) -> int:
        """Return Skew_Time in µs for this priority and the current Master_Adver_Interval."""
        return skew_time(self.priority, self.master_adver_interval)

    @property
    def master_down_interval(self) -> int:
        """Return Master_Down_Interval in µs (3 × Master_Adver_Interval + Skew_Time)."""
        return master_down_interval(self.priority, self.master_adver_interval)

    @property
    def holding(self) -> tuple[IPAddress, ...]:
        """Return the addresses this instance has on the interface (empty when none).

        A Master holds its `addresses`; a resigned Master the `released` ones until it lets go.
        """
        return self.addresses if self.state is State.MASTER else self.released


def interface_addresses(instances: Iterable[VrrpInstance]) -> frozenset[IPAddress]:
    """Return the addresses the interface must carry for `instances`: what any of them holds.

    Empty when none holds anything. Two instances may hold one address for a moment (one
    resigned and releasing it, another Master of it now); it stays while either holds it.
    """
    return frozenset(a for inst in instances for a in inst.holding)


def skew_time(priority: int, master_adver_interval: int) -> int:
    """Return Skew_Time in µs: ((256 - priority) × interval) / 256, interval in cs (§6.1)."""
    return (256 - priority) * master_adver_interval * US_PER_CS // 256


def master_down_interval(priority: int, master_adver_interval: int) -> int:
    """Return Master_Down_Interval in µs: 3 × interval + Skew_Time, interval in cs (§6.1)."""
    return 3 * master_adver_interval * US_PER_CS + skew_time(priority, master_adver_interval)


def wins_over_local(instance: VrrpInstance, event: AdvertReceived) -> bool:
    """Return True when the sender of `event` outranks this router (§6.4.3).

    Higher priority wins; on equal priority the higher primary address (compared as an
    unsigned integer) wins.
    """
    if event.priority != instance.priority:
        return event.priority > instance.priority
    return int(event.src) > int(instance.primary_ip)


# -- the transition function ------------------------------------------------------------------


def step(instance: VrrpInstance, event: Event) -> tuple[VrrpInstance, tuple[Action, ...]]:
    """Return the instance after `event` and the actions to perform, in order (§6.4).

    An empty action tuple with an unchanged instance means the event does not apply in this
    state (a stale timer, a second Startup, an advert while Initialize, a Backup discarding a
    lower-priority advert while preempting); no event raises.
    """
    if isinstance(event, PriorityChanged):
        return _priority_changed(instance, event)
    if isinstance(event, Reconfigured):
        return _reconfigured(instance, event)
    if isinstance(event, GratuitousSent | GratuitousTimerFired):
        return _burst(instance, event)
    if instance.release_at is not None:  # a resigned Master (in Initialize)
        return _releasing(instance, event)
    if instance.state is State.INITIALIZE:
        return _initialize(instance, event)
    if instance.state is State.BACKUP:
        return _backup(instance, event)
    return _master(instance, event)


def _initialize(inst: VrrpInstance, event: Event) -> tuple[VrrpInstance, tuple[Action, ...]]:
    if not isinstance(event, Startup):
        return inst, ()
    now = event.now
    if inst.priority == OWNER_PRIORITY:  # §6.4.1: the address owner starts as Master
        return _become_master(replace(inst, started_at=now), now)
    learned = replace(
        inst,
        state=State.BACKUP,
        started_at=now,
        master_adver_interval=inst.advertisement_interval,
        master=None,
    )
    first = learned.master_down_interval + inst.startup_delay * US_PER_CS
    return _restart_master_down(learned, now + first)


def _backup(inst: VrrpInstance, event: Event) -> tuple[VrrpInstance, tuple[Action, ...]]:
    if isinstance(event, Shutdown | Resign):  # §6.4.2: cancel Master_Down_Timer, to Initialize
        return _stopped(inst), (CancelTimers(),)
    if isinstance(event, MasterDownTimerFired):
        if inst.master_down_at is None or event.now < inst.master_down_at:
            return inst, ()  # stale: the timer was restarted after this one was scheduled
        return _become_master(inst, event.now)
    if isinstance(event, AdvertReceived):
        if event.priority == 0:  # the Master resigned: take over after Skew_Time only
            return _restart_master_down(inst, event.now + inst.skew_time)
        if not _preempting(inst, event.now) or event.priority >= inst.priority:
            learned = replace(inst, master_adver_interval=event.max_adver_int, master=event.src)
            return _restart_master_down(learned, event.now + learned.master_down_interval)
        return inst, ()  # preempting a lower-priority Master: let the down timer run out
    return inst, ()  # Startup while running, or an Adver_Timer that no longer exists


def _master(inst: VrrpInstance, event: Event) -> tuple[VrrpInstance, tuple[Action, ...]]:
    now = event.now
    if isinstance(event, Shutdown):  # §6.4.3: cancel Adver_Timer, resign, to Initialize
        return _stopped(inst), (CancelTimers(), SendAdvert(0), RemoveAddresses(inst.addresses))
    if isinstance(event, Resign):  # the same, keeping the addresses until a successor is up
        at = now + master_down_interval(1, inst.advertisement_interval)
        resigned = replace(_stopped(inst), released=inst.addresses, release_at=at)
        return resigned, (CancelTimers(), SendAdvert(0), StartReleaseTimer(at))
    if isinstance(event, AdverTimerFired):
        if inst.adver_timer_at is None or now < inst.adver_timer_at:
            return inst, ()  # stale
        return _advertise(inst, now)
    if isinstance(event, AdvertReceived):
        if event.priority == 0:  # another router resigned: assert ourselves at once
            return _advertise(inst, now)
        if wins_over_local(inst, event):  # §6.4.3: step down to Backup
            learned = replace(
                inst,
                state=State.BACKUP,
                master_adver_interval=event.max_adver_int,
                master=event.src,
                adver_timer_at=None,
                gratuitous_left=0,
                gratuitous_at=None,
            )
            at = now + learned.master_down_interval
            return replace(learned, master_down_at=at), (
                CancelTimers(),
                RemoveAddresses(inst.addresses),
                StartMasterDownTimer(at),
            )
        # A lower-ranked Master: two Masters, as after a healed partition. §6.4.3 discards
        # the advert; like keepalived we answer at once (it steps down on our advert) and
        # re-announce, because neighbours that followed the other Master still point at it.
        return _reassert(inst, now)
    if isinstance(event, CarrierUp):
        # Our link was down: a backup may have taken over and stepped down again on our
        # first advert without ever sending one we could hear, so the neighbours would keep
        # pointing at it (issue #18, finding 7). Assert ourselves and re-announce at once.
        return _reassert(inst, now)
    return inst, ()  # Startup while running, or a Master_Down_Timer that no longer exists


def _releasing(inst: VrrpInstance, event: Event) -> tuple[VrrpInstance, tuple[Action, ...]]:
    assert inst.release_at is not None
    if isinstance(event, Startup | Shutdown):  # the release ends at once, then the event
        ended = replace(inst, released=(), release_at=None, successor_heard=False)
        removal: tuple[Action, ...] = (RemoveAddresses(inst.released),)
        if isinstance(event, Shutdown):
            return ended, removal
        started, actions = _initialize(ended, event)
        return started, removal + actions
    if isinstance(event, ReleaseTimerFired):
        if event.now < inst.release_at:
            return inst, ()  # stale: a successor's advert moved the deadline
        ended = replace(inst, released=(), release_at=None, successor_heard=False)
        return ended, (RemoveAddresses(inst.released),)
    if isinstance(event, AdvertReceived) and event.priority > 0 and not inst.successor_heard:
        # Another router is Master now and its gratuitous burst follows its first advert. One
        # more of its advert intervals lets the clients' caches move before this node stops
        # answering, so requests in flight still land somewhere.
        at = event.now + event.max_adver_int * US_PER_CS
        return replace(inst, release_at=at, successor_heard=True), (StartReleaseTimer(at),)
    return inst, ()  # resigned already; adverts after the first; other timers


def _priority_changed(
    inst: VrrpInstance, event: PriorityChanged
) -> tuple[VrrpInstance, tuple[Action, ...]]:
    if event.priority == inst.priority:
        return inst, ()
    changed = replace(inst, priority=event.priority)
    if inst.state is State.MASTER:  # tell the Backups now: one may preempt a lowered Master
        return _advertise(changed, event.now)
    return changed, ()


def _reconfigured(
    inst: VrrpInstance, event: Reconfigured
) -> tuple[VrrpInstance, tuple[Action, ...]]:
    new = event.config
    changed = replace(
        inst,
        primary_ip=new.primary_ip,
        advertisement_interval=new.advertisement_interval,
        preempt=new.preempt,
        preempt_delay=new.preempt_delay,
        startup_delay=new.startup_delay,
        addresses=new.addresses,
        burst=new.burst,
    )
    actions: tuple[Action, ...] = ()
    if inst.state is State.MASTER:  # a Backup adds what it holds when it becomes Master
        gone = tuple(a for a in inst.addresses if a not in new.addresses)
        added = tuple(a for a in new.addresses if a not in inst.addresses)
        if gone:
            actions += (RemoveAddresses(gone),)
        if added:  # neighbours learn the new addresses from the announcement, not the advert
            changed, announce = _announce(changed)
            actions += (AddAddresses(added), *announce)
    changed, more = _priority_changed(changed, PriorityChanged(event.now, new.priority))
    return changed, actions + more


def _burst(
    inst: VrrpInstance, event: GratuitousSent | GratuitousTimerFired
) -> tuple[VrrpInstance, tuple[Action, ...]]:
    if inst.state is not State.MASTER:
        return inst, ()  # the burst ended with Master
    now = event.now
    if isinstance(event, GratuitousTimerFired):
        if inst.gratuitous_at is None or now < inst.gratuitous_at:
            return inst, ()  # stale: the burst was restarted or a round is being sent
        return replace(inst, gratuitous_at=None), (SendGratuitous(inst.addresses),)
    if inst.gratuitous_left == 0 or inst.gratuitous_at is not None:
        return inst, ()  # no round was being sent
    left = inst.gratuitous_left - 1
    if left > 0:
        at: int | None = now + inst.burst.spacing_us
    elif inst.burst.refresh_us is not None:
        left, at = 1, now + inst.burst.refresh_us
    else:
        at = None
    return replace(inst, gratuitous_left=left, gratuitous_at=at), (
        () if at is None else (StartGratuitousTimer(at),)
    )


# -- helpers ----------------------------------------------------------------------------------


def _preempting(inst: VrrpInstance, now: int) -> bool:
    if not inst.preempt:
        return False
    started = inst.started_at if inst.started_at is not None else now
    return now >= started + inst.preempt_delay * US_PER_CS


def _become_master(inst: VrrpInstance, now: int) -> tuple[VrrpInstance, tuple[Action, ...]]:
    at = now + inst.advertisement_interval * US_PER_CS
    master = replace(
        inst,
        state=State.MASTER,
        adver_timer_at=at,
        master_down_at=None,
        master=inst.primary_ip,
    )
    master, announce = _announce(master)
    actions: tuple[Action, ...] = (
        SendAdvert(inst.priority),
        AddAddresses(inst.addresses),
        *announce,
        StartAdverTimer(at),
    )
    return master, actions


def _reassert(inst: VrrpInstance, now: int) -> tuple[VrrpInstance, tuple[Action, ...]]:
    """Return a Master that advertises at once and restarts its gratuitous burst."""
    inst, actions = _advertise(inst, now)
    inst, announce = _announce(inst)
    return inst, (*actions, *announce)


def _announce(inst: VrrpInstance) -> tuple[VrrpInstance, tuple[Action, ...]]:
    """Return `inst` at the start of a new burst (replacing any in progress) and its round."""
    started = replace(inst, gratuitous_left=inst.burst.count, gratuitous_at=None)
    return started, (SendGratuitous(inst.addresses),)


def _advertise(inst: VrrpInstance, now: int) -> tuple[VrrpInstance, tuple[Action, ...]]:
    at = now + inst.advertisement_interval * US_PER_CS
    return replace(inst, adver_timer_at=at), (SendAdvert(inst.priority), StartAdverTimer(at))


def _restart_master_down(inst: VrrpInstance, at: int) -> tuple[VrrpInstance, tuple[Action, ...]]:
    return replace(inst, master_down_at=at, adver_timer_at=None), (StartMasterDownTimer(at),)


def _stopped(inst: VrrpInstance) -> VrrpInstance:
    return replace(
        inst,
        state=State.INITIALIZE,
        adver_timer_at=None,
        master_down_at=None,
        started_at=None,
        master=None,
        gratuitous_left=0,
        gratuitous_at=None,
    )
