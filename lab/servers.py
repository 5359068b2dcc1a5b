"""Tiny pod servers for the lab: each answer names the pod and the client address it saw.

Run inside a pod namespace::

    python -m lab.servers --name pod-1-1 --tcp 8080 --udp 8081 [--sctp 8082]
        [--ready-file PATH]

Every listener binds `::` with IPV6_V6ONLY=0, so IPv4 and IPv6 clients both work.

- TCP (and SCTP, one-to-one style): the server writes one line
  ``"<podname> <client-ip>:<client-port>\\n"`` *immediately* on accept, without waiting for a
  request, then half-closes (FIN) and drains whatever the client sent (up to a short grace
  period) before closing, so a client that did send a request line gets a FIN, not a reset.
- UDP: each datagram is answered with the same line (the source address is chosen by
  routing; a pod has one address per family, so it is the address the datagram reached).

IPv4 clients (IPv4-mapped addresses such as ``::ffff:198.18.0.100``) are reported in plain
IPv4 form. IPv6 client addresses are written without brackets; split the line on the *last*
colon to get the port.

SCTP is only served when the kernel supports it: when the socket cannot be created, the
server logs that and does not listen on SCTP (nothing is faked). Once every listener is bound,
the ready file (if given) is written with a JSON object ``{"tcp": port, "udp": port,
"sctp": port-or-null}`` naming the ports actually served. Stdlib only; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import json
import os
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

DRAIN_SECONDS = 1.0


class _Stopped(Exception):
    """Raised by the SIGTERM/SIGINT handler to leave the serve loop."""


def reply_line(pod: str, client: tuple[str, int] | tuple[str, int, int, int]) -> bytes:
    """Return the answer line for a client (host, port, ...) sockaddr, IPv4-mapped unmapped."""
    host, port = client[0], client[1]
    addr = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return f"{pod} {addr}:{port}\n".encode()


def sctp_supported() -> bool:
    """Return True when this kernel can create SCTP sockets (False when the module is absent)."""
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_SCTP).close()
    except OSError as exc:
        if exc.errno in (errno.EPROTONOSUPPORT, errno.ESOCKTNOSUPPORT, errno.EAFNOSUPPORT):
            return False
        raise
    return True


def _listener(kind: int, proto: int, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", port))
        if kind == socket.SOCK_STREAM:
            sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _serve_stream_conn(conn: socket.socket, pod: str, client: tuple[str, int]) -> None:
    with conn:
        try:
            conn.sendall(reply_line(pod, client))
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(DRAIN_SECONDS)
            while conn.recv(4096):
                pass
        except OSError:
            pass  # the client went away or sent nothing more: either way we are done


def _accept(listener: socket.socket, pod: str) -> None:
    try:
        conn, client = listener.accept()
    except OSError:
        return
    threading.Thread(target=_serve_stream_conn, args=(conn, pod, client), daemon=True).start()


def _answer_datagram(sock: socket.socket, pod: str) -> None:
    try:
        _, client = sock.recvfrom(65535)
        sock.sendto(reply_line(pod, client), client)
    except OSError:
        pass


def serve(
    pod: str,
    *,
    tcp: int,
    udp: int,
    sctp: int | None,
    ready_file: Path | None,
    stop: threading.Event,
) -> None:
    """Serve until `stop` is set. Writes `ready_file` once every listener is bound."""
    sel = selectors.DefaultSelector()
    sockets: list[socket.socket] = []
    served: dict[str, int | None] = {"tcp": tcp, "udp": udp, "sctp": None}
    try:
        tcp_sock = _listener(socket.SOCK_STREAM, socket.IPPROTO_TCP, tcp)
        sockets.append(tcp_sock)
        sel.register(tcp_sock, selectors.EVENT_READ, "stream")
        udp_sock = _listener(socket.SOCK_DGRAM, socket.IPPROTO_UDP, udp)
        sockets.append(udp_sock)
        sel.register(udp_sock, selectors.EVENT_READ, "dgram")
        if sctp is not None and not sctp_supported():
            print(f"{pod}: this kernel has no SCTP, not listening on {sctp}", flush=True)
        elif sctp is not None:
            sctp_sock = _listener(socket.SOCK_STREAM, socket.IPPROTO_SCTP, sctp)
            sockets.append(sctp_sock)
            sel.register(sctp_sock, selectors.EVENT_READ, "stream")
            served["sctp"] = sctp
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(served))
            os.replace(tmp, ready_file)
        print(f"{pod}: serving {served}", flush=True)
        while not stop.is_set():
            for key, _ in sel.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if key.data == "stream":
                    _accept(sock, pod)
                else:
                    _answer_datagram(sock, pod)
    finally:
        sel.close()
        for sock in sockets:
            sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve until SIGTERM or SIGINT; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--name", required=True, help="pod name put in every answer")
    parser.add_argument("--tcp", type=int, required=True, help="TCP port")
    parser.add_argument("--udp", type=int, required=True, help="UDP port")
    parser.add_argument("--sctp", type=int, default=None, help="SCTP port (if supported)")
    parser.add_argument("--ready-file", type=Path, default=None, help="written once listening")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        raise _Stopped  # interrupts select() at once instead of at its next timeout

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with contextlib.suppress(_Stopped):
        serve(
            args.name,
            tcp=args.tcp,
            udp=args.udp,
            sctp=args.sctp,
            ready_file=args.ready_file,
            stop=stop,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
