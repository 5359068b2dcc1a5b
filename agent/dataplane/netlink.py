"""The netlink element sender: one NETLINK_NETFILTER socket that applies element batches.

The batch itself is encoded by rules/netlink.py (pure) from the typed ops; this is the I/O:
`NetlinkElementSender` sends a batch and waits for the kernel's acknowledgement of every
message; any error raises NftError and nothing is applied (the kernel aborts the whole batch).
It also runs nf_tables dumps for the read-back (agent/dataplane/netlink_dump.py). A socket
stays in the network namespace it was opened in, whichever thread uses it later.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterable
from typing import Protocol

from agent import netns
from agent.dataplane.libnft import NftError
from rules.netlink import (
    NETLINK_CAP_ACK,
    NETLINK_NETFILTER,
    NFNL_SUBSYS_NFTABLES,
    NFPROTO_INET,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    SO_SNDBUFFORCE,
    SOL_NETLINK,
    Batch,
    ElementOp,
    Unsupported,
    decode_acks,
    encode_batch,
    error_code,
    message,
    messages,
)


class ElementSender(Protocol):
    """Applies element ops as one atomic kernel transaction; raises NftError if refused."""

    def apply(self, ops: Iterable[ElementOp]) -> None:
        """Apply every op in one batch, or none of them (raise NftError)."""
        ...


class NetlinkElementSender:
    """An ElementSender over one NETLINK_NETFILTER socket.

    Build it with `open()` in the namespace to program (the agent's: the host namespace), or
    `in_namespace(name)` for a named lab namespace. `apply` sends the batch and reads the
    kernel's acknowledgements: nfnetlink processes a batch inside sendmsg, so they are queued
    when it returns. `timeout` bounds the wait for them anyway.
    """

    def __init__(self, sock: socket.socket, *, timeout: float = 5.0) -> None:
        self._sock = sock
        self._sock.settimeout(timeout)
        self._next_seq = 1
        self._lock = threading.Lock()

    @classmethod
    def open(cls, *, timeout: float = 5.0) -> NetlinkElementSender:
        """Return a sender bound to the calling thread's network namespace."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            sock.bind((0, 0))
            # Acks without a copy of the request; errors for a failed message still come.
            sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        except OSError:
            sock.close()
            raise
        return cls(sock, timeout=timeout)

    @classmethod
    def in_namespace(cls, ns_name: str, *, timeout: float = 5.0) -> NetlinkElementSender:
        """Return a sender whose socket lives in `/run/netns/<ns_name>` (never a root one).

        The socket is opened by a short-lived thread that enters the namespace and ends; the
        socket stays bound to that namespace whichever thread uses it later.
        """
        try:
            return netns.call_in(ns_name, lambda: cls.open(timeout=timeout))
        except netns.NetnsError as exc:
            raise NftError(f"refusing to program {ns_name}: {exc}") from exc

    def apply(self, ops: Iterable[ElementOp]) -> None:
        """Send `ops` as one batch; raise NftError (nothing applied) if the kernel refuses,
        or if an op cannot be encoded (a generator of parsed ops may raise Unsupported)."""
        with self._lock:
            seq = self._next_seq
            try:
                batch = encode_batch(ops, seq)
            except Unsupported as exc:
                raise NftError(f"element batch not encodable: {exc}", str(exc)) from exc
            self._next_seq = (seq + len(batch.acked) + 2) % 0x7FFF0000 or 1
            try:
                self._fit(len(batch.data))
                self._sock.send(batch.data)
                errors = self._collect(batch)
            except (OSError, ValueError) as exc:
                raise NftError(f"netlink element batch failed: {exc}", str(exc)) from exc
        if errors:
            text = "; ".join(f"{what}: {os.strerror(err)}" for what, err in sorted(errors.items()))
            raise NftError(f"kernel refused the element batch: {text}", text)

    def dump(self, msg_type: int, attrs: bytes) -> list[bytes]:
        """Run one nf_tables dump (`msg_type` NFT_MSG_GET*, family inet) and return each
        reply's nfgenmsg and attributes. Raises NftError if the kernel answers with an error.
        """
        with self._lock:
            seq = self._next_seq
            self._next_seq = (seq + 1) % 0x7FFF0000 or 1
            request = message(
                (NFNL_SUBSYS_NFTABLES << 8) | msg_type,
                NLM_F_REQUEST | NLM_F_DUMP,
                seq,
                family=NFPROTO_INET,
                res_id=0,
                attrs=attrs,
            )
            try:
                self._sock.send(request)
                return self._replies(seq)
            except (OSError, ValueError) as exc:
                raise NftError(f"netlink dump failed: {exc}", str(exc)) from exc

    def _replies(self, seq: int) -> list[bytes]:
        out: list[bytes] = []
        while True:
            for reply in messages(self._sock.recv(1 << 17)):
                if reply.seq != seq:
                    continue  # a late answer to an earlier request
                if reply.type in (NLMSG_DONE, NLMSG_ERROR):
                    error = error_code(reply)
                    if error:
                        raise NftError(f"kernel refused the dump: {os.strerror(error)}")
                    if reply.type == NLMSG_DONE:
                        return out
                    continue
                out.append(reply.body)

    def _fit(self, size: int) -> None:
        """Grow the send buffer so that one sendmsg carries `size` bytes (a whole batch must:
        nfnetlink commits what one message holds). Needs CAP_NET_ADMIN beyond wmem_max, as
        libnftables does for a large transaction."""
        if size <= self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 32:
            return
        want = size + 64 * 1024
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, want)
        except PermissionError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, want)
        have = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        if size > have - 32:
            raise OSError(f"a {size}-byte batch does not fit the {have}-byte send buffer")

    def _collect(self, batch: Batch) -> dict[str, int]:
        """Read acks until every message of `batch` is answered; return the errors by name."""
        want = set(batch.acked)
        names = {s: f"message {s - batch.begin_seq}" for s in batch.acked}
        names[batch.begin_seq] = "commit"  # a failed commit is reported on the first message
        errors: dict[str, int] = {}
        while want:
            for seq, err in decode_acks(self._sock.recv(1 << 16)):
                want.discard(seq)
                if err and seq in names:  # not a late answer to an earlier, timed-out batch
                    errors[names[seq]] = err
        return errors

    def close(self) -> None:
        """Close the socket (idempotent)."""
        with contextlib.suppress(OSError):
            self._sock.close()


__all__ = ["ElementSender", "NetlinkElementSender"]
