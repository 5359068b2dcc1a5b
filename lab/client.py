"""Send TCP / UDP / SCTP requests to lab pod servers from inside a namespace, and classify them.

One call runs one short Python process inside the namespace (`ip netns exec NS python -c`)
that performs every probe of the batch in order and prints one JSON line per probe, so a
test making hundreds of requests pays the process start-up once. Probes are sequential:
a dropped probe costs its whole timeout, so pick timeouts with that in mind.

A result is either a `Reply` (the pod name and the client address the pod saw, parsed from
the server's answer line, see lab.servers) or a `Failure` with an `Outcome`:

- REFUSED: the destination actively refused. TCP: a reset answering the SYN, or an ICMP
  port-unreachable (the socket API cannot tell those two apart). UDP: ICMP port-unreachable.
- RESET: an established TCP connection was reset before the answer was read.
- TIMEOUT: no answer before the deadline (the packets were dropped somewhere).
- UNREACHABLE: ICMP host/network unreachable or administratively prohibited, or no route.
  (UDP sockets set IP_RECVERR / IPV6_RECVERR so these ICMP errors are reported too.)
- ERROR: anything else (for example a local EPERM from a netfilter drop on output, or a
  connection closed without an answer); `detail` says what.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from agent.model.net import IPAddress, Protocol
from lab import netns


class Outcome(enum.StrEnum):
    """How a request ended."""

    OK = "ok"
    REFUSED = "refused"
    RESET = "reset"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Reply:
    """A pod's answer: which pod served the request and the client address it saw."""

    pod: str
    client_ip: IPAddress
    client_port: int

    @property
    def outcome(self) -> Outcome:
        """Always Outcome.OK, so results can be compared by outcome uniformly."""
        return Outcome.OK


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that got no answer; `detail` carries the errno name or the reason."""

    outcome: Outcome
    detail: str


Result = Reply | Failure


@dataclass(frozen=True, slots=True)
class Probe:
    """One request: protocol, destination, per-request timeout, optional source address/port."""

    protocol: Protocol
    ip: IPAddress
    port: int
    timeout: float = 2.0
    source: IPAddress | None = None
    source_port: int | None = None


class ClientError(RuntimeError):
    """The probe process itself failed (not a failed request); carries its stderr."""


# Runs inside the namespace with the plain interpreter: stdlib only, reads the probe list as
# JSON on stdin, prints one JSON object per probe: {"line": "..."} or {"outcome", "detail"}.
_SNIPPET = r"""
import errno, json, socket, sys, time
OUT = {
    errno.ECONNREFUSED: "refused",
    errno.ECONNRESET: "reset", errno.EPIPE: "reset",
    errno.ETIMEDOUT: "timeout",
    errno.EHOSTUNREACH: "unreachable", errno.ENETUNREACH: "unreachable",
    errno.EHOSTDOWN: "unreachable", errno.ENETDOWN: "unreachable", errno.EACCES: "unreachable",
}
def one(p):
    fam = socket.AF_INET6 if ":" in p["ip"] else socket.AF_INET
    if p["protocol"] == "udp":
        kind, proto = socket.SOCK_DGRAM, socket.IPPROTO_UDP
    elif p["protocol"] == "sctp":
        kind, proto = socket.SOCK_STREAM, socket.IPPROTO_SCTP
    else:
        kind, proto = socket.SOCK_STREAM, socket.IPPROTO_TCP
    deadline = time.monotonic() + p["timeout"]
    s = None
    try:
        s = socket.socket(fam, kind, proto)
        if kind == socket.SOCK_DGRAM:
            # Report every ICMP error (not only port unreachable) on the connected socket.
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, getattr(socket, "IPV6_RECVERR", 25), 1)
            else:
                s.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_RECVERR", 11), 1)
        if p["source"] is not None or p["source_port"] is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((p["source"] or ("::" if fam == socket.AF_INET6 else "0.0.0.0"),
                    p["source_port"] or 0))
        s.settimeout(p["timeout"])
        s.connect((p["ip"], p["port"]))
        if kind == socket.SOCK_DGRAM:
            s.send(b"ping\n")
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            s.settimeout(left)
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
            if kind == socket.SOCK_DGRAM:
                break
        if not data:
            return {"outcome": "error", "detail": "closed without an answer"}
        return {"line": data.decode(errors="replace")}
    except socket.timeout:
        return {"outcome": "timeout", "detail": "no answer in %gs" % p["timeout"]}
    except OSError as e:
        name = errno.errorcode.get(e.errno or 0, str(e.errno))
        return {"outcome": OUT.get(e.errno, "error"), "detail": "%s: %s" % (name, e.strerror)}
    finally:
        if s is not None:
            s.close()
for p in json.load(sys.stdin):
    print(json.dumps(one(p)), flush=True)
"""


def parse_reply(line: str) -> Reply:
    """Return the Reply an answer line ``"<pod> <client-ip>:<client-port>"`` describes."""
    pod, _, client = line.strip().partition(" ")
    host, _, port = client.rpartition(":")
    if not pod or not host or not port:
        raise ValueError(f"malformed answer line {line!r}")
    return Reply(pod=pod, client_ip=ipaddress.ip_address(host), client_port=int(port))


def run_probes(ns: str, probes: Sequence[Probe], *, python: str | None = None) -> list[Result]:
    """Return one Result per probe, in order, running every probe from namespace `ns`.

    An empty `probes` returns an empty list without starting a process. Raises ClientError
    when the probe process fails or prints something unexpected.
    """
    if not probes:
        return []
    payload = json.dumps(
        [
            {
                "protocol": str(p.protocol),
                "ip": str(p.ip),
                "port": p.port,
                "timeout": p.timeout,
                "source": None if p.source is None else str(p.source),
                "source_port": p.source_port,
            }
            for p in probes
        ]
    )
    budget = sum(p.timeout for p in probes) + 30.0
    proc = netns.run(
        ns,
        [python or sys.executable, "-I", "-c", _SNIPPET],
        check=False,
        timeout=budget,
        input=payload,
    )
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != len(probes):
        raise ClientError(
            f"probe process in {ns} exited {proc.returncode} after {len(lines)} of "
            f"{len(probes)} results: {proc.stderr.strip()}"
        )
    results: list[Result] = []
    for raw in lines:
        obj = json.loads(raw)
        if "line" in obj:
            results.append(parse_reply(obj["line"]))
        else:
            results.append(Failure(outcome=Outcome(obj["outcome"]), detail=obj["detail"]))
    return results


def _request(protocol: Protocol, ns: str, ip: IPAddress, port: int, timeout: float) -> Result:
    return run_probes(ns, [Probe(protocol, ip, port, timeout)])[0]


def tcp_request(ns: str, ip: IPAddress, port: int, timeout: float = 2.0) -> Result:
    """Return the pod's Reply to one TCP connection from `ns` to ip:port, or the Failure."""
    return _request(Protocol.TCP, ns, ip, port, timeout)


def udp_request(ns: str, ip: IPAddress, port: int, timeout: float = 2.0) -> Result:
    """Return the pod's Reply to one UDP datagram from `ns` to ip:port, or the Failure."""
    return _request(Protocol.UDP, ns, ip, port, timeout)


def sctp_request(ns: str, ip: IPAddress, port: int, timeout: float = 2.0) -> Result:
    """Return the pod's Reply to one SCTP association from `ns` to ip:port, or the Failure.

    Where the kernel has no SCTP the Failure is ERROR with EPROTONOSUPPORT in `detail`.
    """
    return _request(Protocol.SCTP, ns, ip, port, timeout)


def requests(
    ns: str,
    *,
    protocol: Protocol,
    ip: IPAddress,
    port: int,
    count: int,
    timeout: float = 2.0,
) -> list[Result]:
    """Return the Results of `count` sequential requests (fresh source port each) in one go."""
    return run_probes(ns, [Probe(protocol, ip, port, timeout)] * count)


def tcp_requests(
    ns: str, ip: IPAddress, port: int, count: int, timeout: float = 2.0
) -> list[Result]:
    """Return the Results of `count` sequential TCP requests from `ns` to ip:port."""
    return requests(ns, protocol=Protocol.TCP, ip=ip, port=port, count=count, timeout=timeout)


def udp_requests(
    ns: str, ip: IPAddress, port: int, count: int, timeout: float = 2.0
) -> list[Result]:
    """Return the Results of `count` sequential UDP requests from `ns` to ip:port."""
    return requests(ns, protocol=Protocol.UDP, ip=ip, port=port, count=count, timeout=timeout)
