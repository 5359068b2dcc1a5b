"""End-to-end fixtures: a real etcd + kube-apiserver on a lab segment, and a lab cluster.

`cp_lab` is a small lab (one node, no pods, no client) whose control-plane host carries the
apiserver; `cp_host` says where the control plane lives, `controlplane` starts etcd and
kube-apiserver there. `cluster` is a full `ClusterLab` (3 nodes in two zones, 2 pods each,
real kube-proxy in nftables mode, a nodelb agent per node) with its own control plane; a test
module can override `cluster_agent_config` to configure the agents. All are module-scoped, so
only one control plane runs at a time. When any test fails, the last lines of every control
plane, kube-proxy and agent log are printed at the end of the run (the files are kept).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from lab import binaries, netns
from lab.cluster import ClusterLab
from lab.controlplane import ControlPlane
from lab.topology import Host, Lab, LabSpec
from tests.conftest import LOGS

CLUSTER_SPEC = LabSpec(nodes=3, pods_per_node=2, zones=("zone-a", "zone-b"))


@pytest.fixture(scope="module")
def cp_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Yield a minimal lab (control plane, one node, no client) for the control plane."""
    lab = Lab(
        LabSpec(nodes=1, pods_per_node=0, with_client=False), tmp_path_factory.mktemp("cp-lab")
    )
    with lab:
        yield lab


@pytest.fixture(scope="module")
def cp_host(cp_lab: Lab) -> Host:
    """Return the lab host the control plane runs on: 198.18.0.2 on the lab segment."""
    assert cp_lab.controlplane is not None
    return cp_lab.controlplane


@pytest.fixture(scope="module")
def controlplane(
    cp_host: Host, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[ControlPlane]:
    """Yield a started control plane on `cp_host`; stopped (by PID) at the end of the module."""
    cp = ControlPlane(cp_host.ns, cp_host.ip4, tmp_path_factory.mktemp("controlplane"))
    pytestconfig.stash.setdefault(LOGS, []).extend(cp.logs)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def cluster_agent_config() -> dict[str, Any]:
    """Return the agents' configuration on top of the cluster defaults (override per module)."""
    return {}


@pytest.fixture(scope="module")
def cluster(
    cluster_agent_config: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[ClusterLab]:
    """Yield a running lab cluster: node-1 zone-a, node-2 zone-b, node-3 zone-a, 2 pods each,
    kube-proxy (nftables) and a nodelb agent on every node; always torn down.

    NODELB_E2E_KUBE_PROXY=0 leaves kube-proxy out, so nodelb alone carries every check."""
    lab = ClusterLab(
        CLUSTER_SPEC,
        tmp_path_factory.mktemp("cluster"),
        agent_config=cluster_agent_config,
        kube_proxy=os.environ.get("NODELB_E2E_KUBE_PROXY", "1") != "0",
    )
    pytestconfig.stash.setdefault(LOGS, []).extend(lab.logs)
    with lab:
        yield lab


@dataclass(frozen=True, slots=True)
class Kubectl:
    """The lab's kubectl, run inside the control-plane namespace as the admin user."""

    ns: str
    argv: tuple[str, ...]

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Return the finished kubectl run (never raises on a non-zero exit)."""
        return netns.run(self.ns, [*self.argv, *args], input=stdin, check=False, timeout=60)

    def apply(self, text: str) -> None:
        """Server-side apply `text` for real; fail the test with kubectl's stderr otherwise."""
        done = self("apply", "--server-side", "--field-manager=deploy-test", "-f", "-", stdin=text)
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def kubectl(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """Return kubectl for the lab apiserver (its discovery cache in a temporary directory)."""
    cache = tmp_path_factory.mktemp("kubectl-cache")
    return Kubectl(
        controlplane.ns,
        (
            str(binaries.binary("kubectl")),
            f"--kubeconfig={controlplane.admin_kubeconfig()}",
            f"--cache-dir={cache}",
            "--request-timeout=10s",
        ),
    )
