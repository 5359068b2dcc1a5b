"""Build and tear down the network-namespace lab: a switch, nodes with pods, client, control plane.

Topology (see docs/lab.md for the full address plan)::

    <prefix>-switch   bridge br0; one veth port per attached host (nodes, client, controlplane)
    <prefix>-node-k   eth0 on the segment; bridge cbr0 for its pods; forwarding on
    <prefix>-pod-k-i  eth0 on node k's cbr0
    <prefix>-client   eth0 on the segment
    <prefix>-cp       eth0 on the segment (the control plane)
    <prefix>-router   eth0 on the segment, eth1 to the outside network (optional)
    <prefix>-outside  eth0 on the outside network: a client that reaches the segment only
                      through the router (optional, with the router)

Every veth pair is created *inside* a lab namespace with its peer placed straight into
another lab namespace, so no link is ever created in the root namespace, and no namespace
gets a default route. Addresses come only from 198.18.0.0/15 and 2001:db8::/32.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    IPv6Address,
    IPv6Interface,
    IPv6Network,
)
from pathlib import Path
from typing import Any

from lab import netns
from lab.lifecycle import UpDown
from lab.wait import GiveUp, wait_until

SEGMENT4 = IPv4Network("198.18.0.0/24")
SEGMENT6 = IPv6Network("2001:db8::/64")
LAB_SPACE4 = IPv4Network("198.18.0.0/15")
LAB_SPACE6 = IPv6Network("2001:db8::/32")
CONTROLPLANE4 = IPv4Address("198.18.0.2")
CONTROLPLANE6 = IPv6Address("2001:db8::2")
CLIENT4 = IPv4Address("198.18.0.100")
CLIENT6 = IPv6Address("2001:db8::100")
# The upstream router: the segment's gateway for the outside network. It reaches LoadBalancer
# IPs on the segment by ARP/ND, as a real upstream router does, so gratuitous ARP/NA must
# move its neighbour entries. The outside network lies outside the nodes' 198.18.0.0/16 and
# outside the pods' 198.19.0.0/17 (the cluster CIDR), as a client on the Internet would.
ROUTER4 = IPv4Address("198.18.0.1")
ROUTER6 = IPv6Address("2001:db8::1")
OUTSIDE4 = IPv4Network("198.19.200.0/24")
OUTSIDE6 = IPv6Network("2001:db8:2::/64")
OUTSIDE_GW4 = IPv4Address("198.19.200.1")
OUTSIDE_GW6 = IPv6Address("2001:db8:2::1")
OUTSIDE_CLIENT4 = IPv4Address("198.19.200.10")
OUTSIDE_CLIENT6 = IPv6Address("2001:db8:2::10")
# Left free on the segment for LoadBalancer / external IPs; the lab never assigns these.
LB_RANGE4 = (IPv4Address("198.18.0.200"), IPv4Address("198.18.0.250"))
LB_RANGE6 = (IPv6Address("2001:db8::200"), IPv6Address("2001:db8::250"))
MAX_NODES = 80  # nodes use .11 .. .90, below the client's .100
MAX_PODS_PER_NODE = 200  # pods use .11 .. .210 in their node's /24
SEGMENT_IFNAME = "eth0"
NODE_POD_BRIDGE = "cbr0"
SWITCH_BRIDGE = "br0"
SERVER_READY_TIMEOUT = 60.0
# No STP (ports forward at once) and no multicast snooping (VRRP and NDP multicast flood).
_BRIDGE_OPTS = "stp_state 0 forward_delay 0 mcast_snooping 0"

_REPO_ROOT = Path(__file__).resolve().parents[1]

# Per-namespace sysctls: DAD off (addresses usable at once), no reverse-path filtering.
# `default` is set before any interface exists so every interface created later inherits it.
_BASE_SYSCTLS = (
    "net.ipv6.conf.all.accept_dad=0",
    "net.ipv6.conf.default.accept_dad=0",
    "net.ipv6.conf.all.accept_ra=0",
    "net.ipv6.conf.default.accept_ra=0",
    "net.ipv4.conf.all.rp_filter=0",
    "net.ipv4.conf.default.rp_filter=0",
)
_ROUTER_SYSCTLS = (
    "net.ipv4.ip_forward=1",
    "net.ipv6.conf.all.forwarding=1",
    "net.ipv6.conf.default.forwarding=1",
)


@dataclass(frozen=True, slots=True)
class Host:
    """A lab machine: its name, namespace, segment-facing interface and addresses on it."""

    name: str
    ns: str
    ip4: IPv4Address
    ip6: IPv6Address
    ifname: str


@dataclass(frozen=True, slots=True)
class LabNode(Host):
    """A Kubernetes node: on the segment, routing for its own pod CIDRs (bridge cbr0)."""

    zone: str
    pod_cidr4: IPv4Network
    pod_cidr6: IPv6Network


@dataclass(frozen=True, slots=True)
class Pod(Host):
    """A pod, attached to its node's cbr0; `ip4`/`ip6` are the pod IPs, `node` its node name."""

    node: str


@dataclass(frozen=True)
class LabSpec:
    """What to build. `prefix` None means a fresh random one (`nlb` + 6 hex digits)."""

    nodes: int = 2
    pods_per_node: int = 2
    zones: tuple[str, ...] = ("zone-a", "zone-b")
    with_controlplane: bool = True
    with_client: bool = True
    with_router: bool = False
    prefix: str | None = None


class LabError(RuntimeError):
    """The lab could not be built or used; the message says which step failed."""


def node_addresses(k: int) -> tuple[IPv4Address, IPv6Address]:
    """Return node-k's segment addresses: 198.18.0.(10+k) and 2001:db8::(10+k) (written alike)."""
    return IPv4Address(f"198.18.0.{10 + k}"), IPv6Address(f"2001:db8::{10 + k}")


def pod_cidrs(k: int) -> tuple[IPv4Network, IPv6Network]:
    """Return node-k's pod CIDRs: 198.19.k.0/24 and 2001:db8:1:k::/64 (k written alike)."""
    return IPv4Network(f"198.19.{k}.0/24"), IPv6Network(f"2001:db8:1:{k}::/64")


def pod_addresses(k: int, i: int) -> tuple[IPv4Address, IPv6Address]:
    """Return pod-k-i's addresses: 198.19.k.(10+i) and 2001:db8:1:k::(10+i) (written alike)."""
    return IPv4Address(f"198.19.{k}.{10 + i}"), IPv6Address(f"2001:db8:1:{k}::{10 + i}")


def gateway_addresses(k: int) -> tuple[IPv4Address, IPv6Address]:
    """Return node-k's cbr0 addresses, its pods' gateway: 198.19.k.1 and 2001:db8:1:k::1."""
    return IPv4Address(f"198.19.{k}.1"), IPv6Address(f"2001:db8:1:{k}::1")


@dataclass
class _Tracked:
    proc: subprocess.Popen[bytes]
    ns: str
    log: Path


@dataclass
class _State:
    namespaces: list[str] = field(default_factory=list)
    procs: list[_Tracked] = field(default_factory=list)


class Lab(UpDown):
    """A network-namespace lab built from a LabSpec; `up()` builds it, `down()` removes it.

    The constructor only computes names and addresses. `nodes`, `pods`, `client` and
    `controlplane` are valid from construction on (`client`/`controlplane` are None when the
    spec leaves them out); the namespaces exist only between `up()` and `down()`.
    """

    def __init__(self, spec: LabSpec, workdir: Path) -> None:
        if not 1 <= spec.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}, got {spec.nodes}")
        if not 0 <= spec.pods_per_node <= MAX_PODS_PER_NODE:
            raise ValueError(f"pods_per_node must be 0..{MAX_PODS_PER_NODE}")
        if not spec.zones:
            raise ValueError("zones must name at least one zone")
        self.spec = spec
        self.workdir = workdir
        self.prefix = spec.prefix if spec.prefix is not None else f"nlb{secrets.token_hex(3)}"
        self.switch_ns = f"{self.prefix}-switch"
        self.nodes: list[LabNode] = []
        self.pods: list[Pod] = []
        for k in range(1, spec.nodes + 1):
            ip4, ip6 = node_addresses(k)
            cidr4, cidr6 = pod_cidrs(k)
            name = f"node-{k}"
            self.nodes.append(
                LabNode(
                    name=name,
                    ns=f"{self.prefix}-{name}",
                    ip4=ip4,
                    ip6=ip6,
                    ifname=SEGMENT_IFNAME,
                    zone=spec.zones[(k - 1) % len(spec.zones)],
                    pod_cidr4=cidr4,
                    pod_cidr6=cidr6,
                )
            )
            for i in range(1, spec.pods_per_node + 1):
                pip4, pip6 = pod_addresses(k, i)
                pod_name = f"pod-{k}-{i}"
                self.pods.append(
                    Pod(
                        name=pod_name,
                        ns=f"{self.prefix}-{pod_name}",
                        ip4=pip4,
                        ip6=pip6,
                        ifname=SEGMENT_IFNAME,
                        node=name,
                    )
                )
        self.client: Host | None = (
            Host("client", f"{self.prefix}-client", CLIENT4, CLIENT6, SEGMENT_IFNAME)
            if spec.with_client
            else None
        )
        self.controlplane: Host | None = (
            Host("controlplane", f"{self.prefix}-cp", CONTROLPLANE4, CONTROLPLANE6, SEGMENT_IFNAME)
            if spec.with_controlplane
            else None
        )
        self.router: Host | None = None
        self.outside: Host | None = None
        if spec.with_router:
            self.router = Host("router", f"{self.prefix}-router", ROUTER4, ROUTER6, SEGMENT_IFNAME)
            self.outside = Host(
                "outside",
                f"{self.prefix}-outside",
                OUTSIDE_CLIENT4,
                OUTSIDE_CLIENT6,
                SEGMENT_IFNAME,
            )
        self._state = _State()
        self._served: dict[str, dict[str, int | None]] = {}

    # -- lookup ---------------------------------------------------------------------------

    def node(self, name: str) -> LabNode:
        """Return the node called `name`; raises KeyError for an unknown name."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def pods_on(self, node_name: str) -> list[Pod]:
        """Return the pods on node `node_name`, in index order (empty if it has none)."""
        return [pod for pod in self.pods if pod.node == node_name]

    def pod(self, name: str) -> Pod:
        """Return the pod called `name`; raises KeyError for an unknown name."""
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise KeyError(name)

    def segment_hosts(self) -> list[Host]:
        """Return every host with a port on the switch: router, control plane, nodes, client."""
        hosts: list[Host] = []
        if self.router is not None:
            hosts.append(self.router)
        if self.controlplane is not None:
            hosts.append(self.controlplane)
        hosts.extend(self.nodes)
        if self.client is not None:
            hosts.append(self.client)
        return hosts

    @property
    def namespaces(self) -> list[str]:
        """Return the names of every namespace this lab has created and not yet removed."""
        return list(self._state.namespaces)

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Return every process `spawn` started (running or exited) not yet stopped by the lab."""
        return [t.proc for t in self._state.procs]

    # -- lifecycle ------------------------------------------------------------------------

    def up(self) -> None:
        """Build every namespace, link, address and route; on failure remove it all, re-raise."""
        if self._state.namespaces:
            raise LabError(f"lab {self.prefix} is already up")
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Safety net: if the program exits (say after Ctrl-C) without down(), tear down anyway.
        atexit.register(self._down_at_exit)
        try:
            self._build()
        except BaseException:
            with contextlib.suppress(Exception):  # the build error is the one to report
                self.down()
            raise

    def down(self) -> None:
        """Stop every process the lab started, then delete every namespace. Idempotent.

        Processes are stopped by PID (their own process group, started by `spawn`); any
        process still inside a lab namespace is then stopped by `netns.delete`. Every step is
        attempted even when an earlier one fails; the first error is re-raised at the end.
        """
        atexit.unregister(self._down_at_exit)
        first_error: BaseException | None = None
        for tracked in self._state.procs:  # signal all first, so they stop in parallel
            if tracked.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(tracked.proc.pid, signal.SIGTERM)
        for tracked in reversed(self._state.procs):
            try:
                netns.stop(tracked.proc)
            except Exception as exc:
                first_error = first_error or exc
        self._state.procs.clear()
        self._served.clear()
        # Pods before nodes before the switch: leaves first, though any order works.
        for name in reversed(self._state.namespaces):
            try:
                netns.delete(name)
            except Exception as exc:
                first_error = first_error or exc
        self._state.namespaces = [n for n in self._state.namespaces if netns.exists(n)]
        if first_error is not None:
            raise first_error
        if self._state.namespaces:
            raise LabError(f"namespaces left after teardown: {self._state.namespaces}")

    def detach(self) -> None:
        """Leave the lab running after this process exits (`nodelb lab up`).

        Only the exit-time teardown is dropped; `nodelb lab down` later removes the lab by its
        namespaces (which also stops every process inside them).
        """
        atexit.unregister(self._down_at_exit)

    def _down_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.down()

    # -- processes ------------------------------------------------------------------------

    def spawn(
        self,
        ns: str,
        argv: Sequence[str],
        *,
        log_name: str,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` in lab namespace `ns`, tracked for teardown; output to workdir/logs.

        Returns the Popen; its PID leads a fresh process group that `down()` stops.
        """
        if ns not in self._state.namespaces:
            raise LabError(f"{ns!r} is not a namespace of lab {self.prefix}")
        logdir = self.workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        log = logdir / f"{log_name}.log"
        proc = netns.spawn(ns, argv, log=log, env=env)
        self._state.procs.append(_Tracked(proc=proc, ns=ns, log=log))
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop one tracked process (TERM, then KILL) and forget it."""
        netns.stop(proc)
        self._state.procs = [t for t in self._state.procs if t.proc is not proc]

    # -- the segment's cables ----------------------------------------------------------------

    def switch_port(self, host: Host) -> str:
        """Return the name of `host`'s port on the switch bridge (in `switch_ns`)."""
        return f"sw-{host.name}"[:15]

    def unplug(self, host: Host) -> None:
        """Take `host`'s switch port down: nothing it sends reaches the segment, nothing on
        the segment reaches it, and its own interface loses carrier (a pulled cable, or a
        node that lost power). Its namespace, addresses and processes are left as they are."""
        self._ip(self.switch_ns, f"link set {self.switch_port(host)} down")

    def plug(self, host: Host) -> None:
        """Bring `host`'s switch port up again (after `unplug`)."""
        self._ip(self.switch_ns, f"link set {self.switch_port(host)} up")

    def forget_addresses(self, host: Host) -> list[str]:
        """Remove every address of `host`'s segment interface but its own and its link-local
        one, as a reboot would (the addresses a crashed VRRP speaker left behind); return them.
        """
        out = netns.run(host.ns, ["ip", "-j", "addr", "show", "dev", host.ifname]).stdout
        own = {str(host.ip4), str(host.ip6)}
        removed = []
        for link in json.loads(out):
            for a in link["addr_info"]:
                local = a["local"]
                if local in own or local.startswith("fe80:"):
                    continue
                netns.run(
                    host.ns, ["ip", "addr", "del", f"{local}/{a['prefixlen']}", "dev", host.ifname]
                )
                removed.append(local)
        return removed

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        """Return what a tracked process has written so far ('' if nothing)."""
        for tracked in self._state.procs:
            if tracked.proc is proc:
                return tracked.log.read_text(errors="replace") if tracked.log.exists() else ""
        raise KeyError(proc.pid)

    def start_pod_servers(
        self, tcp_port: int = 8080, udp_port: int = 8081, sctp_port: int | None = None
    ) -> None:
        """Start one lab.servers process per pod and wait until every one is listening.

        When the kernel has no SCTP the servers serve TCP and UDP only (see `sctp_served`).
        """
        self.start_servers(self.pods, tcp_port=tcp_port, udp_port=udp_port, sctp_port=sctp_port)

    def start_servers(
        self,
        hosts: Sequence[Host],
        *,
        tcp_port: int = 8080,
        udp_port: int = 8081,
        sctp_port: int | None = None,
    ) -> list[subprocess.Popen[bytes]]:
        """Start an lab.servers process named after each host, in its namespace.

        Returns the processes (tracked, stopped by `down()`) once every one is listening.
        Readiness is each server's ready file (written after binding), polled with a
        deadline; a server that exits first fails the wait at once with its log.
        """
        ready_dir = self.workdir / "ready"
        ready_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        started: list[tuple[Host, subprocess.Popen[bytes], Path]] = []
        for h in hosts:
            ready = ready_dir / f"{h.name}.json"
            ready.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "lab.servers", "--name", h.name]
            argv += ["--tcp", str(tcp_port), "--udp", str(udp_port), "--ready-file", str(ready)]
            if sctp_port is not None:
                argv += ["--sctp", str(sctp_port)]
            proc = self.spawn(h.ns, argv, log_name=f"server-{h.name}", env=env)
            started.append((h, proc, ready))

        def all_ready() -> bool:
            for h, proc, _ in started:
                if proc.poll() is not None:
                    raise GiveUp(
                        f"server in {h.name} exited {proc.returncode}: {self.log_of(proc)}"
                    )
            return all(ready.exists() for _, _, ready in started)

        wait_until(all_ready, SERVER_READY_TIMEOUT, f"servers in {len(started)} hosts to listen")
        for h, _, ready in started:
            self._served[h.name] = json.loads(ready.read_text())
        return [proc for _, proc, _ in started]

    def sctp_served(self) -> bool:
        """Return True when every pod server listens on SCTP (False if not asked or no kernel)."""
        served = [self._served.get(pod.name, {}) for pod in self.pods]
        return bool(served) and all(s.get("sctp") is not None for s in served)

    # -- description ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Return names, namespaces, addresses and zones as plain JSON-ready values."""

        def host(h: Host) -> dict[str, Any]:
            return {
                "name": h.name,
                "ns": h.ns,
                "ip4": str(h.ip4),
                "ip6": str(h.ip6),
                "ifname": h.ifname,
            }

        return {
            "prefix": self.prefix,
            "switch_ns": self.switch_ns,
            "segment": {"ipv4": str(SEGMENT4), "ipv6": str(SEGMENT6)},
            "lb_range": {
                "ipv4": [str(LB_RANGE4[0]), str(LB_RANGE4[1])],
                "ipv6": [str(LB_RANGE6[0]), str(LB_RANGE6[1])],
            },
            "nodes": [
                host(n)
                | {"zone": n.zone, "pod_cidr4": str(n.pod_cidr4), "pod_cidr6": str(n.pod_cidr6)}
                for n in self.nodes
            ],
            "pods": [host(p) | {"node": p.node} for p in self.pods],
            "client": None if self.client is None else host(self.client),
            "controlplane": None if self.controlplane is None else host(self.controlplane),
            "router": None if self.router is None else host(self.router),
            "outside": None if self.outside is None else host(self.outside),
            "up": bool(self._state.namespaces),
        }

    # -- building -------------------------------------------------------------------------

    def _create_ns(self, name: str, *, router: bool = False) -> None:
        if netns.exists(name):  # someone else's: never record (and so never delete) it
            raise LabError(f"network namespace {name!r} already exists")
        # Recorded before creation so a half-created namespace is still removed by down().
        self._state.namespaces.append(name)
        netns.create(name)
        sysctls = _BASE_SYSCTLS + (_ROUTER_SYSCTLS if router else ())
        netns.run(name, ["sysctl", "-q", "-w", *sysctls])

    def _ip(self, ns: str, command: str) -> None:
        """Run `ip <command>` (split on spaces: no argument contains one) inside `ns`."""
        netns.run(ns, ["ip", *command.split()])

    def _build(self) -> None:
        sw = self.switch_ns
        self._create_ns(sw)
        self._ip(sw, f"link add name {SWITCH_BRIDGE} type bridge {_BRIDGE_OPTS}")
        self._ip(sw, f"link set {SWITCH_BRIDGE} up")
        for h in self.segment_hosts():
            self._create_ns(h.ns, router=isinstance(h, LabNode) or h is self.router)
            port = self.switch_port(h)
            self._ip(sw, f"link add name {port} type veth peer name {h.ifname} netns {h.ns}")
            self._ip(sw, f"link set {port} master {SWITCH_BRIDGE}")
            self._ip(sw, f"link set {port} up")
            self._address(
                h.ns,
                h.ifname,
                IPv4Interface((h.ip4, SEGMENT4.prefixlen)),
                IPv6Interface((h.ip6, SEGMENT6.prefixlen)),
            )
        for k, node in enumerate(self.nodes, start=1):
            self._build_node(k, node)
        for h in self.segment_hosts():
            # Nodes route to the other nodes' pods; client and control plane to every node's.
            for peer in self.nodes:
                if peer.name != h.name:
                    self._ip(h.ns, f"-4 route add {peer.pod_cidr4} via {peer.ip4}")
                    self._ip(h.ns, f"-6 route add {peer.pod_cidr6} via {peer.ip6}")
        if self.router is not None and self.outside is not None:
            self._build_outside(self.router, self.outside)

    def _build_outside(self, router: Host, outside: Host) -> None:
        """Link the outside client to the router; route the outside network via the router."""
        self._create_ns(outside.ns)
        self._ip(
            router.ns, f"link add name eth1 type veth peer name {outside.ifname} netns {outside.ns}"
        )
        self._address(
            router.ns,
            "eth1",
            IPv4Interface((OUTSIDE_GW4, OUTSIDE4.prefixlen)),
            IPv6Interface((OUTSIDE_GW6, OUTSIDE6.prefixlen)),
        )
        self._address(
            outside.ns,
            outside.ifname,
            IPv4Interface((outside.ip4, OUTSIDE4.prefixlen)),
            IPv6Interface((outside.ip6, OUTSIDE6.prefixlen)),
        )
        # The whole lab space, not a default route: nothing leaves the lab.
        self._ip(outside.ns, f"-4 route add {LAB_SPACE4} via {OUTSIDE_GW4}")
        self._ip(outside.ns, f"-6 route add {LAB_SPACE6} via {OUTSIDE_GW6}")
        # The router is every segment host's gateway for the rest of the lab space (the
        # outside network, and addresses such as Service ClusterIPs that only need a route
        # for the first lookup before kube-proxy's DNAT): a default route scoped to the lab.
        for h in self.segment_hosts():
            if h is not router:
                self._ip(h.ns, f"-4 route add {LAB_SPACE4} via {router.ip4}")
                self._ip(h.ns, f"-6 route add {LAB_SPACE6} via {router.ip6}")

    def _build_node(self, k: int, node: LabNode) -> None:
        gw4, gw6 = gateway_addresses(k)
        self._ip(node.ns, f"link add name {NODE_POD_BRIDGE} type bridge {_BRIDGE_OPTS}")
        self._ip(node.ns, f"link set {NODE_POD_BRIDGE} up")
        self._address(
            node.ns,
            NODE_POD_BRIDGE,
            IPv4Interface((gw4, node.pod_cidr4.prefixlen)),
            IPv6Interface((gw6, node.pod_cidr6.prefixlen)),
        )
        for i, pod in enumerate(self.pods_on(node.name), start=1):
            self._create_ns(pod.ns)
            port = f"vp{i}"
            self._ip(
                node.ns, f"link add name {port} type veth peer name {pod.ifname} netns {pod.ns}"
            )
            self._ip(node.ns, f"link set {port} master {NODE_POD_BRIDGE}")
            # Hairpin mode, as the real nodes' CNI bridge sets it (lab/noderuntime.py): with
            # br_netfilter, a pod's packet DNATed to its own address is bridged back out of the
            # port it came in by, which a bridge port refuses without it.
            self._ip(node.ns, f"link set {port} type bridge_slave hairpin on")
            self._ip(node.ns, f"link set {port} up")
            self._address(
                pod.ns,
                pod.ifname,
                IPv4Interface((pod.ip4, node.pod_cidr4.prefixlen)),
                IPv6Interface((pod.ip6, node.pod_cidr6.prefixlen)),
            )
            self._ip(pod.ns, f"-4 route add {LAB_SPACE4} via {gw4}")
            self._ip(pod.ns, f"-6 route add {LAB_SPACE6} via {gw6}")

    def _address(self, ns: str, ifname: str, ip4: IPv4Interface, ip6: IPv6Interface) -> None:
        self._ip(ns, f"addr add {ip4} dev {ifname}")
        self._ip(ns, f"-6 addr add {ip6} dev {ifname} nodad")
        self._ip(ns, f"link set {ifname} up")


def remove_stale(prefix: str) -> list[str]:
    """Delete every namespace named `<prefix>-*` (left by a crashed run); return their names."""
    if not netns.NETNS_DIR.exists():
        return []
    removed = []
    for entry in sorted(netns.NETNS_DIR.iterdir()):
        if entry.name.startswith(f"{prefix}-"):
            with contextlib.suppress(netns.NetnsError):
                netns.delete(entry.name)
            removed.append(entry.name)
    return removed
