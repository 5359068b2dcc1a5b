"""A real-node lab that fails half way leaves the host as it found it.

The failure comes after nodelb is installed, so every kind of host state exists when it
strikes: kubelets and containerd with running containers, pod volumes and root filesystems
mounted, pod network namespaces, cgroups in every hierarchy, the sysctls kubelet rewrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import hoststate, netns
from lab.kubelet import NODES_ROOT
from lab.realnodes import RealNodeCluster, leftovers
from lab.topology import LabSpec


class FailsAfterInstall(RealNodeCluster):
    """A real-node lab whose bring-up fails once nodelb runs on every node."""

    def install(self) -> None:
        super().install()
        self.mounted_at_failure = hoststate.mounts_under(
            Path("/proc/self/mountinfo").read_text(), [NODES_ROOT / self.lab.prefix]
        )
        self.pids_at_failure = {
            p for rt in self._runtimes for p in hoststate.cgroup_pids(rt.paths.cgroup)
        }
        raise RuntimeError("injected failure after the install")


def test_a_bring_up_that_fails_after_the_install_leaves_nothing_behind(tmp_path: Path) -> None:
    sysctls = hoststate.read_sysctls(hoststate.KUBELET_SYSCTLS)
    spec = LabSpec(nodes=2, pods_per_node=0, with_client=False, with_router=True)
    cluster = FailsAfterInstall(spec, tmp_path)
    with pytest.raises(RuntimeError, match="injected failure"):
        cluster.up()
    # What there was to clean up: containers ran, and their mounts were there.
    assert any("/containerd/state/" in m for m in cluster.mounted_at_failure)
    assert any("/kubelet/pods/" in m for m in cluster.mounted_at_failure)
    assert len(cluster.pids_at_failure) > 6
    # ... and it is all gone: mounts, directories, cgroups, namespaces, sysctls, processes.
    assert leftovers([cluster.lab.prefix]) == []
    assert not [ns for ns in cluster.lab.namespaces if netns.exists(ns)]
    assert not any(e.name.startswith(cluster.lab.prefix) for e in netns.NETNS_DIR.iterdir())
    assert hoststate.read_sysctls(hoststate.KUBELET_SYSCTLS) == sysctls
    alive = [pid for pid in cluster.pids_at_failure if Path(f"/proc/{pid}").exists()]
    assert alive == []
