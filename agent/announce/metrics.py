"""Prometheus metrics of the announcer, fed from the speaker's status snapshots.

The speaker child keeps totals; the agent polls `SpeakerProcess.status()` and calls
`SpeakerMetrics.update(status)`, which sets the gauges and advances each counter by what the
totals grew since the last snapshot. A restarted child starts from zero again: a total that
went down counts from zero, so counters never go backwards.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from agent.announce.vrrp.control import SpeakerStatus

STATES = ("Initialize", "Backup", "Master")


def family_label(version: int) -> str:
    """Return the `family` label value: "IPv4" / "IPv6", as the controller's metrics and the
    Service's ipFamilies spell it."""
    return f"IPv{version}"


class SpeakerMetrics:
    """The nodelb_vrrp_* / nodelb_gratuitous_* / nodelb_held_addresses metrics on a registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.state = Gauge(
            "nodelb_vrrp_state",
            "1 for the VRRP instance's current state, 0 for the others.",
            ["vrid", "family", "state"],
            registry=registry,
        )
        self.priority = Gauge(
            "nodelb_vrrp_priority",
            "This node's VRRP priority for the instance.",
            ["vrid", "family"],
            registry=registry,
        )
        self.adverts_sent = Counter(
            "nodelb_vrrp_adverts_sent",
            "VRRP advertisements sent.",
            ["vrid", "family"],
            registry=registry,
        )
        self.adverts_received = Counter(
            "nodelb_vrrp_adverts_received",
            "VRRP advertisements accepted (every check passed).",
            ["vrid", "family"],
            registry=registry,
        )
        self.adverts_dropped = Counter(
            "nodelb_vrrp_adverts_dropped",
            "Protocol-112 packets dropped, by reason (ttl, unknown_source, unknown_vrid,"
            " malformed, or the codec's reason such as bad_checksum).",
            ["family", "reason"],
            registry=registry,
        )
        self.transitions = Counter(
            "nodelb_vrrp_transitions",
            "VRRP state changes, by the state entered.",
            ["vrid", "family", "to"],
            registry=registry,
        )
        self.takeovers = Counter(
            "nodelb_vrrp_takeovers",
            "Times this node became Master of the instance.",
            ["vrid", "family"],
            registry=registry,
        )
        self.gratuitous_sent = Counter(
            "nodelb_gratuitous_sent",
            "Gratuitous ARPs (request / reply) and unsolicited NAs sent.",
            ["family", "kind"],
            registry=registry,
        )
        self.held = Gauge(
            "nodelb_held_addresses",
            "Addresses this node holds on its interface (marked as nodelb's).",
            ["family"],
            registry=registry,
        )
        self.realtime = Gauge(
            "nodelb_speaker_realtime_priority",
            "The SCHED_RR priority the VRRP speaker runs at; 0 when it runs at normal priority"
            " (real-time scheduling off, or refused by the node).",
            registry=registry,
        )
        self.pinned_cpu = Gauge(
            "nodelb_speaker_cpu",
            "The CPU the VRRP speaker is pinned to (announce.speakerCPU); -1 when it is not"
            " pinned.",
            registry=registry,
        )
        self._last: dict[tuple[int, tuple[str, ...]], int] = {}
        self._instances: set[tuple[str, str]] = set()
        self._pid: int | None = None

    def _advance(self, counter: Counter, labels: tuple[str, ...], total: int) -> None:
        key = (id(counter), labels)
        previous = self._last.get(key, 0)
        grown = total - previous if total >= previous else total
        if grown:
            counter.labels(*labels).inc(grown)
        else:
            counter.labels(*labels)  # make the series visible at 0
        self._last[key] = total

    def update(self, status: SpeakerStatus) -> None:
        """Bring every metric up to `status` (a snapshot from SpeakerProcess.status())."""
        if status.pid != self._pid:  # a new child: its totals start from zero
            self._last.clear()
            self._pid = status.pid
        current = {(str(i.vrid), family_label(i.family)) for i in status.instances}
        for vrid, family in self._instances - current:  # removed instances: no stale state
            for s in STATES:
                self.state.remove(vrid, family, s)
            self.priority.remove(vrid, family)
        self._instances = current
        for i in status.instances:
            vrid, family = str(i.vrid), family_label(i.family)
            for s in STATES:
                self.state.labels(vrid, family, s).set(1 if s == i.state else 0)
            self.priority.labels(vrid, family).set(i.priority)
            self._advance(self.adverts_sent, (vrid, family), i.adverts_sent)
            self._advance(self.adverts_received, (vrid, family), i.adverts_received)
            self._advance(self.takeovers, (vrid, family), i.takeovers)
            for to, count in i.transitions:
                self._advance(self.transitions, (vrid, family, to), count)
        for (family_n, reason), count in status.dropped:
            self._advance(self.adverts_dropped, (family_label(family_n), reason), count)
        for (family_n, kind), count in status.gratuitous:
            self._advance(self.gratuitous_sent, (family_label(family_n), kind), count)
        for f in (4, 6):
            self.held.labels(family_label(f)).set(sum(1 for a in status.held if a.version == f))
        self.realtime.set(status.realtime_priority)
