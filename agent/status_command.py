"""`nodelb status`: fetch an agent's status document, check it, and print it as tables or JSON.

The document's schema, its parser and its builder are agent/node/status_document.py; this is
the command: `fetch` and `run` are the shell, the table rendering is pure.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.config import DEFAULT_METRICS_ADDRESS
from agent.http_server import parse_addresses
from agent.model.net import IPAddress
from agent.model.tunnel import BUCKETS
from agent.node.status_document import (
    STATUS_PATH,
    StatusDocument,
    StatusFormatError,
    format_time,
    parse_status,
    to_json,
)
from agent.serving_cert import DEFAULT_CERT_OUT, client_context

DEFAULT_TIMEOUT = 5.0
MAX_DOCUMENT_BYTES = 64 << 20  # 10k frontends are about 1.5 MB; refuse anything absurd


DEFAULT_CONFIG = Path("/etc/nodelb/config.yaml")  # the DaemonSet's ConfigMap mount
IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def url_from_address(address: str) -> str:
    """Return the https URL of the first of an agent's listen addresses, a wildcard read as
    loopback (the agent runs with hostNetwork, so loopback on the node reaches it)."""
    host, port = parse_addresses(address)[0]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def default_url(config: Path | None = DEFAULT_CONFIG) -> str:
    """Return the local agent's URL from `metricsAddress` in its config file (the default
    address when the file does not exist or does not set it).

    Raises StatusFetchError when the file exists but cannot be read or the address is bad.
    """
    address = DEFAULT_METRICS_ADDRESS
    if config is not None and config.exists():
        try:
            raw = yaml.safe_load(config.read_text()) or {}
            if isinstance(raw, dict) and raw.get("metricsAddress") is not None:
                address = str(raw["metricsAddress"])
        except (OSError, yaml.YAMLError) as exc:
            raise StatusFetchError(f"{config}: cannot read the agent's config: {exc}") from None
    try:
        return url_from_address(address)
    except ValueError as exc:
        raise StatusFetchError(f"{config}: metricsAddress: {exc}") from None


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
    spread = [f for f in frontends if f.spread]
    if spread:
        lines += ["", f"Spread (buckets of {BUCKETS} per serving node)"]
        rows = [
            [
                str(f.ip),
                str(f.port),
                f.protocol.value.upper(),
                str(BUCKETS - sum(n for _, n in f.spread)),
                ", ".join(f"{ip} {n}" for ip, n in f.spread),
            ]
            for f in spread
        ]
        lines += _table(("IP", "PORT", "PROTOCOL", "THIS NODE", "OTHER NODES"), rows, {1, 3})
    return "\n".join(lines)


# --- shell --------------------------------------------------------------------------------


def status_url(url: str) -> str:
    """Return the URL to GET: `url` itself when it has a path, else `url` + "/status".

    Only https:// is accepted (the agent's metrics server speaks nothing else).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" or not parts.netloc:
        raise StatusFetchError(f"{url}: expected an https://host:port URL")
    if parts.path in ("", "/"):
        parts = parts._replace(path=STATUS_PATH)
    return urllib.parse.urlunsplit(parts)


UNAUTHORIZED_HINT = (
    "pass --token or --token-file with a token allowed to get /status (the ClusterRole "
    "nodelb-metrics-reader)"
)


def fetch(
    url: str,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
) -> Any:
    """Return the decoded JSON document served at `status_url(url)`.

    `token` goes as `Authorization: Bearer`; `context` verifies the agent's certificate.
    Raises StatusFetchError (naming the URL) when the agent cannot be reached, answers with a
    status other than 200, sends more than MAX_DOCUMENT_BYTES, or sends something not JSON.
    The document's shape is not checked here (parse_status does that).
    """
    target = status_url(url)
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(target, headers=headers)
    # The agent is on this node or in the cluster: an https_proxy from the environment would
    # send the request somewhere else, so proxies are switched off.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=timeout) as response:
            body = response.read(MAX_DOCUMENT_BYTES + 1)
    except urllib.error.HTTPError as exc:
        hint = f": {UNAUTHORIZED_HINT}" if exc.code in (401, 403) else ""
        raise StatusFetchError(
            f"{target}: the agent answered HTTP {exc.code} {exc.reason}{hint}"
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


def read_token(args: argparse.Namespace) -> str | None:
    """Return the bearer token: --token, else --token-file, else the in-cluster token when
    running in a Pod (None: there is none, and the agent will answer 401)."""
    if args.token:
        return str(args.token)
    path = args.token_file or (IN_CLUSTER_TOKEN if IN_CLUSTER_TOKEN.exists() else None)
    if path is None:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise StatusFetchError(f"{path}: cannot read the token: {exc}") from None


def tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    """Return how the agent's certificate is verified: --cacert (a CA bundle, host name
    checked), else the certificate the agent published on this host (pinned), else nothing
    with --insecure-skip-tls-verify, else the system's CAs."""
    if args.insecure_skip_tls_verify:
        return client_context(ca_file=None, insecure=True)
    if args.cacert is not None:
        return client_context(ca_file=args.cacert)
    if args.agent_cert.exists():
        return client_context(ca_file=args.agent_cert, pinned=True)
    return client_context(ca_file=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `nodelb status`'s options to `parser`."""
    parser.add_argument(
        "--url",
        default=None,
        help="the agent's https://host:port (default: from metricsAddress in --config); "
        "/status is appended when the URL has no path",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="the agent's config file, for its address (default: %(default)s)",
    )
    parser.add_argument("--token", default=None, help="a bearer token allowed to get /status")
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"a file holding the token (default: {IN_CLUSTER_TOKEN}, when it exists)",
    )
    parser.add_argument(
        "--cacert", type=Path, default=None, help="CA bundle the agent's certificate chains to"
    )
    parser.add_argument(
        "--agent-cert",
        type=Path,
        default=Path(DEFAULT_CERT_OUT),
        help="the self-signed certificate the agent published, pinned when it exists "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        help="do not verify the agent's certificate",
    )
    parser.add_argument("--json", action="store_true", help="print the document as JSON")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    """Fetch, check and print the status; return 0, or 1 with a message on stderr."""
    url = args.url
    try:
        url = url or default_url(args.config)
        raw = fetch(url, args.timeout, token=read_token(args), context=tls_context(args))
        status = parse_status(raw)
    except StatusFetchError as exc:
        print(f"nodelb status: {exc}", file=sys.stderr)
        return 1
    except StatusFormatError as exc:
        print(
            f"nodelb status: {status_url(url)}: malformed status document: {exc}",
            file=sys.stderr,
        )
        return 1
    print(to_json(status) if args.json else render_table(status))
    return 0


def main(argv: list[str]) -> int:
    """Run `nodelb status [options]` (see add_arguments); return the exit code."""
    parser = argparse.ArgumentParser(
        prog="nodelb status", description="Show what the agent on a node is doing."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
