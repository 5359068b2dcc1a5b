"""The HTTP endpoint: /metrics (Prometheus), /healthz, /readyz and (agent) /status, over TLS.

/healthz answers 200 while the main loop is alive; /readyz answers 200 once the caches have
synced and the first full sync is in the kernel (the DaemonSet's readiness probe), else 503
with the reason when the process gives one (`not ready: configuration refused: ...`).
Both are open: the kubelet's probes carry no token. /metrics and /status answer only a bearer
token the `gate` lets through (agent/kube/access.py: TokenReview, then a SubjectAccessReview
on the path), as kube-rbac-proxy does. Every listen address gets its own socket, so the
default (`0.0.0.0:9472,[::]:9472`) serves both families; TLS (agent/serving_cert.py) wraps
each, with the handshake made in the connection's own thread so a slow client holds up
nobody else.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.kube.access import Decision, Verdict

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0  # s a client has to finish the TLS handshake and its request


class Gate(Protocol):
    """Who may read a path (agent.kube.reviews.AccessGate)."""

    def check(self, path: str, authorization: str | None) -> Decision:
        """Return the decision for a GET of `path` with that Authorization header."""
        ...


def parse_address(address: str) -> tuple[str, int]:
    """Return (host, port) for "host:port" or "[v6]:port"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_addresses(text: str) -> list[tuple[str, int]]:
    """Return every (host, port) of a comma-separated list of listen addresses.

    Raises ValueError naming the entry that is not `host:port` or `[v6]:port`.
    """
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            if ":" not in part:
                raise ValueError(part)
            out.append(parse_address(part))
        except ValueError:
            raise ValueError(f"listen address {part!r} is not host:port or [v6]:port") from None
    if not out:
        raise ValueError("no listen address given")
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler, bind_and_activate=False)
        if self.address_family == socket.AF_INET6:
            # One socket per family: "[::]" must not also take IPv4, or "0.0.0.0" beside it
            # fails with EADDRINUSE.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            self.server_bind()
            self.server_activate()
        except BaseException:
            self.server_close()
            raise


class HealthServer:
    """Serves the four paths from its own threads; start with run(), stop with close()."""

    def __init__(
        self,
        address: str,
        *,
        alive: Callable[[], bool],
        ready: Callable[[], bool],
        gate: Gate,
        tls: ssl.SSLContext | None,
        status: Callable[[], dict[str, Any]] | None = None,
        why_not_ready: Callable[[], str] | None = None,
    ) -> None:
        self._addresses = parse_addresses(address)
        self._alive = alive
        self._ready = ready
        self._gate = gate
        self._tls = tls
        self._status = status
        self._why_not_ready = why_not_ready
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        """Return the bound port of the first address (useful when configured as 0)."""
        return self.ports[0]

    @property
    def ports(self) -> list[int]:
        """Return the bound port of every address, in order."""
        return [int(s.server_address[1]) for s in self._servers]

    def run(self) -> None:
        alive, ready, status, gate, tls = (
            self._alive,
            self._ready,
            self._status,
            self._gate,
            self._tls,
        )
        why_not_ready = self._why_not_ready

        def not_ready() -> bytes:
            why = why_not_ready() if why_not_ready is not None else ""
            return f"not ready: {why}\n".encode() if why else b"not ready\n"

        class Handler(BaseHTTPRequestHandler):
            timeout = HANDSHAKE_TIMEOUT

            def handle(self) -> None:
                # A client that went away or spoke no TLS: nothing to answer.
                with contextlib.suppress(OSError):
                    if isinstance(self.connection, ssl.SSLSocket):
                        self.connection.do_handshake()
                    super().handle()

            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                decision = gate.check(path, self.headers.get("Authorization"))
                if decision.verdict not in (Verdict.OPEN, Verdict.ALLOWED):
                    code = decision.verdict.status
                    extra = {"WWW-Authenticate": "Bearer"} if code == 401 else {}
                    self._send(code, decision.message.encode(), headers=extra)
                elif path == "/metrics":
                    self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = alive()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"loop stopped\n")
                elif path == "/readyz":
                    ok = ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else not_ready())
                elif path == "/status" and status is not None:
                    self._send(200, orjson.dumps(status()), "application/json")
                else:
                    self._send(404, b"not found\n")

            def _send(
                self,
                code: int,
                body: bytes,
                ctype: str = "text/plain",
                headers: dict[str, str] | None = None,
            ) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        for address in self._addresses:
            try:
                server = _Server(address, Handler)
            except OSError as exc:
                # A host without IPv6 (ipv6.disable=1) still serves the default's IPv4 half.
                if address[0] != "::" or exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                    raise
                log.warning("not listening on [::]:%d: %s", address[1], exc)
                continue
            if tls is not None:
                server.socket = tls.wrap_socket(
                    server.socket, server_side=True, do_handshake_on_connect=False
                )
            self._servers.append(server)
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, name="health", daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
