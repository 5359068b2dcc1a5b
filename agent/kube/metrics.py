"""Prometheus metrics of the API plumbing every role shares: watches, Events, API reach."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVENTS_DROPPED = Counter(
    "nodelb_events_dropped_total",
    "Kubernetes Events not posted: the 1000-deep send queue was full, or the API refused.",
)


WATCH_RESTARTS = Counter(
    "nodelb_watch_restarts_total",
    "List/watch restarts, by resource and reason (gone: relist after 410; error: reconnect).",
    ["resource", "reason"],
)

API_CUT_OFF = Gauge(
    "nodelb_api_cut_off",
    "1 while the agent is cut off from the API server (its probes get no answer), else 0.",
)
