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
      gratuitous: {count: 5, spacingMs: 200, refreshSeconds: null}
      reportNamespace: nodelb-system  # where each node's report Lease lives
      reportLeaseSeconds: 30
      speakerCPU: null            # pin the speaker to this CPU and the agent to the others
      realtimePriority: 10        # SCHED_RR priority of the speaker; 0 = normal scheduling.
                                  # Needs CAP_SYS_NICE; refused, the speaker runs at normal
                                  # priority, logs why and reports 0 in
                                  # nodelb_speaker_realtime_priority

Parsed once, with errors naming the key, into frozen values (`AnnounceSettings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.announce.ownership import (
    NodeSelector,
    OwnershipConfig,
    Requirement,
    SelectorOperator,
    VridRange,
)
from agent.announce.vrrp.codec import DEFAULT_CHECKSUM_MODE, ChecksumMode
from agent.announce.vrrp.config import GratuitousConfig

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
}


class AnnounceConfigError(ValueError):
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
    gratuitous: GratuitousConfig = field(default_factory=GratuitousConfig)
    report_namespace: str = "nodelb-system"
    report_lease_seconds: int = 30
    # On kernels without full preemption a long nft commit in the agent can delay the
    # speaker's timers when both share a CPU; pinning them apart keeps adverts on time.
    speaker_cpu: int | None = None
    # On by default: at normal priority a loaded node's timers ran up to 2.3 s late.
    realtime_priority: int = 10


def _int(raw: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise AnnounceConfigError(
            f"announce.{key}: expected an integer in {lo}..{hi}, got {value!r}"
        )
    return value


def _vrids(raw: Mapping[str, Any], key: str) -> VridRange:
    text = str(raw.get(key, "1-255"))
    first, sep, last = text.partition("-")
    try:
        return VridRange(int(first), int(last if sep else first))
    except ValueError as exc:
        raise AnnounceConfigError(f"announce.{key}: {text!r} is not a VRID range ({exc})") from None


def _selector(raw: Any) -> NodeSelector | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise AnnounceConfigError(f"announce.nodeSelector: expected a mapping, got {raw!r}")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise AnnounceConfigError("announce.nodeSelector.matchLabels: expected a mapping")
    reqs: list[Requirement] = []
    for i, expr in enumerate(raw.get("matchExpressions") or []):
        where = f"announce.nodeSelector.matchExpressions[{i}]"
        if not isinstance(expr, Mapping) or "key" not in expr:
            raise AnnounceConfigError(f"{where}: expected a mapping with key and operator")
        try:
            op = SelectorOperator(str(expr.get("operator")))
        except ValueError:
            raise AnnounceConfigError(
                f"{where}.operator: {expr.get('operator')!r} is not one of "
                f"{', '.join(o.value for o in SelectorOperator)}"
            ) from None
        values = frozenset(str(v) for v in expr.get("values") or ())
        try:
            reqs.append(Requirement(str(expr["key"]), op, values))
        except ValueError as exc:
            raise AnnounceConfigError(f"{where}: {exc}") from None
    try:
        return NodeSelector(
            match_labels=frozenset((str(k), str(v)) for k, v in labels.items()),
            match_expressions=frozenset(reqs),
        )
    except ValueError as exc:
        raise AnnounceConfigError(f"announce.nodeSelector: {exc}") from None


def parse_announce(raw: Any) -> AnnounceSettings:
    """Return the validated announce settings (absent section: announcing off)."""
    if raw is None:
        return AnnounceSettings()
    if not isinstance(raw, Mapping):
        raise AnnounceConfigError(f"announce: expected a mapping, got {raw!r}")
    unknown = set(raw) - KNOWN
    if unknown:
        raise AnnounceConfigError(f"unknown announce keys: {', '.join(sorted(unknown))}")
    g = raw.get("gratuitous") or {}
    if not isinstance(g, Mapping):
        raise AnnounceConfigError("announce.gratuitous: expected a mapping")
    try:
        mode = ChecksumMode(str(raw.get("checksumMode", DEFAULT_CHECKSUM_MODE)))
    except ValueError:
        raise AnnounceConfigError(
            f"announce.checksumMode: {raw.get('checksumMode')!r} is not one of "
            f"{', '.join(m.value for m in ChecksumMode)}"
        ) from None
    refresh = g.get("refreshSeconds")
    try:
        gratuitous = GratuitousConfig(
            count=int(g.get("count", 5)),
            spacing_ms=int(g.get("spacingMs", 200)),
            refresh_s=None if refresh is None else float(refresh),
        )
        ownership = OwnershipConfig(
            selector=_selector(raw.get("nodeSelector")),
            ipv4_vrids=_vrids(raw, "ipv4VRIDs"),
            ipv6_vrids=_vrids(raw, "ipv6VRIDs"),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AnnounceConfigError):
            raise
        raise AnnounceConfigError(f"announce: {exc}") from None
    interface = raw.get("interface", "eth0")
    if not isinstance(interface, str) or not interface:
        raise AnnounceConfigError(f"announce.interface: expected a name, got {interface!r}")
    return AnnounceSettings(
        enabled=bool(raw.get("enabled", True)),
        interface=interface,
        advert_interval_cs=_int(raw, "advertIntervalCs", 100, 1, 4095),
        preempt=bool(raw.get("preempt", True)),
        preempt_delay_cs=_int(raw, "preemptDelayCs", 0, 0, 360000),
        checksum_mode=mode,
        ownership=ownership,
        gratuitous=gratuitous,
        report_namespace=str(raw.get("reportNamespace", "nodelb-system")),
        report_lease_seconds=_int(raw, "reportLeaseSeconds", 30, 2, 3600),
        speaker_cpu=None if raw.get("speakerCPU") is None else _int(raw, "speakerCPU", 0, 0, 4095),
        realtime_priority=_int(raw, "realtimePriority", 10, 0, 99),
    )
