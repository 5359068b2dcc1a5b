"""Prometheus metrics of the API plumbing every role shares: watches and Events."""

from __future__ import annotations

from prometheus_client import Counter

EVENTS_DROPPED = Counter(
    "nodelb_events_dropped_total",
    "Kubernetes Events not posted: the 1000-deep send queue was full, or the API refused.",
)


WATCH_RESTARTS = Counter(
    "nodelb_watch_restarts_total",
    "List/watch restarts, by resource and reason (gone: relist after 410; error: reconnect).",
    ["resource", "reason"],
)

HTTP_AUTH = Counter(
    "nodelb_http_auth_total",
    "Requests for /metrics and /status by the bearer-token gate's verdict (Allowed, NoToken, "
    "Unauthenticated, Forbidden, ReviewFailed).",
    ["verdict"],
)
