"""The deployment manifests against a real kube-apiserver (RBAC, PodSecurity, admission on).

- Every object in deploy/daemonset.yaml and deploy/admission-policy.yaml is accepted by the
  server (server-side apply, dry run, with the lab's kubectl as an operator would run it), and
  the two pod templates pass pod admission (priority classes, Pod Security levels).
- The RBAC objects, applied for real, give each ServiceAccount's token exactly the access
  docs/deploy.md promises: SelfSubjectAccessReviews with the real tokens, plus real requests
  that must succeed and real writes that must be refused with 403.
- The ValidatingAdmissionPolicy, applied for real, refuses externalIPs outside the allowed
  CIDRs or inside a LoadBalancer pool (naming the address), and lets admins through.
- The real `nodelb agent` and `nodelb controller`, started with the containers' own arguments,
  the ConfigMap's configuration and only their ServiceAccounts' tokens, do their work: the
  agent syncs and posts Events, the controller takes the Lease and allocates from the pool.
  So the permission table is not only what the roles say but enough for the code.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.controller.finalizer import FINALIZER
from agent.kube.node_report import report_body
from lab import netns, readers
from lab.controlplane import ControlPlane
from lab.topology import Lab
from lab.wait import GiveUp, wait_until
from tests.e2e.conftest import Kubectl

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = DEPLOY / "daemonset.yaml"
POLICY = DEPLOY / "admission-policy.yaml"
NS = "nodelb-system"
APPS = "deploy-apps"  # where the tests' Services live
REQUEST_TIMEOUT = 10.0
POLICY_DEADLINE = 30.0  # the apiserver loads admission policies asynchronously
RBAC_KINDS = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
SYSTEM_NODE_CRITICAL = 2000001000
DEVELOPERS = "deploy-test:developers"
EXTERNALIP_ADMINS = "nodelb:externalip-admins"


def documents(path: Path) -> list[dict[str, Any]]:
    """Return the non-empty YAML documents of `path`."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """Return the one document of `kind` called `name`."""
    (doc,) = (d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    return doc


def api_message(exc: ApiException) -> str:
    """Return the Status message of a refused request (the raw body if it is not JSON)."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.body)


def refused(call: Callable[[], object]) -> ApiException:
    """Return the ApiException `call` raises; fail the test if it succeeds."""
    try:
        call()
    except ApiException as exc:
        return exc
    raise AssertionError("the request was expected to be refused but succeeded")


@pytest.fixture(scope="module")
def admin(controlplane: ControlPlane) -> client.ApiClient:
    """Return an ApiClient as the lab admin (system:masters)."""
    return controlplane.api_client()


@pytest.fixture(scope="module")
def namespace(kubectl: Kubectl) -> str:
    """Create the Namespace document of daemonset.yaml for real (namespaced objects need it)."""
    ns_doc = find(documents(MANIFESTS), "Namespace", NS)
    kubectl.apply(yaml.safe_dump(ns_doc))
    return NS


@pytest.fixture(scope="module")
def rbac(kubectl: Kubectl, namespace: str) -> None:
    """Apply the Namespace, ServiceAccounts, (Cluster)Roles and bindings for real."""
    docs = [d for d in documents(MANIFESTS) if d["kind"] in RBAC_KINDS]
    assert {d["kind"] for d in docs} == RBAC_KINDS
    kubectl.apply(yaml.safe_dump_all(docs))


@pytest.fixture(scope="module")
def tokens(controlplane: ControlPlane, rbac: None, reader: str) -> dict[str, client.ApiClient]:
    """Return an ApiClient per ServiceAccount (nodelb's two and a metrics reader),
    authenticating with a real token."""
    return {
        sa: controlplane.api_client(controlplane.serviceaccount_kubeconfig(NS, sa))
        for sa in ("nodelb-agent", "nodelb-controller", READER_SA)
    }


def node_pod(admin: client.ApiClient, node: str, sa: str) -> str:
    """Return the name of a Pod of ServiceAccount `sa` scheduled to `node` in NS (created,
    with the Node, when missing): what a DaemonSet pod is to the apiserver. Nothing runs it;
    a token bound to it carries the node's name, as the kubelet's projected token does."""
    core = client.CoreV1Api(admin)
    try:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    name = f"{sa}-{node}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            service_account_name=sa,
            containers=[client.V1Container(name="agent", image="ghcr.io/nodelb/nodelb:0.1.0")],
        ),
    )
    try:
        core.create_namespaced_pod(NS, pod, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status != 409:
            raise
    return name


@pytest.fixture(scope="module")
def bound_agent(
    controlplane: ControlPlane, admin: client.ApiClient, rbac: None
) -> Callable[[str], client.ApiClient]:
    """Return a function giving an ApiClient with an agent token bound to a Pod on a node."""
    made: dict[str, client.ApiClient] = {}

    def on(node: str) -> client.ApiClient:
        if node not in made:
            pod = node_pod(admin, node, AGENT)
            path = controlplane.serviceaccount_kubeconfig(NS, AGENT, pod=pod)
            made[node] = controlplane.api_client(path)
        return made[node]

    return on


def report(
    node: str,
    *,
    holder: str | None = None,
    ips: tuple[str, ...] = (),
    resource_version: str | None = None,
    duration: int = 15,
) -> Any:
    """Return the report Lease an agent on `node` writes (held by `holder`, if it lies); the
    client sends a dict as it is."""
    body = report_body(
        node=node,
        namespace=NS,
        ips=[ipaddress.ip_address(i) for i in ips],
        now=datetime.datetime.now(datetime.UTC),
        duration=duration,
        resource_version=resource_version,
    )
    if holder is not None:
        body["spec"]["holderIdentity"] = holder
    return body


# -- (a) every object is accepted by the server ---------------------------------------------


def test_every_object_passes_server_side_dry_run(
    kubectl: Kubectl, namespace: str, admin: client.ApiClient
) -> None:
    docs = documents(MANIFESTS) + documents(POLICY)
    expected = set()
    for d in docs:
        group = d["apiVersion"].rpartition("/")[0]
        expected.add(f"{d['kind'].lower()}{'.' + group if group else ''}/{d['metadata']['name']}")
    done = kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=deploy-test",
        "-o",
        "name",
        f"--filename={MANIFESTS}",
        f"--filename={POLICY}",
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == expected
    # A dry run stores nothing: the workloads and the policy do not exist afterwards.
    apps = client.AppsV1Api(admin)
    for read in (
        lambda: apps.read_namespaced_daemon_set("nodelb-agent", NS),
        lambda: apps.read_namespaced_deployment("nodelb-controller", NS),
        lambda: client.CoreV1Api(admin).read_namespaced_config_map("nodelb-config", NS),
    ):
        assert refused(read).status == 404


def pod_from_template(workload: dict[str, Any], name: str) -> client.V1Pod:
    """Return the Pod a DaemonSet or Deployment would create from its template."""
    template = workload["spec"]["template"]
    metadata = {**template.get("metadata", {}), "name": name}
    pod = client.V1Pod.from_dict({"metadata": metadata, "spec": template["spec"]})
    assert pod is not None
    return pod


def test_agent_pod_is_admitted_in_its_namespace_with_node_critical_priority(
    admin: client.ApiClient, rbac: None
) -> None:
    agent = find(documents(MANIFESTS), "DaemonSet", "nodelb-agent")
    pod = client.CoreV1Api(admin).create_namespaced_pod(
        NS, pod_from_template(agent, "agent-dry-run"), dry_run="All"
    )
    assert pod.spec is not None
    assert pod.spec.priority == SYSTEM_NODE_CRITICAL
    assert pod.spec.host_network is True


def labelled_namespace(admin: client.ApiClient, name: str, level: str) -> None:
    """Create namespace `name` enforcing Pod Security `level`, with the controller's SA."""
    core = client.CoreV1Api(admin)
    labels = {"pod-security.kubernetes.io/enforce": level}
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    for sa in ("nodelb-agent", "nodelb-controller"):
        core.create_namespaced_service_account(
            name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa))
        )


def test_controller_pod_meets_the_restricted_pod_security_level(admin: client.ApiClient) -> None:
    labelled_namespace(admin, "deploy-restricted", "restricted")
    controller = find(documents(MANIFESTS), "Deployment", "nodelb-controller")
    pod = client.CoreV1Api(admin).create_namespaced_pod(
        "deploy-restricted", pod_from_template(controller, "controller-dry-run"), dry_run="All"
    )
    assert pod.spec is not None and pod.spec.security_context is not None
    assert pod.spec.security_context.run_as_non_root is True


def test_agent_pod_needs_the_privileged_level_its_namespace_sets(admin: client.ApiClient) -> None:
    labelled_namespace(admin, "deploy-baseline", "baseline")
    agent = find(documents(MANIFESTS), "DaemonSet", "nodelb-agent")
    exc = refused(
        lambda: client.CoreV1Api(admin).create_namespaced_pod(
            "deploy-baseline", pod_from_template(agent, "agent-dry-run"), dry_run="All"
        )
    )
    assert exc.status == 403
    message = api_message(exc)
    assert "hostNetwork" in message and "NET_ADMIN" in message, message
    assert "SYS_NICE" in message, message  # the speaker's real-time scheduling


# -- (b) RBAC, checked with the ServiceAccounts' own tokens ----------------------------------


@dataclass(frozen=True, slots=True)
class Access:
    """One request a ServiceAccount makes (or must not make), and whether RBAC allows it."""

    sa: str
    verb: str
    resource: str
    namespace: str = ""  # "" for cluster-scoped resources and all-namespace list/watch
    group: str = ""
    subresource: str = ""
    allowed: bool = True
    name: str = ""  # one object (resourceNames), "" for any
    path: str = ""  # a non-resource URL (then resource and the rest are unused)


AGENT, CONTROLLER = "nodelb-agent", "nodelb-controller"
DISCOVERY, COORDINATION = "discovery.k8s.io", "coordination.k8s.io"
NODELB = "nodelb.io"

AUTHN, AUTHZ = "authentication.k8s.io", "authorization.k8s.io"
READER_SA = "deploy-reader"
ACCESS = [
    # both: the reviews behind /metrics and /status; neither may read another's endpoint
    *(Access(sa, "create", "tokenreviews", group=AUTHN) for sa in (AGENT, CONTROLLER)),
    *(Access(sa, "create", "subjectaccessreviews", group=AUTHZ) for sa in (AGENT, CONTROLLER)),
    *(
        Access(sa, "get", "", path=p, allowed=False)
        for sa in (AGENT, CONTROLLER)
        for p in ("/metrics", "/status")
    ),
    # a reader bound to nodelb-metrics-reader: those two paths, nothing else
    *(Access(READER_SA, "get", "", path=p) for p in ("/metrics", "/status")),
    Access(READER_SA, "get", "", path="/debug/pprof", allowed=False),
    Access(READER_SA, "list", "services", allowed=False),
    Access(READER_SA, "create", "tokenreviews", group=AUTHN, allowed=False),
    # agent: what it reads, the Events it posts, its node-report Lease
    *(Access(AGENT, v, "services") for v in ("list", "watch")),
    *(Access(AGENT, v, "endpointslices", group=DISCOVERY) for v in ("list", "watch")),
    *(Access(AGENT, v, "nodes") for v in ("get", "list", "watch")),
    *(Access(AGENT, v, "loadbalancerippools", group=NODELB) for v in ("list", "watch")),
    *(Access(AGENT, v, "events", ns) for v in ("create", "patch") for ns in ("default", "shop")),
    *(
        Access(AGENT, v, "leases", NS, COORDINATION)
        for v in ("get", "list", "watch", "create", "update")
    ),
    # agent: what it must not do
    Access(AGENT, "update", "services", "default", subresource="status", allowed=False),
    Access(AGENT, "patch", "services", "default", subresource="status", allowed=False),
    Access(AGENT, "delete", "services", "default", allowed=False),
    Access(AGENT, "create", "services", "default", allowed=False),
    Access(AGENT, "get", "services", "default", allowed=False),
    Access(AGENT, "create", "secrets", NS, allowed=False),
    Access(AGENT, "get", "secrets", NS, allowed=False),
    Access(AGENT, "list", "secrets", allowed=False),
    Access(AGENT, "create", "pods", NS, allowed=False),
    Access(AGENT, "update", "nodes", allowed=False),
    Access(AGENT, "patch", "nodes", subresource="status", allowed=False),
    Access(AGENT, "delete", "leases", NS, COORDINATION, allowed=False),
    Access(AGENT, "patch", "leases", NS, COORDINATION, allowed=False),
    Access(AGENT, "deletecollection", "leases", NS, COORDINATION, allowed=False),
    Access(AGENT, "create", "leases", "kube-system", COORDINATION, allowed=False),
    Access(AGENT, "create", "events", "default", "events.k8s.io", allowed=False),
    # agent: pools are read only, and policies are not read at all yet
    *(
        Access(AGENT, v, "loadbalancerippools", group=NODELB, subresource=s, allowed=False)
        for v in ("create", "update", "patch", "delete")
        for s in ("", "status")
    ),
    Access(AGENT, "list", "announcementpolicies", group=NODELB, allowed=False),
    # controller: reads, status writes, the cleanup finalizer (patch, which the policy
    # nodelb-controller-services narrows to it), Events, leader and node-report Leases
    *(Access(CONTROLLER, v, "services") for v in ("list", "watch")),
    *(Access(CONTROLLER, "patch", "services", ns) for ns in ("default", "shop")),
    *(
        Access(CONTROLLER, v, "services", ns, subresource="status")
        for v in ("get", "update", "patch")
        for ns in ("default", "shop")
    ),
    *(Access(CONTROLLER, v, "nodes") for v in ("list", "watch")),
    *(Access(CONTROLLER, v, "namespaces") for v in ("list", "watch")),
    # pool objects: read them, write their status and nothing else of them
    *(Access(CONTROLLER, v, "loadbalancerippools", group=NODELB) for v in ("list", "watch")),
    Access(CONTROLLER, "patch", "loadbalancerippools", group=NODELB, subresource="status"),
    *(
        Access(CONTROLLER, v, "loadbalancerippools", group=NODELB, allowed=False)
        for v in ("create", "update", "patch", "delete")
    ),
    Access(
        CONTROLLER,
        "update",
        "loadbalancerippools",
        group=NODELB,
        subresource="status",
        allowed=False,
    ),
    Access(CONTROLLER, "list", "announcementpolicies", group=NODELB, allowed=False),
    Access(
        CONTROLLER,
        "create",
        "customresourcedefinitions",
        group="apiextensions.k8s.io",
        allowed=False,
    ),
    # what its Services' addresses can serve (agent/controller/servability.py)
    *(Access(CONTROLLER, v, "endpointslices", group=DISCOVERY) for v in ("list", "watch")),
    *(Access(CONTROLLER, v, "events", "shop") for v in ("create", "patch")),
    *(Access(CONTROLLER, v, "leases", NS, COORDINATION) for v in ("create", "list", "watch")),
    *(
        Access(CONTROLLER, v, "leases", NS, COORDINATION, name="nodelb-controller")
        for v in ("get", "update")
    ),
    # controller: what it must not do
    Access(CONTROLLER, "create", "pods", NS, allowed=False),
    Access(CONTROLLER, "delete", "services", "default", allowed=False),
    Access(CONTROLLER, "update", "services", "default", allowed=False),
    Access(CONTROLLER, "create", "services", "default", allowed=False),
    Access(CONTROLLER, "get", "secrets", NS, allowed=False),
    Access(CONTROLLER, "update", "nodes", allowed=False),
    Access(CONTROLLER, "delete", "leases", NS, COORDINATION, allowed=False),
    # the node reports are the agents': the controller reads them, never writes one
    Access(CONTROLLER, "update", "leases", NS, COORDINATION, allowed=False),
    Access(CONTROLLER, "update", "leases", NS, COORDINATION, allowed=False, name="nodelb-node-a"),
    Access(CONTROLLER, "patch", "leases", NS, COORDINATION, allowed=False),
    Access(CONTROLLER, "create", "leases", "default", COORDINATION, allowed=False),
    Access(CONTROLLER, "create", "endpointslices", "shop", DISCOVERY, allowed=False),
    Access(CONTROLLER, "update", "endpointslices", "shop", DISCOVERY, allowed=False),
]


def access_id(a: Access) -> str:
    """Return a test id such as "nodelb-agent may list services in all namespaces"."""
    if a.path:
        return f"{a.sa} {'may' if a.allowed else 'may not'} {a.verb} {a.path}"
    what = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    if a.group:
        what += f".{a.group}"
    if a.name:
        what += f" {a.name}"
    where = f"in {a.namespace}" if a.namespace else "cluster-wide"
    return f"{a.sa} {'may' if a.allowed else 'may not'} {a.verb} {what} {where}"


@pytest.mark.parametrize("access", [pytest.param(a, id=access_id(a)) for a in ACCESS])
def test_serviceaccount_token_has_exactly_the_documented_access(
    access: Access, tokens: dict[str, client.ApiClient]
) -> None:
    if access.path:
        spec = client.V1SelfSubjectAccessReviewSpec(
            non_resource_attributes=client.V1NonResourceAttributes(
                path=access.path, verb=access.verb
            )
        )
    else:
        spec = client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=access.verb,
                group=access.group,
                resource=access.resource,
                subresource=access.subresource,
                namespace=access.namespace,
                name=access.name or None,
            )
        )
    review = client.V1SelfSubjectAccessReview(spec=spec)
    result = client.AuthorizationV1Api(tokens[access.sa]).create_self_subject_access_review(
        review, _request_timeout=REQUEST_TIMEOUT
    )
    assert result.status is not None
    assert result.status.allowed is access.allowed, result.status.reason


def test_agent_token_lists_services_and_keeps_its_lease_but_cannot_write_secrets(
    tokens: dict[str, client.ApiClient], bound_agent: Callable[[str], client.ApiClient]
) -> None:
    agent = tokens[AGENT]
    services = client.CoreV1Api(agent).list_service_for_all_namespaces(
        _request_timeout=REQUEST_TIMEOUT
    )
    assert any(s.metadata is not None and s.metadata.name == "kubernetes" for s in services.items)
    coordination = client.CoordinationV1Api(bound_agent("node-7"))
    created: Any = coordination.create_namespaced_lease(
        NS, report("node-7"), _request_timeout=REQUEST_TIMEOUT
    )
    coordination.replace_namespaced_lease(
        "nodelb-node-node-7",
        NS,
        report("node-7", resource_version=created.metadata.resource_version, duration=30),
        _request_timeout=REQUEST_TIMEOUT,
    )
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="stolen"), string_data={"k": "v"})
    exc = refused(
        lambda: client.CoreV1Api(agent).create_namespaced_secret(
            NS, secret, _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert exc.status == 403
    assert "system:serviceaccount:nodelb-system:nodelb-agent" in api_message(exc)


# -- the default install ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(kubectl: Kubectl, tokens: dict[str, client.ApiClient], rbac: None) -> None:
    """Apply the default install for real, as README.md says (`kubectl apply -k deploy/`),
    and wait until the apiserver enforces its Lease policy (policies load asynchronously)."""
    done = kubectl("apply", "--server-side", "--field-manager=deploy-test", "-k", str(DEPLOY))
    assert done.returncode == 0, done.stderr
    unbound = client.CoordinationV1Api(tokens[AGENT])

    def enforced() -> bool:
        try:
            unbound.create_namespaced_lease(
                NS, report("node-probe"), dry_run="All", _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            return exc.status == 403 and "nodelb-leases" in api_message(exc)
        return False

    wait_until(enforced, POLICY_DEADLINE, "the nodelb-leases policy to be enforced")


def test_controller_token_writes_status_and_the_finalizer_but_nothing_else_of_a_service(
    tokens: dict[str, client.ApiClient], admin: client.ApiClient, installed: None
) -> None:
    """RBAC grants the controller patch on services for the cleanup finalizer; the policy
    nodelb-controller-services refuses any other change it makes to a Service itself."""
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="deploy-rbac")))
    created: Any = core.create_namespaced_service(
        "deploy-rbac",
        client.V1Service(
            metadata=client.V1ObjectMeta(name="web", finalizers=["example.com/keep"]),
            spec=client.V1ServiceSpec(type="LoadBalancer", ports=[client.V1ServicePort(port=80)]),
        ),
        _request_timeout=REQUEST_TIMEOUT,
    )
    controller = client.CoreV1Api(tokens[CONTROLLER])

    def patch(body: dict[str, Any]) -> Any:
        return controller.patch_namespaced_service(
            "web",
            "deploy-rbac",
            body,
            _content_type="application/merge-patch+json",
            _request_timeout=REQUEST_TIMEOUT,
        )

    def label_refused() -> ApiException | None:
        try:
            patch({"metadata": {"labels": {"owned": "yes"}}})
        except ApiException as exc:
            return exc if "nodelb-controller-services" in api_message(exc) else None
        return None

    # The policy loads asynchronously: wait until it refuses what RBAC alone would let through.
    exc = wait_until(label_refused, POLICY_DEADLINE, "nodelb-controller-services enforced")
    assert exc is not None and exc.status == 403
    spec = refused(lambda: patch({"spec": {"selector": {"app": "mine"}}}))
    assert spec.status == 403 and "nodelb-controller-services" in api_message(spec)
    other = refused(lambda: patch({"metadata": {"finalizers": [FINALIZER]}}))  # drops a finalizer
    assert other.status == 403 and "nodelb-controller-services" in api_message(other)
    # What the controller does: add the finalizer beside the others, guarded, then remove it.
    version = created.metadata.resource_version
    added = patch(
        {"metadata": {"resourceVersion": version, "finalizers": ["example.com/keep", FINALIZER]}}
    )
    assert added.metadata.finalizers == ["example.com/keep", FINALIZER]
    controller.patch_namespaced_service_status(
        "web",
        "deploy-rbac",
        {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.72.1"}]}}},
        _content_type="application/merge-patch+json",
        _request_timeout=REQUEST_TIMEOUT,
    )
    removed = patch({"metadata": {"finalizers": ["example.com/keep"]}})
    assert removed.metadata.finalizers == ["example.com/keep"]
    stored: Any = core.read_namespaced_service(
        "web", "deploy-rbac", _request_timeout=REQUEST_TIMEOUT
    )
    assert [i.ip for i in stored.status.load_balancer.ingress or []] == ["198.18.72.1"]
    assert stored.metadata.labels is None and stored.spec.selector is None


# -- (c) the externalIP admission policy -----------------------------------------------------


def impersonating(controlplane: ControlPlane, user: str, group: str) -> client.CoreV1Api:
    """Return a CoreV1Api acting as `user` in `group` (the admin impersonates them)."""
    api = controlplane.api_client()
    api.default_headers["Impersonate-User"] = user
    api.default_headers["Impersonate-Group"] = group
    return client.CoreV1Api(api)


def service(name: str, external_ips: list[str], **spec: Any) -> client.V1Service:
    """Return a ClusterIP Service on port 80 asking for `external_ips`."""
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ServiceSpec(
            ports=[client.V1ServicePort(port=80)], external_ips=external_ips or None, **spec
        ),
    )


@dataclass(frozen=True, slots=True)
class Users:
    """Clients for the three kinds of callers the policy tells apart."""

    developer: client.CoreV1Api  # plain user with RBAC to write Services
    ip_admin: client.CoreV1Api  # member of nodelb:externalip-admins
    master: client.CoreV1Api  # system:masters


@pytest.fixture(scope="module")
def users(controlplane: ControlPlane, installed: None, admin: client.ApiClient) -> Users:
    """With the default install applied, grant two groups Service writes in APPS, and wait until the
    apiserver enforces the policy (it loads policies asynchronously)."""
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=APPS)))
    rbac_api = client.RbacAuthorizationV1Api(admin)
    rbac_api.create_namespaced_role(
        APPS,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="service-writer"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[""],
                    resources=["services"],
                    verbs=["get", "create", "update", "patch"],
                )
            ],
        ),
    )
    rbac_api.create_namespaced_role_binding(
        APPS,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="service-writers"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="service-writer"
            ),
            subjects=[
                client.RbacV1Subject(kind="Group", name=g, api_group="rbac.authorization.k8s.io")
                for g in (DEVELOPERS, EXTERNALIP_ADMINS)
            ],
        ),
    )
    found = Users(
        developer=impersonating(controlplane, "alice", DEVELOPERS),
        ip_admin=impersonating(controlplane, "bob", EXTERNALIP_ADMINS),
        master=core,
    )

    def enforced() -> bool:
        try:
            found.developer.create_namespaced_service(
                APPS, service("probe", ["198.18.80.1"]), dry_run="All"
            )
        except ApiException as exc:
            return exc.status == 403 and "nodelb-externalips" in api_message(exc)
        return False

    wait_until(enforced, POLICY_DEADLINE, "the nodelb-externalips policy to be enforced")
    return found


@dataclass(frozen=True, slots=True)
class Create:
    """A Service create and the policy's expected answer."""

    name: str
    who: str  # a Users field
    external_ips: tuple[str, ...]
    refused_ips: tuple[str, ...] = ()  # must be named in the message
    accepted_ips: tuple[str, ...] = ()  # listed, but must not be named
    message: str = ""  # a phrase of the refusal message


OUTSIDE = "outside the CIDRs allowed for external IPs"
IN_POOL = "to a nodelb LoadBalancer pool"
CREATES = [
    pytest.param(
        Create("svc-1", "developer", ("198.18.64.10",)), id="an allowed IPv4 address passes"
    ),
    pytest.param(
        Create("svc-2", "developer", ("2001:db8:64::10",)), id="an allowed IPv6 address passes"
    ),
    pytest.param(
        Create("svc-3", "developer", ("198.18.80.1",), ("198.18.80.1",), message=OUTSIDE),
        id="an IPv4 address outside the allowed CIDRs is refused by name",
    ),
    pytest.param(
        Create("svc-4", "developer", ("2001:db8:65::1",), ("2001:db8:65::1",), message=OUTSIDE),
        id="an IPv6 address outside the allowed CIDRs is refused by name",
    ),
    pytest.param(
        Create("svc-5", "developer", ("198.18.72.10",), ("198.18.72.10",), message=IN_POOL),
        id="an allowed address inside the LoadBalancer pool is refused by name",
    ),
    pytest.param(
        Create(
            "svc-6", "developer", ("2001:db8:64:72::10",), ("2001:db8:64:72::10",), message=IN_POOL
        ),
        id="an IPv6 pool address is refused by name",
    ),
    pytest.param(
        Create(
            "svc-mixed",
            "developer",
            ("198.18.64.11", "198.18.80.2", "198.18.80.3"),
            ("198.18.80.2", "198.18.80.3"),
            ("198.18.64.11",),
            message=OUTSIDE,
        ),
        id="a mixed list is refused naming only the offending addresses",
    ),
    pytest.param(
        Create("svc-7", "ip_admin", ("198.18.80.4", "198.18.72.11")),
        id="a nodelb:externalip-admins member may set any address",
    ),
    pytest.param(
        Create("svc-8", "master", ("198.18.80.5", "198.18.72.12")),
        id="a system:masters member may set any address",
    ),
]


@pytest.mark.parametrize("case", CREATES)
def test_admission_policy_on_create(case: Create, users: Users) -> None:
    api: client.CoreV1Api = getattr(users, case.who)
    name = case.name
    body = service(name, list(case.external_ips))
    if not case.refused_ips:
        api.create_namespaced_service(APPS, body, _request_timeout=REQUEST_TIMEOUT)
        stored: Any = users.master.read_namespaced_service(name, APPS)
        assert stored.spec is not None
        assert stored.spec.external_ips == list(case.external_ips)
        return
    exc = refused(
        lambda: api.create_namespaced_service(APPS, body, _request_timeout=REQUEST_TIMEOUT)
    )
    message = api_message(exc)
    assert exc.status == 403, message
    assert "ValidatingAdmissionPolicy 'nodelb-externalips'" in message
    assert case.message in message
    for ip in case.refused_ips:
        assert ip in message
    for ip in case.accepted_ips:
        assert ip not in message
    assert refused(lambda: users.master.read_namespaced_service(name, APPS)).status == 404


def merge_patch(api: client.CoreV1Api, name: str, patch: dict[str, Any]) -> None:
    """Merge-patch Service `name` in APPS."""
    api.patch_namespaced_service(
        name,
        APPS,
        patch,
        _content_type="application/merge-patch+json",
        _request_timeout=REQUEST_TIMEOUT,
    )


def test_admission_policy_judges_only_addresses_an_update_adds(users: Users) -> None:
    # An admin-made Service with a refused address stays editable by others...
    users.master.create_namespaced_service(APPS, service("legacy", ["198.18.80.20"]))
    merge_patch(users.developer, "legacy", {"metadata": {"labels": {"team": "shop"}}})
    merge_patch(
        users.developer, "legacy", {"spec": {"externalIPs": ["198.18.80.20", "198.18.64.20"]}}
    )
    # ...but nobody without the group may add another refused address to it.
    exc = refused(
        lambda: merge_patch(
            users.developer, "legacy", {"spec": {"externalIPs": ["198.18.80.20", "198.18.80.21"]}}
        )
    )
    message = api_message(exc)
    assert exc.status == 403 and OUTSIDE in message
    assert "198.18.80.21" in message and "198.18.80.20" not in message
    stored: Any = users.master.read_namespaced_service("legacy", APPS)
    assert stored.spec is not None
    assert stored.spec.external_ips == ["198.18.80.20", "198.18.64.20"]


def test_admission_policy_lets_a_service_list_its_own_loadbalancer_ip(users: Users) -> None:
    lb = service("holder", [], type="LoadBalancer")
    users.master.create_namespaced_service(APPS, lb)
    users.master.patch_namespaced_service_status(
        "holder",
        APPS,
        {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.72.30"}]}}},
        _content_type="application/merge-patch+json",
    )
    users.master.create_namespaced_service(APPS, service("other", ["198.18.64.30"]))
    # The Service holding the pool address may list it as an externalIP...
    merge_patch(users.developer, "holder", {"spec": {"externalIPs": ["198.18.72.30"]}})
    # ...another Service may not.
    exc = refused(
        lambda: merge_patch(
            users.developer, "other", {"spec": {"externalIPs": ["198.18.64.30", "198.18.72.30"]}}
        )
    )
    message = api_message(exc)
    assert exc.status == 403 and IN_POOL in message and "198.18.72.30" in message


def test_the_default_install_refuses_a_service_claiming_another_services_lb_ip(
    users: Users,
) -> None:
    """CVE-2020-8554 as kube-proxy would serve it: a Service listing a victim's LoadBalancer
    IP as an externalIP gets the victim's undeclared ports. The default install (the
    `installed` fixture: README's `kubectl apply -k deploy/`) refuses it at the API."""
    users.master.create_namespaced_service(APPS, service("victim", [], type="LoadBalancer"))
    users.master.patch_namespaced_service_status(
        "victim",
        APPS,
        {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.72.50"}]}}},
        _content_type="application/merge-patch+json",
    )
    thief = client.V1Service(
        metadata=client.V1ObjectMeta(name="thief"),
        spec=client.V1ServiceSpec(
            ports=[
                client.V1ServicePort(name="ssh", port=22),
                client.V1ServicePort(name="alt", port=8080),
            ],
            external_ips=["198.18.72.50"],
        ),
    )
    exc = refused(
        lambda: users.developer.create_namespaced_service(
            APPS, thief, _request_timeout=REQUEST_TIMEOUT
        )
    )
    message = api_message(exc)
    assert exc.status == 403 and IN_POOL in message and "198.18.72.50" in message, message
    assert refused(lambda: users.master.read_namespaced_service("thief", APPS)).status == 404


def test_admission_policy_ignores_services_without_external_ips(users: Users) -> None:
    users.developer.create_namespaced_service(APPS, service("plain", [], type="LoadBalancer"))
    stored: Any = users.master.read_namespaced_service("plain", APPS)
    assert stored.spec is not None and stored.spec.type == "LoadBalancer"


# -- (d) the real programs, with these tokens, arguments and configuration -------------------


RUN_NS = "deploy-run"
START_DEADLINE = 60.0
WORK_DEADLINE = 30.0
_REPO = Path(__file__).resolve().parents[2]
AGENT_URL = "https://127.0.0.1:9472"  # the ConfigMap's metricsAddress, dialled in its node
CONTROLLER_URL = "https://127.0.0.1:9473"  # the Deployment's --metrics-address


@dataclass(frozen=True, slots=True)
class Running:
    """`nodelb agent` and `nodelb controller` started from the manifests' own arguments."""

    agent: subprocess.Popen[bytes]
    controller: subprocess.Popen[bytes]
    agent_ns: str
    controller_ns: str
    agent_cert: Path  # the self-signed certificates they published
    controller_cert: Path


def manifest_argv(
    kind: str, name: str, *, config: Path, kubeconfig: Path, cert_out: Path
) -> list[str]:
    """Return the container's command line as the kubelet would run it, pointed at the lab.

    The image's entrypoint `nodelb` is `python -m agent.cli`; `$(POD_NAMESPACE)` is expanded
    as the kubelet does; the ConfigMap mount is replaced by a file holding the same text; the
    in-cluster credentials by a kubeconfig carrying the ServiceAccount's token; and the
    self-signed certificate is published into the test's directory rather than the host's
    /tmp (the container's own /tmp is an emptyDir).
    """
    (c,) = find(documents(MANIFESTS), kind, name)["spec"]["template"]["spec"]["containers"]
    args = [a.replace("$(POD_NAMESPACE)", NS) for a in c["args"]]
    args = [f"--config={config}" if a.startswith("--config=") else a for a in args]
    return [
        sys.executable,
        "-m",
        "agent.cli",
        *args,
        f"--kubeconfig={kubeconfig}",
        f"--metrics-cert-out={cert_out}",
    ]


def wait_ready(
    lab: Lab, proc: subprocess.Popen[bytes], *, ns: str, url: str, cert: Path, what: str
) -> None:
    """Wait until `url` answers 200 (no token: the probe paths are open); fail at once, with
    the log, if the process exits."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise GiveUp(f"{what} exited {proc.returncode}:\n{lab.log_of(proc)[-3000:]}")
        if not cert.exists():
            return False
        try:
            return readers.get(ns, url, cert=cert, token=None)[0] == 200
        except Exception:
            return False  # not listening yet

    wait_until(ready, START_DEADLINE, f"{what} to answer {url}")


@pytest.fixture(scope="module")
def running(
    cp_lab: Lab,
    controlplane: ControlPlane,
    admin: client.ApiClient,
    installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    """Start the agent on node-1 and one controller replica next to the apiserver, each with
    its ServiceAccount's token and the ConfigMap's configuration; stopped by PID after. The
    agent's token is bound to a Pod on node-1, as the kubelet's projected token is."""
    workdir = tmp_path_factory.mktemp("deploy-run")
    config = workdir / "config.yaml"
    config.write_text(
        find(documents(MANIFESTS), "ConfigMap", "nodelb-config")["data"]["config.yaml"]
    )
    env = {**os.environ, "PYTHONPATH": str(_REPO), "POD_NAMESPACE": NS}
    node = cp_lab.node("node-1")
    assert cp_lab.controlplane is not None
    agent_cert, controller_cert = workdir / "agent.crt", workdir / "controller.crt"
    started: list[subprocess.Popen[bytes]] = []
    try:
        agent = cp_lab.spawn(
            node.ns,
            manifest_argv(
                "DaemonSet",
                AGENT,
                config=config,
                kubeconfig=controlplane.serviceaccount_kubeconfig(
                    NS, AGENT, pod=node_pod(admin, node.name, AGENT)
                ),
                cert_out=agent_cert,
            ),
            log_name="deploy-agent",
            env={**env, "NODE_NAME": node.name, "POD_NAME": "nodelb-agent-x1"},
        )
        started.append(agent)
        controller = cp_lab.spawn(
            cp_lab.controlplane.ns,
            manifest_argv(
                "Deployment",
                CONTROLLER,
                config=config,
                kubeconfig=controlplane.serviceaccount_kubeconfig(NS, CONTROLLER),
                cert_out=controller_cert,
            ),
            log_name="deploy-controller",
            env={**env, "POD_NAME": "nodelb-controller-0"},
        )
        started.append(controller)
        wait_ready(
            cp_lab,
            agent,
            ns=node.ns,
            url=f"{AGENT_URL}/readyz",
            cert=agent_cert,
            what="nodelb agent",
        )
        wait_ready(
            cp_lab,
            controller,
            ns=cp_lab.controlplane.ns,
            url=f"{CONTROLLER_URL}/readyz",
            cert=controller_cert,
            what="nodelb controller",
        )
        client.CoreV1Api(controlplane.api_client()).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=RUN_NS))
        )
        yield Running(
            agent, controller, node.ns, cp_lab.controlplane.ns, agent_cert, controller_cert
        )
    finally:
        for proc in started:
            cp_lab.stop(proc)


def events_from(admin: client.ApiClient, component: str, name: str) -> list[client.CoreV1Event]:
    """Return the Events in RUN_NS about object `name` that `component` reported."""
    events = client.CoreV1Api(admin).list_namespaced_event(RUN_NS, _request_timeout=REQUEST_TIMEOUT)
    return [
        e
        for e in events.items
        if e.involved_object.name == name and e.reporting_component == component
    ]


def no_forbidden(lab: Lab, proc: subprocess.Popen[bytes]) -> None:
    """Assert the process never logged a refused API request."""
    log = lab.log_of(proc)
    assert "Forbidden" not in log and " 403" not in log, log[-3000:]


def test_controller_leads_and_allocates_from_the_shipped_pool_with_its_token(
    running: Running, admin: client.ApiClient, cp_lab: Lab
) -> None:
    coordination = client.CoordinationV1Api(admin)

    def holder() -> str | None:
        lease = coordination.read_namespaced_lease("nodelb-controller", NS)
        return lease.spec.holder_identity if lease.spec else None

    assert wait_until(holder, WORK_DEADLINE, "a controller Lease holder") == "nodelb-controller-0"
    core = client.CoreV1Api(admin)
    core.create_namespaced_service(
        RUN_NS, service("web", [], type="LoadBalancer"), _request_timeout=REQUEST_TIMEOUT
    )

    def ingress() -> list[str]:
        svc = core.read_namespaced_service("web", RUN_NS, _request_timeout=REQUEST_TIMEOUT)
        lb = svc.status.load_balancer if svc.status else None
        return [i.ip for i in (lb.ingress if lb else None) or [] if i.ip]

    (ip,) = wait_until(ingress, WORK_DEADLINE, "an ingress IP on Service web")
    assert ipaddress.ip_address(ip) in ipaddress.ip_network("198.18.72.0/24")
    wait_until(
        lambda: events_from(admin, "nodelb-controller", "web"),
        WORK_DEADLINE,
        "an Event from nodelb-controller about web",
    )
    # The cleanup finalizer went on with the token, and comes off again: web is let go.
    stored: Any = core.read_namespaced_service("web", RUN_NS, _request_timeout=REQUEST_TIMEOUT)
    assert FINALIZER in (stored.metadata.finalizers or [])
    core.delete_namespaced_service("web", RUN_NS, _request_timeout=REQUEST_TIMEOUT)

    def gone() -> bool:
        try:
            core.read_namespaced_service("web", RUN_NS, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(gone, WORK_DEADLINE, "web deleted once the controller let it go")
    no_forbidden(cp_lab, running.controller)


def test_agent_syncs_and_posts_events_with_its_token(
    running: Running, admin: client.ApiClient, cp_lab: Lab
) -> None:
    # The admin is exempt from the admission policy, so the agent is the one to refuse it.
    client.CoreV1Api(admin).create_namespaced_service(
        RUN_NS, service("stray", ["198.18.80.9"]), _request_timeout=REQUEST_TIMEOUT
    )
    (event, *_) = wait_until(
        lambda: [
            e
            for e in events_from(admin, "nodelb-agent", "stray")
            if e.reason == "ExternalIPRefused"
        ],
        WORK_DEADLINE,
        "an ExternalIPRefused Event from nodelb-agent",
    )
    assert event.type == "Warning"
    assert "198.18.80.9" in (event.message or "")
    assert readers.get(
        running.agent_ns, f"{AGENT_URL}/readyz", cert=running.agent_cert, token=None
    ) == (200, "ready\n")
    no_forbidden(cp_lab, running.agent)


def condition(admin: client.ApiClient, namespace: str, name: str, kind: str) -> str:
    """Return a Service condition as "status/reason" ("" when it is not set)."""
    svc = client.CoreV1Api(admin).read_namespaced_service(
        name, namespace, _request_timeout=REQUEST_TIMEOUT
    )
    for c in (svc.status.conditions if svc.status else None) or []:
        if c.type == kind:
            return f"{c.status}/{c.reason}"
    return ""


def logged(lab: Lab, proc: subprocess.Popen[bytes], text: str) -> Callable[[], bool]:
    """Return a predicate: has `proc` logged `text`?"""
    return lambda: text in lab.log_of(proc)


def test_controller_believes_no_forged_report_but_the_nodes_own(
    running: Running,
    admin: client.ApiClient,
    cp_lab: Lab,
    bound_agent: Callable[[str], client.ApiClient],
) -> None:
    core = client.CoreV1Api(admin)
    core.create_namespaced_service(
        RUN_NS, service("target", [], type="LoadBalancer"), _request_timeout=REQUEST_TIMEOUT
    )
    svc = client.CoreV1Api(admin).read_namespaced_service

    def ingress() -> list[str]:
        got = svc("target", RUN_NS, _request_timeout=REQUEST_TIMEOUT)
        lb = got.status.load_balancer if got.status else None
        return [i.ip for i in (lb.ingress if lb else None) or [] if i.ip]

    (ip,) = wait_until(ingress, WORK_DEADLINE, "an ingress IP on Service target")
    # What a compromised node would write if the policy were not installed (the admin is
    # not subject to it): a report for a node that does not exist, and one whose name and
    # holder disagree. Neither turns Serving True.
    coordination = client.CoordinationV1Api(admin)
    forged = [report("ghost", ips=(ip,)), report("node-8", holder="node-1", ips=(ip,))]
    for body in forged:
        coordination.create_namespaced_lease(NS, body, _request_timeout=REQUEST_TIMEOUT)
    try:
        for said in ("'ghost' not believed (UnknownNode)", "'node-1' not believed (Malformed)"):
            wait_until(logged(cp_lab, running.controller, said), WORK_DEADLINE, said)
        assert condition(admin, RUN_NS, "target", "LoadBalancerServing") == "False/Provisioning"
        # The node's own report, written with its own Pod-bound token, is believed.
        own = client.CoordinationV1Api(bound_agent("node-5"))
        own.create_namespaced_lease(
            NS, report("node-5", ips=(ip,), duration=60), _request_timeout=REQUEST_TIMEOUT
        )
        wait_until(
            lambda: condition(admin, RUN_NS, "target", "LoadBalancerServing") == "True/Serving",
            WORK_DEADLINE,
            "Serving=True once node-5 reports the address",
        )
    finally:
        for body in forged:
            coordination.delete_namespaced_lease(body["metadata"]["name"], NS)
        coordination.delete_namespaced_lease("nodelb-node-node-5", NS)


# -- (e) one node's token reaches only its own report ----------------------------------------


@pytest.fixture(scope="module")
def controller_lease(admin: client.ApiClient, installed: None) -> None:
    """Make sure the leader Lease exists (as the running controller's)."""
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="nodelb-controller"),
        spec=client.V1LeaseSpec(holder_identity="nodelb-controller-0", lease_duration_seconds=15),
    )
    try:
        client.CoordinationV1Api(admin).create_namespaced_lease(NS, lease)
    except ApiException as exc:
        if exc.status != 409:
            raise


def lease_refusal(call: Callable[[], object]) -> str:
    """Return the message of the 403 the Lease policy answers `call` with."""
    exc = refused(call)
    message = api_message(exc)
    assert exc.status == 403, message
    assert "ValidatingAdmissionPolicy 'nodelb-leases'" in message, message
    return message


def test_an_agent_writes_and_renews_its_own_report(
    installed: None, bound_agent: Callable[[str], client.ApiClient]
) -> None:
    coordination = client.CoordinationV1Api(bound_agent("node-3"))
    created: Any = coordination.create_namespaced_lease(
        NS, report("node-3", ips=("198.18.64.99",)), _request_timeout=REQUEST_TIMEOUT
    )
    version = created.metadata.resource_version
    for _ in range(2):  # renewals, as NodeReporter does them: read, then replace
        renewed: Any = coordination.replace_namespaced_lease(
            "nodelb-node-node-3",
            NS,
            report("node-3", ips=("198.18.64.99",), resource_version=version),
            _request_timeout=REQUEST_TIMEOUT,
        )
        assert renewed.metadata.resource_version != version
        version = renewed.metadata.resource_version
    assert renewed.spec.holder_identity == "node-3"


def test_an_agent_cannot_touch_the_controllers_lease(
    installed: None,
    controller_lease: None,
    bound_agent: Callable[[str], client.ApiClient],
    admin: client.ApiClient,
) -> None:
    coordination = client.CoordinationV1Api(bound_agent("node-3"))
    stolen: Any = coordination.read_namespaced_lease("nodelb-controller", NS)
    before = stolen.spec.holder_identity
    stolen.spec.holder_identity = "node-3"
    stolen.spec.lease_duration_seconds = 86400
    message = lease_refusal(
        lambda: coordination.replace_namespaced_lease(
            "nodelb-controller", NS, stolen, _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert "may write only the Lease nodelb-node-node-3, not nodelb-controller" in message
    for call in (
        lambda: coordination.patch_namespaced_lease(
            "nodelb-controller",
            NS,
            {"spec": {"holderIdentity": "node-3"}},
            _content_type="application/merge-patch+json",
        ),
        lambda: coordination.delete_namespaced_lease("nodelb-controller", NS),
    ):
        assert refused(call).status == 403  # RBAC: neither verb is granted
    stored: Any = client.CoordinationV1Api(admin).read_namespaced_lease("nodelb-controller", NS)
    assert stored.spec.holder_identity == before


def test_an_agent_cannot_report_for_another_node(
    installed: None, bound_agent: Callable[[str], client.ApiClient], admin: client.ApiClient
) -> None:
    coordination = client.CoordinationV1Api(bound_agent("node-3"))
    message = lease_refusal(
        lambda: coordination.create_namespaced_lease(
            NS, report("node-4", ips=("198.18.72.7",)), _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert "may write only the Lease nodelb-node-node-3, not nodelb-node-node-4" in message
    # Its own Lease's name, but held for another node: refused too.
    message = lease_refusal(
        lambda: coordination.create_namespaced_lease(
            NS, report("node-3", holder="node-4"), dry_run="All", _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert "must hold its report Lease as node-3" in message
    missing = refused(
        lambda: client.CoordinationV1Api(admin).read_namespaced_lease("nodelb-node-node-4", NS)
    )
    assert missing.status == 404


def test_an_agent_cannot_overwrite_another_nodes_report(
    installed: None, bound_agent: Callable[[str], client.ApiClient], admin: client.ApiClient
) -> None:
    victim = client.CoordinationV1Api(bound_agent("node-6"))
    created: Any = victim.create_namespaced_lease(
        NS, report("node-6", ips=("198.18.64.60",)), _request_timeout=REQUEST_TIMEOUT
    )
    attacker = client.CoordinationV1Api(bound_agent("node-3"))
    overwrite = report(
        "node-6", ips=("198.18.64.61",), resource_version=created.metadata.resource_version
    )
    message = lease_refusal(
        lambda: attacker.replace_namespaced_lease(
            "nodelb-node-node-6", NS, overwrite, _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert "may write only the Lease nodelb-node-node-3, not nodelb-node-node-6" in message
    stored: Any = client.CoordinationV1Api(admin).read_namespaced_lease("nodelb-node-node-6", NS)
    assert stored.metadata.resource_version == created.metadata.resource_version
    assert stored.metadata.annotations["nodelb.io/serving-ips"] == "198.18.64.60"


def test_a_token_bound_to_no_pod_writes_no_lease(
    installed: None, tokens: dict[str, client.ApiClient]
) -> None:
    unbound = client.CoordinationV1Api(tokens[AGENT])
    message = lease_refusal(
        lambda: unbound.create_namespaced_lease(
            NS, report("node-1"), dry_run="All", _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert "this token names no node" in message


def test_the_controller_writes_no_lease_but_its_own(
    installed: None, tokens: dict[str, client.ApiClient]
) -> None:
    controller = client.CoordinationV1Api(tokens[CONTROLLER])
    message = lease_refusal(
        lambda: controller.create_namespaced_lease(
            NS, report("node-2", ips=("198.18.72.9",)), _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert "the nodelb controller may write only the Lease nodelb-controller" in message


# -- (f) /metrics and /status: only a reader's token, checked by the real apiserver ----------


@pytest.fixture(scope="module")
def reader(controlplane: ControlPlane, admin: client.ApiClient, rbac: None) -> str:
    """Return a token of a ServiceAccount bound to nodelb-metrics-reader, as an operator binds
    Prometheus' (deploy/prometheus-scrape.yaml)."""
    token = controlplane.serviceaccount_token(NS, READER_SA)
    binding: Any = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": READER_SA},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "nodelb-metrics-reader",
        },
        "subjects": [{"kind": "ServiceAccount", "name": READER_SA, "namespace": NS}],
    }
    try:
        client.RbacAuthorizationV1Api(admin).create_cluster_role_binding(binding)
    except ApiException as exc:
        if exc.status != 409:
            raise
    return token


@dataclass(frozen=True, slots=True)
class Scrape:
    """One GET of a protected path and the answer the gate must give."""

    token: str  # "none", "garbage", "agent" (valid, no permission), "reader"
    path: str
    status: int


SCRAPES = [
    pytest.param(Scrape("none", "/metrics", 401), id="no token: 401"),
    pytest.param(Scrape("garbage", "/metrics", 401), id="a token the apiserver rejects: 401"),
    pytest.param(Scrape("agent", "/metrics", 403), id="a valid token without the grant: 403"),
    pytest.param(Scrape("agent", "/status", 403), id="status without the grant: 403"),
    pytest.param(Scrape("reader", "/metrics", 200), id="a reader's token: metrics"),
    pytest.param(Scrape("reader", "/status", 200), id="a reader's token: status"),
    pytest.param(Scrape("none", "/healthz", 200), id="liveness stays open for probes"),
]


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"], ids=["IPv4", "IPv6"])
@pytest.mark.parametrize("case", SCRAPES)
def test_the_agent_answers_only_a_reader_on_both_families(
    case: Scrape,
    host: str,
    running: Running,
    reader: str,
    controlplane: ControlPlane,
) -> None:
    token = {
        "none": None,
        "garbage": "eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl",
        "agent": controlplane.serviceaccount_token(NS, AGENT),
        "reader": reader,
    }[case.token]
    url = f"https://{host}:9472{case.path}"
    code, body = readers.get(running.agent_ns, url, cert=running.agent_cert, token=token)
    assert code == case.status, body
    if case.path == "/metrics" and code == 200:
        assert "nodelb_http_auth_total" in body
    if case.path == "/status" and code == 200:
        assert json.loads(body)["node"] == "node-1"
    if code != 200:
        assert "nodelb_" not in body  # not one metric leaks with the refusal


def test_the_controller_answers_only_a_reader(
    running: Running, reader: str, controlplane: ControlPlane
) -> None:
    get = functools.partial(readers.get, running.controller_ns, cert=running.controller_cert)
    for host in ("127.0.0.1", "[::1]"):
        url = f"https://{host}:9473/metrics"
        assert get(url, token=None)[0] == 401
        assert get(url, token=controlplane.serviceaccount_token(NS, CONTROLLER))[0] == 403
        code, body = get(url, token=reader)
        assert code == 200 and "nodelb_controller_leader" in body


def test_nodelb_status_reads_the_agent_with_a_token_file(
    running: Running, reader: str, tmp_path: Path, cp_lab: Lab
) -> None:
    """The command as an operator runs it on the node: the address from the agent's config,
    the token from a file, the agent's published certificate pinned."""
    config = tmp_path / "config.yaml"
    config.write_text(
        find(documents(MANIFESTS), "ConfigMap", "nodelb-config")["data"]["config.yaml"]
    )
    token = tmp_path / "token"
    token.write_text(reader)
    argv = [
        "env",
        f"PYTHONPATH={_REPO}",
        sys.executable,
        "-m",
        "agent.cli",
        "status",
        f"--config={config}",
        f"--token-file={token}",
        f"--agent-cert={running.agent_cert}",
        "--json",
    ]
    done = netns.run(running.agent_ns, argv, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["node"] == "node-1"
    token.write_text("garbage")
    refused_run = netns.run(running.agent_ns, argv, check=False, timeout=60)
    assert refused_run.returncode == 1
    assert "HTTP 401" in refused_run.stderr and "--token" in refused_run.stderr
