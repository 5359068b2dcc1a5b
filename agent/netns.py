"""Entering a named network namespace, one way for every caller, never a root namespace.

A socket, and a libnftables context (it opens its netlink socket when created), belong to the
network namespace of the thread that created them, for their whole life. So code that must
reach a lab namespace from a process living in the root namespace either moves one dedicated
thread into it for good (`enter`, as the namespaced nft runner's worker does) or runs one
function in a short-lived thread that enters it first (`call_in`, for sockets that are then
used from any thread). Both refuse a namespace that is one of this process's root namespaces
(PID 1's, and the main thread's) and check that the thread arrived; on any failure nothing is
done in the namespace the thread started in.

The agent itself never enters a namespace: it runs with hostNetwork and programs the one it
starts in. This is for the lab, the tests, the benchmarks and tools.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")

T = TypeVar("T")


class NetnsError(RuntimeError):
    """A namespace could not be entered, or must not be; the message says which and why."""


def netns_inode(path: str = "/proc/thread-self/ns/net") -> int:
    """Return the inode that identifies the network namespace at `path` (the calling thread's)."""
    return os.stat(path).st_ino


def root_netns_inodes() -> frozenset[int]:
    """Return the inodes of every namespace this process treats as "root" (never programmed).

    That is PID 1's namespace when readable (it is not in every container), and always the
    namespace this process's main thread is in.
    """
    found = {netns_inode(f"/proc/{os.getpid()}/ns/net")}
    with contextlib.suppress(OSError):
        found.add(netns_inode("/proc/1/ns/net"))
    return frozenset(found)


def _path(name: str) -> Path:
    if not name or "/" in name or name in {".", ".."}:
        raise NetnsError(f"invalid network namespace name {name!r}")
    return NETNS_DIR / name


def enter(name: str) -> None:
    """Move the calling thread into `/run/netns/<name>` for good.

    Raises NetnsError when `name` is not a plain name, when it is a root namespace, when
    setns(2) fails, or when the thread is not in it afterwards.
    """
    path = _path(name)
    roots = root_netns_inodes()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.fstat(fd).st_ino
        if target in roots:
            raise NetnsError(f"refusing to enter {path}: it is the root network namespace")
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns into {name!r} failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    here = netns_inode()
    if here != target or here in roots:
        raise NetnsError(f"thread is not in namespace {name!r} after setns (inode {here})")


def call_in(name: str, fn: Callable[[], T]) -> T:
    """Return `fn()` computed by a fresh thread inside network namespace `name`.

    Exceptions raised by `fn` (or by entering, NetnsError) are re-raised in the caller. Sockets
    `fn` creates stay in the namespace and may be used from any thread afterwards.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            enter(name)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=body, name=f"netns:{name}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
