"""Prometheus metrics of the API plumbing every role shares: watches, Events, API reach."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVENTS_RECORDED = Counter(
    "nodelb_events_recorded_total",
    "Event occurrences handed to the Event sender (each ends in an Event's count or dropped).",
)

EVENTS_DROPPED = Counter(
    "nodelb_events_dropped_total",
    "Event occurrences never posted, by reason (queue_full, api_error, shutdown).",
    ["reason"],
)

EVENTS_REPEATS_SUPPRESSED = Counter(
    "nodelb_events_repeats_suppressed_total",
    "Repeats of an Event sent within its gate window (10 min; 60 s for IPAnnounced) that were "
    "not handed to the Event sender, by reason.",
    ["reason"],
)

EVENT_WRITES = Counter(
    "nodelb_event_writes_total",
    "Event API writes that succeeded, by action (create a new Event, patch a repeat's count).",
    ["action"],
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

HTTP_AUTH = Counter(
    "nodelb_http_auth_total",
    "Requests for /metrics and /status by the bearer-token gate's verdict (Allowed, NoToken, "
    "Unauthenticated, Forbidden, ReviewFailed).",
    ["verdict"],
)
