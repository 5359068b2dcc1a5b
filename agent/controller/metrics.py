"""Prometheus metrics the controller exports (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LEADER = Gauge("nodelb_controller_leader", "1 while this controller replica is the active leader")
POOL_ADDRESSES = Gauge(
    "nodelb_pool_addresses", "Addresses in each pool, per family", ["pool", "family"]
)
POOL_IN_USE = Gauge(
    "nodelb_pool_addresses_in_use",
    "Addresses of each pool held by at least one Service, per family",
    ["pool", "family"],
)
ALLOCATIONS = Counter(
    "nodelb_allocations_total", "Addresses allocated to Services and written to status", ["pool"]
)
REALLOCATIONS = Counter(
    "nodelb_reallocations_total",
    "Addresses taken from a Service at startup (duplicate, outside the pools, wrong family)",
    ["reason"],
)
ALLOCATION_FAILURES = Counter(
    "nodelb_allocation_failures_total",
    "Allocations that left a Service without an address, by reason",
    ["reason"],
)
SERVING_WARNINGS = Counter(
    "nodelb_serving_warnings_total",
    "Warnings sent because a Service's addresses serve nothing, or less than it asks, by reason",
    ["reason"],
)
POOL_EXHAUSTED_EVENTS = Counter(
    "nodelb_pool_exhausted_events_total", "PoolExhausted Warnings sent (rate limited)", ["pool"]
)
STATUS_WRITES = Counter(
    "nodelb_status_writes_total",
    "Service status writes, by result (ok, conflict, error)",
    ["result"],
)
FINALIZER_WRITES = Counter(
    "nodelb_finalizer_writes_total",
    "Patches adding or removing the load-balancer cleanup finalizer, by action and result",
    ["action", "result"],
)
UNHELD_IPS = Gauge(
    "nodelb_service_ips_unheld",
    "Allocated addresses that no live node reports holding with the Service's rules in place",
)
REPORTS_REFUSED = Gauge(
    "nodelb_controller_node_reports_refused",
    "Node reports (or parts of them) the controller does not believe now, by reason",
    ["reason"],
)
CONFIG_RELOADS = Counter(
    "nodelb_config_reloads_total", "Configuration (re)loads, by result (ok, error)", ["result"]
)
CONFIG_REFUSED = Gauge(
    "nodelb_config_refused",
    "1 while the config file in place is refused (the previous config, or none, stays in force)",
)
POOL_OBJECTS_REFUSED = Gauge(
    "nodelb_pool_objects_refused",
    "LoadBalancerIPPool objects whose spec is not in force now, by the Valid condition's reason",
    ["reason"],
)
