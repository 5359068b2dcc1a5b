"""What the VRRP speaker is told to run: frozen values, and their JSON form for the child process.

The speaker (agent/announce/vrrp/speaker.py) runs in its own OS process; the supervisor
(agent/announce/vrrp/process.py) hands it a `SpeakerConfig` as one JSON line on its stdin, at start
and after every change. `to_json` / `from_json` are that boundary: everything past it is typed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.announce.vrrp.codec import DEFAULT_CHECKSUM_MODE, ChecksumMode
from agent.announce.vrrp.machine import DEFAULT_ADVER_INT_CS, DEFAULT_PRIORITY, Burst
from agent.model.net import IPAddress

# A Master repeats one gratuitous round this often unless told otherwise (`announce.gratuitous.
# refreshSeconds`): a fifth of the 300 s FDB ageing most switches and the Linux bridge default
# to, and far inside gateways' ARP timeouts (1200 s to 4 h). docs/decisions.md has the evidence.
DEFAULT_REFRESH_S = 60.0


@dataclass(frozen=True, slots=True)
class GratuitousConfig:
    """How takeovers are announced: a burst of `count` rounds `spacing_ms` apart.

    Every round sends, for each held address, a gratuitous ARP request and/or reply (IPv4,
    per `arp_request` / `arp_reply`) or one unsolicited Neighbor Advertisement (IPv6).
    `refresh_s` None means no periodic refresh; otherwise a Master repeats one round every
    `refresh_s` seconds (switch FDB and neighbour caches age out).
    """

    count: int = 5
    spacing_ms: int = 200
    refresh_s: float | None = None
    arp_request: bool = True
    arp_reply: bool = True

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"gratuitous count must be >= 1, got {self.count}")
        if self.spacing_ms < 0:
            raise ValueError(f"gratuitous spacing must be >= 0 ms, got {self.spacing_ms}")
        if self.refresh_s is not None and self.refresh_s <= 0:
            raise ValueError(f"gratuitous refresh must be > 0 s or None, got {self.refresh_s}")
        if not (self.arp_request or self.arp_reply):
            raise ValueError("at least one gratuitous ARP form (request or reply) must be on")

    def burst(self) -> Burst:
        """Return when the rounds go, as the state machine schedules them (µs, not ms and s)."""
        refresh = None if self.refresh_s is None else int(self.refresh_s * 1_000_000)
        return Burst(count=self.count, spacing_us=self.spacing_ms * 1000, refresh_us=refresh)


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """One virtual router: VRID and family (the key), and how this node runs it.

    `advert_interval_cs` is in centiseconds (1..4095), `preempt_delay_cs` and
    `startup_delay_cs` (added to the first Master_Down_Timer after the instance starts) too.
    `addresses` must all be of `family` (4 or 6); an instance carries at least one.
    """

    vrid: int
    family: int
    priority: int = DEFAULT_PRIORITY
    advert_interval_cs: int = DEFAULT_ADVER_INT_CS
    preempt: bool = True
    preempt_delay_cs: int = 0
    startup_delay_cs: int = 0
    addresses: tuple[IPAddress, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in (4, 6):
            raise ValueError(f"family must be 4 or 6, got {self.family}")
        if not 1 <= self.vrid <= 255:
            raise ValueError(f"vrid must be 1..255, got {self.vrid}")
        if not 1 <= self.priority <= 255:
            raise ValueError(f"priority must be 1..255, got {self.priority}")
        if not 1 <= self.advert_interval_cs <= 0x0FFF:
            raise ValueError(f"advert interval must be 1..4095 cs, got {self.advert_interval_cs}")
        if self.preempt_delay_cs < 0:
            raise ValueError(f"preempt delay must be >= 0, got {self.preempt_delay_cs}")
        if self.startup_delay_cs < 0:
            raise ValueError(f"startup delay must be >= 0, got {self.startup_delay_cs}")
        if not 1 <= len(self.addresses) <= 255:
            raise ValueError(f"an instance carries 1..255 addresses, got {len(self.addresses)}")
        wrong = [a for a in self.addresses if a.version != self.family]
        if wrong:
            raise ValueError(f"VRID {self.vrid} IPv{self.family}: addresses {wrong} are not")

    @property
    def key(self) -> tuple[int, int]:
        """Return (family, vrid): an instance's identity (one VRID per family, RFC 5798 §7.3)."""
        return (self.family, self.vrid)


@dataclass(frozen=True, slots=True)
class SpeakerConfig:
    """Everything one speaker runs on one interface.

    `source4` is this node's IPv4 address on the segment (the advert source and the
    tie-break address); None when no IPv4 instance runs. IPv6 adverts come from the
    interface's link-local address (RFC 5798 §5.1.2.1), found at run time. `peers` are the
    source addresses adverts are accepted from (IPv4 segment addresses and IPv6 link-local
    addresses of the other nodes, or of a keepalived box); adverts from anyone else are dropped
    and counted as `unknown_source`.

    `peer_macs` maps a peer address to the MAC its adverts must leave from (each node publishes
    its own in its report); an advert from that address in a frame from another MAC is dropped
    as `wrong_mac`. A peer with no MAC here is checked by address alone. `keepalived_peers` are
    peers that are not nodelb (a keepalived box standing in as a backup): their adverts may
    carry any priority. From every other peer, priority 255 (address owner) and, when
    `peer_priorities` is set, a priority outside that (lowest, highest) range are dropped as
    `priority`: nodelb never sends them (0, resigning, is always accepted).
    """

    interface: str
    source4: ipaddress.IPv4Address | None = None
    peers: frozenset[IPAddress] = frozenset()
    peer_macs: Mapping[IPAddress, str] = field(default_factory=dict)
    keepalived_peers: frozenset[IPAddress] = frozenset()
    peer_priorities: tuple[int, int] | None = None
    checksum_mode: ChecksumMode = DEFAULT_CHECKSUM_MODE
    instances: tuple[InstanceConfig, ...] = ()
    gratuitous: GratuitousConfig = field(default_factory=GratuitousConfig)

    def __post_init__(self) -> None:
        if not self.interface:
            raise ValueError("interface must be named")
        keys = [i.key for i in self.instances]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"duplicate (family, vrid) instances: {dupes}")
        if self.peer_priorities is not None and not (
            1 <= self.peer_priorities[0] <= self.peer_priorities[1] <= 254
        ):
            raise ValueError(
                f"peer priorities must be a range within 1..254: {self.peer_priorities}"
            )
        if self.source4 is None and any(i.family == 4 for i in self.instances):
            raise ValueError("IPv4 instances need source4 (this node's IPv4 on the segment)")
        held = [a for i in self.instances for a in i.addresses]
        shared = sorted({str(a) for a in held if held.count(a) > 1})
        if shared:
            raise ValueError(f"addresses carried by more than one instance: {shared}")


def to_json(config: SpeakerConfig) -> dict[str, Any]:
    """Return `config` as plain JSON values (addresses as strings)."""
    g = config.gratuitous
    return {
        "interface": config.interface,
        "source4": None if config.source4 is None else str(config.source4),
        "peers": sorted(str(p) for p in config.peers),
        "peer_macs": {
            str(a): m for a, m in sorted(config.peer_macs.items(), key=lambda i: str(i[0]))
        },
        "keepalived_peers": sorted(str(p) for p in config.keepalived_peers),
        "peer_priorities": None if config.peer_priorities is None else list(config.peer_priorities),
        "checksum_mode": str(config.checksum_mode),
        "gratuitous": {
            "count": g.count,
            "spacing_ms": g.spacing_ms,
            "refresh_s": g.refresh_s,
            "arp_request": g.arp_request,
            "arp_reply": g.arp_reply,
        },
        "instances": [
            {
                "vrid": i.vrid,
                "family": i.family,
                "priority": i.priority,
                "advert_interval_cs": i.advert_interval_cs,
                "preempt": i.preempt,
                "preempt_delay_cs": i.preempt_delay_cs,
                "startup_delay_cs": i.startup_delay_cs,
                "addresses": [str(a) for a in i.addresses],
            }
            for i in config.instances
        ],
    }


def from_json(raw: dict[str, Any]) -> SpeakerConfig:
    """Return the SpeakerConfig `raw` describes; raises ValueError/KeyError/TypeError if bad."""
    g = raw.get("gratuitous") or {}
    source4 = raw.get("source4")
    return SpeakerConfig(
        interface=str(raw["interface"]),
        source4=None if source4 is None else ipaddress.IPv4Address(source4),
        peers=frozenset(ipaddress.ip_address(p) for p in raw.get("peers", ())),
        peer_macs={
            ipaddress.ip_address(a): str(m) for a, m in (raw.get("peer_macs") or {}).items()
        },
        keepalived_peers=frozenset(
            ipaddress.ip_address(p) for p in raw.get("keepalived_peers", ())
        ),
        peer_priorities=_priority_range(raw.get("peer_priorities")),
        checksum_mode=ChecksumMode(raw.get("checksum_mode", DEFAULT_CHECKSUM_MODE)),
        gratuitous=GratuitousConfig(
            count=int(g.get("count", 5)),
            spacing_ms=int(g.get("spacing_ms", 200)),
            refresh_s=None if g.get("refresh_s") is None else float(g["refresh_s"]),
            arp_request=bool(g.get("arp_request", True)),
            arp_reply=bool(g.get("arp_reply", True)),
        ),
        instances=tuple(
            InstanceConfig(
                vrid=int(i["vrid"]),
                family=int(i["family"]),
                priority=int(i.get("priority", DEFAULT_PRIORITY)),
                advert_interval_cs=int(i.get("advert_interval_cs", DEFAULT_ADVER_INT_CS)),
                preempt=bool(i.get("preempt", True)),
                preempt_delay_cs=int(i.get("preempt_delay_cs", 0)),
                startup_delay_cs=int(i.get("startup_delay_cs", 0)),
                addresses=tuple(ipaddress.ip_address(a) for a in i["addresses"]),
            )
            for i in raw.get("instances", ())
        ),
    )


def _priority_range(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    low, high = (int(v) for v in raw)
    return (low, high)
