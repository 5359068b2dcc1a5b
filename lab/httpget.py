"""HTTP GETs from inside a lab namespace, many per process: what an outside client sees.

`get_many` runs one short stdlib-only Python process in the namespace that sends `count`
HTTP/1.0 GETs to `ip:port` + `path`, each on a new connection (so each is a new flow that
the load balancer places anew), and prints one JSON line per request. agnhost's netexec
answers `/hostname` with the pod's name and `/clientip` with the address:port it saw.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from agent.model.net import IPAddress
from lab import netns

_SNIPPET = r"""
import json, socket, sys
ip, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
count, timeout = int(sys.argv[4]), float(sys.argv[5])
fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
for _ in range(count):
    out = {}
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect((ip, port))
            s.sendall(b"GET " + path.encode() + b" HTTP/1.0\r\nHost: lab\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split(b" ")
        out["status"] = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
        out["body"] = body.decode(errors="replace").strip()
    except OSError as e:
        out["status"] = 0
        out["error"] = type(e).__name__ + ": " + str(e)
    print(json.dumps(out), flush=True)
"""


@dataclass(frozen=True, slots=True)
class HttpResult:
    """One GET: the status (0 when no answer), the body, and the error when there was none."""

    status: int
    body: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


def get_many(
    ns: str, ip: IPAddress, port: int, path: str, *, count: int = 1, timeout: float = 3.0
) -> list[HttpResult]:
    """Return the results of `count` sequential GETs of `path` at `ip:port`, sent from `ns`."""
    argv = [sys.executable, "-c", _SNIPPET, str(ip), str(port), path, str(count), str(timeout)]
    proc = netns.run(ns, argv, timeout=count * (timeout + 1) + 10)
    results = []
    for line in proc.stdout.splitlines():
        raw = json.loads(line)
        results.append(HttpResult(int(raw["status"]), raw.get("body", ""), raw.get("error", "")))
    return results
