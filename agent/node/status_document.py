"""The agent's status document (`GET /status`, read by `nodelb status`): schema, parser, builder.

The agent serves the document at `GET /status` on its metrics/health HTTP server
(`metricsAddress`, default 0.0.0.0:9472). The schema (docs/status.md has the prose):

```
{"node": "node-1",                              # string, non-empty
 "time": "2026-12-01T03:00:00Z",                # RFC 3339 with offset: when the agent answered
 "lastSync": {
   "time": "2026-12-01T02:59:58Z" | null,       # null exactly when result is "never"
   "result": "ok" | "error" | "never",
   "message": "",                               # the error for "error", else usually ""
   "durationSeconds": 0.012,                    # number >= 0
   "kind": "full" | "partial" | null},          # null exactly when result is "never"
 "vrrp": [{"vrid": 7,                           # 1..255
           "family": "IPv4" | "IPv6",
           "state": "Master" | "Backup" | "Initialize",
           "priority": 254,                     # 0..255
           "addresses": ["198.19.0.10"],        # at least one, all of `family`
           "master": "198.18.0.11" | null}],    # the current master's address, if known
 "heldIPs": ["198.19.0.10"],                    # addresses bound on this node
 "frontends": [{"ip": "198.19.0.10", "port": 80,          # port 1..65535
                "protocol": "TCP" | "UDP" | "SCTP",
                "service": "default/web",
                "endpoints": 3, "localEndpoints": 1,      # counts >= 0
                "spread": {"198.18.0.12": 40}}]}          # optional, below
```

`spread` is present only for a frontend this node spreads (`localTraffic: spread`): the
nodes other than this one that serve its flows, each with the number of buckets it owns
(1..BUCKETS); this node serves the remaining ones.

Keys not listed are ignored, so an older `nodelb status` reads a newer agent's document.
Every listed key but `spread` is required; a wrong type or value raises `StatusFormatError`
naming the path (`vrrp[0].state: ...`). Everything here is pure.

`desired_dict` is the JSON form of a DesiredState (`nodelb render --json`).
"""

from __future__ import annotations

import enum
import ipaddress
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from agent.announce.vrrp.control import InstanceStatus
from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import IPAddress, IPFamily, Protocol
from agent.model.tunnel import BUCKETS, SpreadState


def _endpoints(eps: tuple[Endpoint, ...]) -> list[str]:
    return [f"[{e.ip}]:{e.port}" if e.ip.version == 6 else f"{e.ip}:{e.port}" for e in eps]


def frontend_dict(fe: Frontend) -> dict[str, Any]:
    """Return one frontend as JSON-ready data."""
    return {
        "service": fe.service,
        "ip": str(fe.key.ip),
        "protocol": fe.key.protocol.value,
        "port": fe.key.port,
        "endpoints": _endpoints(fe.endpoints),
        "clusterEndpoints": _endpoints(fe.cluster_endpoints),
        "externalTrafficPolicy": "Local" if fe.local_only else "Cluster",
        "sourceRanges": [str(r) for r in fe.source_ranges],
        "sessionAffinityTimeout": fe.affinity_timeout,
    }


def desired_dict(desired: DesiredState) -> dict[str, Any]:
    """Return the whole desired state as JSON-ready data, in a stable order."""
    frontends = sorted(
        desired.frontends.values(),
        key=lambda f: (f.key.ip.version, int(f.key.ip), f.key.protocol.value, f.key.port),
    )
    return {
        "frontends": [frontend_dict(f) for f in frontends],
        "heldIPs": sorted(str(ip) for ip in desired.held_ips),
        "localCIDRs": [str(c) for c in desired.local_cidrs],
    }


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def status_document(
    *,
    node: str,
    now: float,
    last_sync_time: float | None,
    last_sync_ok: bool | None,
    last_sync_message: str,
    last_sync_duration: float,
    last_sync_full: bool,
    desired: DesiredState | None,
    vrrp: Sequence[InstanceStatus] = (),
    spread: SpreadState | None = None,
) -> StatusDocument:
    """Return the `GET /status` document of an agent (schema above; `to_document` writes it).

    `now` and `last_sync_time` are epoch seconds; `last_sync_ok` None means no sync yet (then
    the time and kind are None). Frontends are sorted by address, port and protocol, each with
    its endpoint counts: `endpoints` serve traffic from outside, `local_endpoints` are those
    inside this node's pod CIDRs. `spread` is the spreading last applied (None: none), whose
    buckets are counted per serving node.
    """
    frontends = []
    buckets = spread.buckets if spread is not None else {}
    local = desired.local_cidrs if desired else ()
    for key in sorted(desired.frontends if desired else (), key=_frontend_order):
        assert desired is not None
        fe = desired.frontends[key]
        frontends.append(
            FrontendStatus(
                ip=key.ip,
                port=key.port,
                protocol=key.protocol,
                service=fe.service,
                endpoints=len(fe.endpoints),
                local_endpoints=sum(1 for e in fe.endpoints if any(e.ip in net for net in local)),
                spread=_bucket_counts(buckets.get(key, ())),
            )
        )
    never = last_sync_ok is None
    return StatusDocument(
        node=node,
        time=_utc(now),
        last_sync=LastSync(
            time=None if never or last_sync_time is None else _utc(last_sync_time),
            result=(
                LastSyncResult.NEVER
                if never
                else (LastSyncResult.OK if last_sync_ok else LastSyncResult.ERROR)
            ),
            message=last_sync_message,
            duration_seconds=last_sync_duration,
            kind=None if never else (SyncKind.FULL if last_sync_full else SyncKind.PARTIAL),
        ),
        vrrp=tuple(
            VrrpInstanceStatus(
                vrid=i.vrid,
                family=IPFamily.IPV4 if i.family == 4 else IPFamily.IPV6,
                state=VrrpState(i.state),
                priority=i.priority,
                addresses=i.addresses,
                master=i.master,
            )
            for i in vrrp
        ),
        held_ips=tuple(sorted(desired.held_ips, key=_address_order) if desired else ()),
        frontends=tuple(frontends),
    )


def _bucket_counts(hops: Sequence[tuple[int, IPAddress]]) -> tuple[tuple[IPAddress, int], ...]:
    counts: dict[IPAddress, int] = {}
    for _, hop in hops:
        counts[hop] = counts.get(hop, 0) + 1
    return tuple(sorted(counts.items(), key=lambda item: _address_order(item[0])))


def _frontend_order(key: FrontendKey) -> tuple[int, int, int, str]:
    return (key.ip.version, int(key.ip), key.port, key.protocol.value)


def _address_order(ip: IPAddress) -> tuple[int, int]:
    return (ip.version, int(ip))


STATUS_PATH = "/status"


class StatusFormatError(ValueError):
    """The status document does not follow the schema; the message names the path."""


class LastSyncResult(enum.StrEnum):
    """How the agent's last sync ended."""

    OK = "ok"
    ERROR = "error"
    NEVER = "never"


class SyncKind(enum.StrEnum):
    """Whether the last sync rewrote the whole table or applied a delta."""

    FULL = "full"
    PARTIAL = "partial"


class VrrpState(enum.StrEnum):
    """A VRRP instance's state (RFC 5798 §6.4), spelled as in the document."""

    MASTER = "Master"
    BACKUP = "Backup"
    INITIALIZE = "Initialize"


@dataclass(frozen=True, slots=True)
class LastSync:
    """The agent's last sync; `time` and `kind` are None exactly when `result` is NEVER."""

    time: datetime | None
    result: LastSyncResult
    message: str
    duration_seconds: float
    kind: SyncKind | None


@dataclass(frozen=True, slots=True)
class VrrpInstanceStatus:
    """One VRRP instance on the node; `master` is None when no master is known."""

    vrid: int
    family: IPFamily
    state: VrrpState
    priority: int
    addresses: tuple[IPAddress, ...]
    master: IPAddress | None


@dataclass(frozen=True, slots=True)
class FrontendStatus:
    """One programmed frontend and how many endpoints serve it (all, and on this node)."""

    ip: IPAddress
    port: int
    protocol: Protocol
    service: str
    endpoints: int
    local_endpoints: int
    # The other nodes serving a spread frontend, with their buckets; empty: not spread.
    spread: tuple[tuple[IPAddress, int], ...] = ()


@dataclass(frozen=True, slots=True)
class StatusDocument:
    """An agent's status document, parsed. Lists keep the document's order."""

    node: str
    time: datetime
    last_sync: LastSync
    vrrp: tuple[VrrpInstanceStatus, ...]
    held_ips: tuple[IPAddress, ...]
    frontends: tuple[FrontendStatus, ...]


T = TypeVar("T")


E = TypeVar("E", bound=enum.StrEnum)


def _get(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise StatusFormatError(f"{path}{key}: missing")
    return obj[key]


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StatusFormatError(f"{path or 'document'}: expected an object, got {value!r:.80}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise StatusFormatError(f"{path}: expected a list, got {value!r:.80}")
    return value


def _str(value: Any, path: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        want = "a string" if empty else "a non-empty string"
        raise StatusFormatError(f"{path}: expected {want}, got {value!r:.80}")
    return value


def _int(value: Any, path: str, low: int, high: int | None = None) -> int:
    # bool is an int in Python but never a count or a number on the wire.
    if not isinstance(value, int) or isinstance(value, bool):
        raise StatusFormatError(f"{path}: expected an integer, got {value!r:.80}")
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise StatusFormatError(f"{path}: {value} is not in {bounds}")
    return value


def _seconds(value: Any, path: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise StatusFormatError(f"{path}: expected a number of seconds >= 0, got {value!r:.80}")
    return float(value)


def _enum(cls: type[E], value: Any, path: str) -> E:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise StatusFormatError(f"{path}: {value!r:.80} is not one of {allowed}") from None


def _time(value: Any, path: str) -> datetime:
    text = _str(value, path)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise StatusFormatError(f"{path}: {text!r:.80} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise StatusFormatError(f"{path}: {text!r:.80} has no UTC offset (RFC 3339 needs one)")
    return parsed


def _ip(value: Any, path: str) -> IPAddress:
    try:
        return ipaddress.ip_address(_str(value, path))
    except ValueError:
        raise StatusFormatError(f"{path}: {value!r:.80} is not an IP address") from None


def _items(value: Any, path: str, parse: Callable[[Any, str], T]) -> tuple[T, ...]:
    return tuple(parse(item, f"{path}[{i}]") for i, item in enumerate(_list(value, path)))


def _last_sync(value: Any, path: str) -> LastSync:
    obj = _mapping(value, path)
    p = f"{path}."
    result = _enum(LastSyncResult, _get(obj, "result", p), f"{p}result")
    raw_time, raw_kind = _get(obj, "time", p), _get(obj, "kind", p)
    never = result is LastSyncResult.NEVER
    if (raw_time is None) != never:
        raise StatusFormatError(f"{p}time: must be null exactly when result is 'never'")
    if (raw_kind is None) != never:
        raise StatusFormatError(f"{p}kind: must be null exactly when result is 'never'")
    return LastSync(
        time=None if raw_time is None else _time(raw_time, f"{p}time"),
        result=result,
        message=_str(_get(obj, "message", p), f"{p}message"),
        duration_seconds=_seconds(_get(obj, "durationSeconds", p), f"{p}durationSeconds"),
        kind=None if raw_kind is None else _enum(SyncKind, raw_kind, f"{p}kind"),
    )


def _vrrp(value: Any, path: str) -> VrrpInstanceStatus:
    obj = _mapping(value, path)
    p = f"{path}."
    family = _enum(IPFamily, _get(obj, "family", p), f"{p}family")
    version = 4 if family is IPFamily.IPV4 else 6
    addresses = _items(_get(obj, "addresses", p), f"{p}addresses", _ip)
    if not addresses:
        raise StatusFormatError(f"{p}addresses: an instance carries at least one address")
    for i, a in enumerate(addresses):
        if a.version != version:
            raise StatusFormatError(f"{p}addresses[{i}]: {a} is not an {family} address")
    raw_master = _get(obj, "master", p)
    return VrrpInstanceStatus(
        vrid=_int(_get(obj, "vrid", p), f"{p}vrid", 1, 255),
        family=family,
        state=_enum(VrrpState, _get(obj, "state", p), f"{p}state"),
        priority=_int(_get(obj, "priority", p), f"{p}priority", 0, 255),
        addresses=addresses,
        master=None if raw_master is None else _ip(raw_master, f"{p}master"),
    )


def _protocol(value: Any, path: str) -> Protocol:
    # The document spells protocols as the Kubernetes API does (TCP); nftables' names are
    # lower case.
    text = _str(value, path)
    by_name = {p.value.upper(): p for p in Protocol}
    if text not in by_name:
        raise StatusFormatError(f"{path}: {text!r:.80} is not one of {', '.join(by_name)}")
    return by_name[text]


def _frontend(value: Any, path: str) -> FrontendStatus:
    obj = _mapping(value, path)
    p = f"{path}."
    return FrontendStatus(
        ip=_ip(_get(obj, "ip", p), f"{p}ip"),
        port=_int(_get(obj, "port", p), f"{p}port", 1, 65535),
        protocol=_protocol(_get(obj, "protocol", p), f"{p}protocol"),
        service=_str(_get(obj, "service", p), f"{p}service", empty=False),
        endpoints=_int(_get(obj, "endpoints", p), f"{p}endpoints", 0),
        local_endpoints=_int(_get(obj, "localEndpoints", p), f"{p}localEndpoints", 0),
        spread=_spread(obj.get("spread", {}), f"{p}spread"),
    )


def _spread(value: Any, path: str) -> tuple[tuple[IPAddress, int], ...]:
    obj = _mapping(value, path)
    return tuple(
        (_ip(k, f"{path}.{k}"), _int(v, f"{path}.{k}", 1, BUCKETS)) for k, v in obj.items()
    )


def parse_status(document: Any) -> StatusDocument:
    """Return the parsed status document; raise StatusFormatError naming the path if malformed."""
    obj = _mapping(document, "")
    return StatusDocument(
        node=_str(_get(obj, "node", ""), "node", empty=False),
        time=_time(_get(obj, "time", ""), "time"),
        last_sync=_last_sync(_get(obj, "lastSync", ""), "lastSync"),
        vrrp=_items(_get(obj, "vrrp", ""), "vrrp", _vrrp),
        held_ips=_items(_get(obj, "heldIPs", ""), "heldIPs", _ip),
        frontends=_items(_get(obj, "frontends", ""), "frontends", _frontend),
    )


def format_time(value: datetime) -> str:
    """Return `value` as RFC 3339, with "Z" for UTC and only the sub-second digits it needs."""
    if value.microsecond == 0:
        spec = "seconds"
    elif value.microsecond % 1000 == 0:
        spec = "milliseconds"
    else:
        spec = "microseconds"
    text = value.isoformat(timespec=spec)
    return text[: -len("+00:00")] + "Z" if text.endswith("+00:00") else text


def to_document(status: StatusDocument) -> dict[str, Any]:
    """Return the status document for `status` (the schema above, keys in schema order)."""
    ls = status.last_sync
    return {
        "node": status.node,
        "time": format_time(status.time),
        "lastSync": {
            "time": None if ls.time is None else format_time(ls.time),
            "result": ls.result.value,
            "message": ls.message,
            "durationSeconds": ls.duration_seconds,
            "kind": None if ls.kind is None else ls.kind.value,
        },
        "vrrp": [
            {
                "vrid": v.vrid,
                "family": v.family.value,
                "state": v.state.value,
                "priority": v.priority,
                "addresses": [str(a) for a in v.addresses],
                "master": None if v.master is None else str(v.master),
            }
            for v in status.vrrp
        ],
        "heldIPs": [str(ip) for ip in status.held_ips],
        "frontends": [_frontend_document(f) for f in status.frontends],
    }


def _frontend_document(f: FrontendStatus) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ip": str(f.ip),
        "port": f.port,
        "protocol": f.protocol.value.upper(),
        "service": f.service,
        "endpoints": f.endpoints,
        "localEndpoints": f.local_endpoints,
    }
    if f.spread:
        out["spread"] = {str(ip): n for ip, n in f.spread}
    return out


def to_json(status: StatusDocument) -> str:
    """Return the status document as indented JSON (no trailing newline)."""
    return json.dumps(to_document(status), indent=2)
