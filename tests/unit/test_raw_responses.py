"""Raw API answers (`_preload_content=False`) give their connection back to the client's pool.

An answer whose body is never read keeps its pooled connection: the pool runs dry and every
later request opens a new TLS connection. bench.allocator found the controller spending half
its time in handshakes that way (Lease writes and Event creates were never read). Here the
real kubernetes client talks HTTP/1.1 keep-alive to a small local server that counts the
TCP connections it accepts: many requests, one thread, must use one connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
from kubernetes import client

from agent.controller.api import KubeControllerAPI, PatchResult
from agent.kube.event_sender import KubeEventSink
from agent.kube.events import Event, ObjectRef


class CountingServer(ThreadingHTTPServer):
    connections = 0
    requests: list[str]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kube-apiserver
    server: CountingServer

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append(f"{self.command} {self.path}")
        if self.command == "PUT" and self.path.endswith("/leases/held"):
            status, body = 409, {"kind": "Status", "code": 409}  # another candidate wrote
        else:
            status, body = 200, {"metadata": {"resourceVersion": "7"}, "items": []}
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[CountingServer]:
    srv = CountingServer(("127.0.0.1", 0), Handler)
    srv.requests = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def api_of(srv: CountingServer) -> Any:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{srv.server_address[1]}"
    return client.ApiClient(configuration)


def lease(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {}}


def test_every_controller_request_reuses_one_connection(server: CountingServer) -> None:
    api = KubeControllerAPI(api_of(server))
    patch = {"metadata": {"resourceVersion": "6"}, "status": {}}
    for _ in range(10):
        assert api.patch_service_status("ns", "web", patch).result is PatchResult.OK
        assert api.patch_service_metadata("ns", "web", patch).resource_version == "7"
        assert api.replace_lease("ns", "mine", lease("mine")) is True
        assert api.replace_lease("ns", "held", lease("held")) is False  # a 409
        assert api.create_lease("ns", lease("new")) is True
        assert api.read_lease("ns", "mine") is not None
        api.list_nodes()
    assert len(server.requests) == 70
    assert server.connections == 1


def test_event_writes_reuse_their_connection(server: CountingServer) -> None:
    sink = KubeEventSink(
        client.CoreV1Api(api_of(server)), component="nodelb-controller", host="c", senders=1
    )
    ref = ObjectRef(kind="Service", namespace="ns", name="web", uid="u1")
    for i in range(20):
        sink.record(Event(ref, "Normal", "IPAllocated", f"allocated 198.19.0.{i}"))
        assert sink.send_ready() == 1
    assert len(server.requests) == 20 and server.connections == 1
