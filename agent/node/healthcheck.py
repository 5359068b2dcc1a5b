"""The healthCheckNodePort listeners for externalTrafficPolicy=Local Services, as kube-proxy's.

An external load balancer (or a router doing ECMP) probes `http://<node>:<healthCheckNodePort>/`
to learn whether a node has a local ready endpoint of the Service: 200 with the count when it
does, 503 when it has none, so traffic is only sent where it will not be dropped. kube-proxy
serves these ports wherever it runs, so nodelb's answer is off by default
(`healthCheckNodePorts: true` turns it on, for clusters without kube-proxy).

The answers themselves are computed by agent/node/health_answers.py (pure); `HealthCheckServers`
opens one HTTP listener per port and swaps the answers in place, so a change of endpoint counts
costs no socket work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.node.health_answers import HealthAnswer

log = logging.getLogger(__name__)


class HealthCheckServers:
    """One HTTP listener per healthCheckNodePort, answering from a shared, swappable table."""

    def __init__(self, host: str = "0.0.0.0") -> None:
        self._host = host
        self._answers: dict[int, HealthAnswer] = {}
        self._servers: dict[int, tuple[ThreadingHTTPServer, threading.Thread]] = {}
        self._lock = threading.Lock()

    @property
    def ports(self) -> frozenset[int]:
        """Return the ports listened on now."""
        return frozenset(self._servers)

    def update(self, answers: Mapping[int, HealthAnswer]) -> list[str]:
        """Serve exactly `answers`: open new ports, close gone ones; return bind errors."""
        with self._lock:
            self._answers = dict(answers)
        errors: list[str] = []
        for port in sorted(set(self._servers) - set(answers)):
            server, thread = self._servers.pop(port)
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        for port in sorted(set(answers) - set(self._servers)):
            try:
                server = ThreadingHTTPServer((self._host, port), self._handler(port))
            except OSError as exc:
                errors.append(f"cannot listen on health check port {port}: {exc}")
                continue
            server.daemon_threads = True
            thread = threading.Thread(target=server.serve_forever, name=f"hc-{port}", daemon=True)
            thread.start()
            self._servers[port] = (server, thread)
        return errors

    def close(self) -> None:
        """Stop every listener."""
        self.update({})

    def _answer(self, port: int) -> HealthAnswer | None:
        with self._lock:
            return self._answers.get(port)

    def _handler(self, port: int) -> type[BaseHTTPRequestHandler]:
        lookup = self._answer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer = lookup(port)
                if answer is None:  # closing: the Service went away meanwhile
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = answer.body()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("X-Load-Balancing-Endpoint-Weight", str(answer.local_endpoints))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
