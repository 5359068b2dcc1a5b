"""Structural promises of the deployment manifests (deploy/*.yaml), checked without a cluster.

What docs/deploy.md says about the objects is checked here against the files: the agent's
exact capabilities and security context, probes on the port the process really listens on,
the node name from the downward API, container arguments the real CLI accepts, the sample
configuration parsed by the agent's own loaders, least-privilege RBAC equal to the documented
table, and the admission policy's CIDRs in step with the configuration. tests/e2e/test_deploy.py
proves the same files against a real apiserver.
"""

from __future__ import annotations

import ast
import ipaddress
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli import build_parser
from agent.config import parse_config
from agent.controller.config import ClusterAddresses, parse_controller_config
from agent.controller.finalizer import FINALIZER
from agent.http_server import parse_addresses
from agent.model.net import IPNetwork
from agent.model.pools import Forbidden, parse_pools

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NS = "nodelb-system"
IMAGE = "ghcr.io/nodelb/nodelb"
LAB_SPACE = (ipaddress.ip_network("198.18.0.0/15"), ipaddress.ip_network("2001:db8::/32"))
OWN_FILES = ("daemonset.yaml", "admission-policy.yaml")


def load(name: str) -> list[dict[str, Any]]:
    """Return the non-empty documents of deploy/`name`."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


MANIFESTS = load("daemonset.yaml")
POLICY_DOCS = load("admission-policy.yaml")


def obj(kind: str, name: str, docs: list[dict[str, Any]] = MANIFESTS) -> dict[str, Any]:
    """Return the one object of `kind` named `name`."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    """Return the pod template spec of a workload."""
    spec: dict[str, Any] = obj(kind, name)["spec"]["template"]["spec"]
    return spec


def container(kind: str, name: str) -> dict[str, Any]:
    """Return the single container of a workload."""
    (c,) = pod_spec(kind, name)["containers"]
    return dict(c)


AGENT = ("DaemonSet", "nodelb-agent")
CONTROLLER = ("Deployment", "nodelb-controller")
WORKLOADS = [pytest.param(AGENT, id="agent"), pytest.param(CONTROLLER, id="controller")]


def config_text() -> str:
    """Return the config file the ConfigMap carries."""
    data: dict[str, str] = obj("ConfigMap", "nodelb-config")["data"]
    return data["config.yaml"]


def config_raw() -> dict[str, Any]:
    """Return the parsed config document of the ConfigMap."""
    raw: dict[str, Any] = yaml.safe_load(config_text())
    return raw


def arg_value(args: list[str], flag: str) -> str | None:
    """Return the value of `--flag=value` (or `--flag value`) in `args`, else None."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def lab_safe(nets: Iterable[IPNetwork]) -> list[str]:
    """Return the networks (as text) that are not inside the lab's address space."""
    return [
        str(n)
        for n in nets
        if not any(n.version == s.version and n.subnet_of(s) for s in LAB_SPACE)  # type: ignore[arg-type]
    ]


# -- every file -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
def test_every_yaml_file_in_deploy_parses_into_mappings(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path.name} holds no document"
    assert all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("name", OWN_FILES)
def test_every_object_is_labelled_and_namespaced_in_nodelb_system(name: str) -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for d in load(name):
        where = f"{d['kind']} {d['metadata']['name']}"
        assert d["metadata"]["labels"]["app.kubernetes.io/name"] == "nodelb", where
        if d["kind"] in cluster_scoped:
            assert "namespace" not in d["metadata"], where
        else:
            assert d["metadata"]["namespace"] == NS, where


def test_the_manifests_hold_exactly_the_documented_objects() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in MANIFESTS + POLICY_DOCS)
    assert kinds == sorted(
        [
            ("Namespace", NS),
            ("ServiceAccount", "nodelb-agent"),
            ("ServiceAccount", "nodelb-controller"),
            ("ClusterRole", "nodelb-agent"),
            ("ClusterRoleBinding", "nodelb-agent"),
            ("Role", "nodelb-agent"),
            ("RoleBinding", "nodelb-agent"),
            ("ClusterRole", "nodelb-controller"),
            ("ClusterRoleBinding", "nodelb-controller"),
            ("ClusterRole", "nodelb-metrics-reader"),
            ("Role", "nodelb-controller"),
            ("RoleBinding", "nodelb-controller"),
            ("ConfigMap", "nodelb-config"),
            ("DaemonSet", "nodelb-agent"),
            ("Deployment", "nodelb-controller"),
            ("PodDisruptionBudget", "nodelb-controller"),
            ("ValidatingAdmissionPolicy", "nodelb-externalips"),
            ("ValidatingAdmissionPolicyBinding", "nodelb-externalips"),
            ("ValidatingAdmissionPolicy", "nodelb-leases"),
            ("ValidatingAdmissionPolicyBinding", "nodelb-leases"),
            ("ValidatingAdmissionPolicy", "nodelb-controller-services"),
            ("ValidatingAdmissionPolicyBinding", "nodelb-controller-services"),
        ]
    )
    # The Namespace comes first so that one `kubectl apply -f` creates it before its objects.
    assert MANIFESTS[0]["kind"] == "Namespace"


def test_namespace_admits_the_privileged_agent() -> None:
    labels = obj("Namespace", NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


# -- the agent DaemonSet ----------------------------------------------------------------------


def test_agent_adds_exactly_net_admin_net_raw_and_sys_nice_and_drops_the_rest() -> None:
    sc = container(*AGENT)["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    # SYS_NICE: the speaker's SCHED_RR, on by default (announce.realtimePriority).
    assert sorted(sc["capabilities"]["add"]) == ["NET_ADMIN", "NET_RAW", "SYS_NICE"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # Root, as docs/deploy.md explains: added capabilities are not effective for non-root.
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False


def test_agent_runs_on_every_node_in_the_host_network() -> None:
    spec = pod_spec(*AGENT)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"] == "nodelb-agent"
    # An Exists toleration without a key tolerates every taint, control-plane ones included.
    assert {"operator": "Exists"} in spec["tolerations"]
    strategy = obj(*AGENT)["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def test_agent_node_name_comes_from_the_downward_api() -> None:
    env = {e["name"]: e for e in container(*AGENT)["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert arg_value(container(*AGENT)["args"], "--node-name") is None  # $NODE_NAME is used


def test_agent_arguments_are_accepted_by_the_real_cli() -> None:
    args = build_parser().parse_args(container(*AGENT)["args"])
    assert args.command == "agent"
    assert args.kubeconfig is None  # in-cluster credentials


# -- both workloads ---------------------------------------------------------------------------


def listen_port(c: dict[str, Any]) -> int:
    """Return the port the process serves /healthz on: --metrics-address, else the config's."""
    address = arg_value(c["args"], "--metrics-address")
    if address is None:
        address = parse_config(config_raw()).metrics_address
    listens = parse_addresses(address)
    # Both families, on one port (agent/http_server.py opens a socket per address).
    assert sorted(h for h, _ in listens) == ["0.0.0.0", "::"], address
    (port,) = {p for _, p in listens}
    return port


@pytest.mark.parametrize("workload", WORKLOADS)
def test_probes_reach_the_port_the_process_listens_on(workload: tuple[str, str]) -> None:
    c = container(*workload)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    expected = listen_port(c)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert get["scheme"] == "HTTPS"  # the endpoint speaks only TLS
        port = get["port"]
        assert ports.get(port, port) == expected, f"{probe} port {port} is not {expected}"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_config_file_argument_points_into_the_mounted_configmap(workload: tuple[str, str]) -> None:
    c = container(*workload)
    path = Path(arg_value(c["args"], "--config") or "")
    volumes = {v["name"]: v for v in pod_spec(*workload)["volumes"]}
    mounts = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    assert len(mounts) == 1, f"nothing mounted at {path.parent}"
    assert mounts[0]["readOnly"] is True
    assert volumes[mounts[0]["name"]]["configMap"]["name"] == "nodelb-config"
    assert path.name in obj("ConfigMap", "nodelb-config")["data"]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_workloads_use_the_release_image_with_requests_and_limits(
    workload: tuple[str, str],
) -> None:
    c = container(*workload)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert c["image"] == f"{IMAGE}:{version}"
    resources = c["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert "memory" in resources["limits"]
    # /tmp is the only writable path; the root filesystem is read-only.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


# -- the controller Deployment ----------------------------------------------------------------


def test_controller_runs_two_non_root_replicas_without_capabilities() -> None:
    deployment = obj(*CONTROLLER)
    assert deployment["spec"]["replicas"] == 2
    spec = pod_spec(*CONTROLLER)
    assert spec["serviceAccountName"] == "nodelb-controller"
    assert spec.get("hostNetwork", False) is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    sc = container(*CONTROLLER)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False


def test_controller_arguments_are_accepted_by_the_real_cli() -> None:
    args = build_parser().parse_args(container(*CONTROLLER)["args"])
    assert args.command == "controller"
    assert args.kubeconfig is None  # in-cluster credentials
    # The kubelet expands $(POD_NAMESPACE) from the env entry below, and the leader-election
    # identity falls back to $POD_NAME: both come from the downward API.
    assert args.namespace == "$(POD_NAMESPACE)"
    assert args.identity is None
    env = {e["name"]: e for e in container(*CONTROLLER)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


# -- the configuration ------------------------------------------------------------------------


def test_configmap_config_parses_with_the_agent_loader_and_pool_parser() -> None:
    raw = config_raw()
    cfg = parse_config(raw)
    assert cfg.pools, "the sample configures a pool"
    assert cfg.external_ip_cidrs
    assert cfg.service_cidrs
    pools = parse_pools(raw["pools"], forbidden=Forbidden(service_cidrs=cfg.service_cidrs))
    assert pools is not None and pools.pools
    assert {p.name for p in pools.pools} == {p.name for p in cfg.pools}
    assert lab_safe(pools.networks()) == []
    assert lab_safe(cfg.external_ip_cidrs) == []
    assert {p.families() for p in pools.pools} == {frozenset({4, 6})}
    assert lab_safe(cfg.service_cidrs) == []


def test_configmap_config_parses_with_the_controller_loader() -> None:
    controller = parse_controller_config(config_raw(), cluster=ClusterAddresses())
    assert controller.pools is not None
    assert [p.name for p in controller.pools.pools] == ["default"]


# -- RBAC -------------------------------------------------------------------------------------

Rule = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "")


def rules(kind: str, name: str) -> set[Rule]:
    """Return the (group, resource, verb, resourceName) a (Cluster)Role grants."""
    out: set[Rule] = set()
    for r in obj(kind, name)["rules"]:
        assert "nonResourceURLs" not in r
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    for n in r.get("resourceNames") or [""]:
                        assert "*" not in (g, res, v, n), f"{kind} {name} uses a wildcard"
                        out.add((g, res, v, n))
    return out


def triples(group: str, resource: str, verbs: str, name: str = "") -> set[Rule]:
    """Return one rule per space-separated verb (on the object `name` only, when given)."""
    return {(group, resource, v, name) for v in verbs.split()}


# /metrics and /status: who is the bearer, and may it get the path (agent/kube/reviews.py).
REVIEWS = triples("authentication.k8s.io", "tokenreviews", "create") | triples(
    "authorization.k8s.io", "subjectaccessreviews", "create"
)

EXPECTED_RULES: dict[tuple[str, str], set[Rule]] = {
    ("ClusterRole", "nodelb-agent"): triples("", "services", "list watch")
    | triples("discovery.k8s.io", "endpointslices", "list watch")
    | triples("", "nodes", "get list watch")
    | triples("nodelb.io", "loadbalancerippools", "list watch")
    | triples("", "events", "create patch")
    | REVIEWS,
    # Which Leases each agent writes is the admission policy nodelb-leases' job.
    ("Role", "nodelb-agent"): triples(
        "coordination.k8s.io", "leases", "get list watch create update"
    ),
    # patch on services: the cleanup finalizer only, as the policy nodelb-controller-services
    # enforces (test_the_controller_policy_lets_it_change_only_the_cleanup_finalizer).
    ("ClusterRole", "nodelb-controller"): triples("", "services", "list watch patch")
    | triples("", "services/status", "get update patch")
    | triples("", "nodes", "list watch")
    | triples("nodelb.io", "loadbalancerippools", "list watch")
    | triples("nodelb.io", "loadbalancerippools/status", "patch")
    | triples("", "namespaces", "list watch")
    | triples("discovery.k8s.io", "endpointslices", "list watch")
    | triples("", "events", "create patch")
    | REVIEWS,
    ("Role", "nodelb-controller"): triples("coordination.k8s.io", "leases", "create list watch")
    | triples("coordination.k8s.io", "leases", "get update", "nodelb-controller"),
}


@pytest.mark.parametrize(
    "role", [pytest.param(k, id=f"{k[0]} {k[1]}") for k in EXPECTED_RULES], ids=str
)
def test_roles_grant_exactly_the_documented_permissions(role: tuple[str, str]) -> None:
    granted = rules(*role)
    expected = EXPECTED_RULES[role]
    assert granted == expected, (
        f"extra: {sorted(granted - expected)}; missing: {sorted(expected - granted)}"
    )
    if role[0] == "Role":
        assert obj(*role)["metadata"]["namespace"] == NS


@pytest.mark.parametrize(
    "binding",
    [
        ("ClusterRoleBinding", "nodelb-agent"),
        ("RoleBinding", "nodelb-agent"),
        ("ClusterRoleBinding", "nodelb-controller"),
        ("RoleBinding", "nodelb-controller"),
    ],
    ids=lambda b: f"{b[0]} {b[1]}",
)
def test_each_binding_gives_its_role_to_its_own_service_account_only(
    binding: tuple[str, str],
) -> None:
    kind, name = binding
    doc = obj(kind, name)
    assert doc["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": kind.removesuffix("Binding"),
        "name": name,
    }
    assert doc["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NS}]


# -- the admission policy ---------------------------------------------------------------------


def policy_list(name: str) -> list[IPNetwork]:
    """Return the CIDRs of the policy variable `name` (a CEL list of string literals)."""
    policy = obj("ValidatingAdmissionPolicy", "nodelb-externalips", POLICY_DOCS)
    (var,) = (v for v in policy["spec"]["variables"] if v["name"] == name)
    # A CEL list of single-quoted strings is also a Python literal.
    values = ast.literal_eval(var["expression"])
    assert isinstance(values, list) and all(isinstance(v, str) for v in values)
    return [ipaddress.ip_network(v) for v in values]


def covered(nets: Iterable[IPNetwork]) -> set[str]:
    """Return the collapsed form of `nets` per family, to compare address sets."""
    out: set[str] = set()
    nets = list(nets)
    for version in (4, 6):
        same = [n for n in nets if n.version == version]
        out |= {str(n) for n in ipaddress.collapse_addresses(same)}  # type: ignore[type-var]
    return out


def test_policy_cidrs_equal_the_configured_external_ip_cidrs_and_pools() -> None:
    cfg = parse_config(config_raw())
    allowed, pooled = policy_list("allowedCIDRs"), policy_list("poolCIDRs")
    assert covered(allowed) == covered(cfg.external_ip_cidrs)
    assert covered(pooled) == covered(n for p in cfg.pools for n in p.networks)
    assert lab_safe(allowed + pooled) == []


def test_policy_checks_service_writes_and_exempts_the_admin_groups() -> None:
    policy = obj("ValidatingAdmissionPolicy", "nodelb-externalips", POLICY_DOCS)
    spec = policy["spec"]
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["services"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    exempt = " ".join(c["expression"] for c in spec["matchConditions"])
    for group in ("system:masters", "nodelb:externalip-admins"):
        assert f"'{group}'" in exempt
    for validation in spec["validations"]:
        assert "messageExpression" in validation and validation["reason"] == "Forbidden"
    binding = obj("ValidatingAdmissionPolicyBinding", "nodelb-externalips", POLICY_DOCS)
    assert binding["spec"] == {"policyName": "nodelb-externalips", "validationActions": ["Deny"]}


def test_the_lease_policy_binds_both_service_accounts_to_their_own_leases() -> None:
    policy = obj("ValidatingAdmissionPolicy", "nodelb-leases", POLICY_DOCS)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": NS}
    }
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    (match,) = spec["matchConditions"]
    for sa in ("nodelb-agent", "nodelb-controller"):
        assert f"'system:serviceaccount:{NS}:{sa}'" in match["expression"]
    node = next(v for v in spec["variables"] if v["name"] == "node")
    assert "'authentication.kubernetes.io/node-name'" in node["expression"]
    binding = obj("ValidatingAdmissionPolicyBinding", "nodelb-leases", POLICY_DOCS)
    assert binding["spec"] == {"policyName": "nodelb-leases", "validationActions": ["Deny"]}


def test_the_controller_policy_lets_it_change_only_the_cleanup_finalizer() -> None:
    policy = obj("ValidatingAdmissionPolicy", "nodelb-controller-services", POLICY_DOCS)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # Updates of the Service itself only: services/status is the controller's to write.
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        [""],
        ["services"],
        ["UPDATE"],
    )
    (match,) = spec["matchConditions"]
    assert f"'system:serviceaccount:{NS}:nodelb-controller'" in match["expression"]
    (validation,) = spec["validations"]
    for kept in ("object.spec == oldObject.spec", "labels", "annotations", "owners"):
        assert kept in validation["expression"]
    finalizers = " ".join(v["expression"] for v in spec["variables"])
    assert f"'{FINALIZER}'" in finalizers  # the one finalizer it may change
    assert validation["reason"] == "Forbidden"
    binding = obj("ValidatingAdmissionPolicyBinding", "nodelb-controller-services", POLICY_DOCS)
    assert binding["spec"] == {
        "policyName": "nodelb-controller-services",
        "validationActions": ["Deny"],
    }


def test_the_default_install_applies_every_manifest_and_every_policy() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    # The admission policies are not optional extras: without nodelb-externalips kube-proxy
    # serves refused externalIPs (CVE-2020-8554), without nodelb-leases nodes forge reports,
    # without nodelb-controller-services the controller's token may rewrite any Service.
    assert kustomization["resources"] == list(OWN_FILES)
    readme = (ROOT / "README.md").read_text()
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    for text in (readme, deploy_doc):
        assert "kubectl apply --server-side -k deploy/" in text


def test_the_metrics_reader_role_grants_get_on_the_two_protected_paths_only() -> None:
    role = obj("ClusterRole", "nodelb-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics", "/status"], "verbs": ["get"]}]
    bound = [d for d in MANIFESTS if d.get("roleRef", {}).get("name") == "nodelb-metrics-reader"]
    assert bound == []  # granted by the operator to its readers, to nobody by default


def test_the_prometheus_example_scrapes_over_tls_with_its_token() -> None:
    (doc,) = load("prometheus-scrape.yaml")
    jobs = doc["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["nodelb-agent", "nodelb-controller"]
    for job in jobs:
        assert job["scheme"] == "https"
        assert job["authorization"]["credentials_file"].endswith("serviceaccount/token")
    assert "nodelb-metrics-reader" in (DEPLOY / "prometheus-scrape.yaml").read_text()
    # The same jobs as docs/metrics.md's scrape configuration (which promtool checks).
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text[text.index("## Scraping") :]
    documented = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert documented["scrape_configs"] == jobs
