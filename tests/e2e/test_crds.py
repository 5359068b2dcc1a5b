"""nodelb's CustomResourceDefinitions against a real kube-apiserver (deploy/helm/nodelb/crds/).

Each CRD is created for real and must become Established (the apiserver compiles every CEL
rule and estimates its cost at that point: a rule too expensive or ill-typed is refused
there). Then good objects are accepted and every bad one is refused with a message that
names the field, the promise docs/configuration.md makes: `kubectl apply` of a pool with a
host-bits CIDR or a reversed range fails at once instead of reaching the controller.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.controller.api import KubeControllerAPI
from agent.controller.leader import ElectionTiming
from agent.controller.loop import Controller, ControllerSettings
from agent.kube.events import ListSink
from lab import binaries, netns
from lab.controlplane import ControlPlane
from lab.wait import wait_until

pytestmark = pytest.mark.e2e

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nodelb" / "crds"
GROUP, VERSION = "nodelb.io", "v1alpha1"
POOLS, POLICIES = "loadbalancerippools", "announcementpolicies"
REQUEST_TIMEOUT = 10.0


def crd_documents() -> list[dict[str, Any]]:
    """Return every CRD document of the chart's crds/ folder."""
    return [
        d for path in sorted(CRDS.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d
    ]


@pytest.fixture(scope="module")
def api(controlplane: ControlPlane) -> Iterator[client.CustomObjectsApi]:
    """Create the CRDs for real, wait until each is Established, and return the objects API."""
    admin = controlplane.api_client()
    ext = client.ApiextensionsV1Api(admin)
    for doc in crd_documents():
        ext.create_custom_resource_definition(doc, _request_timeout=REQUEST_TIMEOUT)  # type: ignore[arg-type]

    def established() -> bool:
        for doc in crd_documents():
            crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            assert crd.status is not None
            conds = {c.type: c for c in (crd.status.conditions or [])}
            bad = conds.get("NonStructuralSchema") or conds.get("NamesAccepted")
            assert bad is None or bad.type != "NonStructuralSchema", bad.message
            if "Established" not in conds or conds["Established"].status != "True":
                return False
        return True

    wait_until(established, 30.0, "the nodelb CRDs to become Established")
    yield client.CustomObjectsApi(admin)


def pool(name: str, **spec: Any) -> dict[str, Any]:
    """Return a LoadBalancerIPPool object."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LoadBalancerIPPool",
        "metadata": {"name": name},
        "spec": spec,
    }


def policy(name: str, **spec: Any) -> dict[str, Any]:
    """Return an AnnouncementPolicy object."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AnnouncementPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(api: client.CustomObjectsApi, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """Create `obj` (a pool or a policy) and return what the server stored."""
    plural = POOLS if obj["kind"] == "LoadBalancerIPPool" else POLICIES
    stored = api.create_cluster_custom_object(
        GROUP, VERSION, plural, obj, _request_timeout=REQUEST_TIMEOUT, **kw
    )
    assert isinstance(stored, dict)
    return stored


def refusal(api: client.CustomObjectsApi, obj: dict[str, Any]) -> str:
    """Return the message of the 422 the server answers `obj` with; fail if it is accepted."""
    try:
        create(api, obj, dry_run="All")
    except ApiException as exc:
        assert exc.status == 422, exc.body
        return str(json.loads(exc.body or "{}")["message"])
    raise AssertionError(f"{obj['kind']} {obj['spec']} was accepted")


GOOD_POOLS = [
    pytest.param(pool("v4-cidr", addresses=["198.18.100.0/24"]), id="an IPv4 CIDR"),
    pytest.param(
        pool("dual", addresses=["198.18.101.10-198.18.101.20", "2001:db8:101::/120"]),
        id="an IPv4 range and an IPv6 CIDR",
    ),
    pytest.param(
        pool("v6-range", addresses=["2001:db8:102::10 - 2001:db8:102::20"]),
        id="an IPv6 range with spaces around the dash",
    ),
    pytest.param(
        pool("one", addresses=["198.18.103.7-198.18.103.7", "198.18.104.1/32"]),
        id="a one-address range and a /32",
    ),
    pytest.param(
        pool(
            "restricted",
            addresses=["198.18.105.0/28"],
            autoAssign=False,
            avoidBuggyIPs=True,
            allowSubnetRouterAnycast=True,
            namespaces=["shop", "kube-system"],
            namespaceSelector={"matchLabels": {"team": "a"}},
            serviceSelector={
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["web"]},
                    {"key": "legacy", "operator": "DoesNotExist"},
                ]
            },
        ),
        id="every field the config file's pools can hold",
    ),
]


@pytest.mark.parametrize("obj", GOOD_POOLS)
def test_a_good_pool_is_accepted_with_its_defaults(
    obj: dict[str, Any], api: client.CustomObjectsApi
) -> None:
    stored = create(api, copy.deepcopy(obj), dry_run="All")
    assert stored["spec"]["addresses"] == obj["spec"]["addresses"]
    assert stored["spec"]["autoAssign"] is obj["spec"].get("autoAssign", True)
    assert stored["spec"]["avoidBuggyIPs"] is obj["spec"].get("avoidBuggyIPs", False)


@dataclass(frozen=True, slots=True)
class Bad:
    """A refused object and what the refusal must say (the field, then the reason)."""

    obj: dict[str, Any]
    field: str
    says: str


BAD = [
    pytest.param(
        Bad(pool("p", addresses=["198.18.0.1/24"]), "spec.addresses[0]", "no host bits"),
        id="a CIDR with host bits set",
    ),
    pytest.param(
        Bad(pool("p", addresses=["198.18.0.0/24", "198.18.300.0/24"]), "spec.addresses[1]", "CIDR"),
        id="an IPv4 octet over 255 names the second entry",
    ),
    pytest.param(
        Bad(pool("p", addresses=["pool-a"]), "spec.addresses[0]", "range of one IP family"),
        id="a word with a dash is not a range",
    ),
    pytest.param(
        Bad(pool("p", addresses=["198.18.0.1-2001:db8::1"]), "spec.addresses[0]", "one IP family"),
        id="a range across families",
    ),
    pytest.param(
        Bad(
            pool("p", addresses=["198.18.0.20-198.18.0.10"]), "spec.addresses[0]", "must not exceed"
        ),
        id="a reversed IPv4 range",
    ),
    pytest.param(
        Bad(
            pool("p", addresses=["198.18.0.1-198.18.0.5-198.18.0.9"]), "spec.addresses[0]", "range"
        ),
        id="a range with three ends",
    ),
    pytest.param(
        Bad(pool("p", addresses=["198.018.0.0/24"]), "spec.addresses[0]", "CIDR"),
        id="a leading zero (octal to some parsers)",
    ),
    pytest.param(Bad(pool("p", addresses=[]), "spec.addresses", "at least 1"), id="no addresses"),
    pytest.param(Bad(pool("p"), "spec.addresses", "Required"), id="addresses missing"),
    pytest.param(
        Bad(
            pool("p", addresses=["198.18.0.0/24", "198.18.0.0/24"]),
            "spec.addresses[1]",
            "Duplicate",
        ),
        id="the same block twice",
    ),
    pytest.param(
        Bad(pool("p", addresses=["198.18.0.0/24"], autoAssign="yes"), "spec.autoAssign", "boolean"),
        id="autoAssign as a string",
    ),
    pytest.param(
        Bad(
            pool("p", addresses=["198.18.0.0/24"], namespaces=["Shop"]),
            "spec.namespaces[0]",
            "match",
        ),
        id="a namespace name that is not a DNS label",
    ),
    pytest.param(
        Bad(
            pool(
                "p",
                addresses=["198.18.0.0/24"],
                serviceSelector={"matchExpressions": [{"key": "a", "operator": "In"}]},
            ),
            "spec.serviceSelector.matchExpressions[0].values",
            "In and NotIn need values",
        ),
        id="In without values",
    ),
    pytest.param(
        Bad(
            pool(
                "p",
                addresses=["198.18.0.0/24"],
                namespaceSelector={
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                },
            ),
            "spec.namespaceSelector.matchExpressions[0].values",
            "take none",
        ),
        id="Exists with values",
    ),
    pytest.param(
        Bad(
            pool(
                "p",
                addresses=["198.18.0.0/24"],
                serviceSelector={"matchExpressions": [{"key": "a", "operator": "Gt"}]},
            ),
            "spec.serviceSelector.matchExpressions[0].operator",
            "Unsupported value",
        ),
        id="an operator Kubernetes selectors do not have",
    ),
    pytest.param(
        Bad(
            pool("p", addresses=["198.18.0.0/24"], serviceSelector={"matchLabels": {"a": 1}}),
            "spec.serviceSelector.matchLabels.a",
            "string",
        ),
        id="a label value that is a number",
    ),
    pytest.param(
        Bad(policy("a", interface="eth0/1"), "spec.interface", "interface name"),
        id="an interface name with a slash",
    ),
    pytest.param(
        Bad(policy("a", interface="a-very-long-interface"), "spec.interface", "15"),
        id="an interface name over 15 bytes",
    ),
    pytest.param(
        Bad(policy("a", advertIntervalCs=0), "spec.advertIntervalCs", "greater than or equal to 1"),
        id="an advert interval of zero",
    ),
    pytest.param(
        Bad(
            policy("a", advertIntervalCs=5000),
            "spec.advertIntervalCs",
            "less than or equal to 4095",
        ),
        id="an advert interval over VRRPv3's 12 bits",
    ),
    pytest.param(
        Bad(
            policy("a", gratuitous={"count": 0}),
            "spec.gratuitous.count",
            "greater than or equal to 1",
        ),
        id="a gratuitous burst of nothing",
    ),
    pytest.param(
        Bad(policy("a", gratuitous={"refreshSeconds": -1}), "spec.gratuitous.refreshSeconds", "0"),
        id="a negative refresh",
    ),
    pytest.param(
        Bad(policy("a", pools=["Pool_A"]), "spec.pools[0]", "match"),
        id="a pool name that cannot be an object name",
    ),
    pytest.param(
        Bad(
            policy("a", nodeSelector={"matchExpressions": [{"key": "a", "operator": "NotIn"}]}),
            "spec.nodeSelector.matchExpressions[0].values",
            "need values",
        ),
        id="a node selector NotIn without values",
    ),
]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_object_is_refused_naming_the_field(bad: Bad, api: client.CustomObjectsApi) -> None:
    message = refusal(api, bad.obj)
    assert f"{bad.field}:" in message, message
    assert bad.says in message, message


def test_a_good_policy_is_accepted(api: client.CustomObjectsApi) -> None:
    obj = policy(
        "edge",
        pools=["dual", "v4-cidr"],
        nodeSelector={"matchLabels": {"nodelb.io/edge": "true"}},
        interface="eth1.100",
        advertIntervalCs=50,
        gratuitous={"count": 10, "spacingMs": 100, "refreshSeconds": 30.5},
    )
    stored = create(api, obj)
    assert stored["spec"]["gratuitous"]["refreshSeconds"] == 30.5


def test_the_controller_alone_writes_status_through_the_subresource(
    api: client.CustomObjectsApi,
) -> None:
    """A spec update leaves status alone and a status update leaves spec alone (the status
    subresource), so agents reading a pool never see the controller's writes as a change."""
    stored = create(api, pool("usage", addresses=["198.18.110.0/30"]))
    stored["status"] = {
        "observedGeneration": 1,
        "ipv4": {"total": 4, "assigned": 1, "available": 3},
        "conditions": [
            {
                "type": "Valid",
                "status": "True",
                "reason": "Valid",
                "message": "",
                "lastTransitionTime": "2026-12-05T00:00:00Z",
            }
        ],
    }
    stored["spec"]["autoAssign"] = False
    after = api.replace_cluster_custom_object_status(GROUP, VERSION, POOLS, "usage", stored)
    assert isinstance(after, dict)
    assert after["status"]["ipv4"] == {"total": 4, "assigned": 1, "available": 3}
    assert after["spec"]["autoAssign"] is True  # the status write did not touch spec
    assert after["metadata"]["generation"] == 1


# -- the controller with pool objects, against the real apiserver -----------------------------


@pytest.fixture(scope="module")
def controller(
    api: client.CustomObjectsApi,
    controlplane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Controller]:
    """Run a controller whose config file has no pools: (so it watches pool objects) in a
    thread, as the admin; stopped at the end of the module."""
    admin = controlplane.api_client()
    client.CoreV1Api(admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=CONTROLLER_NS))
    )
    config = tmp_path_factory.mktemp("crd-controller") / "config.yaml"
    config.write_text("serviceCIDRs: [198.18.128.0/20]\n")
    settings = ControllerSettings(
        namespace=CONTROLLER_NS,
        identity="crd-test",
        config_path=config,
        election=ElectionTiming(lease_duration=15, renew_deadline=10.0, retry_period=1.0),
        reload_period=1.0,
    )
    ctl = Controller(KubeControllerAPI(controlplane.api_client()), settings, events=EVENTS)
    stop = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(ctl.ready.is_set, 30.0, "the controller to become ready")
        yield ctl
    finally:
        stop.set()
        thread.join(timeout=20)


CONTROLLER_NS = "nodelb-crd-test"
EVENTS = ListSink()


def read_pool(api: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    got = api.get_cluster_custom_object(GROUP, VERSION, POOLS, name)
    assert isinstance(got, dict)
    return got


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def test_the_controller_allocates_from_a_pool_object_and_keeps_its_status(
    api: client.CustomObjectsApi, controller: Controller, controlplane: ControlPlane
) -> None:
    create(api, pool("served", addresses=["198.18.120.0/30"]))
    wait_until(
        lambda: condition(read_pool(api, "served"), "Valid").get("status") == "True",
        30.0,
        "pool served to be Valid",
    )
    # Created in the same second, the two would tie on age and the name would decide; once
    # served is in force, a newcomer overlapping it is the one refused, whatever its name.
    create(api, pool("overlapping", addresses=["198.18.120.2-198.18.120.9"]))
    core = client.CoreV1Api(controlplane.api_client())
    core.create_namespaced_service(
        "default",
        client.V1Service(
            # another test's pool exists too: this Service asks for this one by name
            metadata=client.V1ObjectMeta(
                name="crd-web", annotations={"nodelb.io/ip-pool": "served"}
            ),
            spec=client.V1ServiceSpec(
                type="LoadBalancer", ports=[client.V1ServicePort(port=80, protocol="TCP")]
            ),
        ),
    )

    def ingress() -> list[str]:
        svc: Any = core.read_namespaced_service("crd-web", "default")
        lb = svc.status.load_balancer if svc.status else None
        return [i.ip for i in (lb.ingress if lb else None) or [] if i.ip]

    assert wait_until(ingress, 30.0, "an ingress IP from the pool object") == ["198.18.120.0"]

    def used() -> dict[str, Any]:
        obj = read_pool(api, "served")
        usage = (obj.get("status") or {}).get("ipv4") or {}
        return obj if usage.get("assigned") == 1 else {}

    served = wait_until(used, 30.0, "pool served to show one address assigned")
    assert served["status"]["ipv4"] == {"total": 4, "assigned": 1, "available": 3}
    assert condition(served, "Valid")["status"] == "True"
    assert condition(served, "Exhausted")["status"] == "False"
    refused = wait_until(
        lambda: condition(read_pool(api, "overlapping"), "Valid"),
        30.0,
        "pool overlapping to get its Valid condition",
    )
    assert refused["status"] == "False" and refused["reason"] == "OverlapsPool"
    assert "LoadBalancerIPPool served" in refused["message"]
    # kubectl shows the usage at a glance (the printer columns)
    shown = netns.run(
        controlplane.ns,
        [
            str(binaries.binary("kubectl")),
            f"--kubeconfig={controlplane.admin_kubeconfig()}",
            "get",
            "lbpool",
        ],
        check=True,
        timeout=60,
    ).stdout.splitlines()
    rows = table(shown)
    assert list(rows["served"]) == [
        *("NAME", "VALID", "EXHAUSTED", "IPV4 ASSIGNED", "IPV4 AVAILABLE"),
        *("IPV6 ASSIGNED", "IPV6 AVAILABLE", "AGE"),
    ], shown
    assert rows["served"]["VALID"] == "True" and rows["served"]["EXHAUSTED"] == "False"
    assert (rows["served"]["IPV4 ASSIGNED"], rows["served"]["IPV4 AVAILABLE"]) == ("1", "3")
    assert rows["served"]["IPV6 AVAILABLE"] == ""  # the pool has no IPv6 block
    assert (rows["overlapping"]["VALID"], rows["overlapping"]["EXHAUSTED"]) == (
        "False",
        "Unknown",
    )


def table(lines: list[str]) -> dict[str, dict[str, str]]:
    """Return kubectl's table by NAME, each row by column header (cut at the headers' starts)."""
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    rows = {}
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows
