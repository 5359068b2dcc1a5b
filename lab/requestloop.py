"""A client request loop in a lab namespace: what a user sees during a failover.

`RequestLoop` runs a small stdlib-only Python process in the client namespace that opens a TCP
connection to `ip:port` every `interval` seconds (each with `timeout`), reads the pod's one-line
answer (lab.servers), or with `http_path` sends an HTTP/1.0 GET and takes a 200's body as the
answer (agnhost netexec's /hostname on real nodes), and prints one JSON line per request:
monotonic send and end times, ok or the failure. `stop()` ends it (SIGTERM, by PID) and returns the
results; `outage()` is the longest stretch from the first failed request to the next answered
one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agent.model.net import IPAddress
from lab import netns
from lab.vrrp_lab import neighbour_mac

_SNIPPET = r"""
import json, signal, socket, sys, time
ip, port, interval, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
path = sys.argv[5]
fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
running = True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
print(json.dumps({"ready": True}), flush=True)
while running:
    start = time.monotonic()
    out = {"t": start}
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect((ip, port))
            if path:
                s.sendall(b"GET " + path.encode() + b" HTTP/1.0\r\nHost: lab\r\n\r\n")
            data = b""
            while path or not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        if path:
            head, _, body = data.partition(b"\r\n\r\n")
            out["ok"] = head.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"200"]
            out["pod"] = body.decode(errors="replace").strip()
        else:
            out["ok"] = bool(data)
            out["pod"] = data.decode(errors="replace").split()[0] if data else ""
    except OSError as e:
        out["ok"] = False
        out["error"] = type(e).__name__
    out["end"] = time.monotonic()
    print(json.dumps(out), flush=True)
    time.sleep(max(0.0, interval - (time.monotonic() - start)))
"""


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the loop: when it was sent, whether it was answered, and by which pod."""

    t: float
    ok: bool
    pod: str
    error: str
    end: float = 0.0  # when the answer or the failure came (CLOCK_MONOTONIC, as `t`)


class RequestLoop:
    """See the module docstring. `start()` waits until the loop runs; `stop()` collects."""

    def __init__(
        self,
        ns: str,
        ip: IPAddress,
        port: int,
        *,
        interval: float = 0.02,
        timeout: float = 0.2,
        log: Path | None = None,
        http_path: str | None = None,
    ) -> None:
        self._argv = [sys.executable, "-c", _SNIPPET, str(ip), str(port), str(interval)]
        self._argv += [str(timeout), http_path or ""]
        self._ns = ns
        self._log = log
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            ["ip", "netns", "exec", self._ns, *self._argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        first = self._proc.stdout.readline()
        if '"ready"' not in first:
            self.stop()
            raise RuntimeError("the request loop did not start")

    def stop(self) -> list[Request]:
        """Stop the loop (by PID) and return every request it made."""
        proc = self._proc
        if proc is None:
            return []
        self._proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            netns.stop(proc, sig=signal.SIGKILL)  # type: ignore[arg-type]
            out = ""
        results = []
        for line in out.splitlines():
            raw = json.loads(line)
            results.append(
                Request(
                    raw["t"],
                    bool(raw["ok"]),
                    raw.get("pod", ""),
                    raw.get("error", ""),
                    raw.get("end", raw["t"]),
                )
            )
        if self._log is not None:
            self._log.write_text(out)
        return results


def outage(requests: list[Request]) -> float:
    """Return the longest time (s) from a failed request to the next answered one (0: none)."""
    worst = 0.0
    first_failure: float | None = None
    for r in requests:
        if not r.ok and first_failure is None:
            first_failure = r.t
        elif r.ok and first_failure is not None:
            worst = max(worst, r.t - first_failure)
            first_failure = None
    if first_failure is not None and requests:
        worst = max(worst, requests[-1].t - first_failure)
    return worst


def failed(requests: list[Request]) -> int:
    """Return how many requests failed."""
    return sum(1 for r in requests if not r.ok)


def unexplained_failures(
    requests: list[Request], moves: list[tuple[float, float]], *, slack: float = 0.05
) -> list[Request]:
    """Return the failed requests that no move of the IP explains.

    `moves` are windows (earliest, latest) in which the IP moved to another node as the
    client's router sees it (its neighbour entry changed MAC), on CLOCK_MONOTONIC. A
    connection in flight when the IP moves is lost by every L2 load balancer: its next packet
    reaches a node with no conntrack entry for it (a reset, or a timeout). So a failed request
    is explained when it was in flight during a move's window (widened by `slack` for the
    sampling), and at most one per move: the loop is sequential, so only one request can be in
    flight at a move; a second failure around the same move is a real outage.
    """
    unexplained: list[Request] = []
    used: set[int] = set()
    for r in requests:
        if r.ok:
            continue
        hit = next(
            (
                i
                for i, (lo, hi) in enumerate(moves)
                if i not in used and r.t <= hi + slack and r.end >= lo - slack
            ),
            None,
        )
        if hit is None:
            unexplained.append(r)
        else:
            used.add(hit)
    return unexplained


class NeighbourWatch:
    """Sample which MAC a namespace (a client's router) has for an IP, to time the IP's moves.

    `start()` samples every `period` seconds in a thread until `stop()`, which returns the
    moves: one window (earliest, latest) on CLOCK_MONOTONIC per change from one MAC to
    another, from the last sample that showed the old MAC to the first that showed the new.
    """

    def __init__(self, ns: str, ip: IPAddress, *, period: float = 0.02) -> None:
        self._ns, self._ip, self._period = ns, ip, period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._moves: list[tuple[float, float]] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="neighbour-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last: tuple[str, float] | None = None  # the MAC last seen, and when
        while not self._stop.is_set():
            mac = neighbour_mac(self._ns, self._ip)
            now = time.monotonic()
            if mac is not None:
                if last is not None and mac != last[0]:
                    self._moves.append((last[1], now))
                last = (mac, now)
            self._stop.wait(self._period)

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return list(self._moves)
