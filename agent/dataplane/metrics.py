"""Prometheus metrics of the dataplane: syncs, nft transactions, drift, conntrack cleanup."""

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
NFT_FOREIGN_CHANGES = Counter(
    "nodelb_nft_foreign_changes_total",
    "Batches another process committed to the nodelb table, by kind of object changed.",
    ["object"],
)
NFT_TAMPER_REPAIRS = Counter(
    "nodelb_nft_tamper_repairs_total",
    "Rewrites of the nodelb table from the mirror after a foreign change, by result.",
    ["result"],
)
NFT_MONITOR_OVERRUNS = Counter(
    "nodelb_nft_monitor_overruns_total",
    "Times the kernel dropped nodelb table notifications (a drift check follows).",
)
