"""Prometheus metrics the agent exports (prometheus-client, default registry, `nodelb_` names)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SYNC_DURATION = Histogram(
    "nodelb_sync_duration_seconds",
    "Time to apply one dataplane sync (one nft transaction), by mode.",
    ["mode"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
NFT_FAST_PATH_FALLBACKS = Counter(
    "nodelb_nft_fast_path_fallbacks_total",
    "Element batches the kernel refused over netlink, then sent through libnftables.",
)
NFT_TRANSACTION_FAILURES = Counter(
    "nodelb_nft_transaction_failures_total",
    "nft transactions the kernel refused (the previous state stayed in place).",
)
NFT_DRIFT_REPAIRS = Counter(
    "nodelb_nft_drift_repairs_total",
    "Times the table read back from the kernel differed from the mirror and was resynced.",
)
PROGRAMMED_FRONTENDS = Gauge(
    "nodelb_programmed_frontends",
    "Frontends (IP, protocol, port) in the last state the kernel accepted.",
)
PROGRAMMED_MAP_ELEMENTS = Gauge(
    "nodelb_programmed_map_elements",
    "Set and map elements in the last state the kernel accepted.",
)
CONNTRACK_DELETED = Counter(
    "nodelb_conntrack_entries_deleted_total",
    "Stale UDP conntrack entries deleted after endpoints were removed.",
)
CONNTRACK_FAILURES = Counter(
    "nodelb_conntrack_delete_failures_total",
    "conntrack deletions that failed.",
)
SERVICE_PROBLEMS = Counter(
    "nodelb_service_problems_total",
    "Problems reported as Warning Events (malformed Services or slices, refused externalIPs,"
    " port mismatches, frontend conflicts), by reason.",
    ["reason"],
)
EXTERNAL_IPS_REFUSED = Counter(
    "nodelb_external_ips_refused_total",
    "externalIPs refused (outside the allow-list, or a pool address not allocated to the Service).",
)
RESYNC_CORRECTIONS = Counter(
    "nodelb_resync_corrections_total",
    "Services the periodic resync recomputed to a result other than the one programmed.",
)
EVENTS_DROPPED = Counter(
    "nodelb_events_dropped_total",
    "Kubernetes Events not posted: the 1000-deep send queue was full, or the API refused.",
)
SERVICES_HANDLED = Gauge(
    "nodelb_services",
    "Services in the agent's cache that were evaluated for this node.",
)
WATCH_RESTARTS = Counter(
    "nodelb_watch_restarts_total",
    "List/watch restarts, by resource and reason (gone: relist after 410; error: reconnect).",
    ["resource", "reason"],
)
