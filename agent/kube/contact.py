"""Whether this agent can reach the API server, decided from its probes' outcomes (pure).

"Cut off" (issue #18, docs/ownership.md): for `grace` seconds every request the agent sent to
the API server failed without an answer (refused, reset, timed out), or nothing answered for
`stale` seconds. An HTTP error is an answer: the server is reachable, and what it refused is
the caller's business. Watches cannot tell on their own (a watch on a connection whose packets
vanish waits silently for minutes), and report renewals are seconds apart, so a small probe
(agent/kube/contact_probe.py) asks every second and feeds its outcomes here. Time is passed in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

GRACE = 2.0  # failures for this long (from the first failed request's start) cut us off
STALE = 6.0  # no answer at all for this long cuts us off
TIMEOUT = 2.0  # a request in flight this long has failed, whatever the client does next


class Reach(enum.StrEnum):
    """What a decision found (logged and exported as `nodelb_api_cut_off`)."""

    CONNECTED = "Connected"
    CUT_OFF = "CutOff"


@dataclass(frozen=True, slots=True)
class Contact:
    """The agent's reach to the API server as its probes saw it.

    `last_answer` is when a request last got an answer (None: never); `failing_since` when the
    first request that failed since then was sent (None: none failed); `error` that failure's
    text; `pending_since` when the request now in flight was sent (None: none is); `reach` the
    state last decided.
    """

    last_answer: float | None = None
    failing_since: float | None = None
    error: str = ""
    pending_since: float | None = None
    reach: Reach = Reach.CONNECTED


def sent(contact: Contact, *, at: float) -> Contact:
    """Return the contact with a request sent at `at` in flight."""
    return replace(contact, pending_since=at)


def answered(contact: Contact, *, at: float) -> Contact:
    """Return the contact after a request that got an answer at `at`."""
    return replace(contact, last_answer=at, failing_since=None, error="", pending_since=None)


def failed(contact: Contact, *, sent: float, error: str) -> Contact:
    """Return the contact after a request sent at `sent` failed without an answer."""
    if contact.failing_since is not None:
        return replace(contact, error=error, pending_since=None)
    return replace(contact, failing_since=sent, error=error, pending_since=None)


def decide(
    contact: Contact,
    *,
    now: float,
    grace: float = GRACE,
    stale: float = STALE,
    timeout: float = TIMEOUT,
) -> tuple[Contact, Reach | None]:
    """Return the contact with its reach decided at `now`, and the new reach when it changed
    (None: unchanged).

    A request in flight for longer than `timeout` counts as failed from when it was sent: the
    HTTP client retries a hung request on its own, so its failure can take several timeouts
    to surface, and the cut must be said within seconds.
    """
    since = contact.failing_since
    pending = contact.pending_since
    if pending is not None and now - pending >= timeout:
        since = pending if since is None else min(since, pending)
        if contact.failing_since is None:
            contact = replace(contact, failing_since=pending, error="the request hangs")
    failing = since is not None and now - since >= grace
    silent = contact.last_answer is not None and now - contact.last_answer >= stale
    reach = Reach.CUT_OFF if failing or silent else Reach.CONNECTED
    if reach is contact.reach:
        return contact, None
    return replace(contact, reach=reach), reach
