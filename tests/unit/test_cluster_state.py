"""The node core's decisions as pure functions of plain data (agent/node/cluster_state.py).

Every case feeds a ClusterState the changes a reflector would report and reads what `apply`
and `recompute` return: which Services become dirty (an externalIP user when its address's
owner moves), when the ownership input is rebuilt, the periodic resync's batches and
corrections, which problems are reported and the healthCheckNodePort answers. No thread, clock
or fake dataplane: the loop's own tests (test_node_loop.py) cover the shell.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.config import AgentConfig, Pool
from agent.kube.node_report import SOURCES_ANNOTATION, PeerReport, report_sources
from agent.kube.store import Change, EventType, Store
from agent.model.desired_state import FrontendKey
from agent.model.net import Protocol
from agent.model.service import InvalidService
from agent.node.cache import new_stores
from agent.node.cluster_state import (
    Changes,
    ClusterState,
    Dirty,
    Outcome,
    ProblemReport,
    Sweep,
)
from agent.node.health_answers import HealthAnswer
from agent.node.service_frontends import ProblemReason

IP = ipaddress.ip_address
POOL = ipaddress.ip_network("198.18.0.0/24")
R = ProblemReason


def svc(
    name: str,
    ip: str | None = "198.18.0.200",
    *,
    port: int = 80,
    created: str = "2026-01-01T00:00:00Z",
    local: bool = False,
    health_port: int | None = None,
    external: tuple[str, ...] = (),
    lb_class: str | None = None,
) -> dict[str, Any]:
    """A raw LoadBalancer Service ns/<name> with one TCP port named http."""
    spec: dict[str, Any] = {"type": "LoadBalancer", "ports": [{"name": "http", "port": port}]}
    if local:
        spec["externalTrafficPolicy"] = "Local"
    if health_port is not None:
        spec["healthCheckNodePort"] = health_port
    if external:
        spec["externalIPs"] = list(external)
    if lb_class is not None:
        spec["loadBalancerClass"] = lb_class
    ingress = [{"ip": ip}] if ip else []
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"u-{name}",
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": {"loadBalancer": {"ingress": ingress}},
    }


def endpoints(service: str, *eps: tuple[str, str, bool], name: str = "") -> dict[str, Any]:
    """A raw IPv4 EndpointSlice of ns/<service>: (address, node, ready) per endpoint."""
    return {
        "metadata": {
            "namespace": "ns",
            "name": name or f"{service}-1",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [addr], "nodeName": node, "conditions": {"ready": ready}}
            for addr, node, ready in eps
        ],
    }


def ready_on(service: str, *nodes: str) -> dict[str, Any]:
    """A slice of ns/<service> with one ready endpoint on each of `nodes`."""
    return endpoints(service, *((f"198.19.9.{i + 1}", n, True) for i, n in enumerate(nodes)))


def node(name: str, *, ready: bool = True, zone: str | None = None) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Cluster:
    """A ClusterState on node-1 and the reflectors' stores that feed it."""

    def __init__(self, **kw: Any) -> None:
        # Every test address lies in this pool unless a test says otherwise: an agent serves
        # only ingress IPs inside its pools (agent/node/holdable.py).
        config = {"pools": (Pool("test", (POOL,)),), **kw.pop("config", {})}
        self.state = ClusterState(AgentConfig(node_name="node-1", **config), **kw)
        self.services, self.slices, self.nodes = new_stores()
        self.reports: Store[PeerReport] = Store(report_sources)

    @staticmethod
    def _changes(store: Store[Any], event: EventType, raws: Sequence[Any]) -> list[Change[Any]]:
        return [c for raw in raws if (c := store.apply(event, raw)) is not None]

    def put(
        self,
        *,
        services: Sequence[dict[str, Any]] = (),
        slices: Sequence[dict[str, Any]] = (),
        nodes: Sequence[dict[str, Any]] = (),
    ) -> Dirty:
        """Apply raw objects added or modified; return what the state says is dirty."""
        return self.state.apply(
            Changes(
                services=self._changes(self.services, EventType.MODIFIED, services),
                slices=self._changes(self.slices, EventType.MODIFIED, slices),
                nodes=self._changes(self.nodes, EventType.MODIFIED, nodes),
            )
        )

    def delete_service(self, name: str) -> Dirty:
        changes = self._changes(self.services, EventType.DELETED, [svc(name)])
        return self.state.apply(Changes(services=changes))

    def report(self, name: str, *sources: str) -> Dirty:
        annotations = {SOURCES_ANNOTATION: ",".join(sources)}
        raw = {
            "metadata": {
                "namespace": "nodelb",
                "name": f"nodelb-node-{name}",
                "annotations": annotations,
            },
            "spec": {"holderIdentity": name},
        }
        return self.state.apply(
            Changes(reports=self._changes(self.reports, EventType.ADDED, [raw]))
        )

    def recompute(self, dirty: Dirty | None = None, **kw: Any) -> Outcome:
        return self.state.recompute(dirty or Dirty(everything=True), **kw)


def frontend(ip: str, port: int = 80) -> FrontendKey:
    return FrontendKey(IP(ip), Protocol.TCP, port)


def keys(*names: str) -> frozenset[str]:
    return frozenset(f"ns/{n}" for n in names)


# --- apply: what becomes dirty ---------------------------------------------------------------


@dataclass(frozen=True)
class ApplyCase:
    """`setup` is applied first (and recomputed); then `change`, whose Dirty must be `want`."""

    setup: Callable[[Cluster], object]
    change: Callable[[Cluster], Dirty]
    want: Dirty
    announcing: bool = False


def pooled(**kw: Any) -> dict[str, Any]:
    return {"external_ip_cidrs": (POOL,), "pools": (Pool("lab", (POOL,)),), **kw}


USER = svc("web", external=("198.18.0.9",))  # names a pool address as externalIP
OWNER = svc("owner", "198.18.0.9", created="2026-01-01")  # the address's oldest claimant


APPLY_CASES = [
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[USER]),
            change=lambda c: c.put(services=[svc("new", "198.18.0.9", created="2026-02-01")]),
            want=Dirty(keys("new", "web"), sync=True),
        ),
        id="a Service taking a pool address marks the Service naming it as externalIP dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[USER, OWNER]),
            change=lambda c: c.put(services=[svc("young", "198.18.0.9", created="2026-03-01")]),
            want=Dirty(keys("young"), sync=True),
        ),
        id="a younger claimant of an owned address marks no externalIP user dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(
                services=[USER, OWNER, svc("next", "198.18.0.9", created="2026-03-01")]
            ),
            change=lambda c: c.delete_service("owner"),
            want=Dirty(keys("owner", "web"), sync=True),
        ),
        id="the owner going hands the address on and marks its externalIP user dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[USER, svc("other", "198.18.0.8")]),
            change=lambda c: c.put(services=[svc("other", "198.18.0.7")]),
            want=Dirty(keys("other"), sync=True),
        ),
        id="an owner moving between addresses nobody names marks only itself dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[svc("web"), svc("other", "198.18.0.8")]),
            change=lambda c: c.put(slices=[endpoints("web", ("198.19.1.1", "node-2", True))]),
            want=Dirty(keys("web"), sync=True),
        ),
        id="a slice change marks only its own Service dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(slices=[endpoints("web", ("198.19.1.1", "node-2", True))]),
            change=lambda c: c.put(
                slices=[endpoints("other", ("198.19.1.1", "node-2", True), name="web-1")]
            ),
            want=Dirty(keys("web", "other"), sync=True),
        ),
        id="a slice moving to another Service marks both Services dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[svc("web")], nodes=[node("node-1")]),
            change=lambda c: c.put(nodes=[node("node-1", zone="zone-b")]),
            want=Dirty(everything=True, sync=True),
        ),
        id="this node's own record changing marks every Service dirty",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[svc("web")], nodes=[node("node-2")]),
            change=lambda c: c.put(nodes=[node("node-2", ready=False)]),
            want=Dirty(),
        ),
        id="another node's record wants no sync when nothing is announced",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[svc("web")], nodes=[node("node-2")]),
            change=lambda c: c.put(nodes=[node("node-2", ready=False)]),
            want=Dirty(sync=True),
            announcing=True,
        ),
        id="another node's readiness wants a sync with nothing dirty when announcing",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.report("node-2", "fe80::2"),
            change=lambda c: c.report("node-3", "fe80::3"),
            want=Dirty(
                reported={
                    "node-2": PeerReport("node-2", (IP("fe80::2"),)),
                    "node-3": PeerReport("node-3", (IP("fe80::3"),)),
                }
            ),
            announcing=True,
        ),
        id="a node report hands on every node's advert sources and wants no sync",
    ),
    pytest.param(
        ApplyCase(
            setup=lambda c: c.put(services=[svc("web")]),
            change=lambda c: c.state.apply(Changes(held=True)),
            want=Dirty(sync=True),
            announcing=True,
        ),
        id="the announcer's held addresses changing wants a sync with nothing dirty",
    ),
]


@pytest.mark.parametrize("case", APPLY_CASES)
def test_apply_says_which_services_to_recompute(case: ApplyCase) -> None:
    cluster = Cluster(announcing=case.announcing, config=pooled())
    case.setup(cluster)
    cluster.recompute()
    assert case.change(cluster) == case.want


def test_an_external_ip_verdict_follows_its_address_owner_in_the_recompute() -> None:
    cluster = Cluster(config=pooled())
    web = svc("web", "198.18.0.200", external=("198.18.0.9",), created="2026-02-01")
    first = cluster.recompute(cluster.put(services=[web]))
    assert [p.reason for p in first.problems["ns/web"]] == [R.EXTERNAL_IP_REFUSED]
    assert frontend("198.18.0.9") not in first.desired.frontends
    # web is given the address too: it owns it now, so its externalIP is accepted.
    web["status"]["loadBalancer"]["ingress"].append({"ip": "198.18.0.9"})
    owned = cluster.recompute(cluster.put(services=[web]))
    assert "ns/web" not in owned.problems
    assert owned.desired.frontends[frontend("198.18.0.9")].service == "ns/web"
    # An older Service takes it: web is recomputed without a change of its own.
    older = svc("older", "198.18.0.9", port=81, created="2026-01-01")
    dirty = cluster.put(services=[older])
    assert dirty.services == keys("older", "web")
    taken = cluster.recompute(dirty)
    assert [p.reason for p in taken.problems["ns/web"]] == [R.EXTERNAL_IP_REFUSED]
    assert taken.changed == frozenset(
        {frontend("198.18.0.200"), frontend("198.18.0.9"), frontend("198.18.0.9", 81)}
    )


# --- the ownership input ----------------------------------------------------------------------


@dataclass(frozen=True)
class OwnershipCase:
    """After a first recompute of SETUP, `change` is applied and recomputed."""

    change: Callable[[Cluster], Dirty]
    rebuilt: bool  # the recompute returns a new ownership input
    want_local: dict[str, frozenset[str]] = field(default_factory=dict)  # IP -> local nodes


def ownership_setup(c: Cluster) -> None:
    c.put(
        services=[svc("web", "198.18.0.200"), svc("loc", "198.18.0.201", local=True)],
        slices=[
            endpoints("web", ("198.19.1.1", "node-1", True)),
            endpoints("loc", ("198.19.2.1", "node-1", True)),
        ],
        nodes=[node("node-1"), node("node-2")],
    )


OWNERSHIP_CASES = [
    pytest.param(
        OwnershipCase(
            change=lambda c: c.put(slices=[endpoints("web", ("198.19.1.2", "node-2", True))]),
            rebuilt=False,
        ),
        id="a Cluster-policy Service's endpoints moving to another node rebuild nothing",
    ),
    pytest.param(
        OwnershipCase(
            change=lambda c: c.put(slices=[endpoints("loc", ("198.19.2.2", "node-1", True))]),
            rebuilt=False,
        ),
        id="a Local Service's new pod on the same node rebuilds nothing",
    ),
    pytest.param(
        OwnershipCase(
            change=lambda c: c.put(slices=[ready_on("loc", "node-1", "node-2")]),
            rebuilt=True,
            want_local={"198.18.0.201": frozenset({"node-1", "node-2"})},
        ),
        id="a Local Service gaining a node with a ready endpoint rebuilds the input",
    ),
    pytest.param(
        OwnershipCase(
            change=lambda c: c.put(slices=[endpoints("loc", ("198.19.2.1", "node-1", False))]),
            rebuilt=True,
            want_local={"198.18.0.201": frozenset()},
        ),
        id="a Local Service's only endpoint turning unready leaves its IP no eligible node",
    ),
    pytest.param(
        OwnershipCase(
            change=lambda c: c.put(services=[svc("web", "198.18.0.200", port=8080)]),
            rebuilt=False,
        ),
        id="a Service changing its port but not its IPs or policy rebuilds nothing",
    ),
    pytest.param(
        OwnershipCase(change=lambda c: c.put(services=[svc("web", "198.18.0.9")]), rebuilt=True),
        id="a Service moving to another IP rebuilds the input",
    ),
    pytest.param(
        OwnershipCase(change=lambda c: c.put(nodes=[node("node-2", ready=False)]), rebuilt=True),
        id="another Node's readiness rebuilds the input with no Service recomputed",
    ),
    pytest.param(
        OwnershipCase(change=lambda c: c.state.apply(Changes(held=True)), rebuilt=False),
        id="a wake-up from the announcer alone rebuilds nothing",
    ),
]


@pytest.mark.parametrize("case", OWNERSHIP_CASES)
def test_the_ownership_input_is_rebuilt_only_when_what_it_reads_moved(
    case: OwnershipCase,
) -> None:
    cluster = Cluster(announcing=True)
    ownership_setup(cluster)
    first = cluster.recompute()
    assert first.ownership is not None, "the first recompute always hands an input over"
    assert [n.name for n in first.nodes] == ["node-1", "node-2"]
    got = cluster.recompute(case.change(cluster))
    assert (got.ownership is not None) == case.rebuilt
    assert bool(got.nodes) == case.rebuilt
    if got.ownership is None:
        return
    local = {str(u.ip): u.services[0].local_nodes for u in got.ownership.ips if u.services[0].local}
    for ip, nodes in case.want_local.items():
        assert local[ip] == nodes


def test_without_an_announcer_no_ownership_input_is_built_and_every_programmed_ip_is_held() -> None:
    cluster = Cluster()
    ownership_setup(cluster)
    out = cluster.recompute()
    assert out.ownership is None and out.nodes == ()
    assert out.desired.held_ips == {IP("198.18.0.200"), IP("198.18.0.201")}
    held = Cluster(config={"serve_all_ips": False})
    ownership_setup(held)
    assert held.recompute().desired.held_ips == frozenset()


def test_when_announcing_only_the_announced_ips_with_a_frontend_are_held() -> None:
    cluster = Cluster(announcing=True)
    ownership_setup(cluster)
    out = cluster.recompute(held_ips=frozenset({IP("198.18.0.201"), IP("198.18.0.99")}))
    assert out.desired.held_ips == {IP("198.18.0.201")}


# --- the periodic resync ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sweep", "n", "batch", "left"),
    [
        pytest.param(Sweep(("a", "b", "c")), 2, {"a", "b"}, 1, id="a batch takes the first n"),
        pytest.param(Sweep(("a", "b", "c"), 2), 2, {"c"}, 0, id="the last batch is shorter"),
        pytest.param(Sweep(("a", "b"), 2), 2, set(), 0, id="an exhausted sweep takes nothing"),
        pytest.param(Sweep(()), 50, set(), 0, id="a sweep of no Service takes nothing"),
    ],
)
def test_a_sweep_takes_its_services_in_order(
    sweep: Sweep, n: int, batch: set[str], left: int
) -> None:
    taken, after = sweep.take(n)
    assert taken == batch
    assert after.left == left
    assert after.keys == sweep.keys


@dataclass(frozen=True)
class ResyncCase:
    """Five Services are synced, a resync starts and runs in batches of two (the sweep's order
    is its own, so Services are named by their place in it: 0 and 1 form the first batch).
    `stale`: results made outdated before the resync, as if a change had been lost;
    `pending`: Services with a change of their own waiting at the first batch."""

    stale: tuple[int, ...] = ()
    pending: tuple[int, ...] = ()
    corrections: tuple[int, ...] = ()


RESYNC_CASES = [
    pytest.param(ResyncCase(), id="a resync of up-to-date results corrects nothing"),
    pytest.param(
        ResyncCase(stale=(3,), corrections=(3,)),
        id="a stale result found by a batch is corrected and counted once",
    ),
    pytest.param(
        ResyncCase(stale=(0,), pending=(0,)),
        id="a batched Service pending a change of its own is recomputed but is no correction",
    ),
    pytest.param(
        ResyncCase(stale=(4,), pending=(4,)),
        id="a pending change recomputed before its batch leaves that batch nothing to correct",
    ),
    pytest.param(
        ResyncCase(stale=(1, 4), corrections=(1, 4)),
        id="stale results in different batches are each corrected",
    ),
]


@pytest.mark.parametrize("case", RESYNC_CASES)
def test_the_periodic_resync_checks_every_service_in_batches(case: ResyncCase) -> None:
    cluster = Cluster(sweep_batch=2)
    cluster.put(services=[svc(f"s{i}", f"198.18.0.{10 + i}") for i in range(5)])
    synced = cluster.recompute()
    assert cluster.state.start_sweep() == 5
    assert cluster.state.sweep is not None
    order = cluster.state.sweep.keys
    for place in case.stale:
        result = cluster.state.index.results[order[place]]
        cluster.state.index.put(dataclasses.replace(result, frontends=()))
    seen: list[frozenset[str]] = []
    corrections: list[str] = []
    for i in range(3):
        pending = Dirty(frozenset(order[p] for p in case.pending) if i == 0 else frozenset())
        out = cluster.recompute(pending, batch=True)
        batch = frozenset(order[2 * i : 2 * i + 2])
        assert out.changed is not None
        recomputed = {synced.desired.frontends[k].service for k in out.changed}
        assert recomputed == batch | pending.services
        assert out.resynced == (i == 2)
        seen.append(batch)
        corrections.extend(out.corrections)
    assert cluster.state.sweep is None
    assert frozenset().union(*seen) == keys("s0", "s1", "s2", "s3", "s4")
    assert sorted(corrections) == sorted(order[p] for p in case.corrections)
    assert out.desired.frontends == synced.desired.frontends, "every stale result is repaired"


def test_a_recompute_without_batch_leaves_the_resync_where_it_was() -> None:
    cluster = Cluster(sweep_batch=1)
    cluster.put(services=[svc("a"), svc("b", "198.18.0.201")])
    cluster.recompute()
    cluster.state.start_sweep()
    out = cluster.recompute(cluster.put(services=[svc("a", port=81)]))
    assert cluster.state.sweep is not None and cluster.state.sweep.left == 2
    assert not out.resynced
    assert out.changed == frozenset({frontend("198.18.0.200"), frontend("198.18.0.200", 81)})
    cluster.recompute(Dirty(), batch=True)
    last = cluster.recompute(Dirty(), batch=True)
    assert last.resynced and cluster.state.sweep is None


# --- problems ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProblemCase:
    services: Sequence[dict[str, Any]]
    slices: Sequence[dict[str, Any]] = ()
    want: dict[str, tuple[ProblemReason, ...]] = field(default_factory=dict)  # by Service name
    config: dict[str, Any] = field(default_factory=dict)


PROBLEM_CASES = [
    pytest.param(
        ProblemCase(services=[svc("web"), svc("quiet", "198.18.0.201")]),
        id="Services without problems are absent from the problems and the reports",
    ),
    pytest.param(
        ProblemCase(services=[svc("bad", port=0)], want={"bad": (R.INVALID_SERVICE,)}),
        id="a Service that cannot be parsed is reported as invalid",
    ),
    pytest.param(
        ProblemCase(
            services=[svc("web")],
            slices=[
                {
                    "metadata": {
                        "namespace": "ns",
                        "name": "web-x",
                        "labels": {"kubernetes.io/service-name": "web"},
                    },
                    "addressType": "Bogus",
                }
            ],
            want={"web": (R.INVALID_SERVICE,)},
        ),
        id="a slice that cannot be parsed is reported on its Service",
    ),
    pytest.param(
        ProblemCase(
            services=[
                svc("old", created="2026-01-01T00:00:00Z"),
                svc("young", created="2026-02-01T00:00:00Z"),
            ],
            want={"young": (R.FRONTEND_CONFLICT,)},
        ),
        id="two Services on one IP and port: the younger reports the conflict, the older none",
    ),
    pytest.param(
        ProblemCase(
            services=[svc("web", external=("203.0.113.5",))],
            want={"web": (R.EXTERNAL_IP_REFUSED,)},
        ),
        id="an externalIP outside the allow-list is reported as refused",
    ),
    pytest.param(
        ProblemCase(
            services=[svc("web")],
            slices=[
                {
                    **endpoints("web", ("198.19.1.1", "node-1", True)),
                    "ports": [{"name": "grpc", "port": 9090, "protocol": "TCP"}],
                }
            ],
            want={"web": (R.PORT_MISMATCH,)},
        ),
        id="a Service port no slice names is reported as a port mismatch",
    ),
]


@pytest.mark.parametrize("case", PROBLEM_CASES)
def test_problems_are_reported_once_per_problem_with_the_service_s_uid(case: ProblemCase) -> None:
    cluster = Cluster(config=case.config)
    out = cluster.recompute(cluster.put(services=case.services, slices=case.slices))
    got = {k.split("/")[1]: tuple(p.reason for p in ps) for k, ps in out.problems.items()}
    assert got == case.want
    assert {(r.service, r.uid, r.problem.reason) for r in out.reports} == {
        (f"ns/{name}", f"u-{name}", reason)
        for name, reasons in case.want.items()
        for reason in reasons
    }


def test_only_recomputed_services_and_conflicts_are_reported_again() -> None:
    cluster = Cluster()
    out = cluster.recompute(
        cluster.put(
            services=[
                svc("bad", port=0),
                svc("old", created="2026-01-01T00:00:00Z"),
                svc("young", created="2026-02-01T00:00:00Z"),
            ]
        )
    )
    assert set(out.problems) == {"ns/bad", "ns/young"}
    # An unrelated change: the invalid Service is not recomputed, so not reported again; the
    # conflict is a property of the whole assembly, so it stays in every outcome.
    later = cluster.recompute(cluster.put(services=[svc("other", "198.18.0.250")]))
    assert set(later.problems) == {"ns/young"}
    # The invalid Service deleted: recomputed, but gone, so nothing to report.
    gone = cluster.recompute(cluster.delete_service("bad"))
    assert "ns/bad" not in gone.problems
    assert all(r.service != "ns/bad" for r in gone.reports)


def test_a_problem_report_of_an_invalid_service_names_its_uid() -> None:
    cluster = Cluster()
    out = cluster.recompute(cluster.put(services=[svc("bad", port=0)]))
    (report,) = out.reports
    assert report == ProblemReport("ns/bad", "u-bad", out.problems["ns/bad"][0])
    assert isinstance(cluster.state.cache.services["ns/bad"], InvalidService)


# --- health answers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthCase:
    """`first` is applied and recomputed, then `then`: the second outcome's `health` is `want`."""

    then: Callable[[Cluster], Dirty]
    want: dict[int, HealthAnswer] | None
    first_want: dict[int, HealthAnswer] | None = field(
        default_factory=lambda: {30555: HealthAnswer("ns", "web", 1)}
    )
    health_checks: bool = True
    first: Sequence[dict[str, Any]] = (svc("web", local=True, health_port=30555),)


HERE = endpoints("web", ("198.19.1.1", "node-1", True))
ELSEWHERE = endpoints("web", ("198.19.2.1", "node-2", True))

HEALTH_CASES = [
    pytest.param(
        HealthCase(then=lambda c: c.put(services=[svc("other", "198.18.0.201")]), want=None),
        id="an unrelated change leaves the answers alone and none are handed over",
    ),
    pytest.param(
        HealthCase(
            then=lambda c: c.put(
                slices=[HERE, endpoints("web", ("198.19.1.2", "node-1", True), name="web-2")]
            ),
            want={30555: HealthAnswer("ns", "web", 2)},
        ),
        id="a second local ready endpoint raises the count",
    ),
    pytest.param(
        HealthCase(
            then=lambda c: c.put(slices=[ready_on("web", "node-1", "node-2")]),
            want=None,
        ),
        id="an endpoint added on another node leaves this node's answer as it was",
    ),
    pytest.param(
        HealthCase(
            then=lambda c: c.put(slices=[ELSEWHERE], services=[]),
            want={30555: HealthAnswer("ns", "web", 0)},
        ),
        id="the local endpoint moving to another node turns the answer to zero (503)",
    ),
    pytest.param(
        HealthCase(
            then=lambda c: c.put(services=[svc("web", local=True, health_port=None)]), want={}
        ),
        id="a Service that no longer asks for a health port drops its answer",
    ),
    pytest.param(
        HealthCase(then=lambda c: c.delete_service("web"), want={}),
        id="a deleted Service drops its answer",
    ),
    pytest.param(
        HealthCase(
            first=(svc("web", local=True, health_port=30555, lb_class="other.io/lb"),),
            first_want=None,
            then=lambda c: c.put(slices=[ELSEWHERE]),
            want=None,
        ),
        id="a Service of another class never gets an answer",
    ),
    pytest.param(
        HealthCase(
            health_checks=False,
            first_want=None,
            then=lambda c: c.put(slices=[ELSEWHERE]),
            want=None,
        ),
        id="with health checks off no answer is ever handed over",
    ),
]


@pytest.mark.parametrize("case", HEALTH_CASES)
def test_health_answers_are_handed_over_only_when_they_change(case: HealthCase) -> None:
    cluster = Cluster(health_checks=case.health_checks)
    first = cluster.recompute(cluster.put(services=case.first, slices=[HERE]))
    assert first.health == case.first_want
    assert cluster.recompute(case.then(cluster)).health == case.want


# --- counts and the everything path -----------------------------------------------------------


def test_the_outcome_counts_services_and_names_changed_frontends_only_for_partial_recomputes() -> (
    None
):
    cluster = Cluster()
    cluster.put(services=[svc("a"), svc("b", "198.18.0.201")])
    full = cluster.recompute(Dirty(everything=True))
    assert full.services == 2 and full.changed is None
    assert full.programmed_ips == {IP("198.18.0.200"), IP("198.18.0.201")}
    gone = cluster.recompute(cluster.delete_service("a"))
    assert gone.services == 1 and gone.changed == frozenset({frontend("198.18.0.200")})
    assert gone.programmed_ips == {IP("198.18.0.201")}
    nothing = cluster.recompute(Dirty())
    assert nothing.changed == frozenset() and nothing.desired == gone.desired


def test_this_node_s_zone_reaches_selection_after_its_record_changes_everything() -> None:
    cluster = Cluster()
    hinted = endpoints("a", ("198.19.1.1", "node-2", True), ("198.19.1.2", "node-3", True))
    hinted["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-a"}]}
    hinted["endpoints"][1]["hints"] = {"forZones": [{"name": "zone-b"}]}
    cluster.recompute(
        cluster.put(services=[svc("a")], slices=[hinted], nodes=[node("node-1", zone="zone-b")])
    )
    dirty = cluster.put(nodes=[node("node-1", zone="zone-a")])
    assert dirty.everything
    out = cluster.recompute(dirty)
    (fe,) = out.desired.frontends.values()
    assert [str(e.ip) for e in fe.endpoints] == ["198.19.1.1"]
