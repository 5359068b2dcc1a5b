"""The Helm chart (deploy/helm/nodelb), checked without a cluster.

One source of truth: deploy/daemonset.yaml and deploy/admission-policy.yaml are the chart
rendered with its defaults (scripts/render-deploy.sh), and this fails when they drift. `helm
lint` passes with the defaults and with every documented value set (ci/all-values.yaml);
values the schema refuses name the field; every optional object renders from the files that
are tested elsewhere (the promtool-tested rules, the dashboard), and the config file the chart
writes is one the agent's and the controller's own parsers accept. tests/e2e/test_chart.py
applies the renderings to a real apiserver.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.controller.config import ClusterAddresses, parse_controller_config
from lab.helm import ALL_VALUES, CHART, REPO, helm, helm_path, template


@pytest.fixture(scope="module", autouse=True)
def pinned_helm() -> Path:
    """Return the pinned helm; fails (not skips) when it was not built."""
    path = helm_path()
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm not found at {path}: run scripts/build-helm.sh (make setup does)")
    return path


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_all_in_one_manifests_are_the_chart_rendered_with_its_defaults(
    tmp_path: Path,
) -> None:
    subprocess.run(
        [str(REPO / "scripts" / "render-deploy.sh"), str(tmp_path)],
        check=True,
        timeout=120,
        env={**os.environ, "HELM": str(helm_path())},
    )
    for name in ("daemonset.yaml", "admission-policy.yaml"):
        rendered = (tmp_path / name).read_text()
        assert rendered == (REPO / "deploy" / name).read_text(), (
            f"deploy/{name} differs from the chart: edit deploy/helm/nodelb and run "
            "scripts/render-deploy.sh"
        )


@pytest.mark.parametrize(
    "values", [pytest.param((), id="defaults"), pytest.param(("-f", str(ALL_VALUES)), id="all")]
)
def test_helm_lint_passes(values: tuple[str, ...]) -> None:
    done = helm("lint", "--strict", str(CHART), *values)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_documented_value_reaches_its_object() -> None:
    objs = docs(template("-f", str(ALL_VALUES), namespace="lb"))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in objs}
    assert {
        ("LoadBalancerIPPool", "web"),
        ("AnnouncementPolicy", "edge"),
        ("Service", "nodelb-metrics"),
        ("ServiceMonitor", "nodelb"),
        ("PodMonitor", "nodelb"),
        ("PrometheusRule", "nodelb"),
        ("ConfigMap", "nodelb-grafana-dashboard"),
    } <= kinds
    assert not any(d["kind"] == "Namespace" for d in objs)  # namespace.create: false
    assert not any(d["kind"] == "ValidatingAdmissionPolicy" for d in objs)
    by = {(d["kind"], d["metadata"]["name"]): d for d in objs}
    agent = by["DaemonSet", "nodelb-agent"]["spec"]["template"]["spec"]
    controller = by["Deployment", "nodelb-controller"]
    assert agent["containers"][0]["image"] == "registry.example/nodelb:9.9.9"
    assert agent["containers"][0]["imagePullPolicy"] == "Always"
    assert agent["priorityClassName"] == "system-cluster-critical"
    assert agent["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "lb", "effect": "NoSchedule"}
    ]
    assert agent["containers"][0]["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    assert controller["spec"]["replicas"] == 3
    assert controller["spec"]["template"]["spec"]["tolerations"] == []
    assert all(d["metadata"].get("namespace", "lb") == "lb" for d in objs)
    rules = yaml.safe_load((REPO / "deploy" / "prometheus-rules.yaml").read_text())
    assert by["PrometheusRule", "nodelb"]["spec"] == rules
    assert by["PrometheusRule", "nodelb"]["metadata"]["labels"]["release"] == "prometheus"
    dashboard = by["ConfigMap", "nodelb-grafana-dashboard"]
    assert json.loads(dashboard["data"]["nodelb.json"]) == json.loads(
        (REPO / "deploy" / "grafana-dashboard.json").read_text()
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert by["LoadBalancerIPPool", "web"]["spec"]["autoAssign"] is False
    # The config file: no pools: key (pools are objects), read by both parsers as meant.
    raw = yaml.safe_load(by["ConfigMap", "nodelb-config"]["data"]["config.yaml"])
    assert "pools" not in raw
    agent_cfg = parse_config(raw)
    assert agent_cfg.pool_objects and agent_cfg.lb_class == "example.com/lb"
    assert agent_cfg.announce.interface == "eth1"
    assert agent_cfg.announce.report_namespace == "lb"
    assert parse_controller_config(raw, cluster=ClusterAddresses()).pool_objects


def test_the_default_config_keeps_the_file_pools() -> None:
    objs = docs(template())
    (cm,) = (d for d in objs if d["kind"] == "ConfigMap")
    raw = yaml.safe_load(cm["data"]["config.yaml"])
    cfg = parse_controller_config(raw, cluster=ClusterAddresses())
    assert not cfg.pool_objects and [p.name for p in cfg.pools.pools] == ["default"]
    empty = yaml.safe_load(
        next(d for d in docs(template("--set-json", "configPools=[]")) if d["kind"] == "ConfigMap")[
            "data"
        ]["config.yaml"]
    )
    assert empty["pools"] == []  # "allocate nothing", not "pools are objects"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("--set", "image.tagg=1"), "'tagg' not allowed", id="a misspelt key"),
        pytest.param(("--set", "image.tag="), "/image/tag", id="an empty image tag"),
        pytest.param(
            ("--set", "externalIPCIDRs={198.18.0.0}"), "/externalIPCIDRs/0", id="not a CIDR"
        ),
        pytest.param(
            ("--set", "controller.replicas=0"), "/controller/replicas", id="no controller"
        ),
        pytest.param(
            ("--set", "pools[0].name=Bad_Name", "--set", "pools[0].spec.addresses={198.18.0.0/24}"),
            "/pools/0/name",
            id="a pool name that cannot be an object name",
        ),
        pytest.param(
            ("--set", "pools[0].name=a", "--set", "pools[0].spec.addresses={pool-a}"),
            "/pools/0/spec/addresses/0",
            id="a pool address that is neither CIDR nor range",
        ),
        pytest.param(
            ("--set", "metrics.serviceMonitor.interval=often"),
            "/metrics/serviceMonitor/interval",
            id="an interval Prometheus cannot read",
        ),
        pytest.param(
            (
                "--set",
                "configPools[0].name=r",
                "--set",
                "configPools[0].addresses={198.18.72.1-198.18.72.9}",
            ),
            "is a range",
            id="a range pool with the admission policy on (it holds CIDRs only)",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_field(args: tuple[str, ...], says: str) -> None:
    done = helm("template", "nodelb", str(CHART), *args)
    assert done.returncode != 0, f"accepted: {args}"
    assert says in done.stderr, done.stderr


def test_the_chart_is_versioned_with_the_package_and_image() -> None:
    """The chart, its appVersion and the image tag move together (one release, one number)."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert (chart["version"], chart["appVersion"], values["image"]["tag"]) == (version,) * 3
