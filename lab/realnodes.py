"""The real-node lab: kubelet and containerd in every node, nodelb installed from deploy/.

Topology: the netns lab (lab.topology) with a router and an outside client, no hand-made
pods. Control plane: etcd, kube-apiserver (Node,RBAC authorization, NodeRestriction),
kube-controller-manager (EndpointSlices and their hints, DaemonSets, Deployments, tokens)
and kube-scheduler. Every node: its own containerd and kubelet (lab.noderuntime,
lab.kubelet), kube-proxy in nftables mode; pods are real containers on the node's pod CIDRs.
nodelb is installed as a user installs it: `kubectl apply --server-side -f
deploy/daemonset.yaml`, then `deploy/admission-policy.yaml`, with only the sample addresses
replaced (`lab_install_documents`).

Host-wide state is recorded and restored (lab.hoststate): the sysctls kubelet rewrites, the
nodes' cgroups, every mount below the nodes' directories. `down()` does all of it, also after
a failure in `up()`, and at interpreter exit when the caller never got to call it.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode

import yaml
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from agent.model.net import IPAddress
from lab import binaries, hoststate, images, netns, noderuntime
from lab.cluster import kube_proxy_argv
from lab.controlplane import DEFAULT_SERVICE_CIDR, ControlPlane, ControlPlaneAccess, tail
from lab.kubelet import NODES_ROOT, NodePaths, kubelet_argv, kubelet_configuration
from lab.lifecycle import UpDown
from lab.topology import Host, Lab, LabError, LabNode, LabSpec
from lab.vrrp_lab import holds, mac_of, neighbour_mac
from lab.wait import GiveUp, wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY = REPO_ROOT / "deploy"
COREDNS_MANIFEST = Path(__file__).resolve().parent / "manifests" / "coredns.yaml"
# kube-dns's clusterIP, the kubelets' clusterDNS: the tenth address of the Service range, as
# kubeadm picks it.
CLUSTER_DNS_IP = str(ipaddress.ip_network(DEFAULT_SERVICE_CIDR)[10])
NODELB_NAMESPACE = "nodelb-system"
# Pods in 198.19.<k>.0/24: the cluster CIDR stops below the outside network (198.19.200.0/24).
CLUSTER_CIDRS = "198.19.0.0/17,2001:db8:1::/48"
CONTAINERD_TIMEOUT = 30.0
NODE_READY_TIMEOUT = 120.0
INSTALL_TIMEOUT = 240.0
REQUEST_TIMEOUT = 10.0

# The addresses the lab gives nodelb in place of deploy/'s samples: the pool on the segment
# (so the router reaches its addresses by ARP/ND), externalIPs around it.
LAB_POOL = ("198.18.0.208/28", "2001:db8::d0/124")
LAB_EXTERNAL_CIDRS = ("198.18.0.192/26", "2001:db8::c0/122")


# The prefixes of every real-node lab this process has started: the test session's end check
# looks for what any of them left behind (`leftovers`), and only for theirs, so a lab another
# process runs at the same time is not mistaken for a leak.
STARTED: set[str] = set()


class RealNodeError(LabError):
    """The real-node lab could not be built or used; the message carries log tails."""


def lab_install_documents(
    daemonset_yaml: str, policy_yaml: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return deploy/'s two manifests with only the sample addresses replaced by the lab's.

    In the ConfigMap `nodelb-config`: the pools' addresses and `externalIPCIDRs`; in the
    admission policy `nodelb-externalips`: the two address lists it keeps in step with them.
    Every other field is deploy/'s, unchanged (RBAC, securityContext, probes, images).
    """
    ds_docs = [d for d in yaml.safe_load_all(daemonset_yaml) if d]
    policy_docs = [d for d in yaml.safe_load_all(policy_yaml) if d]
    out_ds = copy.deepcopy(ds_docs)
    for doc in out_ds:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "nodelb-config":
            config = yaml.safe_load(doc["data"]["config.yaml"])
            config["externalIPCIDRs"] = list(LAB_EXTERNAL_CIDRS)
            for pool in config.get("pools", []):
                pool["addresses"] = list(LAB_POOL)
            doc["data"]["config.yaml"] = yaml.safe_dump(config, sort_keys=False)
    out_policy = copy.deepcopy(policy_docs)
    replaced = 0
    for doc in out_policy:
        if doc.get("kind") != "ValidatingAdmissionPolicy":
            continue
        for var in doc["spec"].get("variables", []):
            if var["name"] == "allowedCIDRs":
                var["expression"] = _cel_list(LAB_EXTERNAL_CIDRS)
                replaced += 1
            elif var["name"] == "poolCIDRs":
                var["expression"] = _cel_list(LAB_POOL)
                replaced += 1
    if replaced != 2:
        raise RealNodeError(
            f"admission-policy.yaml: expected the variables allowedCIDRs and poolCIDRs, "
            f"replaced {replaced}"
        )
    return out_ds, out_policy


def dns_documents(manifest_yaml: str, *, image: str, cluster_ip: str) -> list[dict[str, Any]]:
    """Return lab/manifests/coredns.yaml with its image and kube-dns's clusterIP filled in.

    Raises RealNodeError unless exactly one container image and one clusterIP were replaced
    (a manifest edited out of step with this function fails here, not as a pod that never
    starts).
    """
    docs = [d for d in yaml.safe_load_all(manifest_yaml) if d]
    images_set = ips_set = 0
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc.get("kind") == "Deployment":
            for container in spec["template"]["spec"]["containers"]:
                if container.get("image") == "COREDNS_IMAGE":
                    container["image"] = image
                    images_set += 1
        elif doc.get("kind") == "Service" and spec.get("clusterIP") == "CLUSTER_DNS_IP":
            spec["clusterIP"] = cluster_ip
            ips_set += 1
    if (images_set, ips_set) != (1, 1):
        raise RealNodeError(
            f"coredns.yaml: expected one COREDNS_IMAGE and one CLUSTER_DNS_IP placeholder, "
            f"replaced {images_set} and {ips_set}"
        )
    return docs


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


@dataclass
class _NodeRuntime:
    node: LabNode
    index: int
    paths: NodePaths
    containerd: subprocess.Popen[bytes] | None = None
    kubelet: subprocess.Popen[bytes] | None = None
    powered_off: bool = False


class RealNodeCluster(ControlPlaneAccess, UpDown):
    """The real-node lab. Nothing happens in the constructor; `up()` builds it all."""

    not_up = RealNodeError

    def __init__(self, spec: LabSpec, workdir: Path, *, install_nodelb: bool = True) -> None:
        if not (spec.with_controlplane and spec.with_router):
            raise ValueError("the real-node lab needs the control plane and the router")
        if spec.pods_per_node:
            raise ValueError("the real-node lab has no hand-made pods: pods_per_node must be 0")
        self.spec = spec
        self.workdir = workdir
        self.lab = Lab(spec, workdir / "lab")
        self.install_nodelb = install_nodelb
        self._cp: ControlPlane | None = None
        self._api: kclient.ApiClient | None = None
        self._saved_sysctls: dict[str, str] = {}
        self._log_links: set[str] = set()
        self._runtimes = [
            _NodeRuntime(
                node=node,
                index=k,
                paths=NodePaths(
                    base=NODES_ROOT / self.lab.prefix / node.name,
                    cgroup=f"{self.lab.prefix}-{node.name}",
                ),
            )
            for k, node in enumerate(self.lab.nodes, start=1)
        ]
        self._kube_proxies: dict[str, subprocess.Popen[bytes]] = {}

    # -- accessors ---------------------------------------------------------------------------

    @property
    def nodes(self) -> list[LabNode]:
        return self.lab.nodes

    @property
    def outside(self) -> Host:
        assert self.lab.outside is not None
        return self.lab.outside

    @property
    def router(self) -> Host:
        assert self.lab.router is not None
        return self.lab.router

    def get_json(self, path: str, **query: str) -> dict[str, Any]:
        """Return the API object or list at `path` (e.g. "/api/v1/nodes") as plain JSON.

        `query` becomes the query string (labelSelector=...). Raises ApiException on any
        status but 200. Plain dicts, not the client's models: the lab reads a few fields.
        """
        url = self.controlplane.url + path + (f"?{urlencode(query)}" if query else "")
        resp = self.api.rest_client.pool_manager.request(
            "GET", url, timeout=REQUEST_TIMEOUT, retries=False
        )
        if resp.status != 200:
            raise ApiException(status=resp.status, reason=resp.data.decode(errors="replace"))
        return cast(dict[str, Any], json.loads(resp.data))

    def node_paths(self, name: str) -> NodePaths:
        """Return where node `name` keeps its kubelet's and containerd's files."""
        return self._runtime(name).paths

    def _runtime(self, name: str) -> _NodeRuntime:
        for rt in self._runtimes:
            if rt.node.name == name:
                return rt
        raise KeyError(name)

    @property
    def logs(self) -> list[Path]:
        """Return every log file of the lab: control plane, controllers, kubelets, runtimes."""
        logdir = self.lab.workdir / "logs"
        out = [self.workdir / "controlplane" / "kube-apiserver.log"]
        out += [logdir / "kube-controller-manager.log", logdir / "kube-scheduler.log"]
        for rt in self._runtimes:
            out += [
                logdir / f"containerd-{rt.node.name}.log",
                logdir / f"kubelet-{rt.node.name}.log",
            ]
            out.append(logdir / f"kube-proxy-{rt.node.name}.log")
        return out

    def log_tails(self, lines: int = 30) -> str:
        """Return the tails of every log: the lab's processes', then every container's."""
        return "\n".join(tail(p, lines) for p in [*self.logs, *self.container_logs()] if p.exists())

    def container_logs(self) -> list[Path]:
        """Return the log file of every container the nodes' kubelets have run so far."""
        return sorted(
            log
            for rt in self._runtimes
            if rt.paths.pod_logs.is_dir()
            for log in rt.paths.pod_logs.rglob("*.log")
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self) -> None:
        """Build everything and wait until nodelb serves; on failure tear down and re-raise."""
        if self._cp is not None:
            raise RealNodeError("the real-node lab is already up")
        self._saved_sysctls = hoststate.read_sysctls(hoststate.KUBELET_SYSCTLS)
        self._log_links = _container_log_links()
        STARTED.add(self.lab.prefix)
        atexit.register(self._down_at_exit)
        try:
            self._build()
        except BaseException as exc:
            if not getattr(exc, "__notes__", None):  # a failed wait has added the tails
                exc.add_note(self.log_tails())
            try:
                self.down()
            except Exception as teardown_error:
                exc.add_note(f"real-node teardown also failed: {teardown_error!r}")
            raise

    def _build(self) -> None:
        archives = images.lab_images()  # fails early, naming the build script, if missing
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lab.up()
        cp_host = self.lab.controlplane
        assert cp_host is not None
        self._cp = ControlPlane(
            cp_host.ns, cp_host.ip4, self.workdir / "controlplane", kubelets=True
        )
        self._cp.start()
        self._start_controllers(cp_host)
        for rt in self._runtimes:
            self._start_containerd(rt, archives)
        for rt in self._runtimes:
            self._start_kubelet(rt)
        self._wait_nodes_ready()
        self._set_pod_cidrs()
        self._start_kube_proxies()
        self.install_dns()
        if self.install_nodelb:
            self.install()

    def down(self) -> None:
        """Stop every node, the controllers and the control plane; remove the lab; restore
        the host (cgroups, mounts, sysctls, container log links). Idempotent; every step is
        tried, the first error re-raised at the end."""
        atexit.unregister(self._down_at_exit)
        errors: list[BaseException] = []

        def attempt(step: Any, *args: Any) -> None:
            try:
                step(*args)
            except Exception as exc:
                errors.append(exc)

        for rt in self._runtimes:
            attempt(self._stop_node, rt)
        self._kube_proxies.clear()
        if self._cp is not None:
            attempt(self._cp.stop)
            self._cp = None
        self._api = None
        attempt(self.lab.down)
        attempt(_remove_new_log_links, self._log_links)
        attempt(hoststate.restore_sysctls, self._saved_sysctls)
        with contextlib.suppress(OSError):
            (NODES_ROOT / self.lab.prefix).rmdir()
        if errors:
            raise errors[0]

    def detach(self) -> None:
        """Leave the lab running after this process exits (`nodelb lab up --real-nodes`);
        `nodelb lab down` removes it later from the recorded state."""
        atexit.unregister(self._down_at_exit)
        self.lab.detach()

    def _down_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.down()

    def to_json(self) -> dict[str, Any]:
        """Return the lab's description, the admin kubeconfig, and what teardown must undo."""
        out = self.lab.to_json()
        out["kubeconfig"] = None if self._cp is None else str(self._cp.admin_kubeconfig())
        out["apiserver"] = None if self._cp is None else self._cp.url
        out["workdir"] = str(self.workdir)
        out["real_nodes"] = {
            "nodes": [
                {"name": rt.node.name, "base": str(rt.paths.base), "cgroup": rt.paths.cgroup}
                for rt in self._runtimes
            ],
            "sysctls": self._saved_sysctls,
            "log_links": sorted(self._log_links),
        }
        return out

    # -- control plane controllers -----------------------------------------------------------

    def _start_controllers(self, cp_host: Host) -> None:
        cp = self.controlplane
        pki = cp.certificates
        kcm_config = cp.client_kubeconfig(
            "kube-controller-manager", user="system:kube-controller-manager"
        )
        sched_config = cp.client_kubeconfig("kube-scheduler", user="system:kube-scheduler")
        self.lab.spawn(
            cp_host.ns,
            [
                str(binaries.binary("kube-controller-manager")),
                f"--kubeconfig={kcm_config}",
                f"--authentication-kubeconfig={kcm_config}",
                f"--authorization-kubeconfig={kcm_config}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca.cert}",
                "--use-service-account-credentials=true",
                "--controllers=*",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                # A node that stops heartbeating (every 4 s) is NotReady after 16 s.
                "--node-monitor-period=2s",
                "--node-monitor-grace-period=16s",
                "--v=1",
            ],
            log_name="kube-controller-manager",
        )
        self.lab.spawn(
            cp_host.ns,
            [
                str(binaries.binary("kube-scheduler")),
                f"--kubeconfig={sched_config}",
                f"--authentication-kubeconfig={sched_config}",
                f"--authorization-kubeconfig={sched_config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--v=1",
            ],
            log_name="kube-scheduler",
        )

    # -- nodes -------------------------------------------------------------------------------

    def _log(self, name: str) -> Path:
        logdir = self.lab.workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        return logdir / f"{name}.log"

    def _start_containerd(self, rt: _NodeRuntime, archives: Sequence[images.ImageArchive]) -> None:
        node, paths = rt.node, rt.paths
        hoststate.create_cgroup(paths.cgroup)
        noderuntime.write_node_files(
            rt.index,
            node,
            paths,
            runc=binaries.binary("runc"),
            sandbox_image=binaries.read_versions()["PAUSE_IMAGE"],
        )
        env = noderuntime.runtime_env(binaries.binary("containerd-shim-runc-v2").parent)
        rt.containerd = noderuntime.spawn_in_node(
            node.ns,
            paths.cgroup,
            [str(binaries.binary("containerd")), f"--config={paths.containerd_config}"],
            log=self._log(f"containerd-{node.name}"),
            env=env,
        )
        ctr_bin = binaries.binary("ctr")
        proc = rt.containerd

        def serving() -> bool:
            if proc.poll() is not None:
                raise GiveUp(f"containerd in {node.name} exited {proc.returncode}")
            noderuntime.ctr(ctr_bin, paths, "version", timeout=5)
            return True

        self._wait(serving, CONTAINERD_TIMEOUT, f"containerd in {node.name} to serve")
        for image in archives:
            noderuntime.ctr(ctr_bin, paths, "images", "import", "--local", str(image.archive))

    def _start_kubelet(self, rt: _NodeRuntime) -> None:
        cp = self.controlplane
        node, paths = rt.node, rt.paths
        kubeconfig = cp.client_kubeconfig(
            f"kubelet-{node.name}", user=f"system:node:{node.name}", groups=["system:nodes"]
        )
        shutil.copyfile(kubeconfig, paths.kubeconfig)
        config = kubelet_configuration(
            node, paths, client_ca=cp.certificates.ca.cert, cluster_dns=[CLUSTER_DNS_IP]
        )
        paths.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))
        env = noderuntime.runtime_env(binaries.binary("containerd-shim-runc-v2").parent)
        rt.kubelet = noderuntime.spawn_in_node(
            node.ns,
            paths.cgroup,
            kubelet_argv(binaries.binary("kubelet"), node, paths),
            log=self._log(f"kubelet-{node.name}"),
            env=env,
        )

    def _wait_nodes_ready(self) -> None:
        def ready() -> bool:
            for rt in self._runtimes:
                if rt.kubelet is not None and rt.kubelet.poll() is not None:
                    raise GiveUp(f"kubelet in {rt.node.name} exited {rt.kubelet.returncode}")
            nodes = self.get_json("/api/v1/nodes")["items"]
            ready_names = {n["metadata"]["name"] for n in nodes if _condition(n, "Ready")}
            return ready_names >= {n.name for n in self.nodes}

        self._wait(ready, NODE_READY_TIMEOUT, "every kubelet's Node to be Ready")

    def _set_pod_cidrs(self) -> None:
        """Write each Node's podCIDRs, as the node IPAM controller would (the CNI network
        already uses them); kube-proxy and nodelb read them."""
        for node in self.nodes:
            if self.get_json(f"/api/v1/nodes/{node.name}")["spec"].get("podCIDRs"):
                continue
            body = {
                "spec": {
                    "podCIDR": str(node.pod_cidr4),
                    "podCIDRs": [str(node.pod_cidr4), str(node.pod_cidr6)],
                }
            }
            self.core.patch_node(node.name, body, _request_timeout=REQUEST_TIMEOUT)

    def _start_kube_proxies(self) -> None:
        kubeconfig = self.controlplane.client_kubeconfig("kube-proxy", user="system:kube-proxy")
        for node in self.nodes:
            argv = kube_proxy_argv(
                node, kubeconfig=kubeconfig, cluster_cidrs=CLUSTER_CIDRS, verbosity=1
            )
            self._kube_proxies[node.name] = self.lab.spawn(
                node.ns, argv, log_name=f"kube-proxy-{node.name}"
            )
        for node in self.nodes:
            proc = self._kube_proxies[node.name]

            def programmed(node: LabNode = node, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise GiveUp(f"kube-proxy in {node.name} exited {proc.returncode}")
                out = netns.run(node.ns, ["nft", "list", "table", "ip", "kube-proxy"], check=False)
                return "service-" in out.stdout

            self._wait(programmed, NODE_READY_TIMEOUT, f"kube-proxy in {node.name} to program nft")

    def _stop_node(self, rt: _NodeRuntime) -> None:
        try:
            stop_node(rt.paths)
        finally:
            for proc in (rt.kubelet, rt.containerd):
                if proc is not None:
                    with contextlib.suppress(Exception):
                        proc.wait(timeout=5)
            rt.kubelet = rt.containerd = None

    def power_off(self, node_name: str) -> None:
        """Power `node_name` off: its cable is pulled (no carrier, nothing answers on the
        segment) and every process of the node is killed at once — kubelet, containerd,
        shims, containers (the nodelb agent among them), kube-proxy. Its Node object stays,
        going NotReady as a real one would."""
        rt = self._runtime(node_name)
        self.lab.unplug(rt.node)
        hoststate.kill_cgroup(rt.paths.cgroup)
        for pid in netns.pids(rt.node.ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        rt.powered_off = True

    # -- nodelb ------------------------------------------------------------------------------

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the lab's kubectl as the admin, inside the control plane's namespace."""
        argv = [
            str(binaries.binary("kubectl")),
            f"--kubeconfig={self.controlplane.admin_kubeconfig()}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
            *args,
        ]
        proc = netns.run(self.controlplane.ns, argv, check=False, timeout=120, input=stdin)
        if check and proc.returncode != 0:
            raise RealNodeError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def install(self) -> None:
        """Install nodelb as README.md says (server-side apply of deploy/'s manifests, the lab's
        addresses in place of the samples) and wait until every agent pod is Ready and the
        controller holds its Lease."""
        ds_docs, policy_docs = lab_install_documents(
            (DEPLOY / "daemonset.yaml").read_text(), (DEPLOY / "admission-policy.yaml").read_text()
        )
        for docs, name in ((ds_docs, "daemonset.yaml"), (policy_docs, "admission-policy.yaml")):
            path = self.workdir / f"install-{name}"
            path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
            self.kubectl("apply", "--server-side", "--field-manager=nodelb-lab", "-f", str(path))
        self.wait_agents_ready()
        self.wait_controller_leader()

    def install_dns(self) -> None:
        """Install CoreDNS (lab/manifests/coredns.yaml) and wait until it answers for the
        cluster: its Deployment available, so kube-dns has a ready endpoint."""
        docs = dns_documents(
            COREDNS_MANIFEST.read_text(),
            image=binaries.read_versions()["COREDNS_IMAGE"],
            cluster_ip=CLUSTER_DNS_IP,
        )
        path = self.workdir / "install-coredns.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        self.kubectl("apply", "--server-side", "--field-manager=nodelb-lab", "-f", str(path))

        def available() -> bool:
            dep = self.get_json("/apis/apps/v1/namespaces/kube-system/deployments/coredns")
            return bool(dep.get("status", {}).get("availableReplicas"))

        self._wait(available, INSTALL_TIMEOUT, "CoreDNS available (kube-dns has an endpoint)")

    def wait_agents_ready(self, timeout: float = INSTALL_TIMEOUT) -> None:
        """Wait until the agent DaemonSet is rolled out and Ready on every powered node."""
        want = {rt.node.name for rt in self._runtimes if not rt.powered_off}

        def ready() -> bool:
            ds = self.get_json(
                f"/apis/apps/v1/namespaces/{NODELB_NAMESPACE}/daemonsets/nodelb-agent"
            )
            seen = ds["status"].get("observedGeneration", 0) >= ds["metadata"]["generation"]
            revision = self._current_revision(ds)
            ready_on = {
                p["spec"]["nodeName"]
                for p in self.agent_pods()
                if "deletionTimestamp" not in p["metadata"]
                and _condition(p, "Ready")
                and p["metadata"]["labels"].get("controller-revision-hash") == revision
            }
            return seen and ready_on >= want

        self._wait(ready, timeout, "nodelb agents of the current revision Ready on every node")

    def agent_pods(self) -> list[dict[str, Any]]:
        """Return the agent DaemonSet's pods (plain JSON)."""
        return self.pods(NODELB_NAMESPACE, "app.kubernetes.io/component=agent")

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Return the pods of `namespace` matching label `selector` (plain JSON)."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        return list(self.get_json(path, labelSelector=selector)["items"])

    def _current_revision(self, ds: Mapping[str, Any]) -> str | None:
        """Return the controller-revision-hash of the DaemonSet's newest template."""
        path = f"/apis/apps/v1/namespaces/{NODELB_NAMESPACE}/controllerrevisions"
        revisions = self.get_json(path, labelSelector="app.kubernetes.io/component=agent")
        owned = [
            r
            for r in revisions["items"]
            if any(
                o["uid"] == ds["metadata"]["uid"] for o in r["metadata"].get("ownerReferences", [])
            )
        ]
        if not owned:
            return None
        latest = max(owned, key=lambda r: int(r["revision"]))
        return cast(str | None, latest["metadata"]["labels"].get("controller-revision-hash"))

    def wait_controller_leader(self, timeout: float = INSTALL_TIMEOUT) -> str:
        """Return the controller pod holding the leader Lease, once one does."""
        path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{NODELB_NAMESPACE}/leases/nodelb-controller"
        )

        def holder() -> str | None:
            try:
                lease = self.get_json(path)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return cast(str | None, lease["spec"].get("holderIdentity") or None)

        return cast(str, self._wait(holder, timeout, "a nodelb controller to hold the Lease"))

    # -- observing the segment -----------------------------------------------------------------

    def node_holding(self, ip: IPAddress) -> str | None:
        """Return the powered node whose segment interface carries `ip` (None: none does).

        Raises RealNodeError when more than one does: an IP is never held twice.
        """
        found = [rt.node.name for rt in self._runtimes if not rt.powered_off and holds(rt.node, ip)]
        if len(found) > 1:
            raise RealNodeError(f"{ip} is held by more than one node: {found}")
        return found[0] if found else None

    def holder_seen_by_router(self, ip: IPAddress) -> str | None:
        """Return the node holding `ip` once the router's neighbour entry names its MAC."""
        node = self.node_holding(ip)
        if node is None:
            return None
        return node if neighbour_mac(self.router.ns, ip) == mac_of(self.lab.node(node)) else None

    # -- internals ---------------------------------------------------------------------------

    def _wait(self, predicate: Any, timeout: float, what: str) -> Any:
        try:
            return wait_until(predicate, timeout, what, interval=0.2)
        except Exception as exc:
            exc.add_note(self.log_tails())
            raise


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    """Return True when the object's status has condition `kind` with status "True"."""
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def stop_node(paths: NodePaths) -> None:
    """Stop a real node for good: kill every process in its cgroup, unmount everything below
    its directory, remove the cgroup, then the directory. Each step is tried; the first
    error is re-raised (the directory is kept then, for a look at what is left)."""
    errors: list[BaseException] = []
    sandboxes = noderuntime.sandbox_ids(paths)
    for step in (
        lambda: hoststate.kill_cgroup(paths.cgroup),
        lambda: hoststate.unmount_under([paths.base]),
        lambda: hoststate.remove_cgroup(paths.cgroup),
    ):
        try:
            step()
        except Exception as exc:
            errors.append(exc)
    for cached in noderuntime.cni_cache_files(sandboxes):
        cached.unlink(missing_ok=True)
    if errors:
        raise errors[0]
    shutil.rmtree(paths.base, ignore_errors=True)


def leftovers(prefixes: Iterable[str] | None = None) -> list[str]:
    """Return one line per thing the real-node labs `prefixes` (default: every one this
    process started) left on the host: a mount below their directory, their directory, a
    cgroup of one of their nodes in any hierarchy. Empty when they cleaned up."""
    out: list[str] = []
    names = sorted(STARTED if prefixes is None else prefixes)
    roots = [NODES_ROOT / p for p in names]
    mounts = hoststate.mounts_under(Path("/proc/self/mountinfo").read_text(), roots)
    out += [f"mount left: {m}" for m in mounts]
    out += [f"directory left: {r}" for r in roots if r.exists()]
    out += [
        f"cgroup left: {c}"
        for c in sorted(hoststate.top_level_cgroups())
        if any(c.split("/", 1)[1].startswith(f"{p}-") for p in names)
    ]
    return out


def teardown_recorded(record: Mapping[str, Any]) -> None:
    """Undo what a real-node lab recorded in `to_json()["real_nodes"]` (for `nodelb lab
    down` in a later process): stop each node, remove kubelet's log links, restore sysctls."""
    errors: list[BaseException] = []
    for node in record.get("nodes", []):
        try:
            stop_node(NodePaths(base=Path(node["base"]), cgroup=node["cgroup"]))
        except Exception as exc:
            errors.append(exc)
        with contextlib.suppress(OSError):  # the lab's own directory, once empty
            Path(node["base"]).parent.rmdir()
    _remove_new_log_links(set(record.get("log_links", [])))
    hoststate.restore_sysctls(record.get("sysctls", {}))
    if errors:
        raise errors[0]


CONTAINER_LOGS = Path("/var/log/containers")


def _container_log_links() -> set[str]:
    """Return the names in /var/log/containers (kubelet's host-wide links to pod logs)."""
    return {e.name for e in CONTAINER_LOGS.iterdir()} if CONTAINER_LOGS.is_dir() else set()


def _remove_new_log_links(before: set[str]) -> None:
    """Remove the links kubelets made in /var/log/containers since `before` that point into
    the lab's directories (kubelet hard-codes that directory; nothing else of ours is there)."""
    for name in _container_log_links() - before:
        link = CONTAINER_LOGS / name
        with contextlib.suppress(OSError):
            if link.is_symlink() and str(os.readlink(link)).startswith(str(NODES_ROOT)):
                link.unlink()
