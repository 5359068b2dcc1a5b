"""`nodelb status`: fetch an agent's status document, check it, and print it as tables or JSON.

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
                "endpoints": 3, "localEndpoints": 1}]}    # counts >= 0
```

Keys not listed are ignored, so an older `nodelb status` reads a newer agent's document.
Every listed key is required; a wrong type or value raises `StatusFormatError` naming the
path (`vrrp[0].state: ...`). The parsing and rendering here are pure; `fetch` and `main` are
the shell.
"""

from __future__ import annotations

import argparse
import enum
import ipaddress
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from agent.config import DEFAULT_METRICS_ADDRESS
from agent.model.desired_state import IPAddress, Protocol
from agent.node.endpoints import IPFamily

STATUS_PATH = "/status"
DEFAULT_TIMEOUT = 5.0
MAX_DOCUMENT_BYTES = 64 << 20  # 10k frontends are about 1.5 MB; refuse anything absurd


def default_url() -> str:
    """Return the URL of the local agent: loopback on the default metrics port.

    The agent runs with hostNetwork and listens on 0.0.0.0 by default, so loopback on the
    node reaches it.
    """
    port = DEFAULT_METRICS_ADDRESS.rpartition(":")[2]
    return f"http://127.0.0.1:{port}"


class StatusFormatError(ValueError):
    """The status document does not follow the schema; the message names the path."""


class StatusFetchError(OSError):
    """The agent could not be reached or did not answer with JSON; the message names the URL."""


class SyncResult(enum.StrEnum):
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
    result: SyncResult
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


@dataclass(frozen=True, slots=True)
class Status:
    """An agent's status document, parsed. Lists keep the document's order."""

    node: str
    time: datetime
    last_sync: LastSync
    vrrp: tuple[VrrpInstanceStatus, ...]
    held_ips: tuple[IPAddress, ...]
    frontends: tuple[FrontendStatus, ...]


# --- parsing ------------------------------------------------------------------------------

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
    result = _enum(SyncResult, _get(obj, "result", p), f"{p}result")
    raw_time, raw_kind = _get(obj, "time", p), _get(obj, "kind", p)
    never = result is SyncResult.NEVER
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
    )


def parse_status(document: Any) -> Status:
    """Return the Status for a decoded status document; raise StatusFormatError if malformed."""
    obj = _mapping(document, "")
    return Status(
        node=_str(_get(obj, "node", ""), "node", empty=False),
        time=_time(_get(obj, "time", ""), "time"),
        last_sync=_last_sync(_get(obj, "lastSync", ""), "lastSync"),
        vrrp=_items(_get(obj, "vrrp", ""), "vrrp", _vrrp),
        held_ips=_items(_get(obj, "heldIPs", ""), "heldIPs", _ip),
        frontends=_items(_get(obj, "frontends", ""), "frontends", _frontend),
    )


# --- output -------------------------------------------------------------------------------


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


def to_document(status: Status) -> dict[str, Any]:
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
        "frontends": [
            {
                "ip": str(f.ip),
                "port": f.port,
                "protocol": f.protocol.value.upper(),
                "service": f.service,
                "endpoints": f.endpoints,
                "localEndpoints": f.local_endpoints,
            }
            for f in status.frontends
        ],
    }


def to_json(status: Status) -> str:
    """Return the status document as indented JSON (no trailing newline)."""
    return json.dumps(to_document(status), indent=2)


def _ip_key(ip: IPAddress) -> tuple[int, int]:
    return ip.version, int(ip)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Return aligned lines: two spaces between columns, `right` columns right-aligned."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    lines = []
    for row in (headers, *rows):
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.3f}s" if seconds < 10 else f"{seconds:.1f}s"


def render_table(status: Status) -> str:
    """Return the status as readable text: node and last sync, VRRP instances, held IPs and
    frontends, each section aligned; VRRP by (family, VRID), IPs by address, frontends by
    (ip, port, protocol). Empty sections say "(none)". No trailing newline."""
    ls = status.last_sync
    lines = [f"Node       {status.node}", f"Time       {format_time(status.time)}"]
    if ls.time is None:
        lines.append("Last sync  never")
    else:
        age = (status.time - ls.time).total_seconds()
        kind = f" ({ls.kind.value})" if ls.kind is not None else ""
        lines.append(
            f"Last sync  {ls.result.value}{kind} at {format_time(ls.time)}, "
            f"{_seconds_text(age)} before this report, took {_seconds_text(ls.duration_seconds)}"
        )
    # nft errors span several lines; each is indented under the sync line.
    lines += [f"           {line}" for line in ls.message.splitlines()]

    lines += ["", "VRRP instances"]
    vrrp = sorted(status.vrrp, key=lambda v: (v.family.value, v.vrid))
    if vrrp:
        rows = [
            [
                str(v.vrid),
                v.family.value,
                v.state.value,
                str(v.priority),
                "-" if v.master is None else str(v.master),
                ", ".join(str(a) for a in sorted(v.addresses, key=_ip_key)),
            ]
            for v in vrrp
        ]
        lines += _table(
            ("VRID", "FAMILY", "STATE", "PRIORITY", "MASTER", "ADDRESSES"), rows, {0, 3}
        )
    else:
        lines.append("(none)")

    lines += ["", "Held IPs"]
    held = sorted(status.held_ips, key=_ip_key)
    lines += [str(ip) for ip in held] if held else ["(none)"]

    lines += ["", "Frontends"]
    frontends = sorted(
        status.frontends, key=lambda f: (_ip_key(f.ip), f.port, f.protocol.value, f.service)
    )
    if frontends:
        rows = [
            [
                str(f.ip),
                str(f.port),
                f.protocol.value.upper(),
                f.service,
                str(f.endpoints),
                str(f.local_endpoints),
            ]
            for f in frontends
        ]
        lines += _table(
            ("IP", "PORT", "PROTOCOL", "SERVICE", "ENDPOINTS", "LOCAL"), rows, {1, 4, 5}
        )
    else:
        lines.append("(none)")
    return "\n".join(lines)


# --- shell --------------------------------------------------------------------------------


def status_url(url: str) -> str:
    """Return the URL to GET: `url` itself when it has a path, else `url` + "/status".

    Only plain http:// is accepted (the agent's metrics server speaks nothing else).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.netloc:
        raise StatusFetchError(f"{url}: expected an http://host:port URL")
    if parts.path in ("", "/"):
        parts = parts._replace(path=STATUS_PATH)
    return urllib.parse.urlunsplit(parts)


# The agent is on this node or in the cluster: an http_proxy from the environment would send
# the request somewhere else, so proxies are switched off.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Return the decoded JSON document served at `status_url(url)`.

    Raises StatusFetchError (naming the URL) when the agent cannot be reached, answers with a
    status other than 200, sends more than MAX_DOCUMENT_BYTES, or sends something not JSON.
    The document's shape is not checked here (parse_status does that).
    """
    target = status_url(url)
    request = urllib.request.Request(target, headers={"Accept": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            body = response.read(MAX_DOCUMENT_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise StatusFetchError(
            f"{target}: the agent answered HTTP {exc.code} {exc.reason}"
        ) from None
    except urllib.error.URLError as exc:
        raise StatusFetchError(f"{target}: cannot reach the agent: {exc.reason}") from None
    except OSError as exc:  # timeouts and resets after the connection was made
        raise StatusFetchError(f"{target}: cannot reach the agent: {exc}") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise StatusFetchError(f"{target}: the answer is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise StatusFetchError(f"{target}: the answer is not JSON ({exc})") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `nodelb status`'s options to `parser`."""
    parser.add_argument(
        "--url",
        default=default_url(),
        help="the agent's metrics/health address (default: %(default)s); /status is appended "
        "when the URL has no path",
    )
    parser.add_argument("--json", action="store_true", help="print the document as JSON")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    """Fetch, check and print the status; return 0, or 1 with a message on stderr."""
    try:
        status = parse_status(fetch(args.url, args.timeout))
    except StatusFetchError as exc:
        print(f"nodelb status: {exc}", file=sys.stderr)
        return 1
    except StatusFormatError as exc:
        print(
            f"nodelb status: {status_url(args.url)}: malformed status document: {exc}",
            file=sys.stderr,
        )
        return 1
    print(to_json(status) if args.json else render_table(status))
    return 0


def main(argv: list[str]) -> int:
    """Run `nodelb status [--url URL] [--json] [--timeout S]`; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="nodelb status", description="Show what the agent on a node is doing."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
