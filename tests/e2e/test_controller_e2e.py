"""The allocation controller against a real kube-apiserver: real processes, real Leases.

Two `nodelb controller` replicas run in the control-plane namespace with a fast election
(4 s Lease). A watcher in the test process follows every Service status change and records
any moment an address is held by two Services — checked continuously, not only at the end.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from agent.controller.finalizer import FINALIZER
from agent.kube.node_report import report_body
from agent.kube.node_reporter import NodeReporter
from lab import readers
from lab.controllers import NAMESPACE, ControllerSet, ensure_node
from lab.controlplane import ControlPlane
from lab.topology import Lab
from lab.wait import GiveUp, wait_until

pytestmark = pytest.mark.e2e

BULK = 500
POOLS: list[dict[str, Any]] = [
    {"name": "main", "addresses": ["198.19.0.0/22"]},
    {"name": "v6", "addresses": ["2001:db8:100::/120"]},
    {"name": "tiny", "addresses": ["198.19.8.1-198.19.8.2"], "autoAssign": False},
    {
        "name": "v6-restricted",
        "addresses": ["2001:db8:200::/120"],
        "namespaces": ["nowhere"],
    },
]
CONFIG: dict[str, Any] = {"pools": POOLS}


@pytest.fixture(scope="module")
def core(controlplane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(controlplane.api_client())


@pytest.fixture(scope="module")
def controllers(
    cp_lab: Lab, controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerSet]:
    """Yield two running controller replicas ("ctl-a", "ctl-b") and one elected leader."""
    cs = ControllerSet(cp_lab, controlplane, Path(tmp_path_factory.mktemp("controllers")))
    cs.ensure_namespace()
    cs.write_config(CONFIG)
    try:
        cs.start("ctl-a")
        cs.start("ctl-b")
        wait_until(cs.leader, 30, "a controller to take the Lease")
        yield cs
    finally:
        cs.stop_all()


def make_ns(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace(cast(Any, {"metadata": {"name": name}}))
    return name


def create_svc(core: client.CoreV1Api, ns: str, body: dict[str, Any]) -> Any:
    """Create a Service from a plain dict (the typed client accepts dicts at run time)."""
    return core.create_namespaced_service(ns, cast(Any, body))


def lb_service(
    name: str,
    *,
    port: int = 80,
    annotations: dict[str, str] | None = None,
    families: list[str] | None = None,
    policy: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "selector": {"app": name},
        "ports": [{"name": "p", "port": port, "protocol": "TCP"}],
    }
    if families:
        spec["ipFamilies"] = families
    if policy:
        spec["ipFamilyPolicy"] = policy
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def status_of(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    raw: Any = core.read_namespaced_service(name, ns, _preload_content=False)
    obj: dict[str, Any] = orjson.loads(raw.data)
    return obj.get("status") or {}


def ips_of(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    ingress = (status_of(core, ns, name).get("loadBalancer") or {}).get("ingress") or []
    return [e["ip"] for e in ingress if e.get("ip")]


def condition(core: client.CoreV1Api, ns: str, name: str, kind: str) -> dict[str, Any] | None:
    for cond in status_of(core, ns, name).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def cond_is(core: client.CoreV1Api, ns: str, name: str, kind: str, want: str) -> bool:
    """Return True when condition `kind` reads `want` ("Status/Reason")."""
    status, reason = want.split("/")
    c = condition(core, ns, name, kind)
    return c is not None and c.get("status") == status and c.get("reason") == reason


def events(core: client.CoreV1Api, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    raw: Any = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    items = orjson.loads(raw.data).get("items") or []
    return [e for e in items if e.get("reason") == reason]


def observe(seconds: float, what: str) -> None:
    """Let `seconds` pass (a window in which something must *not* happen; checked after)."""
    start = datetime.datetime.now(datetime.UTC)
    span = datetime.timedelta(seconds=seconds)
    wait_until(lambda: datetime.datetime.now(datetime.UTC) - start > span, seconds + 4, what)


def scrape(cs: ControllerSet, name: str) -> str:
    code, body = cs.scrape(name)
    assert code == 200, body
    return body


class HolderWatcher:
    """Follows Service status in one namespace; records every moment an IP has two holders."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self._core = core
        self._ns = namespace
        self.current: dict[str, tuple[str, ...]] = {}
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.events_seen = 0
        self._stop = threading.Event()
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        listed: Any = core.list_namespaced_service(namespace)
        self._rv = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as exc:  # the apiserver stopping ends the stream after close()
            if not self._stop.is_set():
                self.errors.append(repr(exc))

    def _follow(self) -> None:
        for ev in self._watch.stream(  # type: ignore[no-untyped-call]
            self._core.list_namespaced_service,
            self._ns,
            resource_version=self._rv,
            timeout_seconds=600,
        ):
            obj = ev["object"]
            key = obj.metadata.name
            ingress = (obj.status.load_balancer.ingress or []) if obj.status.load_balancer else []
            ips = tuple(i.ip for i in ingress if i.ip)
            if ev["type"] == "DELETED":
                self.current.pop(key, None)
            else:
                self.current[key] = ips
            self.events_seen += 1
            holders: dict[str, list[str]] = {}
            for svc, held in self.current.items():
                for ip in held:
                    holders.setdefault(ip, []).append(svc)
            for ip, svcs in holders.items():
                if len(svcs) > 1:
                    self.violations.append(f"{ip} held by {sorted(svcs)}")
            if self._stop.is_set():
                return

    def close(self) -> None:
        self._stop.set()
        self._watch.stop()  # type: ignore[no-untyped-call]


def test_two_controllers_500_services_never_share_an_address_even_when_the_leader_dies(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "bulk")
    watcher = HolderWatcher(core, ns)
    try:
        first = controllers.leader()
        assert first in ("ctl-a", "ctl-b")
        killed = threading.Event()

        def create(i: int) -> None:
            create_svc(core, ns, lb_service(f"s{i:03d}"))

        def kill_leader_midway() -> None:
            wait_until(
                lambda: sum(1 for v in watcher.current.values() if v) >= BULK // 4,
                120,
                "a quarter of the Services to be allocated",
            )
            controllers.kill(str(first))
            killed.set()

        killer = threading.Thread(target=kill_leader_midway, daemon=True)
        killer.start()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, range(BULK)))
        killer.join(timeout=130)
        assert killed.is_set(), "the leader was never killed mid-run"
        wait_until(
            lambda: sum(1 for v in watcher.current.values() if v) == BULK,
            180,
            f"all {BULK} Services to get an address after the leader was killed",
        )
        assert controllers.leader() not in (None, first)
        ips = [ip for v in watcher.current.values() for ip in v]
        assert len(ips) == BULK == len(set(ips))
        assert all(ipaddress.ip_address(ip) in ipaddress.ip_network("198.19.0.0/22") for ip in ips)
        assert watcher.violations == []
        assert watcher.errors == []
        # The new leader found the dead one's allocations in status and kept them.
        assert watcher.events_seen >= BULK
    finally:
        watcher.close()


def test_a_restarted_controller_moves_nothing(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    before = {f"s{i:03d}": ips_of(core, "bulk", f"s{i:03d}") for i in range(BULK)}
    assert all(before.values())
    controllers.stop_all()
    controllers.start("ctl-c")
    wait_until(lambda: controllers.leader() == "ctl-c", 30, "ctl-c to lead")
    # The newest Service is allocated after every existing one is recorded and re-checked.
    create_svc(core, "bulk", lb_service("after-restart"))
    wait_until(lambda: ips_of(core, "bulk", "after-restart"), 60, "the new Service's address")
    after = {name: ips_of(core, "bulk", name) for name in before}
    moved = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert moved == {}
    assert ips_of(core, "bulk", "after-restart")[0] not in {ip for v in before.values() for ip in v}
    # Nothing was rewritten either: the only status write is the new Service's.
    assert 'nodelb_status_writes_total{result="ok"} 1.0' in scrape(controllers, "ctl-c")
    controllers.start("ctl-d")  # back to two replicas for the rest of the module


def test_an_exhausted_pool_reports_boundedly_and_hands_out_a_freed_address_at_once(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "tiny")
    tiny = {"nodelb.io/ip-pool": "tiny"}
    for name in ("t1", "t2"):
        create_svc(core, ns, lb_service(name, annotations=tiny))
    wait_until(lambda: ips_of(core, ns, "t1") and ips_of(core, ns, "t2"), 30, "t1 and t2 served")
    create_svc(core, ns, lb_service("t3", annotations=tiny))
    wait_until(lambda: events(core, ns, "t3", "PoolExhausted"), 30, "a PoolExhausted Event")
    wait_until(
        lambda: cond_is(core, ns, "t3", "LoadBalancerServing", "False/Infrastructure"),
        30,
        "t3 Serving=False/Infrastructure",
    )
    # Resyncs and retries inside the backoff window do not repeat the Warning: over the first
    # 6 s (the backoff starts at 5 s and doubles) at most two can exist.
    observe(6.0, "an observation window")
    assert 1 <= len(events(core, ns, "t3", "PoolExhausted")) <= 2
    freed = ips_of(core, ns, "t1")
    core.delete_namespaced_service("t1", ns)
    # Well inside the current backoff (10 s by now): the release retries waiting Services.
    wait_until(lambda: ips_of(core, ns, "t3") == freed, 4, "t3 to get t1's freed address")
    assert ips_of(core, ns, "t3") == freed
    wait_until(lambda: events(core, ns, "t3", "IPAllocated"), 10, "t3's IPAllocated Event")


def test_dual_stack_gets_one_address_per_family_with_ipmode_vip(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "dual")
    create_svc(core, ns, lb_service("both", families=["IPv4", "IPv6"], policy="RequireDualStack"))
    wait_until(lambda: len(ips_of(core, ns, "both")) == 2, 30, "two addresses")
    ingress = status_of(core, ns, "both")["loadBalancer"]["ingress"]
    assert [ipaddress.ip_address(e["ip"]).version for e in ingress] == [4, 6]
    assert {e.get("ipMode") for e in ingress} == {"VIP"}
    # PreferDualStack in a namespace no IPv6 pool admits: served on IPv4, marked degraded;
    # the restricted v6 pool is not used, the open one is, so force it with a pool name.
    create_svc(
        core,
        ns,
        lb_service(
            "prefer",
            families=["IPv4", "IPv6"],
            policy="PreferDualStack",
            annotations={"nodelb.io/ip-pool": "main"},
        ),
    )
    wait_until(
        lambda: cond_is(core, ns, "prefer", "LoadBalancerDegraded", "True/IPFamiliesNotSupported"),
        30,
        "prefer Degraded=True/IPFamiliesNotSupported",
    )
    assert len(ips_of(core, ns, "prefer")) == 1


def test_sharing_by_key_and_a_port_collision(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "share")
    key = {"nodelb.io/allow-shared-ip": "k1"}
    create_svc(core, ns, lb_service("web", port=80, annotations=key))
    wait_until(lambda: ips_of(core, ns, "web"), 30, "web's address")
    create_svc(core, ns, lb_service("dns", port=53, annotations=key))
    wait_until(lambda: ips_of(core, ns, "dns"), 30, "dns's address")
    assert ips_of(core, ns, "dns") == ips_of(core, ns, "web")
    # Same key, but port 80 is taken on that address: the key cannot be joined.
    wanted = {**key, "nodelb.io/load-balancer-ips": ips_of(core, ns, "web")[0]}
    create_svc(core, ns, lb_service("clash", port=80, annotations=wanted))
    wait_until(lambda: events(core, ns, "clash", "IPRequestInvalid"), 30, "IPRequestInvalid")
    assert ips_of(core, ns, "clash") == []
    assert cond_is(core, ns, "clash", "LoadBalancerServing", "False/Infrastructure")


def test_conditions_follow_the_node_reports(
    core: client.CoreV1Api, controllers: ControllerSet, controlplane: ControlPlane
) -> None:
    ns = make_ns(core, "serve")
    create_svc(core, ns, lb_service("web"))
    wait_until(lambda: ips_of(core, ns, "web"), 30, "web's address")
    assert cond_is(core, ns, "web", "LoadBalancerServing", "False/Provisioning")
    assert cond_is(core, ns, "web", "LoadBalancerProvisioning", "True/Provisioning")
    assert cond_is(core, ns, "web", "LoadBalancerDegraded", "False/NotDegraded")
    ip = ipaddress.ip_address(ips_of(core, ns, "web")[0])
    coord = client.CoordinationV1Api(controlplane.api_client())
    ensure_node(core, "node-x")
    # A node reports it holds the IP with its rules in place, for 3 s, then stops renewing.
    coord.create_namespaced_lease(
        NAMESPACE,
        cast(Any, report_body)(
            node="node-x",
            namespace=NAMESPACE,
            ips=[ip],
            now=datetime.datetime.now(datetime.UTC),
            duration=3,
        ),
    )
    wait_until(
        lambda: cond_is(core, ns, "web", "LoadBalancerServing", "True/Serving"),
        30,
        "Serving=True once a node reports the IP",
    )
    assert cond_is(core, ns, "web", "LoadBalancerProvisioning", "False/Complete")
    wait_until(
        lambda: cond_is(core, ns, "web", "LoadBalancerServing", "False/Provisioning"),
        30,
        "Serving=False again once the report expired",
    )
    # A required feature nodelb does not know: refused, not degraded, and no address.
    create_svc(
        core, ns, lb_service("picky", annotations={"nodelb.io/required-features": "Teleport"})
    )
    wait_until(
        lambda: cond_is(core, ns, "picky", "LoadBalancerServing", "False/Unsupported"),
        30,
        "picky Serving=False/Unsupported",
    )
    assert ips_of(core, ns, "picky") == []
    coord.delete_namespaced_lease("nodelb-node-node-x", NAMESPACE)


def test_the_agents_reporter_turns_serving_on_and_off(
    core: client.CoreV1Api, controllers: ControllerSet, controlplane: ControlPlane
) -> None:
    """The agent's side (NodeReporter) against the controller: report, renew, withdraw."""
    ns = make_ns(core, "reporter")
    create_svc(core, ns, lb_service("web"))
    ip = ipaddress.ip_address(wait_until(lambda: ips_of(core, ns, "web"), 30, "an address")[0])
    coord = client.CoordinationV1Api(controlplane.api_client())
    ensure_node(core, "node-y")
    reporter = NodeReporter(coord, node="node-y", namespace=NAMESPACE, duration=2, renew_every=0.5)
    stop = threading.Event()
    thread = threading.Thread(target=reporter.run, args=(stop,), daemon=True)
    thread.start()
    try:
        reporter.update([ip])
        wait_until(
            lambda: cond_is(core, ns, "web", "LoadBalancerServing", "True/Serving"),
            30,
            "Serving=True from the reporter",
        )
        # Renewals keep it True past the 2 s lease duration.
        first = reporter.writes
        wait_until(lambda: reporter.writes >= first + 6, 30, "three seconds of renewals")
        assert cond_is(core, ns, "web", "LoadBalancerServing", "True/Serving")
        reporter.update([])
        wait_until(
            lambda: cond_is(core, ns, "web", "LoadBalancerServing", "False/Provisioning"),
            30,
            "Serving=False once the node stops serving the IP",
        )
    finally:
        stop.set()
        reporter.wake()
        thread.join(timeout=10)
    assert not thread.is_alive()
    coord.delete_namespaced_lease("nodelb-node-node-y", NAMESPACE)


def test_bad_requests_get_specific_events_and_others_keep_their_addresses(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "bad")
    create_svc(core, ns, lb_service("good"))
    wait_until(lambda: ips_of(core, ns, "good"), 30, "good's address")
    good = ips_of(core, ns, "good")
    cases = {
        "not-an-ip": ({"nodelb.io/load-balancer-ips": "300.1.2.3"}, "InvalidAnnotation"),
        "outside": ({"nodelb.io/load-balancer-ips": "198.18.77.7"}, "RequestedIPNotInPool"),
        "no-pool": ({"nodelb.io/ip-pool": "missing"}, "UnknownPool"),
        "taken": ({"nodelb.io/load-balancer-ips": good[0]}, "RequestedIPInUse"),
    }
    for name, (wanted_annotations, _) in cases.items():
        create_svc(core, ns, lb_service(name, annotations=wanted_annotations))
    for name, (_, reason) in cases.items():
        found = wait_until(
            functools.partial(events, core, ns, name, "IPRequestInvalid"), 30, f"{name}'s Warning"
        )
        assert reason in found[0]["message"], found[0]["message"]
        assert found[0]["type"] == "Warning"
        assert ips_of(core, ns, name) == []
    assert ips_of(core, ns, "good") == good


def test_an_invalid_pool_reload_is_refused_and_a_valid_one_applies(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "reload")
    create_svc(core, ns, lb_service("keeper"))
    kept = wait_until(lambda: ips_of(core, ns, "keeper"), 30, "keeper's address")
    create_svc(core, ns, lb_service("late", annotations={"nodelb.io/ip-pool": "new"}))
    wait_until(lambda: events(core, ns, "late", "IPRequestInvalid"), 30, "UnknownPool Warning")
    leader = controllers.leader()
    assert leader is not None
    overlapping = {"pools": [*POOLS, {"name": "new", "addresses": ["198.19.0.128/25"]}]}
    controllers.write_config(overlapping)
    refused = 'nodelb_config_reloads_total{result="error"} 1.0'
    wait_until(lambda: refused in scrape(controllers, leader), 30, "the overlapping pool refused")
    # Reported once, not at every reload (2 s): after a few more periods it still reads 1.
    observe(5.0, "an observation window of two reload periods")
    assert refused in scrape(controllers, leader)
    assert ips_of(core, ns, "late") == []
    assert ips_of(core, ns, "keeper") == kept
    controllers.write_config({"pools": [*POOLS, {"name": "new", "addresses": ["198.19.9.0/28"]}]})
    wait_until(lambda: ips_of(core, ns, "late"), 30, "late's address from the new pool")
    assert ipaddress.ip_address(ips_of(core, ns, "late")[0]) in ipaddress.ip_network(
        "198.19.9.0/28"
    )
    controllers.write_config(CONFIG)


def test_a_status_write_from_a_stale_view_is_refused(core: client.CoreV1Api) -> None:
    """The guard the controller relies on: a merge patch carrying an old resourceVersion."""
    ns = make_ns(core, "stale")
    created = create_svc(core, ns, lb_service("x"))
    old_rv = created.metadata.resource_version
    core.patch_namespaced_service("x", ns, {"metadata": {"labels": {"touched": "1"}}})
    patch = {
        "metadata": {"resourceVersion": old_rv},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.19.3.250", "ipMode": "VIP"}]}},
    }
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_service_status(
            "x", ns, patch, _content_type="application/merge-patch+json"
        )
    assert err.value.status == 409


# -- the load-balancer cleanup finalizer ------------------------------------------------------


def read_raw(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any] | None:
    """Return the Service as stored (raw JSON), None once it is gone."""
    try:
        raw: Any = core.read_namespaced_service(name, ns, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    obj: dict[str, Any] = orjson.loads(raw.data)
    return obj


def finalized(obj: dict[str, Any]) -> bool:
    return FINALIZER in (obj["metadata"].get("finalizers") or [])


def ingress(obj: dict[str, Any]) -> list[str]:
    entries = ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [e["ip"] for e in entries if e.get("ip")]


def history(core: client.CoreV1Api, ns: str, name: str, since: str) -> list[tuple[str, Any]]:
    """Return every (event type, raw object) of Service `name` since resourceVersion `since`,
    up to its deletion (a watch from the past replays what the apiserver stored)."""
    seen: list[tuple[str, Any]] = []
    stream = watch.Watch()  # type: ignore[no-untyped-call]
    for ev in stream.stream(  # type: ignore[no-untyped-call]
        core.list_namespaced_service,
        ns,
        field_selector=f"metadata.name={name}",
        resource_version=since,
        timeout_seconds=30,
    ):
        seen.append((ev["type"], ev["raw_object"]))
        if ev["type"] == "DELETED":
            stream.stop()  # type: ignore[no-untyped-call]
    return seen


def served(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any] | None:
    """Return the Service once it carries the cleanup finalizer and an address, else None."""
    obj = read_raw(core, ns, name)
    return obj if obj is not None and finalized(obj) and ingress(obj) else None


def test_the_cleanup_finalizer_holds_a_deleted_service_until_its_address_is_free(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "finalizer")
    created = create_svc(core, ns, lb_service("doomed"))
    since = created.metadata.resource_version
    obj = wait_until(lambda: served(core, ns, "doomed"), 30, "doomed's finalizer and address")
    assert obj is not None  # wait_until returns only a truthy value
    freed = ingress(obj)
    core.delete_namespaced_service("doomed", ns)
    # Gone, so the controller removed its finalizer (nothing else would).
    wait_until(lambda: read_raw(core, ns, "doomed") is None, 30, "doomed deleted")
    seen = history(core, ns, "doomed", since)
    assert seen[-1][0] == "DELETED"  # (its object is the last one stored, finalizer and all)
    # The finalizer came before the address, and went only after the status was cleared.
    assert [o for _, o in seen if ingress(o) and not finalized(o)] == []
    dying = [o for _, o in seen if o["metadata"].get("deletionTimestamp")]
    cleared = [o for o in dying if finalized(o) and not ingress(o)]
    assert cleared, [(o["metadata"].get("finalizers"), ingress(o)) for o in dying]
    assert not (cleared[0].get("status") or {}).get("conditions")  # none of nodelb's left
    wait_until(lambda: events(core, ns, "doomed", "IPReleased"), 30, "doomed's IPReleased")
    # Released, not merely unlisted: a Service asking for exactly that address gets it.
    wanted = {"nodelb.io/load-balancer-ips": freed[0]}
    create_svc(core, ns, lb_service("reuser", annotations=wanted))
    assert wait_until(lambda: ips_of(core, ns, "reuser"), 30, "reuser's address") == freed


def test_a_service_changed_to_cluster_ip_loses_its_status_and_then_the_finalizer(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "retyped")
    create_svc(core, ns, lb_service("changer"))
    wait_until(lambda: served(core, ns, "changer"), 30, "changer's finalizer and address")
    core.patch_namespaced_service(
        "changer",
        ns,
        {"spec": {"type": "ClusterIP"}},
        _content_type="application/merge-patch+json",
    )

    def let_go() -> dict[str, Any] | None:
        obj = read_raw(core, ns, "changer")
        if obj is None:
            raise GiveUp("changer was deleted: only its type changed")
        return None if finalized(obj) else obj

    after = wait_until(let_go, 30, "changer's finalizer removed")
    assert after is not None and after["spec"]["type"] == "ClusterIP"
    status = after.get("status") or {}
    assert not (status.get("loadBalancer") or {}).get("ingress")
    assert not status.get("conditions")


# -- wrongly typed configuration (issue 19, item 2); keep these last: they count refusals ----


def http_get(cs: ControllerSet, name: str, path: str) -> tuple[int, str]:
    """Return (status, body) of GET `path` on replica `name` (inside the control-plane ns)."""
    assert cs.lab.controlplane is not None
    url = cs.metrics_url(name).removesuffix("/metrics") + path
    # The probe paths need no token, but TLS all the same: verified against the published cert.
    return readers.get(cs.lab.controlplane.ns, url, cert=cs.cert(name), token=None)


def refusals(cs: ControllerSet, name: str) -> float:
    for line in scrape(cs, name).splitlines():
        if line.startswith('nodelb_config_reloads_total{result="error"}'):
            return float(line.split()[-1])
    return 0.0


def config_events(core: client.CoreV1Api, reason: str) -> list[dict[str, Any]]:
    """Return the Events of `reason` on the controllers' ConfigMap."""
    return events(core, NAMESPACE, "nodelb-config", reason)


def test_a_wrongly_typed_reload_is_refused_with_an_event_and_allocation_continues(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    ns = make_ns(core, "typed")
    create_svc(core, ns, lb_service("before"))
    before = wait_until(lambda: ips_of(core, ns, "before"), 30, "before's address")
    leader = controllers.leader()
    assert leader is not None
    counted = refusals(controllers, leader)
    # What crashed both replicas (exit status 0, and again on restart) before.
    controllers.write_config({"pools": [{"name": "main", "addresses": 5}, *POOLS[1:]]})
    wait_until(lambda: refusals(controllers, leader) == counted + 1, 30, "the refusal counted")
    wrong = "pools[0] (main).addresses: expected a list"
    found = wait_until(
        lambda: [e for e in config_events(core, "ConfigRefused") if wrong in e["message"]],
        30,
        "a ConfigRefused Event naming the key",
    )
    assert found[0]["type"] == "Warning"
    assert "keeping the previous one" in found[0]["message"]
    # Allocation goes on under the pools in force, and nobody crashed.
    create_svc(core, ns, lb_service("during"))
    during = wait_until(lambda: ips_of(core, ns, "during"), 30, "an address under the old pools")
    assert ipaddress.ip_address(during[0]) in ipaddress.ip_network("198.19.0.0/22")
    observe(5.0, "two more reload periods of the same refused file")
    assert refusals(controllers, leader) == counted + 1  # reported once
    assert "nodelb_config_refused 1.0" in scrape(controllers, leader)
    named = [e for e in config_events(core, "ConfigRefused") if wrong in e["message"]]
    assert {e.get("count", 1) for e in named} == {1}  # one Event per replica, never repeated
    assert len(named) <= len(controllers.procs)
    alive = {n: p.poll() for n, p in controllers.procs.items()}
    assert len(alive) == 2 and set(alive.values()) == {None}, alive  # nobody crashed
    assert all(http_get(controllers, n, "/readyz")[0] == 200 for n in controllers.procs)
    assert ips_of(core, ns, "before") == before
    controllers.write_config(CONFIG)
    wait_until(lambda: len(config_events(core, "ConfigLoaded")) > 0, 30, "ConfigLoaded once fixed")
    wait_until(
        lambda: "nodelb_config_refused 0.0" in scrape(controllers, leader), 30, "gauge cleared"
    )


def test_a_controller_started_with_a_bad_file_stays_up_unready_and_becomes_ready_when_fixed(
    controllers: ControllerSet, tmp_path: Path
) -> None:
    bad = tmp_path / "bad-config.yaml"
    bad.write_text("")  # empty: accepted as "pools unset" before, and nothing ever happened
    proc = controllers.start("ctl-bad", extra=(f"--config={bad}",))
    try:

        def unready_body() -> str | None:
            code, body = http_get(controllers, "ctl-bad", "/readyz")
            return body if code == 503 else None

        body = wait_until(unready_body, 30, "ctl-bad answering /readyz")
        assert body is not None
        assert "configuration refused" in body and "the configuration is empty" in body, body
        assert "configuration refused" in controllers.log("ctl-bad")
        observe(3.0, "a few reload periods on the bad file")
        assert proc.poll() is None, "the controller exited on a bad file"
        assert http_get(controllers, "ctl-bad", "/healthz")[0] == 200
        assert http_get(controllers, "ctl-bad", "/readyz")[0] == 503
        bad.write_text("pools: [{name: main, addresses: 5}]\n")  # still bad, another way
        wait_until(
            lambda: "expected a list" in http_get(controllers, "ctl-bad", "/readyz")[1],
            30,
            "the new reason on /readyz",
        )
        controllers.write_config(CONFIG)
        bad.write_text(controllers.config_path.read_text())
        wait_until(
            lambda: http_get(controllers, "ctl-bad", "/readyz") == (200, "ready\n"),
            30,
            "ctl-bad ready once the file is fixed",
        )
        assert proc.poll() is None
    finally:
        controllers.stop("ctl-bad")


def test_an_ipv6_service_never_gets_the_subnet_router_anycast_address(
    core: client.CoreV1Api, controllers: ControllerSet
) -> None:
    """Issue 19 item 6: the first IPv6 address handed out was 2001:db8:0:10:: (a /64's)."""
    anycast = {
        "name": "anycast",
        # A /64 whose anycast is its first address, and a /126 mid-/64 (it may be a link).
        "addresses": ["2001:db8:300::/64", "2001:db8:301::100/126"],
        "autoAssign": False,
    }
    controllers.write_config({"pools": [*POOLS, anycast]})
    ns = make_ns(core, "anycast")
    v6 = ["IPv6"]
    try:
        wide = {"nodelb.io/ip-pool": "anycast"}
        create_svc(core, ns, lb_service("first", families=v6, annotations=wide))
        # Named before the reload sees the pool, it gets UnknownPool first, then an address.
        got = wait_until(lambda: ips_of(core, ns, "first"), 30, "first's address")
        assert got == ["2001:db8:300::1"], got  # not 2001:db8:300::
        asked = {"nodelb.io/load-balancer-ips": "2001:db8:301::100"}
        create_svc(core, ns, lb_service("asks", families=v6, annotations=asked))
        found = wait_until(
            lambda: events(core, ns, "asks", "IPRequestInvalid"), 30, "the request refused"
        )
        assert "2001:db8:301::100" in found[0]["message"]
        narrow = {"nodelb.io/load-balancer-ips": "2001:db8:301::101"}
        create_svc(core, ns, lb_service("beside", families=v6, annotations=narrow))
        assert wait_until(lambda: ips_of(core, ns, "beside"), 30, "beside's address") == [
            "2001:db8:301::101"
        ]
        assert ips_of(core, ns, "asks") == []
    finally:
        controllers.write_config(CONFIG)
