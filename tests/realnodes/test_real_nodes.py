"""nodelb as a user runs it: installed from deploy/ onto real kubelets, judged by real traffic.

Pods are agnhost `netexec` containers scheduled by kube-scheduler and run by containerd;
EndpointSlices and their hints come from kube-controller-manager; the agent and controller
are the DaemonSet and Deployment of deploy/daemonset.yaml, running nodelb's own image. The
client sits outside, behind a router that reaches LoadBalancer IPs by ARP/ND on the segment.

The tests run in file order: the last two change the cluster (a rolling update of the agent
DaemonSet, then a node powered off).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from lab import binaries
from lab.conformance import SUBSET_FILE, focus_on, read_specs
from lab.conformance_run import run_specs
from lab.httpget import HttpResult, get_many
from lab.realnodes import DEPLOY, NODELB_NAMESPACE, RealNodeCluster
from lab.requestloop import NeighbourWatch, RequestLoop, unexplained_failures
from lab.topology import OUTSIDE_CLIENT4
from lab.wait import wait_until

AGNHOST = binaries.read_versions()["AGNHOST_IMAGE"]
NAMESPACE = "default"
APP = "web"
REPLICAS = 6
HTTP_PORT = 8080
SERVICE_PORT = 80
TIMEOUT = 120.0
REQUESTS = 60
TIMEOUT_S = 3.0


def deployment(name: str, replicas: int) -> dict[str, Any]:
    """Return a Deployment of agnhost netexec pods spread evenly over the nodes."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "netexec",
                            "image": AGNHOST,
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["netexec", f"--http-port={HTTP_PORT}"],
                            "ports": [{"containerPort": HTTP_PORT}],
                            "readinessProbe": {
                                "tcpSocket": {"port": HTTP_PORT},
                                "periodSeconds": 1,
                            },
                        }
                    ],
                },
            },
        },
    }


def lb_service(
    name: str,
    *,
    policy: str = "Cluster",
    traffic_distribution: str | None = None,
    family: str = "IPv4",
) -> dict[str, Any]:
    """Return a LoadBalancer Service for the `web` pods (no class: nodelb handles those)."""
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "selector": {"app": APP},
        "externalTrafficPolicy": policy,
        "ipFamilyPolicy": "SingleStack",
        "ipFamilies": [family],
        "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": HTTP_PORT}],
    }
    if traffic_distribution is not None:
        spec["trafficDistribution"] = traffic_distribution
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


@dataclass(frozen=True)
class Web:
    """The web Deployment's pods (name -> node) and each Service's LoadBalancer IP."""

    pods: dict[str, str]
    ips: dict[str, str]


def serving_ip(cluster: RealNodeCluster, name: str) -> str | None:
    """Return the Service's ingress IP once LoadBalancerServing is True (else None)."""
    status = cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/services/{name}")["status"]
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    ingress = status.get("loadBalancer", {}).get("ingress", [])
    if conditions.get("LoadBalancerServing") != "True" or not ingress:
        return None
    return str(ingress[0]["ip"])


def ready_pods(cluster: RealNodeCluster, count: int) -> dict[str, str] | None:
    """Return {pod: node} of the Ready web pods once there are `count` of them (else None)."""
    ready = {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in cluster.pods(NAMESPACE, f"app={APP}")
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    }
    return ready if len(ready) == count else None


@pytest.fixture(scope="module")
def web(real_cluster: RealNodeCluster) -> Iterator[Web]:
    """Create the web Deployment and four Services over it; wait until all are served."""
    apps, core = real_cluster.apps, real_cluster.core
    body: Any = deployment(APP, REPLICAS)
    apps.create_namespaced_deployment(NAMESPACE, body)
    services: dict[str, Any] = {
        "web": lb_service("web"),
        "web-local": lb_service("web-local", policy="Local"),
        "web-node": lb_service("web-node", traffic_distribution="PreferSameNode"),
        "web-zone": lb_service("web-zone", traffic_distribution="PreferSameZone"),
        "web6": lb_service("web6", family="IPv6"),
    }
    for body in services.values():
        core.create_namespaced_service(NAMESPACE, body)

    pods = wait_until(
        lambda: ready_pods(real_cluster, REPLICAS),
        TIMEOUT,
        "the web pods to be Ready",
        interval=0.5,
    )
    ips: dict[str, str] = {}
    for name in services:
        ip = wait_until(
            lambda name=name: serving_ip(real_cluster, name),  # type: ignore[misc]
            TIMEOUT,
            f"Service {name} to be served (LoadBalancerServing=True)",
            interval=0.5,
        )
        assert ip is not None  # wait_until returns only a truthy value
        ips[name] = ip
    assert pods is not None
    yield Web(pods=pods, ips=ips)
    for name in services:
        core.delete_namespaced_service(name, NAMESPACE)
    apps.delete_namespaced_deployment(APP, NAMESPACE)


def from_outside(cluster: RealNodeCluster, ip: str, path: str, count: int) -> list[HttpResult]:
    """Return `count` GETs of `path` at the Service IP, sent by the outside client."""
    return get_many(
        cluster.outside.ns, ip_address(ip), SERVICE_PORT, path, count=count, timeout=TIMEOUT_S
    )


def answered_by(results: list[HttpResult]) -> collections.Counter[str]:
    """Return how many requests each pod answered; fail on any unanswered one."""
    bad = [r for r in results if not r.ok]
    assert not bad, f"{len(bad)} of {len(results)} requests failed: {bad[:5]}"
    return collections.Counter(r.body for r in results)


def holder_of(cluster: RealNodeCluster, ip: str, *, not_: str | None = None) -> str:
    """Return the node holding `ip` (other than `not_`), once the router's entry names it."""
    address = ip_address(ip)

    def settled() -> str | None:
        # A router learns an address's MAC when it has traffic for it (Linux takes no
        # unsolicited ARP for an entry it does not have): one request, then look.
        get_many(cluster.outside.ns, address, SERVICE_PORT, "/hostname", timeout=1.0)
        node = cluster.holder_seen_by_router(address)
        return node if node != not_ else None

    node = wait_until(settled, 30.0, f"one holder of {ip} named by the router", interval=0.2)
    assert node is not None  # wait_until returns only a truthy value
    return node


# -- installed as shipped ----------------------------------------------------------------------


def test_the_agent_runs_from_nodelbs_image_on_every_node(real_cluster: RealNodeCluster) -> None:
    shipped = next(
        d
        for d in yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text())
        if d and d["kind"] == "DaemonSet"
    )
    image = shipped["spec"]["template"]["spec"]["containers"][0]["image"]
    shipped_container = shipped["spec"]["template"]["spec"]["containers"][0]
    pods = real_cluster.agent_pods()
    assert {p["spec"]["nodeName"] for p in pods} == {n.name for n in real_cluster.nodes}
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["image"] == image
        assert container["securityContext"] == shipped_container["securityContext"]
        assert pod["spec"]["serviceAccountName"] == "nodelb-agent"
        assert pod["spec"]["hostNetwork"] is True
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] and status["imageID"], f"{pod['metadata']['name']}: {status}"


def test_one_controller_replica_leads(real_cluster: RealNodeCluster) -> None:
    leader = real_cluster.wait_controller_leader()
    controllers = real_cluster.pods(NODELB_NAMESPACE, "app.kubernetes.io/component=controller")
    assert leader in {p["metadata"]["name"] for p in controllers}


def test_the_agents_token_cannot_write_what_deploy_does_not_grant(
    real_cluster: RealNodeCluster,
) -> None:
    pod = real_cluster.agent_pods()[0]["metadata"]["name"]
    kubeconfig = real_cluster.controlplane.serviceaccount_kubeconfig(
        NODELB_NAMESPACE, "nodelb-agent", pod=pod
    )
    core = kclient.CoreV1Api(real_cluster.controlplane.api_client(kubeconfig))
    assert core.list_service_for_all_namespaces(limit=1).items is not None
    secret = kclient.V1Secret(metadata=kclient.V1ObjectMeta(name="stolen"))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_secret(NODELB_NAMESPACE, secret)
    assert refused.value.status == 403


# -- real traffic ----------------------------------------------------------------------------


def test_pods_resolve_a_service_name_through_the_clusters_dns(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    # The e2e specs reach Services by name from pods: the lab runs CoreDNS as kube-dns.
    cluster_ip = real_cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/services/web")["spec"][
        "clusterIP"
    ]
    pod = sorted(web.pods)[0]
    out = real_cluster.kubectl(
        "exec", "-n", NAMESPACE, pod, "--", "dig", "+short", "+search", "+time=2", "+tries=3", "web"
    ).stdout
    assert out.split() == [cluster_ip], f"{pod} resolved 'web' to {out!r}, not {cluster_ip}"


def test_the_outside_client_reaches_pods_on_several_nodes_through_the_router(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    ip = web.ips["web"]
    holder = holder_of(real_cluster, ip)
    counts = answered_by(from_outside(real_cluster, ip, "/hostname", REQUESTS))
    assert set(counts) <= set(web.pods), f"answers from unknown pods: {counts}"
    nodes = {web.pods[pod] for pod in counts}
    assert len(nodes) >= 2, f"every answer came from one node's pods: {counts}"
    assert holder in {n.name for n in real_cluster.nodes}


def test_the_outside_client_reaches_an_ipv6_service_through_the_routers_neighbour_discovery(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    ip = web.ips["web6"]
    assert ip_address(ip).version == 6
    holder_of(real_cluster, ip)  # the router's ND entry names the holder's MAC
    counts = answered_by(from_outside(real_cluster, ip, "/hostname", REQUESTS))
    assert len({web.pods[pod] for pod in counts}) >= 2, counts


def test_prefer_same_node_hints_from_the_controller_keep_traffic_on_the_holder(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    ip = web.ips["web-node"]
    slices = kclient.DiscoveryV1Api(real_cluster.api).list_namespaced_endpoint_slice(
        NAMESPACE, label_selector="kubernetes.io/service-name=web-node"
    )
    hinted = [ep.hints.for_nodes for s in slices.items for ep in (s.endpoints or []) if ep.hints]
    assert hinted and all(hinted), "the EndpointSlice controller wrote no forNodes hints"
    holder = holder_of(real_cluster, ip)
    counts = answered_by(from_outside(real_cluster, ip, "/hostname", REQUESTS // 2))
    assert {web.pods[pod] for pod in counts} == {holder}, counts


def test_prefer_same_zone_hints_keep_traffic_in_the_holders_zone(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    ip = web.ips["web-zone"]
    holder = holder_of(real_cluster, ip)
    zone = real_cluster.lab.node(holder).zone
    in_zone = {n.name for n in real_cluster.nodes if n.zone == zone}
    counts = answered_by(from_outside(real_cluster, ip, "/hostname", REQUESTS))
    nodes = {web.pods[pod] for pod in counts}
    assert nodes <= in_zone, f"answers from outside {zone}: {counts}"


def test_local_policy_shows_the_outside_clients_own_address(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    ip = web.ips["web-local"]
    holder = holder_of(real_cluster, ip)
    results = from_outside(real_cluster, ip, "/clientip", 10)
    seen = {r.body.rsplit(":", 1)[0] for r in results if r.ok}
    assert all(r.ok for r in results), results
    assert seen == {str(OUTSIDE_CLIENT4)}
    hostnames = answered_by(from_outside(real_cluster, ip, "/hostname", 10))
    assert {web.pods[pod] for pod in hostnames} == {holder}


# -- the upstream judge --------------------------------------------------------------------------


def test_the_upstream_load_balancer_specs_of_the_ci_subset_pass(
    real_cluster: RealNodeCluster, web: Web, tmp_path: Path
) -> None:
    # conformance/subset.txt: the [Feature:LoadBalancer] specs short enough for every CI run;
    # `make conformance` runs them all. e2e.test runs from the outside network, as there.
    subset = read_specs(SUBSET_FILE.read_text(), source=str(SUBSET_FILE))
    run = run_specs(real_cluster, focus=focus_on(subset), report_dir=tmp_path, timeout=900.0)
    bad = run.not_passed(subset)
    assert not bad, "\n".join(f"{r.outcome.value}: {r.spec}: {r.note}" for r in bad) + (
        f"\ne2e.test log: {run.log}"
    )

    # The suite deletes its namespaces without waiting: the tests after this one change the
    # cluster and measure every request, so they start once the specs' pods and Services are
    # gone, not while the nodes still tear them down.
    def namespaces_gone() -> bool:
        items = real_cluster.get_json("/api/v1/namespaces")["items"]
        return not any(ns["status"].get("phase") == "Terminating" for ns in items)

    wait_until(namespaces_gone, 180.0, "the specs' namespaces to be deleted", interval=1.0)


# -- changes to the cluster (last) -------------------------------------------------------------


def test_a_rolling_update_of_the_agents_loses_no_request_but_one_in_flight_at_a_move(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    """Every agent restarts in turn while a client outside sends a request every 50 ms.

    The holder's agent resigns (its backup takes over within Skew_Time) and, restarted, may
    take the IP back: each is a move of the IP, timed from the router's neighbour entry. A
    connection in flight at that instant is lost, as with every L2 load balancer (the new
    holder has no conntrack entry for it); nothing else may be (lab.requestloop's
    `unexplained_failures`: at most the one in-flight request per move).
    """
    ip = web.ips["web"]
    holder_of(real_cluster, ip)
    watch = NeighbourWatch(real_cluster.router.ns, ip_address(ip))
    loop = RequestLoop(
        real_cluster.outside.ns,
        ip_address(ip),
        SERVICE_PORT,
        interval=0.05,
        timeout=1.0,
        http_path="/hostname",
    )
    watch.start()
    loop.start()
    try:
        patch = {
            "spec": {"template": {"metadata": {"annotations": {"nodelb.io/lab-restart": "1"}}}}
        }
        real_cluster.apps.patch_namespaced_daemon_set(
            "nodelb-agent", NODELB_NAMESPACE, patch, _preload_content=False
        )
        real_cluster.wait_agents_ready()
    finally:
        requests = loop.stop()
        moves = watch.stop()
    assert len(requests) > 100, f"the loop ran only {len(requests)} requests"
    lost = [r for r in requests if not r.ok]
    print(f"{len(requests)} requests, {len(lost)} failed, {len(moves)} moves of {ip}")
    assert not unexplained_failures(requests, moves), (lost[:10], moves)


def test_a_powered_off_holder_is_replaced_and_the_router_follows(
    real_cluster: RealNodeCluster, web: Web
) -> None:
    ip = web.ips["web"]
    holder = holder_of(real_cluster, ip)
    real_cluster.power_off(holder)
    new_holder = holder_of(real_cluster, ip, not_=holder)
    assert new_holder != holder

    def served() -> bool:
        return all(r.ok for r in from_outside(real_cluster, ip, "/hostname", 20))

    wait_until(served, 90.0, f"{ip} to be served again after {holder} lost power", interval=1.0)
    counts = answered_by(from_outside(real_cluster, ip, "/hostname", REQUESTS))
    assert holder not in {web.pods[pod] for pod in counts}
