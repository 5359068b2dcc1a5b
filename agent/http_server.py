"""The HTTP endpoint: /metrics (Prometheus), /healthz, /readyz and (agent) /status.

/healthz answers 200 while the main loop is alive; /readyz answers 200 once the caches have
synced and the first full sync is in the kernel (the DaemonSet's readiness probe), else 503
with the reason when the process gives one (`not ready: configuration refused: ...`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def parse_address(address: str) -> tuple[str, int]:
    """Return (host, port) for "host:port" or "[v6]:port"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class HealthServer:
    """Serves the three paths from its own thread; start with run(), stop with close()."""

    def __init__(
        self,
        address: str,
        *,
        alive: Callable[[], bool],
        ready: Callable[[], bool],
        status: Callable[[], dict[str, Any]] | None = None,
        why_not_ready: Callable[[], str] | None = None,
    ) -> None:
        self._address = parse_address(address)
        self._alive = alive
        self._ready = ready
        self._status = status
        self._why_not_ready = why_not_ready
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """Return the bound port (useful when configured as 0)."""
        assert self._server is not None
        return int(self._server.server_address[1])

    def run(self) -> None:
        alive, ready, status = self._alive, self._ready, self._status
        why_not_ready = self._why_not_ready

        def not_ready() -> bytes:
            why = why_not_ready() if why_not_ready is not None else ""
            return f"not ready: {why}\n".encode() if why else b"not ready\n"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    ok = alive()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"loop stopped\n")
                elif self.path == "/readyz":
                    ok = ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else not_ready())
                elif self.path == "/status" and status is not None:
                    self._send(200, orjson.dumps(status()), "application/json")
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(self._address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
