"""Smoke test of the lab control plane: the API objects nodelb lives on round-trip for real."""

from __future__ import annotations

import time
from collections.abc import Iterator
from ipaddress import IPv4Address
from typing import Any, cast

import orjson
import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lab import binaries
from lab.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

NAMESPACE = "smoke"
REQUEST_TIMEOUT = 10.0
WATCH_DEADLINE = 20.0


@pytest.fixture(scope="module")
def api(controlplane: ControlPlane) -> Iterator[client.ApiClient]:
    """Yield an admin ApiClient with namespace NAMESPACE created."""
    api = controlplane.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    yield api
    core.delete_namespace(NAMESPACE)


def raw(response: object) -> dict[str, Any]:
    """Return the JSON body of a `_preload_content=False` call, parsed as nodelb does (orjson)."""
    body = cast(urllib3.BaseHTTPResponse, response).data
    return cast(dict[str, Any], orjson.loads(body))


def test_version_reports_the_pinned_release(api: client.ApiClient) -> None:
    info = raw(client.VersionApi(api).get_code(_preload_content=False))
    assert info["gitVersion"] == binaries.kube_version()


def test_loadbalancer_service_round_trips(
    api: client.ApiClient, controlplane: ControlPlane
) -> None:
    core = client.CoreV1Api(api)
    body = client.V1Service(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1ServiceSpec(
            type="LoadBalancer",
            load_balancer_class="nodelb.io/lb",
            external_traffic_policy="Local",
            selector={"app": "web"},
            ports=[client.V1ServicePort(name="http", port=80, target_port=8080)],
        ),
    )
    core.create_namespaced_service(NAMESPACE, body, _request_timeout=REQUEST_TIMEOUT)
    svc = raw(
        core.read_namespaced_service(
            "web", NAMESPACE, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
    )
    spec = svc["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["loadBalancerClass"] == "nodelb.io/lb"
    assert spec["externalTrafficPolicy"] == "Local"
    assert spec["healthCheckNodePort"], "Local LoadBalancer Services get a health port"
    assert IPv4Address(spec["clusterIP"]) in controlplane.service_cidr
    (port,) = spec["ports"]
    assert (port["port"], port["targetPort"], port["protocol"]) == (80, 8080, "TCP")
    assert 30000 <= port["nodePort"] <= 32767


def test_endpointslice_keeps_node_and_zone_hints(api: client.ApiClient) -> None:
    discovery = client.DiscoveryV1Api(api)
    body = client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(
            name="web-1",
            labels={
                "kubernetes.io/service-name": "web",
                "endpointslice.kubernetes.io/managed-by": "tests.nodelb.io",
            },
        ),
        address_type="IPv4",
        ports=[client.DiscoveryV1EndpointPort(name="http", port=8080, protocol="TCP")],
        endpoints=[
            client.V1Endpoint(
                addresses=["198.19.1.11"],
                conditions=client.V1EndpointConditions(ready=True, serving=True),
                node_name="node-1",
                zone="zone-a",
                hints=client.V1EndpointHints(
                    for_nodes=[client.V1ForNode(name="node-1")],
                    for_zones=[client.V1ForZone(name="zone-a")],
                ),
            )
        ],
    )
    discovery.create_namespaced_endpoint_slice(NAMESPACE, body, _request_timeout=REQUEST_TIMEOUT)
    resp = discovery.read_namespaced_endpoint_slice(
        "web-1", NAMESPACE, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
    )
    eps = raw(resp)
    assert eps["addressType"] == "IPv4"
    assert eps["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    (endpoint,) = eps["endpoints"]
    assert endpoint["addresses"] == ["198.19.1.11"]
    assert endpoint["nodeName"] == "node-1"
    assert endpoint["zone"] == "zone-a"
    assert endpoint["conditions"]["ready"] is True
    assert endpoint["hints"] == {
        "forNodes": [{"name": "node-1"}],
        "forZones": [{"name": "zone-a"}],
    }


def test_service_watch_sees_an_update(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_service(
        NAMESPACE,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="watched"),
            spec=client.V1ServiceSpec(
                type="LoadBalancer", ports=[client.V1ServicePort(port=443, target_port=8443)]
            ),
        ),
        _request_timeout=REQUEST_TIMEOUT,
    )
    listing = raw(
        core.list_namespaced_service(
            NAMESPACE, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
    )
    since = listing["metadata"]["resourceVersion"]
    # The update lands before the watch connects; watching from `since` must still deliver it.
    core.patch_namespaced_service(
        "watched",
        NAMESPACE,
        {"metadata": {"annotations": {"smoke.nodelb.io/touched": "yes"}}},
        _request_timeout=REQUEST_TIMEOUT,
    )
    stream = cast(
        urllib3.BaseHTTPResponse,
        core.list_namespaced_service(
            NAMESPACE,
            watch=True,
            resource_version=since,
            timeout_seconds=int(WATCH_DEADLINE),
            _preload_content=False,
            _request_timeout=WATCH_DEADLINE + 5,
        ),
    )
    deadline = time.monotonic() + WATCH_DEADLINE
    seen: list[tuple[str, str]] = []
    modified: dict[str, Any] | None = None
    try:
        for line in stream:
            event = orjson.loads(line)
            name = event["object"]["metadata"]["name"]
            seen.append((event["type"], name))
            if event["type"] == "MODIFIED" and name == "watched":
                modified = event["object"]
                break
            if time.monotonic() > deadline:
                break
    finally:
        stream.release_conn()
    assert modified is not None, f"no MODIFIED event for 'watched'; saw {seen}"
    assert modified["metadata"]["annotations"] == {"smoke.nodelb.io/touched": "yes"}


def test_serviceaccount_token_authenticates_and_is_bound_by_rbac(
    controlplane: ControlPlane,
) -> None:
    kubeconfig = controlplane.serviceaccount_kubeconfig("smoke-sa", "reader")
    sa = controlplane.api_client(kubeconfig)
    review = raw(
        client.AuthenticationV1Api(sa).create_self_subject_review(
            client.V1SelfSubjectReview(),
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
    )
    assert review["status"]["userInfo"]["username"] == "system:serviceaccount:smoke-sa:reader"
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(sa).create_namespaced_config_map(
            "smoke-sa",
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name="nope")),
            _request_timeout=REQUEST_TIMEOUT,
        )
    assert refused.value.status == 403
    assert "system:serviceaccount:smoke-sa:reader" in str(refused.value.body)
