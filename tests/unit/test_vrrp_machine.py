"""The VRRPv3 state machine against RFC 5798 §6.4, case by case, plus an election simulation.

Every case starts from a hand-built instance (VRID 51, priority 100, 198.18.0.11, interval
100 cs, addresses 198.18.0.200 and .201, unless it says otherwise) and the event arrives at
NOW = 5 s; times are microseconds.
For priority 100 and 100 cs: Skew_Time = 156 × 1 s / 256 = 609 375 µs and
Master_Down_Interval = 3 s + Skew_Time = 3 609 375 µs (§6.1).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.announce.ownership import startup_delay_cs
from agent.announce.vrrp.machine import (
    EVENT_TYPES,
    Action,
    AddAddresses,
    AdverTimerFired,
    AdvertReceived,
    Burst,
    CancelTimers,
    CarrierUp,
    Event,
    GratuitousSent,
    GratuitousTimerFired,
    MasterDownTimerFired,
    PriorityChanged,
    Reconfigured,
    ReleaseTimerFired,
    RemoveAddresses,
    Resign,
    SendAdvert,
    SendGratuitous,
    Shutdown,
    StartAdverTimer,
    StartGratuitousTimer,
    StartMasterDownTimer,
    StartReleaseTimer,
    Startup,
    State,
    VrrpInstance,
    interface_addresses,
    master_down_interval,
    skew_time,
    step,
)

SELF = IPv4Address("198.18.0.11")
HIGHER_IP = IPv4Address("198.18.0.12")
LOWER_IP = IPv4Address("198.18.0.10")
VIPS = (IPv4Address("198.18.0.200"), IPv4Address("198.18.0.201"))
NEW_VIP = IPv4Address("198.18.0.202")
NOW = 5_000_000
SECOND = 1_000_000
SKEW = 609_375
MDI = 3_609_375
BECOME_MASTER = (
    SendAdvert(100),
    AddAddresses(VIPS),
    SendGratuitous(VIPS),
    StartAdverTimer(NOW + SECOND),
)

INIT = VrrpInstance(vrid=51, priority=100, primary_ip=SELF, addresses=VIPS)
BACKUP = replace(INIT, state=State.BACKUP, started_at=0, master_down_at=NOW, master=HIGHER_IP)
MASTER = replace(INIT, state=State.MASTER, started_at=0, adver_timer_at=NOW, master=SELF)
# The default burst (5 rounds, 200 ms apart): its first round is being sent, or the third is due.
SENDING = replace(MASTER, gratuitous_left=5)
WAITING = replace(MASTER, gratuitous_left=3, gratuitous_at=NOW)
SPACING = 200_000
# A resigned Master keeps its addresses for Master_Down_Interval at priority 1 at most:
# 3 s + 255 × 1 s / 256 = 3 996 093 µs, unless a successor's advert comes first.
RELEASE = 3_996_093
RESIGNED = replace(INIT, released=VIPS, release_at=NOW + RELEASE)


def advert(priority: int, *, src: IPv4Address = HIGHER_IP, interval: int = 100) -> AdvertReceived:
    return AdvertReceived(now=NOW, src=src, priority=priority, max_adver_int=interval)


# -- the RFC table ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """What §6.4 (or, where it is silent, this implementation) says for one (state, event)."""

    targets: frozenset[State]
    text: str


def rule(text: str, *targets: State) -> Rule:
    return Rule(frozenset(targets), text)


IN, BK, MS = State.INITIALIZE, State.BACKUP, State.MASTER
RFC_TABLE: dict[tuple[State, type[Event]], Rule] = {
    (IN, Startup): rule(
        "§6.4.1: owner (255) -> Master with advert+ARP; else -> Backup (a release ends first)",
        BK,
        MS,
    ),
    (IN, Shutdown): rule("not in §6.4.1: already stopped; a release ends at once", IN),
    (IN, Resign): rule("already stopped (or resigned): nothing to do", IN),
    (IN, MasterDownTimerFired): rule("no timer runs in Initialize: ignored", IN),
    (IN, AdverTimerFired): rule("no timer runs in Initialize: ignored", IN),
    (IN, AdvertReceived): rule(
        "§6.4.1 lists only Startup: ignored, but a successor's first advert sets the release", IN
    ),
    (IN, PriorityChanged): rule("configuration only: takes effect at Startup", IN),
    (IN, Reconfigured): rule("configuration only: takes effect at Startup", IN),
    (IN, GratuitousSent): rule("no burst runs in Initialize: ignored", IN),
    (IN, GratuitousTimerFired): rule("no burst runs in Initialize: ignored", IN),
    (IN, ReleaseTimerFired): rule("a resigned Master removes what it kept; else ignored", IN),
    (IN, CarrierUp): rule("nothing announced in Initialize: ignored", IN),
    (BK, Startup): rule("already started: ignored", BK),
    (BK, Shutdown): rule("§6.4.2: cancel Master_Down_Timer, -> Initialize", IN),
    (BK, Resign): rule("as Shutdown (§6.4.2): a Backup holds nothing to keep", IN),
    (BK, MasterDownTimerFired): rule("§6.4.2: advert, ARP/NA, Adver_Timer, -> Master", MS, BK),
    (BK, AdverTimerFired): rule("no Adver_Timer runs in Backup: ignored", BK),
    (BK, AdvertReceived): rule("§6.4.2: prio 0 -> Skew_Time; accept or discard by preempt", BK),
    (BK, PriorityChanged): rule("new priority used by the next timer computation", BK),
    (BK, Reconfigured): rule("recorded; a Backup holds no address to change", BK),
    (BK, GratuitousSent): rule("a burst ends with Master: ignored", BK),
    (BK, GratuitousTimerFired): rule("a burst ends with Master: ignored", BK),
    (BK, ReleaseTimerFired): rule("no release runs in Backup: ignored", BK),
    (BK, CarrierUp): rule("a Backup announces nothing: its down timer decides", BK),
    (MS, Startup): rule("already started: ignored", MS),
    (MS, Shutdown): rule("§6.4.3: cancel Adver_Timer, advert priority 0, -> Initialize", IN),
    (MS, Resign): rule("§6.4.3 keeping the addresses until a successor is up, -> Initialize", IN),
    (MS, MasterDownTimerFired): rule("no Master_Down_Timer runs in Master: ignored", MS),
    (MS, AdverTimerFired): rule("§6.4.3: send advert, reset Adver_Timer", MS),
    (MS, AdvertReceived): rule(
        "§6.4.3: prio 0 -> advert; higher (or tie, higher IP) -> Backup", MS, BK
    ),
    (MS, PriorityChanged): rule("re-advertise at once with the new priority", MS),
    (MS, Reconfigured): rule("swap changed addresses, announce new ones, then as priority", MS),
    (MS, GratuitousSent): rule("next round `spacing` after this one left, then refresh", MS),
    (MS, GratuitousTimerFired): rule("the next round of the burst is due: send it", MS),
    (MS, ReleaseTimerFired): rule("no release runs in Master: ignored", MS),
    (MS, CarrierUp): rule("not in the RFC: advertise at once and re-announce", MS),
}


@dataclass(frozen=True, slots=True)
class Case:
    before: VrrpInstance
    event: Event
    state: State
    actions: tuple[Action, ...] = ()
    after: tuple[tuple[str, object], ...] = ()  # fields of the resulting instance to check


CASES = [
    # Initialize
    pytest.param(
        Case(INIT, Startup(NOW), BK, (StartMasterDownTimer(NOW + MDI),)),
        id="startup of a non-owner goes to Backup with the Master_Down_Timer at 3 intervals + skew",
    ),
    pytest.param(
        Case(
            replace(INIT, priority=150, advertisement_interval=10),
            Startup(NOW),
            BK,
            (StartMasterDownTimer(NOW + 300_000 + 41_406),),
            (("master_adver_interval", 10), ("started_at", NOW)),
        ),
        id="startup with keepalived's 0.1 s interval at priority 150: skew 41 406 us",
    ),
    pytest.param(
        Case(
            replace(INIT, startup_delay=200),
            Startup(NOW),
            BK,
            (StartMasterDownTimer(NOW + MDI + 2 * SECOND),),
            (("startup_delay", 200),),
        ),
        id="a startup delay (2 s) lengthens the first Master_Down_Timer only",
    ),
    pytest.param(
        Case(
            replace(INIT, priority=255),
            Startup(NOW),
            MS,
            (
                SendAdvert(255),
                AddAddresses(VIPS),
                SendGratuitous(VIPS),
                StartAdverTimer(NOW + SECOND),
            ),
            (("master", SELF), ("adver_timer_at", NOW + SECOND)),
        ),
        id="startup of the address owner (255) goes straight to Master and announces",
    ),
    pytest.param(Case(INIT, Shutdown(NOW), IN), id="shutdown while stopped does nothing"),
    pytest.param(
        Case(INIT, MasterDownTimerFired(NOW), IN), id="a down timer while stopped is ignored"
    ),
    pytest.param(
        Case(INIT, AdverTimerFired(NOW), IN), id="an adver timer while stopped is ignored"
    ),
    pytest.param(Case(INIT, advert(200), IN), id="an advert while stopped is ignored"),
    pytest.param(Case(INIT, Resign(NOW), IN), id="resigning while stopped does nothing"),
    pytest.param(
        Case(INIT, ReleaseTimerFired(NOW), IN), id="a release timer while stopped is ignored"
    ),
    pytest.param(
        Case(RESIGNED, Resign(NOW), IN), id="resigning again while releasing changes nothing"
    ),
    pytest.param(
        Case(
            RESIGNED,
            advert(200, interval=50),
            IN,
            (StartReleaseTimer(NOW + 500_000),),
            (("release_at", NOW + 500_000), ("successor_heard", True), ("released", VIPS)),
        ),
        id="a successor's first advert moves the release to one of its intervals from now",
    ),
    pytest.param(
        Case(
            RESIGNED,
            advert(50, interval=50),
            IN,
            (StartReleaseTimer(NOW + 500_000),),
            (("release_at", NOW + 500_000), ("successor_heard", True)),
        ),
        id="any non-zero priority is a successor: the release does not wait for a better one",
    ),
    pytest.param(
        Case(replace(RESIGNED, successor_heard=True), advert(200), IN),
        id="the successor's later adverts do not move the release again",
    ),
    pytest.param(
        Case(RESIGNED, advert(0), IN),
        id="another router resigning is no successor: the release keeps its deadline",
    ),
    pytest.param(
        Case(
            replace(RESIGNED, release_at=NOW),
            ReleaseTimerFired(NOW),
            IN,
            (RemoveAddresses(VIPS),),
            (("released", ()), ("release_at", None), ("successor_heard", False)),
        ),
        id="the release timer removes what the resigned Master kept",
    ),
    pytest.param(
        Case(RESIGNED, ReleaseTimerFired(NOW), IN),
        id="a stale release timer (a successor moved the deadline) is ignored",
    ),
    pytest.param(
        Case(RESIGNED, MasterDownTimerFired(NOW), IN),
        id="a protocol timer while releasing is ignored",
    ),
    pytest.param(
        Case(
            RESIGNED,
            Startup(NOW),
            BK,
            (RemoveAddresses(VIPS), StartMasterDownTimer(NOW + MDI)),
            (("released", ()), ("release_at", None)),
        ),
        id="a startup while releasing ends the release at once, then starts as a Backup",
    ),
    pytest.param(
        Case(
            RESIGNED,
            Shutdown(NOW),
            IN,
            (RemoveAddresses(VIPS),),
            (("released", ()), ("release_at", None)),
        ),
        id="a shutdown while releasing removes the kept addresses at once",
    ),
    pytest.param(
        Case(
            RESIGNED,
            Reconfigured(NOW, replace(INIT, addresses=(NEW_VIP,))),
            IN,
            (),
            (("addresses", (NEW_VIP,)), ("released", VIPS), ("release_at", NOW + RELEASE)),
        ),
        id="a reconfiguration while releasing is recorded; the release keeps what it kept",
    ),
    pytest.param(Case(INIT, GratuitousSent(NOW), IN), id="a round sent while stopped is ignored"),
    pytest.param(
        Case(INIT, GratuitousTimerFired(NOW), IN), id="a gratuitous timer while stopped is ignored"
    ),
    pytest.param(
        Case(INIT, PriorityChanged(NOW, 120), IN, (), (("priority", 120),)),
        id="a priority change while stopped is only recorded",
    ),
    pytest.param(
        Case(
            INIT,
            Reconfigured(
                NOW, replace(INIT, priority=120, advertisement_interval=10, addresses=(NEW_VIP,))
            ),
            IN,
            (),
            (("priority", 120), ("advertisement_interval", 10), ("addresses", (NEW_VIP,))),
        ),
        id="a reconfiguration while stopped is only recorded",
    ),
    # Backup
    pytest.param(Case(BACKUP, Startup(NOW), BK), id="a second startup in Backup is ignored"),
    pytest.param(
        Case(
            BACKUP,
            Resign(NOW),
            IN,
            (CancelTimers(),),
            (("master_down_at", None), ("release_at", None), ("released", ())),
        ),
        id="resigning in Backup is a shutdown: it holds nothing to keep",
    ),
    pytest.param(
        Case(BACKUP, ReleaseTimerFired(NOW), BK), id="a release timer in Backup is ignored"
    ),
    pytest.param(
        Case(BACKUP, Shutdown(NOW), IN, (CancelTimers(),), (("master_down_at", None),)),
        id="shutdown in Backup cancels the timer and goes to Initialize",
    ),
    pytest.param(
        Case(BACKUP, MasterDownTimerFired(NOW), MS, BECOME_MASTER, (("master", SELF),)),
        id="the Master_Down_Timer firing in Backup takes over: advert, addresses, ARP, timer",
    ),
    pytest.param(
        Case(
            BACKUP,
            MasterDownTimerFired(NOW),
            MS,
            BECOME_MASTER,
            (("gratuitous_left", 5), ("gratuitous_at", None)),
        ),
        id="a takeover starts a burst of `count` rounds with its first round being sent",
    ),
    pytest.param(
        Case(replace(BACKUP, gratuitous_left=2), GratuitousSent(NOW), BK),
        id="a round reported sent in Backup is ignored: the burst ended with Master",
    ),
    pytest.param(
        Case(replace(BACKUP, gratuitous_at=NOW), GratuitousTimerFired(NOW), BK),
        id="a gratuitous timer in Backup is ignored",
    ),
    pytest.param(
        Case(replace(BACKUP, master_down_at=NOW + 1), MasterDownTimerFired(NOW), BK),
        id="a stale Master_Down_Timer (restarted since) does not take over",
    ),
    pytest.param(Case(BACKUP, AdverTimerFired(NOW), BK), id="an adver timer in Backup is ignored"),
    pytest.param(
        Case(BACKUP, advert(0), BK, (StartMasterDownTimer(NOW + SKEW),)),
        id="a priority-0 advert in Backup sets the down timer to Skew_Time",
    ),
    pytest.param(
        Case(
            BACKUP,
            advert(200, interval=50),
            BK,
            (StartMasterDownTimer(NOW + 1_500_000 + 304_687),),
            (("master_adver_interval", 50), ("master", HIGHER_IP)),
        ),
        id="a higher-priority advert in Backup teaches its interval and resets the down timer",
    ),
    pytest.param(
        Case(BACKUP, advert(100, src=LOWER_IP), BK, (StartMasterDownTimer(NOW + MDI),)),
        id="an equal-priority advert in Backup is accepted whatever the address",
    ),
    pytest.param(
        Case(BACKUP, advert(50), BK),
        id="a lower-priority advert in Backup is discarded when preempting",
    ),
    pytest.param(
        Case(replace(BACKUP, preempt=False), advert(50), BK, (StartMasterDownTimer(NOW + MDI),)),
        id="a lower-priority advert in Backup is accepted when preemption is off",
    ),
    pytest.param(
        Case(
            replace(BACKUP, preempt_delay=1000), advert(50), BK, (StartMasterDownTimer(NOW + MDI),)
        ),
        id="a lower-priority advert is accepted during the preempt delay after startup",
    ),
    pytest.param(
        Case(replace(BACKUP, preempt_delay=500), advert(50), BK),
        id="a lower-priority advert is discarded once the preempt delay has passed",
    ),
    pytest.param(
        Case(BACKUP, PriorityChanged(NOW, 200), BK, (), (("priority", 200),)),
        id="a priority change in Backup is recorded without actions",
    ),
    pytest.param(
        Case(
            BACKUP,
            Reconfigured(NOW, replace(INIT, priority=200, preempt=False, addresses=(NEW_VIP,))),
            BK,
            (),
            (
                ("priority", 200),
                ("preempt", False),
                ("addresses", (NEW_VIP,)),
                ("master_down_at", NOW),
            ),
        ),
        id="a reconfiguration in Backup is recorded without actions: it holds no address yet",
    ),
    pytest.param(
        Case(
            BACKUP,
            Reconfigured(NOW, replace(MASTER, vrid=52, master=LOWER_IP)),
            BK,
            (),
            (("vrid", 51), ("state", BK), ("master", HIGHER_IP), ("master_down_at", NOW)),
        ),
        id="only the configuration of a reconfiguration counts: its VRID and state are ignored",
    ),
    # Master
    pytest.param(Case(MASTER, Startup(NOW), MS), id="a second startup in Master is ignored"),
    pytest.param(
        Case(
            MASTER,
            Resign(NOW),
            IN,
            (CancelTimers(), SendAdvert(0), StartReleaseTimer(NOW + RELEASE)),
            (
                ("released", VIPS),
                ("release_at", NOW + RELEASE),
                ("successor_heard", False),
                ("adver_timer_at", None),
                ("master", None),
            ),
        ),
        id="resigning in Master sends priority 0 but keeps the addresses until released",
    ),
    pytest.param(
        Case(
            replace(WAITING, advertisement_interval=10),
            Resign(NOW),
            IN,
            (CancelTimers(), SendAdvert(0), StartReleaseTimer(NOW + 300_000 + 99_609)),
            (("gratuitous_left", 0), ("gratuitous_at", None), ("released", VIPS)),
        ),
        id="a resigning Master's own interval sets the deadline, and its burst ends",
    ),
    pytest.param(
        Case(MASTER, ReleaseTimerFired(NOW), MS), id="a release timer in Master is ignored"
    ),
    pytest.param(
        Case(
            MASTER,
            Shutdown(NOW),
            IN,
            (CancelTimers(), SendAdvert(0), RemoveAddresses(VIPS)),
            (("adver_timer_at", None), ("master", None)),
        ),
        id="shutdown in Master resigns with priority 0 and removes the addresses",
    ),
    pytest.param(
        Case(MASTER, MasterDownTimerFired(NOW), MS), id="a down timer in Master is ignored"
    ),
    pytest.param(
        Case(
            MASTER,
            AdverTimerFired(NOW),
            MS,
            (SendAdvert(100), StartAdverTimer(NOW + SECOND)),
            (("adver_timer_at", NOW + SECOND),),
        ),
        id="the Adver_Timer in Master sends an advert and restarts",
    ),
    pytest.param(
        Case(replace(MASTER, adver_timer_at=NOW + 1), AdverTimerFired(NOW), MS),
        id="a stale Adver_Timer in Master is ignored",
    ),
    pytest.param(
        Case(MASTER, advert(0), MS, (SendAdvert(100), StartAdverTimer(NOW + SECOND))),
        id="a priority-0 advert in Master is answered with an advert at once",
    ),
    pytest.param(
        Case(
            MASTER,
            advert(200, interval=50),
            BK,
            (
                CancelTimers(),
                RemoveAddresses(VIPS),
                StartMasterDownTimer(NOW + 1_500_000 + 304_687),
            ),
            (("master", HIGHER_IP), ("master_adver_interval", 50), ("adver_timer_at", None)),
        ),
        id="a higher-priority advert in Master steps down, learning the sender's interval",
    ),
    pytest.param(
        Case(
            MASTER,
            advert(100, src=HIGHER_IP),
            BK,
            (CancelTimers(), RemoveAddresses(VIPS), StartMasterDownTimer(NOW + MDI)),
        ),
        id="an equal-priority advert from a higher primary address in Master steps down",
    ),
    pytest.param(
        Case(
            MASTER,
            advert(100, src=LOWER_IP),
            MS,
            (SendAdvert(100), StartAdverTimer(NOW + SECOND), SendGratuitous(VIPS)),
        ),
        id="an equal-priority Master with a lower address is answered at once and re-announced",
    ),
    pytest.param(
        Case(
            MASTER,
            advert(50),
            MS,
            (SendAdvert(100), StartAdverTimer(NOW + SECOND), SendGratuitous(VIPS)),
        ),
        id="a lower-priority Master (a healed partition) is answered at once and re-announced",
    ),
    pytest.param(
        Case(
            MASTER,
            CarrierUp(NOW),
            MS,
            (SendAdvert(100), StartAdverTimer(NOW + SECOND), SendGratuitous(VIPS)),
            (("gratuitous_left", 5), ("adver_timer_at", NOW + SECOND)),
        ),
        id="a Master whose link comes back advertises at once and re-announces its addresses",
    ),
    pytest.param(
        Case(BACKUP, CarrierUp(NOW), BK),
        id="a Backup whose link comes back waits for its down timer",
    ),
    pytest.param(Case(INIT, CarrierUp(NOW), IN), id="the link coming back while stopped"),
    pytest.param(
        Case(
            WAITING,
            advert(50),
            MS,
            (SendAdvert(100), StartAdverTimer(NOW + SECOND), SendGratuitous(VIPS)),
            (("gratuitous_left", 5), ("gratuitous_at", None)),
        ),
        id="a healed partition's re-announcement restarts the burst from its first round",
    ),
    pytest.param(
        Case(
            WAITING,
            advert(200),
            BK,
            (CancelTimers(), RemoveAddresses(VIPS), StartMasterDownTimer(NOW + MDI)),
            (("gratuitous_left", 0), ("gratuitous_at", None)),
        ),
        id="stepping down ends the burst: no more rounds for addresses no longer held",
    ),
    pytest.param(
        Case(
            WAITING,
            Shutdown(NOW),
            IN,
            (CancelTimers(), SendAdvert(0), RemoveAddresses(VIPS)),
            (("gratuitous_left", 0), ("gratuitous_at", None)),
        ),
        id="a shutdown ends the burst",
    ),
    pytest.param(
        Case(
            SENDING,
            GratuitousSent(NOW),
            MS,
            (StartGratuitousTimer(NOW + SPACING),),
            (("gratuitous_left", 4), ("gratuitous_at", NOW + SPACING)),
        ),
        id="a round reported sent schedules the next one `spacing` after it left",
    ),
    pytest.param(
        Case(
            replace(SENDING, gratuitous_left=3, burst=Burst(count=3, spacing_us=0)),
            GratuitousSent(NOW),
            MS,
            (StartGratuitousTimer(NOW),),
            (("gratuitous_left", 2), ("gratuitous_at", NOW)),
        ),
        id="with no spacing the next round is due as soon as the previous one left",
    ),
    pytest.param(
        Case(
            replace(SENDING, gratuitous_left=1),
            GratuitousSent(NOW),
            MS,
            (),
            (("gratuitous_left", 0), ("gratuitous_at", None)),
        ),
        id="the last round reported sent ends the burst when there is no refresh",
    ),
    pytest.param(
        Case(
            replace(SENDING, gratuitous_left=1, burst=Burst(refresh_us=30 * SECOND)),
            GratuitousSent(NOW),
            MS,
            (StartGratuitousTimer(NOW + 30 * SECOND),),
            (("gratuitous_left", 1), ("gratuitous_at", NOW + 30 * SECOND)),
        ),
        id="after the last round a refresh is one more round every `refresh`",
    ),
    pytest.param(
        Case(WAITING, GratuitousSent(NOW), MS),
        id="a round reported sent while none is being sent is ignored",
    ),
    pytest.param(
        Case(MASTER, GratuitousSent(NOW), MS),
        id="a round reported sent after the burst ended is ignored",
    ),
    pytest.param(
        Case(
            WAITING,
            GratuitousTimerFired(NOW),
            MS,
            (SendGratuitous(VIPS),),
            (("gratuitous_left", 3), ("gratuitous_at", None)),
        ),
        id="the gratuitous timer in Master sends the next round",
    ),
    pytest.param(
        Case(replace(WAITING, gratuitous_at=NOW + 1), GratuitousTimerFired(NOW), MS),
        id="a stale gratuitous timer in Master is ignored",
    ),
    pytest.param(
        Case(SENDING, GratuitousTimerFired(NOW), MS),
        id="a gratuitous timer while a round is being sent is ignored (the burst restarted)",
    ),
    pytest.param(
        Case(
            MASTER,
            PriorityChanged(NOW, 150),
            MS,
            (SendAdvert(150), StartAdverTimer(NOW + SECOND)),
            (("priority", 150),),
        ),
        id="a priority change in Master is advertised at once",
    ),
    pytest.param(
        Case(MASTER, PriorityChanged(NOW, 100), MS),
        id="a priority 'change' to the same value in Master does nothing",
    ),
    pytest.param(
        Case(
            MASTER,
            Reconfigured(NOW, replace(INIT, addresses=(VIPS[1], NEW_VIP))),
            MS,
            (
                RemoveAddresses((VIPS[0],)),
                AddAddresses((NEW_VIP,)),
                SendGratuitous((VIPS[1], NEW_VIP)),
            ),
            (("addresses", (VIPS[1], NEW_VIP)), ("adver_timer_at", NOW)),
        ),
        id="a Master whose addresses change removes the old, adds the new and announces all",
    ),
    pytest.param(
        Case(
            WAITING,
            Reconfigured(NOW, replace(INIT, addresses=(*VIPS, NEW_VIP), burst=Burst(count=2))),
            MS,
            (AddAddresses((NEW_VIP,)), SendGratuitous((*VIPS, NEW_VIP))),
            (("gratuitous_left", 2), ("gratuitous_at", None), ("burst", Burst(count=2))),
        ),
        id="a Master's new addresses restart the burst, with the new burst settings",
    ),
    pytest.param(
        Case(
            WAITING,
            Reconfigured(NOW, replace(INIT, burst=Burst(spacing_us=50_000))),
            MS,
            (),
            (("gratuitous_left", 3), ("gratuitous_at", NOW), ("burst", Burst(spacing_us=50_000))),
        ),
        id="new burst settings alone apply from the next round on; the due one stays due",
    ),
    pytest.param(
        Case(
            MASTER,
            Reconfigured(NOW, replace(INIT, addresses=(VIPS[0],))),
            MS,
            (RemoveAddresses((VIPS[1],)),),
            (("addresses", (VIPS[0],)),),
        ),
        id="a Master that loses an address only removes it: there is nothing new to announce",
    ),
    pytest.param(
        Case(
            MASTER,
            Reconfigured(NOW, replace(INIT, priority=150)),
            MS,
            (SendAdvert(150), StartAdverTimer(NOW + SECOND)),
            (("priority", 150),),
        ),
        id="a Master's reconfigured priority is advertised at once, as a priority change is",
    ),
    pytest.param(
        Case(
            MASTER,
            Reconfigured(NOW, replace(INIT, priority=150, addresses=(NEW_VIP,))),
            MS,
            (
                RemoveAddresses(VIPS),
                AddAddresses((NEW_VIP,)),
                SendGratuitous((NEW_VIP,)),
                SendAdvert(150),
                StartAdverTimer(NOW + SECOND),
            ),
            (("priority", 150), ("addresses", (NEW_VIP,))),
        ),
        id="a Master reconfigured in both first swaps the addresses, then advertises the priority",
    ),
    pytest.param(
        Case(
            MASTER,
            Reconfigured(
                NOW, replace(INIT, advertisement_interval=10, preempt=False, startup_delay=100)
            ),
            MS,
            (),
            (("advertisement_interval", 10), ("preempt", False), ("adver_timer_at", NOW)),
        ),
        id="a Master's new interval and preempt settings wait for the next advert",
    ),
    pytest.param(
        Case(
            MASTER,
            Reconfigured(NOW, replace(INIT, addresses=(VIPS[1], VIPS[0]))),
            MS,
            (),
            (("addresses", (VIPS[1], VIPS[0])),),
        ),
        id="a Master whose addresses are only reordered has nothing to add, remove or announce",
    ),
    pytest.param(
        Case(MASTER, Reconfigured(NOW, INIT), MS),
        id="a reconfiguration to the same configuration in Master does nothing",
    ),
]


def _pair(case: Case) -> tuple[State, type[Event]]:
    return case.before.state, type(case.event)


def test_every_state_event_pair_has_an_rfc_rule_and_a_case() -> None:
    covered = {_pair(p.values[0]) for p in CASES if isinstance(p.values[0], Case)}
    missing_rule = [
        (s, e.__name__) for s, e in itertools.product(State, EVENT_TYPES) if (s, e) not in RFC_TABLE
    ]
    missing_case = [
        (s, e.__name__) for s, e in itertools.product(State, EVENT_TYPES) if (s, e) not in covered
    ]
    assert not missing_rule, f"pairs without an RFC rule: {missing_rule}"
    assert not missing_case, f"pairs without a case: {missing_case}"
    assert len(RFC_TABLE) == len(State) * len(EVENT_TYPES)


@pytest.mark.parametrize("case", CASES)
def test_step_follows_the_rfc_table(case: Case) -> None:
    after, actions = step(case.before, case.event)
    mismatches = []
    table = RFC_TABLE[_pair(case)]
    if after.state not in table.targets:
        mismatches.append(f"state {after.state} is not allowed by the rule: {table.text}")
    if after.state is not case.state:
        mismatches.append(f"state {after.state}, expected {case.state}")
    if actions != case.actions:
        mismatches.append(f"actions {actions}, expected {case.actions}")
    for name, value in case.after:
        if getattr(after, name) != value:
            mismatches.append(f"{name} = {getattr(after, name)!r}, expected {value!r}")
    if not actions and case.after == () and after != case.before:
        mismatches.append(f"a no-op changed the instance: {after}")
    assert not mismatches, mismatches


def test_a_burst_counts_each_spacing_from_when_the_previous_round_left() -> None:
    # An I/O layer whose timers fire 1 ms late and whose rounds take 7 ms to leave.
    inst = replace(BACKUP, burst=Burst(count=3, spacing_us=SPACING, refresh_us=SECOND))
    inst, actions = step(inst, MasterDownTimerFired(NOW))
    sent: list[int] = []
    now = NOW
    for _ in range(5):
        assert SendGratuitous(VIPS) in actions, actions
        now += 7_000
        sent.append(now)
        inst, actions = step(inst, GratuitousSent(now))
        (timer,) = actions
        assert isinstance(timer, StartGratuitousTimer)
        now = timer.at + 1_000
        inst, actions = step(inst, GratuitousTimerFired(now))
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    # Two spacings complete the burst of three, then the refresh goes on.
    assert gaps == [SPACING + 8_000, SPACING + 8_000, SECOND + 8_000, SECOND + 8_000]
    inst, _ = step(inst, GratuitousSent(now + 7_000))
    assert inst.gratuitous_at is not None
    due = inst.gratuitous_at
    inst, _ = step(inst, replace(advert(200), now=now))  # a higher priority takes over
    assert step(inst, GratuitousTimerFired(due)) == (inst, ())


def test_the_interface_carries_what_masters_and_releasing_instances_hold() -> None:
    other = replace(BACKUP, vrid=52, addresses=(NEW_VIP,))
    assert [i.holding for i in (INIT, BACKUP, MASTER, RESIGNED, other)] == [(), (), VIPS, VIPS, ()]
    moved = replace(MASTER, vrid=53, addresses=(VIPS[0], NEW_VIP))
    assert interface_addresses([RESIGNED, other, moved]) == {*VIPS, NEW_VIP}
    assert interface_addresses([INIT, other]) == frozenset()


def test_timer_formulas_match_section_6_1() -> None:
    assert skew_time(100, 100) == SKEW
    assert master_down_interval(100, 100) == MDI
    assert skew_time(255, 100) == 3_906  # 1 s / 256, floored to the microsecond
    assert skew_time(1, 4095) == 255 * 4095 * 10_000 // 256
    assert master_down_interval(254, 1) == 30_000 + 2 * 10_000 // 256


def test_invalid_own_priorities_are_refused() -> None:
    for bad in (0, 256):
        with pytest.raises(ValueError):
            PriorityChanged(NOW, bad)
        with pytest.raises(ValueError):
            VrrpInstance(vrid=1, priority=bad, primary_ip=SELF)
    with pytest.raises(ValueError):
        VrrpInstance(vrid=0, priority=100, primary_ip=SELF)
    with pytest.raises(ValueError):
        VrrpInstance(vrid=1, priority=100, primary_ip=SELF, advertisement_interval=0)
    for bad_burst in ({"count": 0}, {"spacing_us": -1}, {"refresh_us": 0}):
        with pytest.raises(ValueError):
            Burst(**bad_burst)
    with pytest.raises(ValueError):  # one instance, one family (RFC 5798 §7.3)
        VrrpInstance(vrid=1, priority=100, primary_ip=SELF, addresses=(SELF, IPv6Address("::1")))


# -- the election, simulated ------------------------------------------------------------------


@dataclass
class Sim:
    """Instances exchanging adverts over a shared segment with a fake clock (µs).

    Every advert reaches every other instance after `latency`. Each instance has the two
    timers of an I/O layer; a restarted or cancelled timer never fires (a generation
    counter), and the sim checks that at most one of them runs at a time.
    """

    nodes: list[VrrpInstance]
    latency: int
    queue: list[tuple[int, int, int, Event, int]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)
    adver_gen: list[int] = field(default_factory=list)
    down_gen: list[int] = field(default_factory=list)
    running: list[set[str]] = field(default_factory=list)
    takeovers: list[int] = field(default_factory=list)  # AddAddresses per node
    held: list[set[IPv4Address | IPv6Address]] = field(default_factory=list)  # per node
    release_gen: list[int] = field(default_factory=list)
    now: int = 0

    def __post_init__(self) -> None:
        n = len(self.nodes)
        self.adver_gen, self.down_gen, self.release_gen = [0] * n, [0] * n, [0] * n
        self.running = [set() for _ in range(n)]
        self.takeovers = [0] * n
        self.held = [set() for _ in range(n)]

    def at(self, when: int, node: int, event: Event, gen: int = -1) -> None:
        heapq.heappush(self.queue, (when, next(self.seq), node, event, gen))

    def run_until(self, until: int) -> None:
        while self.queue and self.queue[0][0] <= until:
            when, _, k, event, gen = heapq.heappop(self.queue)
            self.now = when
            if isinstance(event, AdverTimerFired) and gen != self.adver_gen[k]:
                continue
            if isinstance(event, MasterDownTimerFired) and gen != self.down_gen[k]:
                continue
            if isinstance(event, ReleaseTimerFired) and gen != self.release_gen[k]:
                continue
            if isinstance(event, AdverTimerFired | MasterDownTimerFired):
                self.running[k].discard(type(event).__name__)
            self.nodes[k], actions = step(self.nodes[k], event)
            for action in actions:
                self.perform(k, action)
            assert len(self.running[k]) <= 1, f"node {k} runs both timers"
            assert self.held[k] == set(self.nodes[k].holding), f"node {k}: {self.nodes[k]}"
        self.now = until

    def perform(self, k: int, action: Action) -> None:
        node = self.nodes[k]
        if isinstance(action, SendAdvert):
            for other in range(len(self.nodes)):
                if other != k:
                    received = AdvertReceived(
                        now=self.now + self.latency,
                        src=node.primary_ip,
                        priority=action.priority,
                        max_adver_int=node.advertisement_interval,
                    )
                    self.at(received.now, other, received)
        elif isinstance(action, StartAdverTimer):
            self.adver_gen[k] += 1
            self.running[k].add("AdverTimerFired")
            self.at(action.at, k, AdverTimerFired(action.at), self.adver_gen[k])
        elif isinstance(action, StartMasterDownTimer):
            self.down_gen[k] += 1
            self.running[k].add("MasterDownTimerFired")
            self.at(action.at, k, MasterDownTimerFired(action.at), self.down_gen[k])
        elif isinstance(action, AddAddresses):
            self.takeovers[k] += 1
            self.held[k] |= set(action.addresses)
        elif isinstance(action, RemoveAddresses):
            self.held[k] -= set(action.addresses)
        elif isinstance(action, StartReleaseTimer):
            self.release_gen[k] += 1
            self.at(action.at, k, ReleaseTimerFired(action.at), self.release_gen[k])
        elif isinstance(action, CancelTimers):
            self.adver_gen[k] += 1
            self.down_gen[k] += 1
            self.running[k].clear()

    def masters(self) -> list[int]:
        return [k for k, n in enumerate(self.nodes) if n.state is State.MASTER]


@st.composite
def elections(draw: st.DrawFn) -> tuple[list[VrrpInstance], list[int], int]:
    n = draw(st.integers(2, 6))
    last_octets = draw(st.lists(st.integers(1, 254), min_size=n, max_size=n, unique=True))
    interval = draw(st.sampled_from([10, 20, 100]))
    nodes = [
        VrrpInstance(
            vrid=51,
            priority=draw(st.integers(1, 255)),
            primary_ip=IPv4Address(f"198.18.0.{octet}"),
            addresses=VIPS,
            advertisement_interval=interval,
            preempt=draw(st.booleans()),
            startup_delay=draw(st.integers(0, 3 * interval)),
        )
        for octet in last_octets
    ]
    starts = [draw(st.integers(0, 2 * SECOND)) for _ in nodes]
    latency = draw(st.integers(0, 2_000))
    return nodes, starts, latency


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(Shutdown, id="the Master shuts down"),
        pytest.param(Resign, id="the Master resigns gracefully and releases its addresses"),
    ],
)
@settings(max_examples=150, deadline=None)
@given(elections())
def test_instances_given_the_same_adverts_converge_to_exactly_one_master(
    stop: type[Shutdown | Resign],
    election: tuple[list[VrrpInstance], list[int], int],
) -> None:
    nodes, starts, latency = election
    # Two owners of the same address is a misconfiguration the RFC does not resolve cleanly.
    if sum(n.priority == 255 for n in nodes) > 1:
        nodes = [replace(n, priority=254) if n.priority == 255 else n for n in nodes]
    sim = Sim(list(nodes), latency)
    for k, start in enumerate(starts):
        sim.at(start, k, Startup(start))
    settle = max(starts) + 20 * master_down_interval(1, nodes[0].advertisement_interval)
    sim.run_until(settle)
    masters = sim.masters()
    assert len(masters) == 1, f"masters {masters}: {sim.nodes}"
    winner = masters[0]
    assert all(n.state is State.BACKUP for k, n in enumerate(sim.nodes) if k != winner)
    assert all(n.master == sim.nodes[winner].primary_ip for n in sim.nodes)
    if all(n.preempt for n in nodes):
        # Preemption elects the highest priority. Among equal priorities the address decides
        # only between simultaneous Masters: a Backup accepts an equal-priority Master (§6.4.2).
        assert sim.nodes[winner].priority == max(n.priority for n in sim.nodes)

    # The Master resigns: the others elect exactly one new Master among themselves.
    sim.at(sim.now, winner, stop(sim.now))
    sim.run_until(2 * settle)
    masters = sim.masters()
    assert len(masters) == 1 and masters[0] != winner, f"after resignation: {sim.nodes}"
    # Only the new Master holds the addresses; the old one has let go (Sim checks each step).
    assert [k for k, held in enumerate(sim.held) if held] == masters, sim.held
    if all(n.preempt for n in nodes):
        rest = [n for k, n in enumerate(sim.nodes) if k != winner]
        assert sim.nodes[masters[0]].priority == max(n.priority for n in rest)


@pytest.mark.parametrize(
    ("stagger", "takeovers"),
    [
        pytest.param(False, [1, 1], id="without it the quicker backup wins and is preempted"),
        pytest.param(True, [1, 0], id="with it the late preferred router is the only Master"),
    ],
)
def test_a_startup_delay_by_rank_lets_a_late_preferred_router_win_the_first_election(
    stagger: bool, takeovers: list[int]
) -> None:
    # The preferred router's agent saw the new instance half an interval after the next rank's:
    # Skew_Time separates priorities 254 and 253 by 1/256 of an interval only.
    interval = 100
    preferred = VrrpInstance(
        vrid=51, priority=254, primary_ip=LOWER_IP, advertisement_interval=interval
    )
    second = VrrpInstance(
        vrid=51,
        priority=253,
        primary_ip=HIGHER_IP,
        advertisement_interval=interval,
        startup_delay=startup_delay_cs(253, interval) if stagger else 0,
    )
    sim = Sim([preferred, second], latency=1_000)
    sim.at(0, 1, Startup(0))
    sim.at(SECOND // 2, 0, Startup(SECOND // 2))
    sim.run_until(20 * SECOND)
    assert sim.masters() == [0]
    assert sim.takeovers == takeovers


def test_a_resignation_hands_over_within_skew_time_not_master_down_interval() -> None:
    high = VrrpInstance(vrid=51, priority=200, primary_ip=HIGHER_IP, advertisement_interval=100)
    low = VrrpInstance(vrid=51, priority=100, primary_ip=SELF, advertisement_interval=100)
    sim = Sim([high, low], latency=0)
    sim.at(0, 0, Startup(0))
    sim.at(0, 1, Startup(0))
    sim.run_until(10 * SECOND)
    assert sim.masters() == [0]
    sim.at(sim.now, 0, Shutdown(sim.now))
    sim.run_until(sim.now + SKEW)
    assert sim.masters() == [1], "the Backup takes over Skew_Time after the priority-0 advert"


def test_a_resigned_master_keeps_its_addresses_until_its_successor_advertised_an_interval() -> None:
    high = VrrpInstance(vrid=51, priority=200, primary_ip=HIGHER_IP, addresses=VIPS)
    low = VrrpInstance(vrid=51, priority=100, primary_ip=SELF, addresses=VIPS)
    sim = Sim([high, low], latency=0)
    sim.at(0, 0, Startup(0))
    sim.at(0, 1, Startup(0))
    sim.run_until(10 * SECOND)
    assert sim.masters() == [0] and sim.held == [set(VIPS), set()]
    resigned = sim.now
    sim.at(resigned, 0, Resign(resigned))
    sim.run_until(resigned + SKEW)  # the Backup takes over after Skew_Time ...
    assert sim.masters() == [1] and sim.held == [set(VIPS), set(VIPS)]
    took_over = resigned + SKEW
    sim.run_until(took_over + SECOND - 1)  # ... and the old Master answers one interval more
    assert sim.held == [set(VIPS), set(VIPS)]
    sim.run_until(took_over + SECOND)
    assert sim.held == [set(), set(VIPS)]
    assert sim.nodes[0].state is State.INITIALIZE and sim.nodes[0].release_at is None


def test_a_resigned_master_nobody_replaces_lets_go_after_the_longest_master_down_interval() -> None:
    sim = Sim([VrrpInstance(vrid=51, priority=255, primary_ip=SELF, addresses=VIPS)], latency=0)
    sim.at(0, 0, Startup(0))
    sim.run_until(SECOND)
    sim.at(SECOND, 0, Resign(SECOND))
    sim.run_until(SECOND + RELEASE - 1)
    assert sim.held == [set(VIPS)]
    sim.run_until(SECOND + RELEASE)
    assert sim.held == [set()]


def test_equal_priorities_starting_together_elect_the_higher_primary_address() -> None:
    nodes = [
        VrrpInstance(vrid=51, priority=100, primary_ip=ip, advertisement_interval=10)
        for ip in (LOWER_IP, HIGHER_IP, SELF)
    ]
    sim = Sim(nodes, latency=500)
    for k in range(len(nodes)):
        sim.at(0, k, Startup(0))
    sim.run_until(5 * SECOND)
    assert sim.masters() == [1], sim.nodes  # all fire together; the tie-break settles it
