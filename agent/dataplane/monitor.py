"""Who changed the nodelb table: nf_tables change notifications, read as `nft monitor` reads them.

Every committed nf_tables batch in a network namespace is multicast to the NFNLGRP_NFTABLES
group: one message per object it created or deleted (NEWTABLE, DELCHAIN, NEWRULE, NEWSETELEM,
...), each naming its table, then one NFT_MSG_NEWGEN carrying the new generation's id and the
thread (its TID, `task_pid_nr`) and command name of the process that committed it. So a batch
is "ours" when its NEWGEN names a thread of this process that committed a transaction, and
"foreign" otherwise: kube-proxy's batches touch only its own tables and are ignored, an
operator's or an attacker's `nft` on the nodelb table is foreign, and the agent repairs the
table from its mirror at once (agent/dataplane/tamper.py) instead of at the next drift check.

Decoding (`notifications`, `GenerationTracker`) is pure; `TableMonitor` is the socket. A batch
of ours can be large (a full sync adds 100k elements, one notification each), so the socket's
receive buffer is grown; if the kernel still drops notifications (ENOBUFS) the monitor says
so, and the caller compares the whole table instead of trusting what it saw.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rules import layout as L
from rules.netlink import (
    NETLINK_NETFILTER,
    NFNL_SUBSYS_NFTABLES,
    DecodeError,
    attributes,
)

NFNLGRP_NFTABLES = 7
NFT_MSG_NEWGEN = 15
NFTA_GEN_ID = 1
NFTA_GEN_PROC_PID = 2
NFTA_GEN_PROC_NAME = 3
NFTA_TABLE_NAME = 1  # the first attribute of every object message (table, chain, rule, set,
# element, object, flowtable) is its table's name: NFTA_*_TABLE == 1
NLMSG_ERROR = 2
RCVBUF_BYTES = 64 << 20
"""Receive buffer asked for (SO_RCVBUFFORCE): ~100 bytes a notification, so a full sync's 100k
element notifications fit even when the monitor is not scheduled for a while."""

MESSAGE_NAMES: dict[int, str] = {
    0: "table",
    2: "table",
    3: "chain",
    5: "chain",
    6: "rule",
    8: "rule",
    9: "set",
    11: "set",
    12: "element",
    14: "element",
    18: "object",
    20: "object",
    22: "flowtable",
    24: "flowtable",
}
"""NFT_MSG_NEW*/DEL* message types of nf_tables.h, by the kind of object they carry."""

_CREATING = frozenset({0, 3, 6, 9, 12, 18, 22})  # the NEW* ones
_INET = 1  # NFPROTO_INET


@dataclass(frozen=True, slots=True)
class Notification:
    """One decoded notification: an object change in `table` (family `family`), or the end of
    a batch (`generation` set: its id, and `pid`/`process` of the committing thread)."""

    kind: str  # table | chain | rule | set | element | object | flowtable | generation
    created: bool = False  # NEW* (True) or DEL* (False); meaningless for a generation
    family: int = 0
    table: str = ""
    generation: int | None = None
    pid: int = 0
    process: str = ""


def _u32(raw: bytes | None) -> int:
    return int(struct.unpack("!I", raw)[0]) if raw is not None and len(raw) >= 4 else 0


_TABLE_ATTR = struct.Struct("=HH")
_HEADER = struct.Struct("=IH")
_OUR_TABLE = L.TABLE_NAME.encode() + b"\0"


def notifications(data: bytes | memoryview) -> list[Notification]:
    """Return the notifications in one datagram that matter here: every generation (the end
    of a batch), and the object changes in the inet nodelb table.

    Everything else (other subsystems, other tables such as kube-proxy's, object kinds nodelb
    does not track) is skipped after reading two header fields and the first attribute, with
    no allocation: kube-proxy's full sync at 10k Services sends ~200k notifications, and ours
    one per element. Raises DecodeError (rules.netlink) on a truncated message.
    """
    out: list[Notification] = []
    off, end = 0, len(data)
    while off + 16 <= end:
        length, mtype = _HEADER.unpack_from(data, off)
        if length < 16 or off + length > end:
            raise DecodeError(f"truncated netlink message at {off}: length {length}")
        if mtype >> 8 == NFNL_SUBSYS_NFTABLES and length >= 20:
            msg = mtype & 0xFF
            if msg == NFT_MSG_NEWGEN:
                out.append(_generation(bytes(data[off + 16 : off + length])))
            elif msg in MESSAGE_NAMES and data[off + 16] == _INET and length >= 24:
                alen, atype = _TABLE_ATTR.unpack_from(data, off + 20)
                if alen < 4 or off + 20 + alen > off + length:
                    raise DecodeError(f"truncated attribute at {off + 20}: length {alen}")
                name = data[off + 24 : off + 20 + alen]
                if atype & 0x3FFF == NFTA_TABLE_NAME and name == _OUR_TABLE:
                    out.append(
                        Notification(MESSAGE_NAMES[msg], msg in _CREATING, _INET, L.TABLE_NAME)
                    )
        off += min((length + 3) & ~3, end - off)
    return out


def _generation(body: bytes) -> Notification:
    attrs = attributes(body, 4)
    gen = _u32(attrs.get(NFTA_GEN_ID))
    pid = _u32(attrs.get(NFTA_GEN_PROC_PID))
    name = attrs.get(NFTA_GEN_PROC_NAME, b"").rstrip(b"\0").decode(errors="replace")
    return Notification("generation", generation=gen, pid=pid, process=name)


@dataclass(frozen=True, slots=True)
class Generation:
    """One committed batch that touched the nodelb table: its generation, who committed it
    (thread id and command name), and the kinds of object it changed there (sorted)."""

    id: int
    pid: int
    process: str
    changed: tuple[str, ...]


def _ours(n: Notification) -> bool:
    return n.table == L.TABLE_NAME and n.family == _INET


class GenerationTracker:
    """Folds notifications into batches: `feed` returns a Generation at the end of every batch
    that touched the nodelb table (None otherwise). Pure bookkeeping over decoded values."""

    def __init__(self) -> None:
        self._changed: set[str] = set()

    def feed(self, n: Notification) -> Generation | None:
        """Take one notification; return the batch it ends, if it ends one touching us."""
        if n.kind != "generation":
            if _ours(n):
                self._changed.add(n.kind)
            return None
        changed, self._changed = self._changed, set()
        if not changed:
            return None
        return Generation(n.generation or 0, n.pid, n.process, tuple(sorted(changed)))

    def reset(self) -> None:
        """Forget a batch in progress (after notifications were lost)."""
        self._changed = set()


def foreign(gen: Generation, own: Callable[[int], bool]) -> bool:
    """Return True when `gen` was committed by a thread `own` does not recognise (not this
    agent's applier): someone else changed the nodelb table."""
    return not own(gen.pid)


class TableMonitor:
    """The NFNLGRP_NFTABLES subscription of the namespace the opening thread is in.

    `open()` binds the socket (the agent's: the host namespace; tests open it inside a lab
    namespace with agent.netns.call_in); `read()` blocks up to `timeout` seconds and returns
    the batches that touched the nodelb table, or raises Overrun when the kernel dropped
    notifications (the caller must then compare the whole table).
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._tracker = GenerationTracker()
        self._buffer = bytearray(1 << 20)
        self._view = memoryview(self._buffer)

    @classmethod
    def open(cls) -> TableMonitor:
        """Return a monitor subscribed in the calling thread's network namespace."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            sock.bind((0, 1 << (NFNLGRP_NFTABLES - 1)))
            with contextlib.suppress(OSError):  # needs CAP_NET_ADMIN; else the default size
                sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, RCVBUF_BYTES)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    def read(self, timeout: float) -> list[Generation]:
        """Return the batches touching nodelb that ended in what arrived within `timeout` s
        (empty when nothing did). Raises Overrun after the kernel dropped notifications.

        Datagrams are read into one buffer the monitor keeps: a flood of notifications must
        not allocate a megabyte per datagram (the allocator kept what it freed: +25 MB RSS on
        a 10k-Service node with kube-proxy beside it).
        """
        self._sock.settimeout(timeout)
        out: list[Generation] = []
        try:
            size = self._sock.recv_into(self._buffer)
            self._sock.setblocking(False)
            while True:
                out.extend(self._fold(self._view[:size]))
                size = self._sock.recv_into(self._buffer)
        except (TimeoutError, BlockingIOError):
            return out
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                self._tracker.reset()
                raise Overrun from exc
            raise

    def _fold(self, data: memoryview) -> Iterable[Generation]:
        for n in notifications(data):
            gen = self._tracker.feed(n)
            if gen is not None:
                yield gen

    def close(self) -> None:
        """Close the socket (idempotent)."""
        with contextlib.suppress(OSError):
            self._sock.close()


_SO_RCVBUFFORCE = 33  # asm-generic/socket.h


class Overrun(Exception):
    """The kernel dropped notifications (ENOBUFS): what changed meanwhile is unknown."""
