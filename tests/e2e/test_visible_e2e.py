"""Every problem visible, against a real kube-apiserver: the Services that used to read
LoadBalancerServing True with no Event (FQDN-only slices, slices without ports, an IPv4
Service whose only source range is IPv6, a dual-stack Service with endpoints of one family)
now get a Warning Event and a condition that tells the truth; and an Event flood costs a
bounded number of Event objects and writes, with every occurrence counted.

A `nodelb controller` runs in the control-plane namespace; a node report Lease in the test
says a node holds every address with its rules in place, so the only thing between each
Service and Serving=True is what its addresses can serve. A control Service with a usable
slice turns True under the same report, so a False is never the report's doing.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from agent.kube.event_sender import KubeEventSink
from agent.kube.events import Event, ObjectRef
from agent.kube.node_report import lease_name, report_body
from lab.controllers import NAMESPACE, ControllerSet, ensure_node
from lab.controlplane import ControlPlane
from lab.topology import Lab
from lab.wait import wait_until

pytestmark = pytest.mark.e2e

NODE = "node-visible"
CONFIG: dict[str, Any] = {
    "pools": [
        {"name": "v4", "addresses": ["198.19.40.0/24"]},
        {"name": "v6", "addresses": ["2001:db8:400::/120"]},
    ],
    # The test's one report stands for an agent and lasts the module: the controller caps a
    # report's life at what the agents are configured to report for.
    "announce": {"reportLeaseSeconds": 600},
}
DEADLINE = 30


@pytest.fixture(scope="module")
def api(controlplane: ControlPlane) -> client.ApiClient:
    return controlplane.api_client()


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def controller(
    cp_lab: Lab, controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerSet]:
    cs = ControllerSet(cp_lab, controlplane, Path(tmp_path_factory.mktemp("visible")))
    cs.ensure_namespace()
    cs.write_config(CONFIG)
    try:
        cs.start("ctl-v")
        wait_until(cs.leader, DEADLINE, "the controller to take the Lease")
        yield cs
    finally:
        cs.stop_all()


class Report:
    """One node report Lease naming every address the test adds (valid for 10 minutes)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._coord = client.CoordinationV1Api(api)
        self.ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
        ensure_node(client.CoreV1Api(api), NODE)  # reports count only for Nodes

    def hold(self, *ips: str) -> None:
        self.ips.extend(ipaddress.ip_address(ip) for ip in ips)
        body = report_body(
            node=NODE,
            namespace=NAMESPACE,
            ips=self.ips,
            now=datetime.datetime.now(datetime.UTC),
            duration=600,
        )
        try:
            old: Any = self._coord.read_namespaced_lease(lease_name(NODE), NAMESPACE)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
            self._coord.create_namespaced_lease(NAMESPACE, cast(Any, body))
            return
        body["metadata"]["resourceVersion"] = old.metadata.resource_version
        self._coord.replace_namespaced_lease(lease_name(NODE), NAMESPACE, cast(Any, body))

    def close(self) -> None:
        with contextlib.suppress(client.exceptions.ApiException):
            self._coord.delete_namespaced_lease(lease_name(NODE), NAMESPACE)


@pytest.fixture(scope="module")
def report(api: client.ApiClient, controller: ControllerSet) -> Iterator[Report]:
    r = Report(api)
    try:
        yield r
    finally:
        r.close()


def service(
    name: str,
    *,
    ports: list[dict[str, Any]] | None = None,
    families: list[str] | None = None,
    ranges: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "ports": ports or [{"name": "http", "port": 80, "protocol": "TCP"}],
    }
    if families:
        spec["ipFamilies"] = families
        spec["ipFamilyPolicy"] = "PreferDualStack" if len(families) > 1 else "SingleStack"
    if ranges:
        spec["loadBalancerSourceRanges"] = ranges
    return {"metadata": {"name": name}, "spec": spec}  # no selector: the test writes slices


def endpoint_slice(
    service_name: str,
    suffix: str,
    address_type: str,
    addresses: list[str],
    *,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{service_name}-{suffix}",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": address_type,
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}] if ports is None else ports,
    }


def status_of(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    raw: Any = core.read_namespaced_service(name, ns, _preload_content=False)
    return cast(dict[str, Any], orjson.loads(raw.data).get("status") or {})


def ips_of(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    ingress = (status_of(core, ns, name).get("loadBalancer") or {}).get("ingress") or []
    return [e["ip"] for e in ingress if e.get("ip")]


def condition(core: client.CoreV1Api, ns: str, name: str, kind: str) -> dict[str, Any]:
    for cond in status_of(core, ns, name).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def reads(core: client.CoreV1Api, ns: str, name: str, kind: str, want: str) -> bool:
    c = condition(core, ns, name, kind)
    return f"{c.get('status')}/{c.get('reason')}" == want


def warnings(core: client.CoreV1Api, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    raw: Any = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    items = orjson.loads(raw.data).get("items") or []
    return [e for e in items if e.get("reason") == reason and e.get("type") == "Warning"]


@pytest.fixture(scope="module")
def ns(core: client.CoreV1Api, controller: ControllerSet) -> str:
    core.create_namespace(cast(Any, {"metadata": {"name": "visible"}}))
    return "visible"


@dataclass(frozen=True)
class World:
    """The API clients, the node report and the test namespace."""

    core: client.CoreV1Api
    api: client.ApiClient
    report: Report
    ns: str

    def make(
        self, body: dict[str, Any], slices: list[dict[str, Any]], *, addresses: int = 1
    ) -> list[str]:
        """Create the Service and its slices; return its addresses, once a node reports them."""
        self.core.create_namespaced_service(self.ns, cast(Any, body))
        discovery = client.DiscoveryV1Api(self.api)
        for s in slices:
            discovery.create_namespaced_endpoint_slice(self.ns, cast(Any, s))
        name = body["metadata"]["name"]

        def allocated() -> list[str]:
            got = ips_of(self.core, self.ns, name)
            return got if len(got) == addresses else []

        ips = wait_until(allocated, DEADLINE, f"{name}'s addresses")
        self.report.hold(*ips)
        return ips

    def reads(self, name: str, kind: str, want: str) -> bool:
        return reads(self.core, self.ns, name, kind, want)

    def warnings(self, name: str, reason: str) -> list[dict[str, Any]]:
        return warnings(self.core, self.ns, name, reason)


@pytest.fixture(scope="module")
def world(core: client.CoreV1Api, api: client.ApiClient, report: Report, ns: str) -> World:
    return World(core, api, report, ns)


@dataclass(frozen=True)
class Silent:
    """A Service that can serve nothing, its slices, and the Warning it must get."""

    body: dict[str, Any]
    slices: list[dict[str, Any]]
    reason: str

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Silent(
                service("fqdn"),
                [endpoint_slice("fqdn", "a", "FQDN", ["db.example.org"])],
                "FQDNEndpointsNotSupported",
            ),
            id="a Service whose EndpointSlices are all FQDN",
        ),
        pytest.param(
            Silent(
                service("portless"),
                [endpoint_slice("portless", "a", "IPv4", ["198.18.50.1"], ports=[])],
                "EndpointSlicePortsMissing",
            ),
            id="a Service whose slices list endpoints but no ports",
        ),
        pytest.param(
            Silent(
                service("ranges", ranges=["2001:db8:999::/48"]),
                [endpoint_slice("ranges", "a", "IPv4", ["198.18.50.2"])],
                "SourceRangesExcludeFamily",
            ),
            id="an IPv4 Service whose only source range is IPv6",
        ),
        pytest.param(
            Silent(
                service("misnamed"),
                [
                    endpoint_slice(
                        "misnamed",
                        "a",
                        "IPv4",
                        ["198.18.50.3"],
                        ports=[{"name": "web", "port": 8080, "protocol": "TCP"}],
                    )
                ],
                "PortWithoutEndpoints",
            ),
            id="a Service whose only port no slice serves",
        ),
    ],
)
def test_a_service_that_can_serve_nothing_says_so(world: World, case: Silent) -> None:
    name = case.name
    world.make(case.body, case.slices)
    # The control: same report, a usable slice, Serving=True.
    control = f"{name}-ok"
    world.make(service(control), [endpoint_slice(control, "a", "IPv4", ["198.18.51.1"])])
    wait_until(
        lambda: world.reads(control, "LoadBalancerServing", "True/Serving"),
        DEADLINE,
        f"{control} Serving=True under the same report",
    )
    wait_until(
        lambda: world.reads(name, "LoadBalancerServing", "False/Unsupported"),
        DEADLINE,
        f"{name} Serving=False/Unsupported",
    )
    found = wait_until(
        functools.partial(world.warnings, name, case.reason), DEADLINE, f"{name}'s {case.reason}"
    )
    assert found[0]["source"]["component"] == "nodelb-controller"
    message = condition(world.core, world.ns, name, "LoadBalancerServing")["message"]
    assert "can serve nothing" in message, message
    assert world.reads(name, "LoadBalancerDegraded", "False/NotDegraded")
    assert ips_of(world.core, world.ns, name), "the address stays: a fix needs no new one"


def test_fixing_the_slices_turns_serving_true(world: World) -> None:
    world.make(service("later"), [endpoint_slice("later", "a", "FQDN", ["x.example.org"])])
    wait_until(
        lambda: world.reads("later", "LoadBalancerServing", "False/Unsupported"),
        DEADLINE,
        "later Serving=False/Unsupported while FQDN only",
    )
    client.DiscoveryV1Api(world.api).create_namespaced_endpoint_slice(
        world.ns, cast(Any, endpoint_slice("later", "b", "IPv4", ["198.18.52.1"]))
    )
    wait_until(
        lambda: world.reads("later", "LoadBalancerServing", "True/Serving"),
        DEADLINE,
        "later Serving=True once an IPv4 slice serves it",
    )


def test_a_dual_stack_service_with_endpoints_of_one_family_is_degraded(world: World) -> None:
    world.make(
        service("dual", families=["IPv4", "IPv6"]),
        [endpoint_slice("dual", "a", "IPv4", ["198.18.53.1"])],
        addresses=2,
    )
    wait_until(
        lambda: world.reads("dual", "LoadBalancerDegraded", "True/IPFamiliesNotSupported"),
        DEADLINE,
        "dual Degraded=True/IPFamiliesNotSupported",
    )
    # The report naming both addresses may reach the controller after its Degraded write.
    wait_until(
        lambda: world.reads("dual", "LoadBalancerServing", "True/Serving"),
        DEADLINE,
        "dual Serving=True (its IPv4 address serves)",
    )
    found = wait_until(
        functools.partial(world.warnings, "dual", "NoEndpointsOfFamily"),
        DEADLINE,
        "dual's NoEndpointsOfFamily",
    )
    assert "IPv6" in found[0]["message"]


def test_a_dual_stack_service_whose_family_has_no_pool_gets_a_warning(world: World) -> None:
    body = service("half", families=["IPv4", "IPv6"])
    body["metadata"]["annotations"] = {"nodelb.io/ip-pool": "v4"}  # a pool of one family
    world.make(body, [endpoint_slice("half", "a", "IPv4", ["198.18.54.1"])])
    wait_until(
        lambda: world.reads("half", "LoadBalancerDegraded", "True/IPFamiliesNotSupported"),
        DEADLINE,
        "half Degraded=True/IPFamiliesNotSupported",
    )
    found = wait_until(
        functools.partial(world.warnings, "half", "IPFamilyNotAllocated"),
        DEADLINE,
        "half's IPFamilyNotAllocated",
    )
    assert "IPv6" in found[0]["message"]


# -- an Event flood ------------------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def event_objects(core: client.CoreV1Api, ns: str) -> list[dict[str, Any]]:
    raw: Any = core.list_namespaced_event(ns, _preload_content=False)
    return [
        e
        for e in orjson.loads(raw.data).get("items") or []
        if (e.get("source") or {}).get("component") == "flood-test"
    ]


def test_an_event_flood_costs_few_objects_and_writes_and_every_occurrence_is_counted(
    core: client.CoreV1Api, controlplane: ControlPlane
) -> None:
    core.create_namespace(cast(Any, {"metadata": {"name": "flood"}}))
    sink = KubeEventSink(core, component="flood-test", host="node-1", max_pending=40)
    refs = [ObjectRef("Service", "flood", f"svc-{i}", f"uid-{i}") for i in range(50)]
    recorded0 = sample("nodelb_events_recorded_total")
    dropped0 = {
        r: sample("nodelb_events_dropped_total", reason=r)
        for r in ("queue_full", "api_error", "shutdown")
    }
    writes0 = sample("nodelb_event_writes_total", action="create") + sample(
        "nodelb_event_writes_total", action="patch"
    )

    def hot(n: int) -> None:
        for i in range(n):  # 3 objects x 4 messages, over and over
            sink.record(Event(refs[i % 3], "Warning", "Flood", f"problem {i % 4}"))

    # Before the sender runs: the 12 hot Events wait, folded; of 50 distinct ones, 28 fit
    # beside them in the 40 allowed to wait, and 22 are dropped (and counted).
    hot(15_000)
    for ref in refs:
        sink.record(Event(ref, "Warning", "Once", "a single problem"))
    assert sample("nodelb_events_dropped_total", reason="queue_full") - dropped0["queue_full"] == 22
    sink.run()
    try:
        hot(15_000)  # while the sender writes: repeats become patches, then wait for tokens
        wait_until(lambda: len(event_objects(core, "flood")) == 40, 60, "40 Event objects written")
    finally:
        sink.close()  # the last flush writes what the rate limit still held
    recorded = sample("nodelb_events_recorded_total") - recorded0
    assert recorded == 30_050
    dropped = {r: sample("nodelb_events_dropped_total", reason=r) - dropped0[r] for r in dropped0}
    assert dropped == {"queue_full": 22, "api_error": 0, "shutdown": 0}
    objects = event_objects(core, "flood")
    flood = [e for e in objects if e["reason"] == "Flood"]
    assert len(flood) == 12, [e["message"] for e in flood]  # 3 objects x 4 messages
    assert sum(int(e["count"]) for e in flood) == 30_000, "no repeat was lost"
    assert sum(int(e["count"]) for e in objects) + dropped["queue_full"] == recorded
    writes = (
        sample("nodelb_event_writes_total", action="create")
        + sample("nodelb_event_writes_total", action="patch")
        - writes0
    )
    # A burst of 25 per hot object, a create per other Once, the final flush of the 12.
    assert writes <= 3 * 25 + 25 + 12, writes
    print(f"flood: {recorded:.0f} occurrences, {len(objects)} Event objects, {writes:.0f} writes")
