"""A real kubelet for one lab node: its configuration, credentials and command line.

The node is a network namespace; kubelet runs in it with `nsenter --net` (see
`lab.noderuntime`), sharing the host's mount namespace so the volumes it mounts are visible
to containerd and runc. Everything it owns lives under the node's directory: root dir,
certificates, pod logs. The settings below are the ones this machine needs (cgroup v1 in
hybrid mode, no CAP_SYS_RESOURCE) and the ones that keep several kubelets apart on one host.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Any

from lab.topology import LabNode

# Every real node's directory is below this one (`<prefix>/<node>`): kubelet's and
# containerd's files and every mount they make, so teardown and the test session's end check
# find exactly the lab's mounts.
NODES_ROOT = Path("/var/lib/nodelb-lab")
KUBELET_PORT = 10250
HEALTHZ_PORT = 10248
ZONE_LABEL = "topology.kubernetes.io/zone"


@dataclass(frozen=True, slots=True)
class NodePaths:
    """Where one lab node keeps what its kubelet and containerd write.

    `base` is the node's own directory; every mount the node makes is below it, so teardown
    can unmount exactly what it owns. `cgroup` is the node's cgroup (in every hierarchy).
    """

    base: Path
    cgroup: str

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "kubelet.kubeconfig"

    @property
    def containerd_root(self) -> Path:
        return self.base / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd" / "state"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd" / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def shim_socket_dir(self) -> Path:
        """Where the node's shims put their sockets (containerd allows at most 42 characters)."""
        return self.base / "s"

    @property
    def runc_root(self) -> Path:
        """runc's state directory for the node's containers (its default is host-wide)."""
        return self.base / "containerd" / "runc"

    @property
    def netns_dir(self) -> Path:
        """Where containerd bind-mounts its pods' network namespaces (not /run/netns)."""
        return self.base / "netns"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        """host-local IPAM's allocations, per node (its default is host-wide)."""
        return self.base / "cni" / "ipam"


def kubelet_configuration(
    node: LabNode, paths: NodePaths, *, client_ca: Path, cluster_dns: list[str] | None = None
) -> dict[str, Any]:
    """Return the KubeletConfiguration (v1beta1) for `node` as a plain dict.

    - cgroup v1 (hybrid) here: `failCgroupV1: false`, the cgroupfs driver, and the node's own
      cgroupRoot, made beforehand in every hierarchy, so the kubelets' pods never mix;
    - no CAP_SYS_RESOURCE: `oomScoreAdj: 0` (kubelet would lower its own to -999 and fail);
    - each node's own root dir, pod logs and endpoints; the node's address for the API port;
    - no DNS from the host (`resolvConf: ""`): pods get only what `cluster_dns` says;
    - disk eviction and image GC effectively off: the lab's nodes share one disk and images
      are imported, never pulled again.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": str(node.ip4),
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{paths.cgroup}",
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "podLogsDir": str(paths.pod_logs),
        "resolvConf": "",
        "clusterDomain": "cluster.local",
        "clusterDNS": list(cluster_dns or []),
        "protectKernelDefaults": False,
        "serializeImagePulls": False,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 50,
        # Heartbeats every 4 s; the lab's node lifecycle controller gives up after 16 s, so a
        # node powered off has its pods out of the EndpointSlices in seconds, not a minute.
        "nodeStatusUpdateFrequency": "4s",
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": True,
        "containerLogMaxSize": "5Mi",
        "containerLogMaxFiles": 2,
    }


def kubelet_argv(
    binary: Path,
    node: LabNode,
    paths: NodePaths,
    *,
    node_ip6: IPv6Address | None = None,
    node_ip4: IPv4Address | None = None,
) -> list[str]:
    """Return kubelet's command line for `node` (config file and kubeconfig already written).

    The zone label is one kubelet may set on its own Node under NodeRestriction.
    """
    ip4 = node_ip4 or node.ip4
    ip6 = node_ip6 or node.ip6
    return [
        str(binary),
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={paths.kubeconfig}",
        f"--root-dir={paths.kubelet_root}",
        f"--cert-dir={paths.kubelet_root / 'pki'}",
        f"--hostname-override={node.name}",
        f"--node-ip={ip4},{ip6}",
        f"--node-labels={ZONE_LABEL}={node.zone}",
        "--v=1",
    ]
