"""`nodelb status`: fetch an agent's status document, check it, and print it as tables or JSON.

The document's schema, its parser and its builder are agent/node/status_document.py; this is
the command: `fetch` and `run` are the shell, the table rendering is pure.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from agent.config import DEFAULT_METRICS_ADDRESS
from agent.model.net import IPAddress
from agent.node.status_document import (
    STATUS_PATH,
    StatusDocument,
    StatusFormatError,
    format_time,
    parse_status,
    to_json,
)

DEFAULT_TIMEOUT = 5.0
MAX_DOCUMENT_BYTES = 64 << 20  # 10k frontends are about 1.5 MB; refuse anything absurd


def default_url() -> str:
    """Return the URL of the local agent: loopback on the default metrics port.

    The agent runs with hostNetwork and listens on 0.0.0.0 by default, so loopback on the
    node reaches it.
    """
    port = DEFAULT_METRICS_ADDRESS.rpartition(":")[2]
    return f"http://127.0.0.1:{port}"


class StatusFetchError(OSError):
    """The agent could not be reached or did not answer with JSON; the message names the URL."""


# --- parsing ------------------------------------------------------------------------------


# --- output -------------------------------------------------------------------------------


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


def render_table(status: StatusDocument) -> str:
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
