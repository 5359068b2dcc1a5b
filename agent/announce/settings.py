"""The `announce:` section of the agent's config file: who holds IPs and how they are announced.

    announce:
      enabled: true               # off: the node holds no IP (serveAllIPs decides instead)
      interface: eth0             # the segment the IPs live on
      advertIntervalCs: 100       # VRRP advert interval, centiseconds
      preempt: true
      preemptDelayCs: 0
      checksumMode: rfc5798       # or vrrpv2-compat (keepalived 2.2.7 speaks rfc5798)
      ipv4VRIDs: "1-255"          # the VRID range per family, "first-last"
      ipv6VRIDs: "1-255"
      nodeSelector: {matchLabels: {...}, matchExpressions: [{key, operator, values}]}
      gratuitous: {count: 5, spacingMs: 200, refreshSeconds: 60}  # 0 or null: no refresh
      reportNamespace: nodelb-system  # where each node's report Lease lives
      reportLeaseSeconds: 30
      speakerCPU: auto            # pin the speaker to this CPU and the agent to the others;
                                  # auto: the highest CPU when there are two or more;
                                  # null: no pinning (speaker_cpu.py says why)
      realtimePriority: 10        # SCHED_RR priority of the speaker; 0 = normal scheduling.
                                  # Needs CAP_SYS_NICE; refused, the speaker runs at normal
                                  # priority, logs why and reports 0 in
                                  # nodelb_speaker_realtime_priority
      keepalivedPeers: []         # keepalived boxes on the segment: peers, any priority

Parsed once, with errors naming the key, into frozen values (`AnnounceSettings`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.announce.ownership import OwnershipConfig, VridRange
from agent.announce.speaker_cpu import AUTO, SpeakerCpuSetting
from agent.announce.vrrp.codec import DEFAULT_CHECKSUM_MODE, ChecksumMode
from agent.announce.vrrp.config import DEFAULT_REFRESH_S, GratuitousConfig
from agent.model.config_values import (
    ConfigError,
    boolean,
    integer,
    known_keys,
    mapping,
    number,
    optional_integer,
    section,
    string,
    string_list,
    wrong,
)
from agent.model.labels import LabelSelector, parse_label_selector
from agent.model.net import IPAddress

KNOWN = {
    "enabled",
    "interface",
    "advertIntervalCs",
    "preempt",
    "preemptDelayCs",
    "checksumMode",
    "ipv4VRIDs",
    "ipv6VRIDs",
    "nodeSelector",
    "gratuitous",
    "reportNamespace",
    "reportLeaseSeconds",
    "speakerCPU",
    "realtimePriority",
    "keepalivedPeers",
}


class AnnounceConfigError(ConfigError):
    """The announce section is invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class AnnounceSettings:
    """How this node takes part in the election (see the module docstring for the keys)."""

    enabled: bool = False
    interface: str = "eth0"
    advert_interval_cs: int = 100
    preempt: bool = True
    preempt_delay_cs: int = 0
    checksum_mode: ChecksumMode = DEFAULT_CHECKSUM_MODE
    ownership: OwnershipConfig = field(default_factory=OwnershipConfig)
    gratuitous: GratuitousConfig = field(
        default_factory=lambda: GratuitousConfig(refresh_s=DEFAULT_REFRESH_S)
    )
    report_namespace: str = "nodelb-system"
    report_lease_seconds: int = 30
    # On kernels without full preemption a long nft commit in the agent can delay the
    # speaker's timers when both share a CPU; pinning them apart keeps adverts on time.
    speaker_cpu: SpeakerCpuSetting = AUTO
    # On by default: at normal priority a loaded node's timers ran up to 2.3 s late.
    realtime_priority: int = 10
    # Peers that are not nodelb (keepalived standing in as a backup): their adverts are
    # accepted and may carry any priority; nodelb peers may not send 255 or leave the plan's
    # rank range (docs/vrrp.md).
    keepalived_peers: frozenset[IPAddress] = frozenset()


def _vrids(raw: Mapping[str, Any], key: str) -> VridRange:
    where = f"announce.{key}"
    value = raw.get(key, "1-255")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a single VRID written as a number
    if not isinstance(value, str):
        raise wrong(where, 'a VRID range such as "1-255"', value)
    first, sep, last = value.partition("-")
    try:
        return VridRange(int(first), int(last if sep else first))
    except ValueError as exc:
        raise AnnounceConfigError(f"{where}: {value!r} is not a VRID range ({exc})") from None


def _selector(raw: Mapping[str, Any]) -> LabelSelector | None:
    if raw.get("nodeSelector") is None:
        return None
    return parse_label_selector(raw["nodeSelector"], "announce.nodeSelector")


def _gratuitous(raw: Mapping[str, Any]) -> GratuitousConfig:
    where = "announce.gratuitous"
    g = section(raw, "gratuitous", where)
    known_keys(g, {"count", "spacingMs", "refreshSeconds"}, where)
    try:
        return GratuitousConfig(
            count=integer(g, "count", 5, f"{where}.count", lo=1, hi=1000),
            spacing_ms=integer(g, "spacingMs", 200, f"{where}.spacingMs", lo=0, hi=60_000),
            refresh_s=_refresh(g, f"{where}.refreshSeconds"),
        )
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise AnnounceConfigError(f"{where}: {exc}") from None


def _refresh(g: Mapping[str, Any], where: str) -> float | None:
    """Return the refresh interval: absent, the default; 0 or null, none (only takeovers are
    announced)."""
    value = g.get("refreshSeconds", DEFAULT_REFRESH_S)
    if value is None or (type(value) in (int, float) and value == 0):
        return None
    return number(g, "refreshSeconds", DEFAULT_REFRESH_S, where, lo=0.001, hi=86400)


def _speaker_cpu(raw: Mapping[str, Any]) -> SpeakerCpuSetting:
    """Return the speakerCPU setting: absent, "auto"; null, no pinning; else a CPU number."""
    if "speakerCPU" not in raw:
        return AUTO
    if raw["speakerCPU"] == AUTO:
        return AUTO
    if raw["speakerCPU"] is None:
        return None
    if isinstance(raw["speakerCPU"], str):
        raise wrong("announce.speakerCPU", 'a CPU number, "auto" or null', raw["speakerCPU"])
    return optional_integer(raw, "speakerCPU", "announce.speakerCPU", lo=0, hi=4095)


def _addresses(raw: Mapping[str, Any], key: str) -> frozenset[IPAddress]:
    """Return the addresses listed under `key` (absent or null: none)."""
    if raw.get(key) is None:
        return frozenset()
    out: set[IPAddress] = set()
    for i, item in enumerate(string_list(raw, key, f"announce.{key}")):
        try:
            out.add(ipaddress.ip_address(item))
        except ValueError:
            raise AnnounceConfigError(f"announce.{key}[{i}]: {item!r} is not an address") from None
    return frozenset(out)


def parse_announce(raw: Any) -> AnnounceSettings:
    """Return the validated announce settings (absent or null section: announcing off).

    Raises AnnounceConfigError (a ConfigError) naming the key and the expected type.
    """
    if raw is None:
        return AnnounceSettings()
    try:
        return _parse(mapping(raw, "announce"))
    except AnnounceConfigError:
        raise
    except ConfigError as exc:
        raise AnnounceConfigError(str(exc)) from None


def _parse(raw: Mapping[str, Any]) -> AnnounceSettings:
    known_keys(raw, KNOWN, "announce")
    mode_text = string(raw, "checksumMode", DEFAULT_CHECKSUM_MODE.value, "announce.checksumMode")
    try:
        mode = ChecksumMode(mode_text)
    except ValueError:
        raise AnnounceConfigError(
            f"announce.checksumMode: {mode_text!r} is not one of "
            f"{', '.join(m.value for m in ChecksumMode)}"
        ) from None
    try:
        ownership = OwnershipConfig(
            selector=_selector(raw),
            ipv4_vrids=_vrids(raw, "ipv4VRIDs"),
            ipv6_vrids=_vrids(raw, "ipv6VRIDs"),
        )
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise AnnounceConfigError(f"announce: {exc}") from None

    def whole(key: str, default: int, lo: int, hi: int) -> int:
        return integer(raw, key, default, f"announce.{key}", lo=lo, hi=hi)

    return AnnounceSettings(
        enabled=boolean(raw, "enabled", True, "announce.enabled"),
        interface=string(raw, "interface", "eth0", "announce.interface"),
        advert_interval_cs=whole("advertIntervalCs", 100, 1, 4095),
        preempt=boolean(raw, "preempt", True, "announce.preempt"),
        preempt_delay_cs=whole("preemptDelayCs", 0, 0, 360000),
        checksum_mode=mode,
        ownership=ownership,
        gratuitous=_gratuitous(raw),
        report_namespace=string(
            raw, "reportNamespace", "nodelb-system", "announce.reportNamespace"
        ),
        report_lease_seconds=whole("reportLeaseSeconds", 30, 2, 3600),
        speaker_cpu=_speaker_cpu(raw),
        realtime_priority=whole("realtimePriority", 10, 0, 99),
        keepalived_peers=_addresses(raw, "keepalivedPeers"),
    )
