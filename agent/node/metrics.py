"""Prometheus metrics of the node role: Services handled, problems reported, resync corrections.

The dataplane's are in agent/dataplane/metrics.py, the API plumbing's in agent/kube/metrics.py,
the announcer's in agent/announce/metrics.py (all on the default registry, `nodelb_` names).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from agent.node.service_frontends import ProblemReason

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
LB_IPS_REFUSED = Counter(
    "nodelb_lb_ips_refused_total",
    "Warning Events for LoadBalancer ingress IPs this agent refused to serve and hold (outside"
    " every pool, or a Node, API server, pod or service address).",
)
RESYNC_CORRECTIONS = Counter(
    "nodelb_resync_corrections_total",
    "Services the periodic resync recomputed to a result other than the one programmed.",
)
SERVICES_HANDLED = Gauge(
    "nodelb_services",
    "Services in the agent's cache that were evaluated for this node.",
)


def count_problem(reason: ProblemReason) -> None:
    """Count one problem reported as a Warning Event (a refused externalIP or LoadBalancer IP
    also as a refusal)."""
    SERVICE_PROBLEMS.labels(reason.value).inc()
    if reason is ProblemReason.EXTERNAL_IP_REFUSED:
        EXTERNAL_IPS_REFUSED.inc()
    elif reason is ProblemReason.LB_IP_REFUSED:
        LB_IPS_REFUSED.inc()


SPREAD_SYNC_FAILURES = Counter(
    "nodelb_spread_sync_failures_total",
    "Times the spread tunnel device or the spread table could not be programmed (retried).",
)
