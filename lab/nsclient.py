"""Reach servers inside a lab namespace from a process that lives in the root namespace.

A socket belongs to the network namespace of the thread that created it, for its whole life.
So `call_in_netns` runs one function in a short-lived thread that has first entered the lab
namespace with setns(2); the calling thread never changes namespace. The urllib3 connection
classes below open every TCP connection that way, which lets the kubernetes Python client (and
plain urllib3) talk to a lab kube-apiserver without any link, address or route in the root
namespace. If entering the namespace fails, nothing is connected: there is no fallback to the
root namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from agent import netns
from lab.netns import NetnsError

T = TypeVar("T")


def call_in_netns(name: str, fn: Callable[[], T]) -> T:
    """Return `fn()` computed by a fresh thread inside network namespace `name` (agent.netns;
    a root namespace is refused). Sockets `fn` creates stay in the namespace."""
    return netns.call_in(name, fn)


def pool_classes(name: str) -> dict[str, type[HTTPConnectionPool]]:
    """Return urllib3 pool classes (by scheme) whose connections are opened inside `name`."""

    class NsHTTPConnection(HTTPConnection):
        def _new_conn(self) -> Any:
            return call_in_netns(name, super()._new_conn)

    class NsHTTPSConnection(HTTPSConnection):
        def _new_conn(self) -> Any:
            return call_in_netns(name, super()._new_conn)

    class NsHTTPConnectionPool(HTTPConnectionPool):
        ConnectionCls = NsHTTPConnection

    class NsHTTPSConnectionPool(HTTPSConnectionPool):
        ConnectionCls = NsHTTPSConnection

    return {"http": NsHTTPConnectionPool, "https": NsHTTPSConnectionPool}


def route_pool_manager(pool_manager: urllib3.PoolManager, name: str) -> None:
    """Make every connection `pool_manager` opens from now on start inside namespace `name`.

    Refuses proxy managers (a proxy would be dialled in the root namespace) and managers that
    already hold pools (those connections would not be re-routed).
    """
    if type(pool_manager) is not urllib3.PoolManager:  # ProxyManager, SOCKSProxyManager, ...
        raise NetnsError(f"cannot route a {type(pool_manager).__name__} into {name!r}")
    if len(pool_manager.pools):
        raise NetnsError("pool manager already has open pools")
    pool_manager.pool_classes_by_scheme = pool_classes(name)


def pool_manager(name: str, **kwargs: Any) -> urllib3.PoolManager:
    """Return a urllib3 PoolManager whose connections are all opened inside namespace `name`."""
    manager = urllib3.PoolManager(**kwargs)
    route_pool_manager(manager, name)
    return manager
