"""The Helm chart's renderings against a real kube-apiserver.

`helm template` with the defaults and with every documented value set
(deploy/helm/nodelb/ci/all-values.yaml) is applied with a server-side dry run and strict
field validation, as `kubectl apply --server-side` would send it, after the chart's CRDs are
installed for real. The prometheus-operator kinds (ServiceMonitor, PodMonitor,
PrometheusRule) are left out: their CRDs are not nodelb's and the lab apiserver has none.
The RBAC of the all-values rendering (another namespace) is applied for real and its tokens'
access to the pool objects reviewed: the defaults' RBAC is deploy/daemonset.yaml's
(tests/unit/test_chart.py), which tests/e2e/test_deploy.py reviews in full.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from lab import netns
from lab.controlplane import ControlPlane
from lab.helm import ALL_VALUES, CHART, helm_path, template
from lab.wait import wait_until
from tests.e2e.conftest import Kubectl

pytestmark = pytest.mark.e2e

FOREIGN = frozenset({"ServiceMonitor", "PodMonitor", "PrometheusRule"})
ALL_NS = "lb"
INSTALL_NS = "lb-installed"


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def crds(kubectl: Kubectl) -> Iterator[None]:
    """Install the chart's CRDs for real (as `helm install` does first) and wait for them."""
    for path in sorted((CHART / "crds").glob("*.yaml")):
        kubectl.apply(path.read_text())
    done = kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/loadbalancerippools.nodelb.io",
        "crd/announcementpolicies.nodelb.io",
    )
    assert done.returncode == 0, done.stderr
    yield


def dry_run(kubectl: Kubectl, objs: list[dict[str, Any]]) -> str:
    done = kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "--field-manager=chart-test",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(objs),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("args", "namespace"),
    [
        pytest.param((), "nodelb-system", id="defaults"),
        pytest.param(("-f", str(ALL_VALUES)), ALL_NS, id="every value set"),
    ],
)
def test_the_rendering_passes_a_strict_server_side_dry_run(
    args: tuple[str, ...], namespace: str, kubectl: Kubectl, crds: None
) -> None:
    objs = [d for d in docs(template(*args, namespace=namespace)) if d["kind"] not in FOREIGN]
    made = [d for d in objs if d["kind"] == "Namespace"]
    # Namespaced objects need their namespace to exist, even in a dry run.
    kubectl.apply(
        yaml.safe_dump(
            made[0]
            if made
            else {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    )
    out = dry_run(kubectl, objs)
    for d in objs:
        assert f"{d['metadata']['name']} serverside-applied (server dry run)" in out, out


@pytest.fixture(scope="module")
def all_values_rbac(
    kubectl: Kubectl, crds: None, controlplane: ControlPlane
) -> dict[str, client.ApiClient]:
    objs = docs(template("-f", str(ALL_VALUES), namespace=ALL_NS))
    kubectl.apply(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ALL_NS}})
    )
    rbac = [
        d
        for d in objs
        if d["kind"]
        in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    ]
    kubectl.apply(yaml.safe_dump_all(rbac))
    return {
        sa: controlplane.api_client(controlplane.serviceaccount_kubeconfig(ALL_NS, sa))
        for sa in ("nodelb-agent", "nodelb-controller")
    }


@pytest.mark.parametrize(
    ("sa", "verb", "subresource", "allowed"),
    [
        ("nodelb-agent", "list", "", True),
        ("nodelb-agent", "watch", "", True),
        ("nodelb-agent", "patch", "status", False),
        ("nodelb-agent", "update", "", False),
        ("nodelb-controller", "watch", "", True),
        ("nodelb-controller", "patch", "status", True),
        ("nodelb-controller", "update", "status", False),
        ("nodelb-controller", "delete", "", False),
    ],
)
def test_the_charts_tokens_in_another_namespace_have_the_pool_access_documented(
    sa: str,
    verb: str,
    subresource: str,
    allowed: bool,
    all_values_rbac: dict[str, client.ApiClient],
) -> None:
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb,
                group="nodelb.io",
                resource="loadbalancerippools",
                subresource=subresource,
            )
        )
    )

    def answer() -> bool | None:
        result = client.AuthorizationV1Api(all_values_rbac[sa]).create_self_subject_access_review(
            review
        )
        return None if result.status is None else bool(result.status.allowed)

    got = wait_until(
        lambda: answer() is allowed, 10.0, f"{sa} {verb} pools/{subresource} = {allowed}"
    )
    assert got


def test_helm_install_creates_the_crds_and_the_pool_objects(
    controlplane: ControlPlane, kubectl: Kubectl
) -> None:
    """A real `helm install` (no nodes run the pods here): the CRDs go in first, so the pool
    and policy objects of the same release are accepted; `helm uninstall` removes the
    objects and, as helm does, leaves the CRDs."""
    # The ClusterRoles have fixed names, so one release per cluster: the access tests above
    # applied them outside helm, and helm refuses to adopt objects it did not make.
    cleared = kubectl(
        "delete", "clusterrole,clusterrolebinding", "-l", "app.kubernetes.io/name=nodelb"
    )
    assert cleared.returncode == 0, cleared.stderr
    argv = [
        str(helm_path()),
        f"--kubeconfig={controlplane.admin_kubeconfig()}",
    ]
    install = netns.run(
        controlplane.ns,
        [
            *argv,
            "install",
            "nodelb",
            str(CHART),
            "--namespace",
            INSTALL_NS,
            "--create-namespace",
            "--set",
            "namespace.create=false",
            "-f",
            str(ALL_VALUES),
            *("--set", "metrics.serviceMonitor.enabled=false"),
            *("--set", "metrics.podMonitor.enabled=false"),
            *("--set", "metrics.prometheusRule.enabled=false"),
        ],
        check=False,
        timeout=120,
    )
    assert install.returncode == 0, install.stderr
    got = kubectl("get", "lbpool/web", "announcementpolicy/edge", "-o", "name")
    assert got.stdout.split() == [
        "loadbalancerippool.nodelb.io/web",
        "announcementpolicy.nodelb.io/edge",
    ], got.stderr
    shown = kubectl("get", "-n", INSTALL_NS, "daemonset/nodelb-agent", "-o", "name")
    assert shown.returncode == 0, shown.stderr
    gone = netns.run(
        controlplane.ns,
        [*argv, "uninstall", "nodelb", "--namespace", INSTALL_NS, "--wait"],
        check=False,
        timeout=120,
    )
    assert gone.returncode == 0, gone.stderr
    assert kubectl("get", "lbpool/web").returncode != 0
    assert kubectl("get", "crd/loadbalancerippools.nodelb.io").returncode == 0
