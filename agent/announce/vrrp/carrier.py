"""Whether the speaker's interface has its carrier, from rtnetlink link notifications.

A holder whose link went down and came back is still Master (nothing told it otherwise), but
meanwhile a backup may have taken over, announced itself and, on the holder's first advert
after the link returned, stepped down without sending one the holder could hear: the
neighbours then keep pointing at the backup (issue #18, finding 7). The speaker feeds the
state machine `CarrierUp` when the carrier returns, and a Master re-announces at once.

"Carrier" is IFF_LOWER_UP: a switch port (or the veth peer) going down clears it while the
interface itself stays administratively up. `link_flags` and `regained` are the pure part;
`CarrierWatch` is a plain NETLINK_ROUTE socket bound to RTMGRP_LINK, read only when the
speaker's selector says it is readable. Not pyroute2 here: its reader drains the socket into
a queue of its own, so a selector on its descriptor misses notifications it already holds
(measured: a carrier change showed up one notification late).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

from rules.netlink import DecodeError, messages

IFF_LOWER_UP = 0x10000
RTMGRP_LINK = 1
RTM_NEWLINK = 16
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, pad, type, index, flags, change


def link_flags(data: bytes) -> Iterator[tuple[int, int]]:
    """Yield (interface index, flags) of every RTM_NEWLINK message in one netlink read; a
    truncated or malformed message ends the read (the kernel sends whole ones)."""
    try:
        for message in messages(data):
            if message.type == RTM_NEWLINK and len(message.body) >= _IFINFO.size:
                _, _, index, flags, _ = _IFINFO.unpack_from(message.body, 0)
                yield index, flags
    except DecodeError:
        return


def regained(had: bool | None, flags: int) -> tuple[bool, bool]:
    """Return (whether the link has its carrier now, whether it just came back): back only
    after it was seen without (None: unknown yet, as at start, is not a loss)."""
    now = bool(flags & IFF_LOWER_UP)
    return now, had is False and now


class CarrierWatch:
    """Link notifications of one interface. `open()` before use, `close()` after."""

    def __init__(self, ifname: str) -> None:
        self.ifname = ifname
        self._sock: socket.socket | None = None
        self._index = 0
        self.carrier: bool | None = None  # unknown until the first notification

    def open(self) -> None:
        """Subscribe to link notifications (LookupError: no such interface)."""
        try:
            self._index = socket.if_nametoindex(self.ifname)
        except OSError:
            raise LookupError(f"no interface {self.ifname!r}") from None
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            sock.bind((0, RTMGRP_LINK))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def fileno(self) -> int:
        """Return the socket's descriptor, for the speaker's selector."""
        assert self._sock is not None
        return self._sock.fileno()

    def read(self) -> bool:
        """Consume the waiting notifications; return True when the carrier came back."""
        assert self._sock is not None
        back = False
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return back
            except OSError:  # ENOBUFS: notifications were lost; the next one tells the state
                self.carrier = None
                return back
            for index, flags in link_flags(data):
                if index == self._index:
                    self.carrier, came = regained(self.carrier, flags)
                    back = back or came

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
