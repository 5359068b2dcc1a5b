"""Delete stale UDP conntrack entries that still point at an endpoint a sync removed.

UDP has no connection teardown, so a client that keeps sending to a frontend keeps its
conntrack entry, and with it the DNAT to an endpoint that no longer exists, until the entry
idles out. kube-proxy deletes those entries after every sync; so does nodelb.

`removed_udp_endpoints` is the pure decision; `delete_stale_udp` is the shell, driving the
`conntrack` tool through a `ConntrackRunner` (the current namespace, or a named one via
`ip netns exec` for tests and tools).
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
from collections.abc import Iterable, Sequence
from typing import Protocol as TypingProtocol

from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import Protocol

log = logging.getLogger(__name__)

# conntrack -D exits 1 and prints this when nothing matched; that is not a failure.
_NOTHING_DELETED = "0 flow entries have been deleted"


class ConntrackError(RuntimeError):
    """The conntrack tool failed; the message carries the command and its stderr."""


def _served(state: DesiredState, key: FrontendKey) -> frozenset[Endpoint]:
    fe = state.frontends.get(key)
    if fe is None:
        return frozenset()
    return frozenset(fe.endpoints) | frozenset(fe.cluster_endpoints)


def removed_udp_endpoints(
    old: DesiredState,
    new: DesiredState,
    *,
    candidates: Iterable[FrontendKey] | None = None,
) -> set[tuple[FrontendKey, Endpoint]]:
    """Return every (UDP frontend, endpoint) pair that `old` served and `new` no longer does.

    An endpoint counts as served by a frontend when it is in its `endpoints` or its
    `cluster_endpoints`; a frontend that disappears takes all its endpoints with it. Empty when
    nothing was removed. TCP and SCTP frontends are never listed (their connections end on
    their own, or are reset by the kernel once the endpoint is gone). `candidates`, if given,
    are the only keys that may differ between the states (see rules.delta.changed_keys).
    """
    out: set[tuple[FrontendKey, Endpoint]] = set()
    pairs: Iterable[tuple[FrontendKey, Frontend]]
    if candidates is None:
        pairs = old.frontends.items()
    else:
        pairs = ((k, old.frontends[k]) for k in set(candidates) if k in old.frontends)
    for key, fe in pairs:
        if key.protocol is not Protocol.UDP or new.frontends.get(key) is fe:
            continue
        for ep in _served(old, key) - _served(new, key):
            out.add((key, ep))
    return out


def delete_argv(key: FrontendKey, endpoint: Endpoint) -> list[str]:
    """Return the `conntrack -D` argv that deletes UDP flows from `key` DNATed to `endpoint`.

    Matches the original destination (frontend IP and port) and the reply source (the
    endpoint's IP and port, i.e. where the flow was DNATed to).
    """
    family = "ipv6" if isinstance(key.ip, ipaddress.IPv6Address) else "ipv4"
    return [
        "conntrack",
        "-D",
        "-f",
        family,
        "-p",
        "udp",
        "--orig-dst",
        str(key.ip),
        "--orig-port-dst",
        str(key.port),
        "--reply-src",
        str(endpoint.ip),
        "--reply-port-src",
        str(endpoint.port),
    ]


class ConntrackRunner(TypingProtocol):
    """Runs the conntrack tool with `argv[1:]` in one fixed network namespace."""

    def delete(self, argv: Sequence[str]) -> int:
        """Run a `conntrack -D` argv; return how many entries it deleted (0 if none matched).

        Raises ConntrackError when the tool fails for any other reason.
        """
        ...


def _parse_deleted(proc: subprocess.CompletedProcess[str], argv: Sequence[str]) -> int:
    text = proc.stderr + proc.stdout
    if proc.returncode != 0 and _NOTHING_DELETED not in text:
        raise ConntrackError(f"{' '.join(argv)} exited {proc.returncode}: {text.strip()}")
    for line in text.splitlines():
        if "flow entries have been deleted" in line:
            words = line.split(":")[-1].split()
            if words and words[0].isdigit():
                return int(words[0])
    return 0


class ToolConntrackRunner:
    """A ConntrackRunner that runs `conntrack` in the current namespace, or in `netns`.

    With `netns` set the tool runs under `ip netns exec <netns>`, which tests and tools use to
    stay out of the root namespace.
    """

    def __init__(self, netns: str | None = None, *, timeout: float = 30.0) -> None:
        self.netns = netns
        self.timeout = timeout

    def delete(self, argv: Sequence[str]) -> int:
        """Run the argv (see ConntrackRunner.delete) and return the deleted-entry count."""
        cmd = list(argv)
        if self.netns is not None:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=self.timeout, check=False
        )
        return _parse_deleted(proc, cmd)


def delete_stale_udp(
    runner: ConntrackRunner, removed: set[tuple[FrontendKey, Endpoint]]
) -> tuple[int, list[str]]:
    """Delete the conntrack entries for every removed pair; return (entries deleted, errors).

    Every pair is tried even when one fails; the errors are returned as text (and logged), not
    raised, because stale UDP flows are a nuisance, not a reason to fail a sync.
    """
    deleted = 0
    errors: list[str] = []
    for key, ep in sorted(removed, key=lambda p: (str(p[0].ip), p[0].port, p[1])):
        try:
            deleted += runner.delete(delete_argv(key, ep))
        except (ConntrackError, OSError, subprocess.SubprocessError) as exc:
            log.warning("conntrack cleanup for %s -> %s failed: %s", key, ep, exc)
            errors.append(str(exc))
    return deleted, errors
