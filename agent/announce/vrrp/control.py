"""The speaker's control protocol, both directions: commands in, the status snapshot out.

The agent (process.SpeakerProcess) writes commands as JSON lines to the speaker's stdin and
reads the status snapshot the speaker rewrites atomically in a file (speaker.Speaker.status).
This module is both sides' encoding: `encode_command` / `decode_command` for the commands
(`Configure`, `Stop`), and the snapshot's schema and parser (`parse_status`; the supervisor
reads the file, process.read_status). Nothing here touches a socket, a clock, a file or a
process.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from agent.announce.vrrp.config import SpeakerConfig, from_json, to_json
from agent.model.net import IPAddress

# -- commands (agent -> speaker, one JSON line each) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Configure:
    """Run exactly `config`'s instances (`{"config": {...}}`): the speaker changes what differs."""

    config: SpeakerConfig


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the speaker (`{"stop": {"graceful": true}}`); graceful: every Master resigns first."""

    graceful: bool = True


Command = Configure | Stop


def encode_command(command: Command) -> bytes:
    """Return `command` as one JSON line, newline included."""
    if isinstance(command, Configure):
        message: dict[str, Any] = {"config": to_json(command.config)}
    else:
        message = {"stop": {"graceful": command.graceful}}
    return json.dumps(message).encode() + b"\n"


def decode_command(line: bytes) -> Command:
    """Return the command in one JSON line; raises ValueError for anything that is not one.

    A `stop` without `graceful` is graceful (as EOF on the pipe is).
    """
    try:
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"a command is a JSON object, got {type(message).__name__}")
        if "stop" in message:
            return Stop(graceful=bool(message["stop"].get("graceful", True)))
        if "config" in message:
            return Configure(from_json(message["config"]))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed command: {exc!r}") from exc
    raise ValueError(f"unknown command {sorted(message)}")


# -- the status snapshot (speaker -> agent, a file) -------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """One instance as the speaker last reported it; `master` None when none is known."""

    vrid: int
    family: int
    state: str  # Initialize | Backup | Master
    priority: int
    addresses: tuple[IPAddress, ...]
    master: IPAddress | None
    adverts_sent: int
    adverts_received: int
    takeovers: int
    transitions: tuple[tuple[str, int], ...]  # (to state, count), sorted


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change the speaker made (for Events): `seq` grows by one per change."""

    seq: int
    time_us: int
    vrid: int
    family: int
    from_state: str
    to_state: str
    event: str


@dataclass(frozen=True, slots=True)
class SpeakerStatus:
    """A speaker's snapshot. `state` is starting | running | stopped; counters are totals.

    `dropped` and `gratuitous` are ((family, reason or kind), count) pairs, sorted; `held`
    the marked addresses on the interface; `transitions` the most recent state changes (up
    to 64), oldest first; `timer_late_max_us` the most a timer fired after its deadline and
    `timers_late` how many fired more than 10 ms late (the loop could not run in time);
    `realtime_priority` the SCHED_RR priority the speaker runs at, 0 when it runs at normal
    priority (asked for none, or the node refused it).
    """

    pid: int
    seq: int
    time_us: int
    state: str
    interface: str
    instances: tuple[InstanceStatus, ...]
    dropped: tuple[tuple[tuple[int, str], int], ...]
    gratuitous: tuple[tuple[tuple[int, str], int], ...]
    held: tuple[IPAddress, ...]
    send_errors: int
    timer_late_max_us: int
    timers_late: int
    transitions: tuple[Transition, ...]
    errors: tuple[str, ...]
    realtime_priority: int = 0

    def instance(self, family: int, vrid: int) -> InstanceStatus | None:
        """Return the instance (family, vrid), None when the speaker does not run it."""
        for i in self.instances:
            if (i.family, i.vrid) == (family, vrid):
                return i
        return None

    def dropped_count(self, family: int, reason: str) -> int:
        """Return how many packets of `family` were dropped for `reason` (0 if none)."""
        return dict(self.dropped).get((family, reason), 0)


def parse_status(raw: dict[str, Any]) -> SpeakerStatus:
    """Return the status in a speaker's JSON snapshot; raises KeyError/ValueError if malformed."""

    def pairs(table: dict[str, dict[str, int]]) -> tuple[tuple[tuple[int, str], int], ...]:
        return tuple(
            sorted(((int(f), str(k)), int(n)) for f, c in table.items() for k, n in c.items())
        )

    return SpeakerStatus(
        pid=int(raw["pid"]),
        seq=int(raw["seq"]),
        time_us=int(raw["time_us"]),
        state=str(raw["state"]),
        interface=str(raw["interface"]),
        instances=tuple(
            InstanceStatus(
                vrid=int(i["vrid"]),
                family=int(i["family"]),
                state=str(i["state"]),
                priority=int(i["priority"]),
                addresses=tuple(ipaddress.ip_address(a) for a in i["addresses"]),
                master=None if i["master"] is None else ipaddress.ip_address(i["master"]),
                adverts_sent=int(i["adverts_sent"]),
                adverts_received=int(i["adverts_received"]),
                takeovers=int(i["takeovers"]),
                transitions=tuple(sorted((str(k), int(v)) for k, v in i["transitions"].items())),
            )
            for i in raw["instances"]
        ),
        dropped=pairs(raw["dropped"]),
        gratuitous=pairs(raw["gratuitous"]),
        held=tuple(ipaddress.ip_address(a) for f in ("4", "6") for a in raw["held"].get(f, ())),
        send_errors=int(raw["send_errors"]),
        timer_late_max_us=int(raw["timer_late_max_us"]),
        timers_late=int(raw["timers_late"]),
        transitions=tuple(
            Transition(
                seq=int(e["seq"]),
                time_us=int(e["time_us"]),
                vrid=int(e["vrid"]),
                family=int(e["family"]),
                from_state=str(e["from"]),
                to_state=str(e["to"]),
                event=str(e["event"]),
            )
            for e in raw["events"]
        ),
        errors=tuple(str(e) for e in raw["errors"]),
        realtime_priority=int(raw.get("realtime_priority", 0)),
    )
