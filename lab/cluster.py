"""A lab cluster: the netns lab plus a real control plane, Node objects, pod servers, real
kube-proxy (nftables mode) and `nodelb agent` in every node namespace.

Used by the e2e tests and by `nodelb lab up`. `ClusterLab(spec, workdir)` does no work;
`up()` builds everything (and on failure tears down what it built, then re-raises), `down()`
removes everything and is idempotent; it is also a context manager.

Controllers that do not run in the lab are stood in for by small helpers that write what the
real ones would: `create_service` writes `status.loadBalancer.ingress` (the allocator),
`write_endpointslices` writes EndpointSlices with hints (the EndpointSlice controller), and
`route_lb_via` routes a LoadBalancer IP from the client via one node (the announcer).

Safety: every process runs inside a lab namespace through `Lab.spawn` and is stopped by PID;
`nft` is only ever run inside node namespaces, read-only; routes are only changed inside the
client namespace; addresses come only from the lab space.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import urllib3
import yaml
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from agent.model.net import IPAddress
from lab import binaries, netns, readers
from lab.controlplane import ControlPlane, ControlPlaneAccess, tail
from lab.lifecycle import UpDown
from lab.topology import (
    LAB_SPACE4,
    LAB_SPACE6,
    LB_RANGE4,
    LB_RANGE6,
    Lab,
    LabError,
    LabNode,
    LabSpec,
)
from lab.vrrp_lab import child_speaker_pids, crash, revive
from lab.wait import GiveUp, wait_until

AGENT_METRICS_PORT = 9472
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBE_PROXY_METRICS = "127.0.0.1:10249"
CLUSTER_CIDRS = "198.19.0.0/16,2001:db8:1::/48"
POD_TCP_PORT = 8080
POD_UDP_PORT = 8081
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
READY_TIMEOUT = 60.0
RULES_TIMEOUT = 30.0
REQUEST_TIMEOUT = 10.0
LOG_TAIL_LINES = 40
STOP_GRACE = 5.0
NFT_TABLE = ("inet", "nodelb")
# The frontend-keyed maps and sets of the nodelb table (docs/dataplane.md), per family.
FRONTEND_MAPS = ("ext", "int", "noep", "drop")
_PROTO_NUMBERS = {"tcp": 6, "udp": 17, "sctp": 132}
_REPO_ROOT = Path(__file__).resolve().parents[1]

NODELB_NAMESPACE = "nodelb-system"
# What `announce` settings the lab uses when a test or the demo turns the announcer on: fast
# adverts (200 ms, so Master_Down is under a second) and short report Leases.
LAB_ANNOUNCE: dict[str, Any] = {
    "serveAllIPs": False,
    "announce": {
        "enabled": True,
        "interface": "eth0",
        "advertIntervalCs": 20,
        "reportNamespace": NODELB_NAMESPACE,
        "reportLeaseSeconds": 6,
        "gratuitous": {"count": 3, "spacingMs": 100},
    },
}
DEFAULT_AGENT_CONFIG: dict[str, Any] = {
    "pools": [
        {
            "name": "default",
            "addresses": [
                f"{LB_RANGE4[0]}-{LB_RANGE4[1]}",
                f"{LB_RANGE6[0]}-{LB_RANGE6[1]}",
            ],
        }
    ],
}

Hints = Literal["node", "zone"]


class ClusterError(LabError):
    """The cluster could not be brought up or used; the message carries the relevant logs."""


@dataclass(frozen=True, slots=True)
class SvcPort:
    """One Service port: `target_port` is also the EndpointSlice port (pods listen there)."""

    name: str
    port: int
    target_port: int = POD_TCP_PORT
    protocol: str = "TCP"


def tcp_port(port: int = 80, name: str = "http") -> SvcPort:
    """Return a TCP Service port forwarding to the pod servers' TCP port."""
    return SvcPort(name=name, port=port, target_port=POD_TCP_PORT, protocol="TCP")


def udp_port(port: int = 53, name: str = "dns") -> SvcPort:
    """Return a UDP Service port forwarding to the pod servers' UDP port."""
    return SvcPort(name=name, port=port, target_port=POD_UDP_PORT, protocol="UDP")


def merge_config(base: Mapping[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return `base` updated by `override`, key by key (mappings merge, other values replace)."""
    out: dict[str, Any] = dict(base)
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def frontend_keys(table: Mapping[str, Any] | None) -> dict[str, set[tuple[IPAddress, int, int]]]:
    """Return, per frontend map/set name (`ext4`, `noep6`, ...), its (ip, proto, port) keys.

    `table` is the parsed output of `nft -j list table inet nodelb`; None (no table) gives {}.
    """
    out: dict[str, set[tuple[IPAddress, int, int]]] = {}
    if not table:
        return out
    wanted = {f"{base}{fam}" for base in FRONTEND_MAPS for fam in (4, 6)}
    for item in table.get("nftables", []):
        obj = item.get("map") or item.get("set")
        if not obj or obj.get("name") not in wanted:
            continue
        keys = out.setdefault(obj["name"], set())
        for elem in obj.get("elem") or []:
            key = _element_key(elem)
            if key is not None:
                keys.add(key)
    return out


def _element_key(elem: Any) -> tuple[IPAddress, int, int] | None:
    if isinstance(elem, list):  # map element: [key, value]
        elem = elem[0]
    if isinstance(elem, dict) and "elem" in elem:  # element with options (timeout, ...)
        elem = elem["elem"].get("val")
    if not isinstance(elem, dict) or "concat" not in elem:
        return None
    atoms = elem["concat"]
    if len(atoms) != 3:
        return None
    ip, proto, port = atoms
    proto_n = _PROTO_NUMBERS.get(str(proto)) if not isinstance(proto, int) else proto
    if proto_n is None or not isinstance(port, int):
        return None
    return ipaddress.ip_address(str(ip)), proto_n, port


def kube_proxy_argv(
    node: LabNode, *, kubeconfig: Path, cluster_cidrs: str, verbosity: int = 2
) -> list[str]:
    """Return kube-proxy's command line for `node`: nftables mode, no global sysctls.

    Both labs run it so (ClusterLab with its own pods, the real-node lab beside kubelets).
    """
    return [
        str(binaries.binary("kube-proxy")),
        "--proxy-mode=nftables",
        f"--hostname-override={node.name}",
        f"--kubeconfig={kubeconfig}",
        f"--cluster-cidr={cluster_cidrs}",
        # 0 leaves each conntrack sysctl as it is: nothing outside the namespace changes.
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--conntrack-udp-timeout=0",
        "--conntrack-udp-timeout-stream=0",
        f"--healthz-bind-address={node.ip4}:{KUBE_PROXY_HEALTHZ_PORT}",
        f"--metrics-bind-address={KUBE_PROXY_METRICS}",
        "--oom-score-adj=0",
        f"--v={verbosity}",
    ]


class ClusterLab(ControlPlaneAccess, UpDown):
    """A lab with a control plane, registered Nodes, pod servers, kube-proxy and nodelb agents.

    Nothing happens in the constructor. `lab`, `nodes` and `pods` are valid from construction
    on; `api`, `controlplane` only between `up()` and `down()`.
    """

    not_up = ClusterError

    def __init__(
        self,
        spec: LabSpec,
        workdir: Path,
        *,
        agents: bool = True,
        kube_proxy: bool = True,
        agent_config: Mapping[str, Any] | None = None,
    ) -> None:
        if not (spec.with_controlplane and spec.with_client):
            raise ValueError("a cluster lab needs the control plane and the client")
        self.spec = spec
        self.workdir = workdir
        self.lab = Lab(spec, workdir / "lab")
        self.with_agents = agents
        self.with_kube_proxy = kube_proxy
        self.agent_config = merge_config(DEFAULT_AGENT_CONFIG, agent_config)
        self._cp: ControlPlane | None = None
        self._api: kclient.ApiClient | None = None
        self._agents: dict[str, subprocess.Popen[bytes]] = {}
        self._kube_proxies: dict[str, subprocess.Popen[bytes]] = {}
        self._routes: dict[IPAddress, str] = {}
        self._crashed: set[str] = set()

    # -- accessors ---------------------------------------------------------------------------

    @property
    def nodes(self) -> list[LabNode]:
        """Return the lab's nodes."""
        return self.lab.nodes

    @property
    def client_ns(self) -> str:
        """Return the client's namespace."""
        assert self.lab.client is not None
        return self.lab.client.ns

    def kubeconfig(self) -> Path:
        """Return the admin kubeconfig path (for processes inside the lab)."""
        return self.controlplane.admin_kubeconfig()

    @property
    def agent_pids(self) -> dict[str, int]:
        """Return the PID of each running agent by node name."""
        return {n: p.pid for n, p in self._agents.items() if p.poll() is None}

    @property
    def kube_proxy_pids(self) -> dict[str, int]:
        """Return the PID of each running kube-proxy by node name."""
        return {n: p.pid for n, p in self._kube_proxies.items() if p.poll() is None}

    @property
    def logs(self) -> list[Path]:
        """Return every log file of the cluster (control plane, kube-proxies, agents)."""
        logdir = self.lab.workdir / "logs"
        out = [self.workdir / "controlplane" / "etcd.log"]
        out.append(self.workdir / "controlplane" / "kube-apiserver.log")
        for node in self.nodes:
            out += [logdir / f"kube-proxy-{node.name}.log", logdir / f"agent-{node.name}.log"]
        return out

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self) -> None:
        """Build the lab, start the control plane, register Nodes, start servers, kube-proxy
        and agents, each waited for with a deadline. On failure everything is torn down."""
        if self._cp is not None:
            raise ClusterError("the cluster is already up")
        if (self.workdir / "controlplane" / "pki").exists():
            raise ClusterError(f"{self.workdir} already holds a control plane: use a fresh one")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.lab.up()
            cp_host = self.lab.controlplane
            assert cp_host is not None
            self._cp = ControlPlane(cp_host.ns, cp_host.ip4, self.workdir / "controlplane")
            self._cp.start()
            self.register_nodes()
            self._create_nodelb_namespace()
            self.lab.start_pod_servers(tcp_port=POD_TCP_PORT, udp_port=POD_UDP_PORT)
            if self.with_kube_proxy:
                self._start_kube_proxies()
            if self.with_agents:
                self._write_agent_config()
                for node in self.nodes:
                    self._agents[node.name] = self._spawn_agent(node)
                for node in self.nodes:
                    self._wait_agent_ready(node)
        except BaseException as exc:
            try:
                self.down()
            except Exception as teardown_error:
                exc.add_note(f"cluster teardown also failed: {teardown_error!r}")
            raise

    def down(self) -> None:
        """Stop agents, kube-proxies, the control plane, then remove the lab. Idempotent.

        Every step is attempted; the first error is re-raised at the end.
        """
        first_error: BaseException | None = None
        procs = [*self._agents.values(), *self._kube_proxies.values()]
        try:
            self._stop_together(procs)
        except Exception as exc:
            first_error = exc
        self._agents.clear()
        self._kube_proxies.clear()
        if self._cp is not None:
            try:
                self._cp.stop()
            except Exception as exc:
                first_error = first_error or exc
            self._cp = None
        self._api = None
        self._routes.clear()
        self._crashed.clear()
        try:
            self.lab.down()
        except Exception as exc:
            first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def stop_controlplane(self) -> None:
        """Stop kube-apiserver and etcd (data kept); `api` is unusable until started again."""
        self._api = None
        self.controlplane.stop()

    def start_controlplane(self) -> None:
        """Start the control plane again after `stop_controlplane()`; returns once ready."""
        self.controlplane.start()

    def to_json(self) -> dict[str, Any]:
        """Return the lab's description plus kubeconfig path and process PIDs."""
        out = self.lab.to_json()
        out["kubeconfig"] = None if self._cp is None else str(self._cp.admin_kubeconfig())
        out["apiserver"] = None if self._cp is None else self._cp.url
        out["agents"] = self.agent_pids
        out["kube_proxies"] = self.kube_proxy_pids
        out["routes"] = {str(ip): node for ip, node in self._routes.items()}
        out["workdir"] = str(self.workdir)
        return out

    # -- Nodes -------------------------------------------------------------------------------

    def register_nodes(self) -> None:
        """Create a Node per lab node (labels, podCIDRs) and write its status (addresses,
        Ready=True) through the status subresource, as the kubelet would."""
        core = self.core
        for node in self.nodes:
            body: Any = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node.name,
                    "labels": {ZONE_LABEL: node.zone, HOSTNAME_LABEL: node.name},
                },
                "spec": {
                    "podCIDR": str(node.pod_cidr4),
                    "podCIDRs": [str(node.pod_cidr4), str(node.pod_cidr6)],
                },
            }
            try:
                core.create_node(body, _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status != 409:  # 409: already registered (register_nodes called again)
                    raise
            status = {
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": str(node.ip4)},
                        {"type": "InternalIP", "address": str(node.ip6)},
                        {"type": "Hostname", "address": node.name},
                    ],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "lab node",
                            "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now(),
                        }
                    ],
                }
            }
            core.patch_node_status(node.name, status, _request_timeout=REQUEST_TIMEOUT)

    # -- kube-proxy --------------------------------------------------------------------------

    def _create_nodelb_namespace(self) -> None:
        """Create the namespace nodelb's Leases live in (the agents' node reports)."""
        try:
            self.core.create_namespace(
                kclient.V1Namespace(metadata=kclient.V1ObjectMeta(name=NODELB_NAMESPACE))
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    def kube_proxy_argv(self, node: LabNode) -> list[str]:
        """Return kube-proxy's command line for `node` in this lab."""
        return kube_proxy_argv(node, kubeconfig=self.kubeconfig(), cluster_cidrs=CLUSTER_CIDRS)

    def _start_kube_proxies(self) -> None:
        for node in self.nodes:
            self._kube_proxies[node.name] = self.lab.spawn(
                node.ns, self.kube_proxy_argv(node), log_name=f"kube-proxy-{node.name}"
            )
        for node in self.nodes:
            proc = self._kube_proxies[node.name]

            def programmed(node: LabNode = node, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise GiveUp(f"kube-proxy in {node.name} exited {proc.returncode}")
                return all(
                    netns.run(
                        node.ns, ["nft", "list", "table", fam, "kube-proxy"], check=False
                    ).stdout.count("chain ")
                    > 0
                    for fam in ("ip", "ip6")
                )

            self._wait(
                programmed,
                READY_TIMEOUT,
                f"kube-proxy in {node.name} to program nft",
                [self._log(f"kube-proxy-{node.name}")],
            )

    # -- agents ------------------------------------------------------------------------------

    @property
    def agent_config_path(self) -> Path:
        """Return the path of the agents' config file."""
        return self.workdir / "nodelb-config.yaml"

    def _write_agent_config(self) -> None:
        self.agent_config_path.write_text(yaml.safe_dump(self.agent_config, sort_keys=False))

    def agent_argv(self, node: LabNode) -> list[str]:
        """Return the `nodelb agent` command line for `node`."""
        return [
            sys.executable,
            "-m",
            "agent.cli",
            "agent",
            f"--kubeconfig={self.kubeconfig()}",
            f"--node-name={node.name}",
            f"--config={self.agent_config_path}",
            f"--metrics-address={node.ip4}:{AGENT_METRICS_PORT}",
            f"--metrics-cert-out={self.agent_cert(node.name)}",
            "--log-format=text",
        ]

    def agent_cert(self, node_name: str) -> Path:
        """Return where the agent of `node_name` publishes its self-signed certificate."""
        return self.workdir / f"agent-{node_name}-metrics.crt"

    def _spawn_agent(self, node: LabNode) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        return self.lab.spawn(
            node.ns, self.agent_argv(node), log_name=f"agent-{node.name}", env=env
        )

    def agent_url(self, node: LabNode, path: str = "/readyz") -> str:
        """Return the URL of an agent's health/metrics endpoint (dialled inside `node.ns`)."""
        return f"https://{node.ip4}:{AGENT_METRICS_PORT}{path}"

    def agent_get(self, node_name: str, path: str) -> tuple[int, str]:
        """Return (status, body) of a GET on an agent's HTTPS endpoint, from inside its node,
        as a scraper does: the lab reader's token (lab/readers.py), the agent's published
        certificate verified."""
        return self.agent_get_as(node_name, path, readers.reader_token(self.controlplane))

    def agent_get_as(self, node_name: str, path: str, token: str | None) -> tuple[int, str]:
        """Return (status, body) of a GET on an agent's endpoint with `token` (None: none)."""
        node = self.lab.node(node_name)
        return readers.get(
            node.ns, self.agent_url(node, path), cert=self.agent_cert(node_name), token=token
        )

    def _wait_agent_ready(self, node: LabNode) -> None:
        proc = self._agents[node.name]

        def ready() -> bool:
            if proc.poll() is not None:
                raise GiveUp(f"nodelb agent in {node.name} exited {proc.returncode}")
            return self.agent_get(node.name, "/readyz")[0] == 200

        self._wait(
            ready,
            READY_TIMEOUT,
            f"nodelb agent in {node.name} to be ready",
            [self._log(f"agent-{node.name}")],
        )

    def start_agent(self, node_name: str) -> None:
        """Start the agent on `node_name` (after `stop_agent`) and wait until it is ready."""
        if node_name in self._agents:
            raise ClusterError(f"the agent on {node_name} is already running")
        node = self.lab.node(node_name)
        if not self.agent_config_path.exists():
            self._write_agent_config()
        self._agents[node_name] = self._spawn_agent(node)
        self._wait_agent_ready(node)

    def stop_agent(self, node_name: str) -> None:
        """Stop the agent on `node_name` (SIGTERM, then KILL) by PID. Its table stays."""
        proc = self._agents.pop(node_name, None)
        if proc is not None:
            self._stop_together([proc])

    def kill_agent(self, node_name: str) -> None:
        """SIGKILL the agent's process group on `node_name` by PID: the agent crashes, the
        node does not. Its speaker runs in a session of its own, sees its parent die and
        resigns gracefully (priority 0), so the IP moves as in a handover; `crash_node` is
        the crash of the whole node."""
        proc = self._agents.pop(node_name)
        netns.stop(proc, sig=signal.SIGKILL)
        self.lab.stop(proc)

    def crash_node(self, node_name: str) -> None:
        """Crash `node_name` as a power loss would: its segment link goes down, then its
        speaker and its agent get SIGKILL, each by its own PID (the speaker runs in a session
        of its own, so killing the agent's process group would only make it resign: a
        graceful handover, not a crash). Nothing is cleaned up; `revive_node` boots it again.
        """
        proc = self._agents.pop(node_name)
        node = self.lab.node(node_name)
        crash(self.lab, node, child_speaker_pids(proc.pid))
        netns.stop(proc, sig=signal.SIGKILL)
        self.lab.stop(proc)
        self._crashed.add(node_name)

    @property
    def crashed(self) -> frozenset[str]:
        """Return the nodes `crash_node` took down that no `revive_node` brought back."""
        return frozenset(self._crashed)

    def revive_node(self, node_name: str) -> None:
        """Boot a crashed node again: the addresses and the nodelb table its agent left are
        gone (a reboot clears them), its link comes up, and its agent starts (waited for)."""
        node = self.lab.node(node_name)
        revive(self.lab, node)
        netns.run(node.ns, ["nft", "delete", "table", "inet", "nodelb"], check=False)
        self._crashed.discard(node_name)
        self.start_agent(node_name)

    def restart_agent(self, node_name: str) -> None:
        """Stop and start the agent on `node_name`; returns once it is ready again."""
        self.stop_agent(node_name)
        self.start_agent(node_name)

    def agent_log(self, node_name: str) -> str:
        """Return the agent's log so far ('' if none)."""
        path = self._log(f"agent-{node_name}")
        return path.read_text(errors="replace") if path.exists() else ""

    # -- API helpers: stand-ins for controllers ---------------------------------------------

    def create_service(
        self,
        name: str,
        *,
        ports: Sequence[SvcPort],
        lb_ip: str | Sequence[str] | None,
        policy: str = "Cluster",
        lb_class: str | None = None,
        external_ips: Sequence[str] = (),
        affinity: int | None = None,
        source_ranges: Sequence[str] = (),
        traffic_distribution: str | None = None,
        namespace: str = "default",
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a LoadBalancer Service, then write `status.loadBalancer.ingress` (ipMode
        VIP) through the status subresource as the allocator would. Returns the Service as
        read back (raw dict). `lb_ip` None leaves the status empty (pending)."""
        spec: dict[str, Any] = {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "externalTrafficPolicy": policy,
            "ports": [
                {
                    "name": p.name,
                    "port": p.port,
                    "targetPort": p.target_port,
                    "protocol": p.protocol,
                }
                for p in ports
            ],
        }
        if lb_class is not None:
            spec["loadBalancerClass"] = lb_class
        if external_ips:
            spec["externalIPs"] = list(external_ips)
        if affinity is not None:
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": affinity}}
        if source_ranges:
            spec["loadBalancerSourceRanges"] = list(source_ranges)
        if traffic_distribution is not None:
            spec["trafficDistribution"] = traffic_distribution
        body: Any = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": dict(annotations or {}),
            },
            "spec": spec,
        }
        self.core.create_namespaced_service(namespace, body, _request_timeout=REQUEST_TIMEOUT)
        if lb_ip is not None:
            self.set_ingress(name, [lb_ip] if isinstance(lb_ip, str) else list(lb_ip), namespace)
        return self.read_service(name, namespace)

    def set_ingress(self, name: str, ips: Sequence[str], namespace: str = "default") -> None:
        """Write `status.loadBalancer.ingress` = [{ip, ipMode: VIP}] via the status subresource."""
        for ip in ips:
            _check_lab_address(ip)
        status = {
            "status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"} for ip in ips]}}
        }
        self.core.patch_namespaced_service_status(
            name, namespace, status, _request_timeout=REQUEST_TIMEOUT
        )

    def read_service(self, name: str, namespace: str = "default") -> dict[str, Any]:
        """Return the Service as raw JSON."""
        resp = self.core.read_namespaced_service(
            name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        return cast(dict[str, Any], json.loads(cast(urllib3.BaseHTTPResponse, resp).data))

    def delete_service(self, name: str, namespace: str = "default") -> None:
        """Delete the Service and its EndpointSlices (no garbage collector runs in the lab)."""
        try:
            self.core.delete_namespaced_service(name, namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.discovery.delete_collection_namespaced_endpoint_slice(
            namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={name}",
            _request_timeout=REQUEST_TIMEOUT,
        )

    def write_endpointslices(
        self,
        service: str,
        pods: Iterable[str],
        *,
        hints: Hints | None = None,
        not_ready: Collection[str] = (),
        terminating: Collection[str] = (),
        ports: Sequence[SvcPort] | None = None,
        families: Collection[int] = (4, 6),
        namespace: str = "default",
    ) -> None:
        """Write the Service's EndpointSlices (one per family, `<service>-ipv4`/`-ipv6`) for
        `pods`, as the EndpointSlice controller would.

        Ports are the Service's (name, targetPort, protocol) unless `ports` overrides them.
        `hints="node"` sets `forNodes` (and `forZones`, as the controller does for
        PreferSameNode, KEP-3015); `"zone"` sets `forZones` (PreferSameZone). Pods in
        `not_ready` are neither ready nor serving; pods in `terminating` are serving and
        terminating but not ready. Every call rewrites the slices whole (hints included), as
        the controller does when pods come and go. `families` picks the address types
        written; a slice of a family left out is deleted.
        """
        pod_list = [self.lab.pod(p) for p in pods]
        if ports is None:
            svc = self.read_service(service, namespace)
            ports = [
                SvcPort(
                    name=p.get("name", ""),
                    port=p["port"],
                    target_port=p["targetPort"],
                    protocol=p.get("protocol", "TCP"),
                )
                for p in svc["spec"]["ports"]
            ]
            uid = svc["metadata"]["uid"]
        else:
            uid = self.read_service(service, namespace)["metadata"]["uid"]
        for fam in (4, 6):
            name = f"{service}-ipv{fam}"
            if fam not in families:
                try:
                    self.discovery.delete_namespaced_endpoint_slice(
                        name, namespace, _request_timeout=REQUEST_TIMEOUT
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                continue
            endpoints = []
            for pod in pod_list:
                node = self.lab.node(pod.node)
                ready = pod.name not in not_ready and pod.name not in terminating
                ep: dict[str, Any] = {
                    "addresses": [str(pod.ip4 if fam == 4 else pod.ip6)],
                    "conditions": {
                        "ready": ready,
                        "serving": ready or pod.name in terminating,
                        "terminating": pod.name in terminating,
                    },
                    "nodeName": node.name,
                    "zone": node.zone,
                    "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod.name},
                }
                if hints is not None:
                    h: dict[str, Any] = {"forZones": [{"name": node.zone}]}
                    if hints == "node":
                        h["forNodes"] = [{"name": node.name}]
                    ep["hints"] = h
                endpoints.append(ep)
            body: Any = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        SERVICE_NAME_LABEL: service,
                        MANAGED_BY_LABEL: SLICE_CONTROLLER,
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Service",
                            "name": service,
                            "uid": uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "addressType": f"IPv{fam}",
                "endpoints": endpoints,
                "ports": [
                    {"name": p.name, "port": p.target_port, "protocol": p.protocol} for p in ports
                ],
            }
            self._apply_slice(name, namespace, body)

    def _apply_slice(self, name: str, namespace: str, body: Any) -> None:
        try:
            self.discovery.create_namespaced_endpoint_slice(
                namespace, body, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = self.discovery.read_namespaced_endpoint_slice(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            raw = json.loads(cast(urllib3.BaseHTTPResponse, current).data)
            body["metadata"]["resourceVersion"] = raw["metadata"]["resourceVersion"]
            self.discovery.replace_namespaced_endpoint_slice(
                name, namespace, body, _request_timeout=REQUEST_TIMEOUT
            )

    def events_for(
        self, name: str, *, reason: str | None = None, namespace: str = "default"
    ) -> list[dict[str, Any]]:
        """Return the core/v1 Events about Service `name` (raw dicts), optionally by reason."""
        resp = self.core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.kind=Service,involvedObject.name={name}",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        items = json.loads(cast(urllib3.BaseHTTPResponse, resp).data)["items"]
        return [e for e in items if reason is None or e.get("reason") == reason]

    # -- routes: the announcer's stand-in ----------------------------------------------------

    def route_lb_via(self, ip: str | IPAddress, node_name: str) -> None:
        """Route one LoadBalancer IP (/32 or /128) from the client via `node_name` (replace)."""
        addr = ipaddress.ip_address(str(ip))
        _check_lab_address(str(addr))
        node = self.lab.node(node_name)
        if addr.version == 4:
            cmd = ["ip", "-4", "route", "replace", f"{addr}/32", "via", str(node.ip4)]
        else:
            cmd = ["ip", "-6", "route", "replace", f"{addr}/128", "via", str(node.ip6)]
        netns.run(self.client_ns, cmd)
        self._routes[addr] = node_name

    def unroute_lb(self, ip: str | IPAddress) -> None:
        """Remove the client's route for `ip` (no error if there is none)."""
        addr = ipaddress.ip_address(str(ip))
        plen = 32 if addr.version == 4 else 128
        netns.run(
            self.client_ns,
            ["ip", f"-{addr.version}", "route", "del", f"{addr}/{plen}"],
            check=False,
        )
        self._routes.pop(addr, None)

    # -- nodelb table read-back --------------------------------------------------------------

    def nodelb_table(self, node_name: str) -> dict[str, Any] | None:
        """Return `nft -j list table inet nodelb` in `node_name` parsed, None if no table."""
        node = self.lab.node(node_name)
        proc = netns.run(node.ns, ["nft", "-j", "list", "table", *NFT_TABLE], check=False)
        if proc.returncode != 0:
            return None
        return cast(dict[str, Any], json.loads(proc.stdout))

    def has_rule(
        self,
        node_name: str,
        ip: str,
        port: int,
        protocol: str = "tcp",
        *,
        with_endpoints: bool = False,
    ) -> bool:
        """Return True when the node's nodelb table has a frontend element for ip/proto/port
        (in `ext`, `int`, `noep` or `drop`; with `with_endpoints`, not in `noep`: the node
        has seen the Service's endpoints)."""
        key = (ipaddress.ip_address(ip), _PROTO_NUMBERS[protocol.lower()], port)
        maps = [m for m, keys in frontend_keys(self.nodelb_table(node_name)).items() if key in keys]
        if with_endpoints and any(m.startswith("noep") for m in maps):
            return False
        return bool(maps)

    def wait_rules(
        self,
        ip: str,
        port: int,
        expect_present: bool = True,
        *,
        protocol: str = "tcp",
        nodes: Sequence[str] | None = None,
        timeout: float = RULES_TIMEOUT,
        with_endpoints: bool = False,
    ) -> None:
        """Poll each node's nodelb table until the frontend ip/proto/port is present (or
        absent) everywhere, with `with_endpoints` outside `noep`; raises WaitTimeout naming
        the nodes that lag, with agent logs."""
        names = list(nodes) if nodes is not None else [n.name for n in self.nodes]
        lagging: list[str] = []

        def present(n: str) -> bool:
            return self.has_rule(n, ip, port, protocol, with_endpoints=with_endpoints)

        def settled() -> bool:
            lagging[:] = [n for n in names if present(n) != expect_present]
            return not lagging

        what = f"{ip} {protocol}/{port} to be {'present' if expect_present else 'absent'}"
        self._wait(
            settled,
            timeout,
            f"{what} in the nodelb tables (lagging: {lagging})",
            [self._log(f"agent-{n}") for n in names],
        )

    # -- internals ---------------------------------------------------------------------------

    def _stop_together(
        self, procs: Sequence[subprocess.Popen[bytes]], grace: float = STOP_GRACE
    ) -> None:
        """Stop processes in parallel: SIGTERM to every group, one shared grace period, then
        SIGKILL to the groups still running; each is then forgotten by the lab."""
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: all(p.poll() is not None for p in procs), grace, "processes to stop")
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        first_error: BaseException | None = None
        for proc in procs:
            try:
                self.lab.stop(proc)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def _log(self, name: str) -> Path:
        return self.lab.workdir / "logs" / f"{name}.log"

    def _wait(self, predicate: Any, timeout: float, what: str, logs: Sequence[Path]) -> None:
        try:
            wait_until(predicate, timeout, what, interval=0.1)
        except (TimeoutError, GiveUp) as exc:
            tails = "\n".join(tail(p, LOG_TAIL_LINES) for p in logs)
            raise ClusterError(f"{exc}\n{tails}") from exc


def _check_lab_address(ip: str) -> None:
    addr = ipaddress.ip_address(ip)
    space = LAB_SPACE4 if addr.version == 4 else LAB_SPACE6
    if addr not in space:
        raise ValueError(f"{ip} is outside the lab address space {space}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
