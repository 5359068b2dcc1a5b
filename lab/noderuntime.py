"""containerd and kubelet inside one lab node: configuration (pure) and processes (shell).

Each node namespace gets its own containerd (root, state, socket, CNI configuration, pod
network namespaces, all under the node's directory) and its own kubelet. Both are started
with `nsenter --net`, not `ip netns exec`: the latter gives them a private mount namespace,
and kubelet's volume mounts must be visible to containerd and runc. Both are placed in the
node's cgroup first, so every process of the node (shims and containers included) can be
found and stopped there, and a "powered off" node is exactly that cgroup killed.

Pods get addresses from the node's pod CIDRs through Debian's CNI plugins (bridge on the
node's cbr0, host-local IPAM with its data kept per node); their routes cover the lab space
only, never a default route.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Any

from lab import hoststate, netns
from lab.kubelet import NodePaths
from lab.topology import LAB_SPACE4, LAB_SPACE6, LabNode, gateway_addresses

CNI_BIN_DIR = Path("/usr/lib/cni")
# libcni's cache of each attachment's result: host-wide, not configurable through containerd.
CNI_CACHE_DIR = Path("/var/lib/cni/results")
CNI_NETWORK = "lab-pods"
NETNS_DIR = Path("/run/netns")
K8S_NAMESPACE = "k8s.io"


def _toml_str(value: str) -> str:
    """Return `value` as a TOML basic string (JSON's escapes are TOML's for these paths)."""
    return json.dumps(value)


def containerd_config(paths: NodePaths, *, runc: Path, sandbox_image: str, cni_bin: Path) -> str:
    """Return containerd's config.toml (version 3, containerd 2.x) for one lab node.

    Every path a containerd writes is the node's own; NRI is off (its socket path is
    host-wide and would clash between nodes); runc is the pinned build; the CRI runtime
    keeps its OOM score at or above containerd's (no CAP_SYS_RESOURCE here, so lowering it
    fails); pod network namespaces are mounted under the node's state directory instead of
    the host-wide /run/netns.
    """
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc_rt = f"{runtime}.containerd.runtimes.runc"
    lines = [
        "version = 3",
        f"root = {_toml_str(str(paths.containerd_root))}",
        f"state = {_toml_str(str(paths.containerd_state))}",
        f"temp = {_toml_str(str(paths.base / 'containerd' / 'tmp'))}",
        "disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.internal.v1.tracing']",
        "oom_score = 0",
        "",
        "[grpc]",
        f"  address = {_toml_str(str(paths.containerd_socket))}",
        "",
        # Shim sockets go to /run/containerd/s unless told, where a SIGKILLed shim leaves
        # its socket behind; under the node's directory they go with it.
        "[plugins.'io.containerd.shim.v1.manager']",
        f"  socket_dir = {_toml_str(str(paths.shim_socket_dir))}",
        "",
        "[plugins.'io.containerd.internal.v1.opt']",
        f"  path = {_toml_str(str(paths.base / 'containerd' / 'opt'))}",
        "",
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = {_toml_str(sandbox_image)}",
        "",
        f"[{runtime}]",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  enable_selinux = false",
        f"[{runtime}.cni]",
        f"  bin_dirs = [{_toml_str(str(cni_bin))}]",
        f"  conf_dir = {_toml_str(str(paths.cni_conf_dir))}",
        "  max_conf_num = 1",
        f"[{runtime}.containerd]",
        "  default_runtime_name = 'runc'",
        f"[{runc_rt}]",
        "  runtime_type = 'io.containerd.runc.v2'",
        f"[{runc_rt}.options]",
        f"  BinaryName = {_toml_str(str(runc))}",
        f"  Root = {_toml_str(str(paths.runc_root))}",
        "  SystemdCgroup = false",
        "",
    ]
    return "\n".join(lines)


def cni_conflist(
    node_index: int, cidr4: IPv4Network, cidr6: IPv6Network, paths: NodePaths
) -> dict[str, Any]:
    """Return the node's CNI network: a bridge on cbr0, host-local IPAM in its pod CIDRs.

    Addresses start at .10 (below are the gateway and spare); routes cover the lab space
    only; no masquerade (kube-proxy and nodelb decide about source NAT).
    """
    gw4, gw6 = gateway_addresses(node_index)
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cbr0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(paths.cni_data_dir),
                    "ranges": [
                        [
                            {
                                "subnet": str(cidr4),
                                "rangeStart": str(cidr4.network_address + 10),
                                "gateway": str(gw4),
                            }
                        ],
                        [
                            {
                                "subnet": str(cidr6),
                                "rangeStart": str(cidr6.network_address + 10),
                                "gateway": str(gw6),
                            }
                        ],
                    ],
                    "routes": [{"dst": str(LAB_SPACE4)}, {"dst": str(LAB_SPACE6)}],
                },
            }
        ],
    }


def write_node_files(
    node_index: int,
    node: LabNode,
    paths: NodePaths,
    *,
    runc: Path,
    sandbox_image: str,
    cni_bin: Path = CNI_BIN_DIR,
) -> None:
    """Create the node's directories and write containerd's config and the CNI network."""
    for d in (
        paths.base,
        paths.kubelet_root,
        paths.pod_logs,
        paths.containerd_root,
        paths.containerd_state,
        paths.cni_conf_dir,
        paths.cni_data_dir,
    ):
        d.mkdir(parents=True, exist_ok=True)
    paths.containerd_config.write_text(
        containerd_config(paths, runc=runc, sandbox_image=sandbox_image, cni_bin=cni_bin)
    )
    conflist = cni_conflist(node_index, node.pod_cidr4, node.pod_cidr6, paths)
    (paths.cni_conf_dir / "10-lab.conflist").write_text(json.dumps(conflist, indent=2) + "\n")


def runtime_env(shim_dir: Path) -> dict[str, str]:
    """Return the environment for containerd and kubelet: the shim's directory first on PATH.

    containerd looks up `containerd-shim-runc-v2` on PATH; the pinned build must win over
    anything the host has.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "CONTAINERD"))}
    env["PATH"] = os.pathsep.join([str(shim_dir), env.get("PATH", "/usr/sbin:/usr/bin:/bin")])
    return env


def spawn_in_node(
    ns: str,
    cgroup: str,
    argv: Sequence[str],
    *,
    log: Path,
    env: dict[str, str],
) -> subprocess.Popen[bytes]:
    """Start `argv` in network namespace `ns` and cgroup `/<cgroup>`, sharing host mounts.

    A small shell joins the cgroup in every hierarchy, then execs `nsenter --net`: the
    process and all it starts (shims, containers) are in the node's cgroup from the first
    instruction. It leads its own session, so its PID is its process group.
    """
    joins = " ".join(
        f"echo $$ > {shlex.quote(str(h / cgroup / 'cgroup.procs'))};"
        for h in hoststate.hierarchies()
    )
    script = f"{joins} exec nsenter --net={shlex.quote(str(NETNS_DIR / ns))} -- " + " ".join(
        shlex.quote(a) for a in argv
    )
    return netns.start(["sh", "-c", script], log=log, env=env)


def sandbox_ids(paths: NodePaths) -> set[str]:
    """Return the ids of every pod sandbox the node's containerd has recorded (empty: none)."""
    ids: set[str] = set()
    for top in (paths.containerd_root, paths.containerd_state):
        sandboxes = top / "io.containerd.grpc.v1.cri" / "sandboxes"
        if sandboxes.is_dir():
            ids.update(e.name for e in sandboxes.iterdir())
    return ids


def cni_cache_files(ids: set[str], cache_dir: Path = CNI_CACHE_DIR) -> list[Path]:
    """Return libcni's cached results for the sandboxes `ids` (the pods' network and their
    loopback): host-wide files a killed node never gets to delete."""
    if not ids or not cache_dir.is_dir():
        return []
    wanted = {f"{CNI_NETWORK}-{i}-eth0" for i in ids} | {f"cni-loopback-{i}-lo" for i in ids}
    return sorted(e for e in cache_dir.iterdir() if e.name in wanted)


def ctr(
    ctr_bin: Path, paths: NodePaths, *args: str, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `ctr` against the node's containerd in the k8s.io namespace; raise on failure."""
    argv = [str(ctr_bin), "--address", str(paths.containerd_socket), "-n", K8S_NAMESPACE, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc
