"""Snapshot of what the root network namespace holds, to prove the test run left it alone.

Only reads: `nft list ruleset`, `ip addr`, `ip route` and `ip link` in the root namespace.
The session-end check in tests/conftest.py compares two snapshots.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RootSnapshot:
    """The root namespace's nft ruleset, addresses, routes and links."""

    ruleset: str
    addresses: frozenset[tuple[str, str, str, int]]
    routes: frozenset[tuple[str, ...]]
    links: frozenset[str]

    def differences(self, later: RootSnapshot) -> list[str]:
        """Return one line per difference between this snapshot and `later` (empty if none)."""
        out: list[str] = []
        if self.ruleset != later.ruleset:
            out.append(
                f"nft ruleset changed:\n--- before\n{self.ruleset}\n--- after\n{later.ruleset}"
            )
        for name in ("addresses", "routes", "links"):
            before, after = getattr(self, name), getattr(later, name)
            if added := sorted(map(str, after - before)):
                out.append(f"{name} added: {added}")
            if removed := sorted(map(str, before - after)):
                out.append(f"{name} removed: {removed}")
        return out


def _cmd(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def take() -> RootSnapshot:
    """Read the root namespace's state (the caller must be in the root namespace)."""
    addresses = set()
    for link in json.loads(_cmd("ip", "-j", "addr", "show")):
        for a in link.get("addr_info", []):
            addresses.add((link["ifname"], a["family"], a["local"], int(a["prefixlen"])))
    routes = set()
    for fam in ("-4", "-6"):
        for r in json.loads(_cmd("ip", "-j", fam, "route", "show", "table", "all")):
            routes.add(
                tuple(
                    str(r.get(k, ""))
                    for k in ("table", "type", "dst", "gateway", "dev", "prefsrc", "protocol")
                )
            )
    links = {link["ifname"] for link in json.loads(_cmd("ip", "-j", "link", "show"))}
    return RootSnapshot(
        ruleset=_cmd("nft", "list", "ruleset"),
        addresses=frozenset(addresses),
        routes=frozenset(routes),
        links=frozenset(links),
    )
