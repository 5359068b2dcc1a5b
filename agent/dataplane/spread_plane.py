"""Puts a SpreadState into the kernel: the tunnel device and the `netdev nodelb` table.

`SpreadPlane.sync(state)` programs the device and its peers first (the table names the
device, which nft resolves when the rule is loaded), then the table in one nft batch; `None`
removes the table first and the device after. A state equal to the last one applied is not
sent again. Errors (NftError, pyroute2's NetlinkError, OSError from a sysctl) reach the
caller, and the next sync tries again: nothing is remembered as applied until both parts are.

A new plane does not know what the kernel holds, so its first `sync(None)` removes whatever
a previous agent left (a table that kept spreading with stale buckets would be wrong); that
first removal is best effort (logged), every later one is not.

`in_netns` runs a function where the programming must happen: the agent passes a plain call
(it runs in the node's namespace); the lab passes `agent.netns.call_in(ns, ...)`, because the
device's sysctls are written through /proc/sys, which follows the calling thread's namespace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from pyroute2 import IPRoute

from agent.dataplane import tunnel
from agent.model.tunnel import SpreadState
from rules.spread import render_spread, render_spread_cleanup

log = logging.getLogger(__name__)

InNetns = Callable[[Callable[[], None]], None]


class TextRunner(Protocol):
    """What SpreadPlane needs of an nft runner (agent/dataplane/libnft.py)."""

    def run_text(self, text: str) -> None: ...


def _here(fn: Callable[[], None]) -> None:
    fn()


class SpreadPlane:
    """The spreading half of a node's dataplane; see the module docstring."""

    def __init__(self, nft: TextRunner, *, in_netns: InNetns = _here) -> None:
        self._nft = nft
        self._in_netns = in_netns
        self._applied: SpreadState | None = None
        # None: unknown. A previous agent may have left a table and a device behind, which
        # would go on spreading with stale buckets; the first sync(None) removes them.
        self._present: bool | None = None

    def sync(self, state: SpreadState | None) -> bool:
        """Make the kernel express `state` (None: no spreading); return True if anything was
        sent."""
        if state is None:
            if self._present is False:
                return False
            if self._present is None:
                # Best effort: a node that never spread must not fail its syncs over it (a
                # kernel without the netdev family, for one).
                try:
                    self.remove()
                except Exception as exc:
                    log.warning("could not remove a leftover spread table or device: %s", exc)
                    self._present = False
                return True
            self.remove()
            return True
        if self._present and state == self._applied:
            return False

        def device() -> None:
            with IPRoute() as ipr:
                tunnel.program(ipr, state.node, state.peers)

        self._present = True  # from here on, a failure must still clean up on None
        self._in_netns(device)
        self._nft.run_text(render_spread(state))
        self._applied = state
        return True

    def remove(self) -> None:
        """Remove the spread table and the tunnel device, whether or not this plane made
        them (a previous agent may have; `nodelb cleanup`)."""
        self._nft.run_text(render_spread_cleanup())
        self._in_netns(_remove_device)
        self._applied, self._present = None, False


def _remove_device() -> None:
    with IPRoute() as ipr:
        tunnel.remove(ipr)
