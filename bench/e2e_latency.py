"""Benchmark object-written-to-rule-in-kernel latency in the lab cluster, nodelb vs kube-proxy.

A `ClusterLab` (real kube-apiserver + etcd, Node objects, real kube-proxy in nftables mode and
`nodelb agent` on every node) is loaded with S LoadBalancer Services (one TCP port each,
`allocateLoadBalancerNodePorts: false`, ingress written as the allocator would) and one
EndpointSlice each with `--endpoints` endpoints. Endpoint addresses lie in the nodes' pod
CIDRs; nothing listens behind them: the rules are what is measured. The objects are written
in parallel (a thread pool) and the time taken is reported. Beyond 4k Services an extra
ServiceCIDR object gives the apiserver room for the ClusterIPs.

Then, for each of `--changes` changes, one Service's slice is patched (one endpoint address
replaced by a fresh one) and the time from just before the PATCH is sent until the new
endpoint appears in the kernel is taken, on every node, for both tables:
- nodelb: an added `be4_n` element `<lb ip> . tcp . <port> . <i> : <addr> . <port>` in
  `table inet nodelb`;
- kube-proxy: the re-added rule of the Service's chain `service-<hash>-<ns>/<svc>/tcp/<port>`
  in `table ip kube-proxy`, whose anonymous `numgen random mod n map { i : addr . port }` now
  holds the new endpoint (kube-proxy v1.37's nftables mode has no per-endpoint chains for a
  Service without affinity: it rewrites that one rule).
Nothing is polled: `nft monitor new` runs in every node namespace (a lab process, writing to a
FIFO), and a reader thread per node stamps each line on arrival. The latency of a change is
that of the slowest node. Changes are spaced by `--gap` seconds after both tables settled, so
kube-proxy's default 1 s minimum sync period does not count against it. A change not seen
within `--timeout` counts as missed (not in the percentiles): nft 1.0.6's monitor drops element
events for a set it has not cached ("Received event for an unknown set"), which can happen
when a full resync recreates the nodelb table.

Process figures, for every agent and kube-proxy: VmRSS and VmHWM from /proc/<pid>/status
after each phase, and CPU seconds (utime+stime of the process plus its reaped children:
kube-proxy runs `nft` as a child per transaction) over the setup and the change phases.

Sizes run in ascending order in one cluster, each topping up the previous one. Prints a
table, then as its last line one JSON object with every figure.

    .venv/bin/python -m bench.e2e_latency [--services 1000,10000] [--changes 100] [--nodes 2]
        [--endpoints 10] [--threads 8] [--gap 1.0] [--timeout 20] [--announce]
        [--resync-period S]
        [--workdir DIR (keep logs)]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ipaddress
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from bench.measure import percentile, proc_mem_mb
from lab import netns
from lab.cluster import (
    LAB_ANNOUNCE,
    MANAGED_BY_LABEL,
    POD_TCP_PORT,
    SERVICE_NAME_LABEL,
    SLICE_CONTROLLER,
    ClusterLab,
)
from lab.topology import LB_RANGE4, LabSpec
from lab.wait import wait_until

NAMESPACE = "default"
PORT_NAME = "http"
FIRST_FRONTEND_PORT = 10000
# The apiserver's own range (198.18.128.0/20) holds 4094 ClusterIPs; this one adds 16382.
EXTRA_SERVICE_CIDR = "198.18.192.0/18"
EXTRA_CIDR_ABOVE = 4000  # Services: create the extra ServiceCIDR beyond this many
BASE_HOSTS = range(20, 220)  # host part of baseline endpoint addresses in a node's /24
CHANGE_HOSTS = range(230, 255)  # host part of the addresses changes bring in (never baseline)
TARGET_P99_MS = 100.0
TARGET_RSS_MB = 200.0
SETTLE_TIMEOUT = 1800.0
REQUEST_TIMEOUT = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
_END = b"\n#nodelb-bench-end\n"


# -- the objects -----------------------------------------------------------------------------


def lb_ip(i: int) -> str:
    """Return Service i's LoadBalancer IP: the lab's LB range, round-robin."""
    span = int(LB_RANGE4[1]) - int(LB_RANGE4[0]) + 1
    return str(ipaddress.IPv4Address(int(LB_RANGE4[0]) + i % span))


def lb_port(i: int) -> int:
    """Return Service i's port: (ip, port) is unique per Service."""
    span = int(LB_RANGE4[1]) - int(LB_RANGE4[0]) + 1
    return FIRST_FRONTEND_PORT + i // span


def svc_name(i: int) -> str:
    return f"lat-{i:05d}"


def base_endpoints(i: int, n: int, nodes: int) -> list[tuple[str, int]]:
    """Return Service i's baseline endpoints as (address, node index), spread over nodes."""
    per_node = -(-n // nodes)
    out = []
    for j in range(n):
        k = 1 + j % nodes
        host = BASE_HOSTS[(i * per_node + j // nodes) % len(BASE_HOSTS)]
        out.append((f"198.19.{k}.{host}", k))
    return out


def slice_endpoints(eps: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [
        {
            "addresses": [addr],
            "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": f"node-{k}",
        }
        for addr, k in eps
    ]


def service_body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc_name(i), "namespace": NAMESPACE},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": svc_name(i)},
            "externalTrafficPolicy": "Cluster",
            "allocateLoadBalancerNodePorts": False,
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": lb_port(i),
                    "targetPort": POD_TCP_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def slice_body(i: int, uid: str, eps: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{svc_name(i)}-ipv4",
            "namespace": NAMESPACE,
            "labels": {SERVICE_NAME_LABEL: svc_name(i), MANAGED_BY_LABEL: SLICE_CONTROLLER},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": svc_name(i),
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": slice_endpoints(eps),
        "ports": [{"name": PORT_NAME, "port": POD_TCP_PORT, "protocol": "TCP"}],
    }


# -- process figures -------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """Return utime+stime of `pid` plus its reaped children's (cutime+cstime), in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime=14, stime=15, cutime=16, cstime=17.
    return sum(int(fields[n - 3]) for n in (14, 15, 16, 17)) / CLK_TCK


@dataclass
class ProcFigures:
    """One kind of process (nodelb agents or kube-proxies), max over the nodes."""

    rss_mb: float
    hwm_mb: float
    setup_cpu_s: float
    changes_cpu_s: float
    changes_cpu_pct: float


def cpu_all(pids: dict[str, int]) -> dict[str, float]:
    return {n: proc_cpu_s(p) for n, p in pids.items()}


def proc_figures(
    pids: dict[str, int],
    cpu0: dict[str, float],
    cpu1: dict[str, float],
    cpu2: dict[str, float],
    change_wall_s: float,
) -> ProcFigures:
    mem = [proc_mem_mb(p) for p in pids.values()]
    setup = max(cpu1[n] - cpu0[n] for n in pids)
    chg = max(cpu2[n] - cpu1[n] for n in pids)
    return ProcFigures(
        rss_mb=max(m[0] for m in mem),
        hwm_mb=max(m[1] for m in mem),
        setup_cpu_s=setup,
        changes_cpu_s=chg,
        changes_cpu_pct=100 * chg / change_wall_s if change_wall_s > 0 else 0.0,
    )


def sync_metrics(cluster: ClusterLab) -> dict[str, dict[str, tuple[float, float]]]:
    """Return, per node, the agent's nodelb_sync_duration_seconds (sum, count) by mode."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    pat = re.compile(r'^nodelb_sync_duration_seconds_(sum|count)\{mode="([^"]+)"\} (\S+)$')
    counters = re.compile(r"^nodelb_(nft_drift_repairs|nft_transaction_failures)_total (\S+)$")
    for node in cluster.nodes:
        by_mode: dict[str, list[float]] = {}
        with contextlib.suppress(Exception):
            _, text = cluster.agent_get(node.name, "/metrics")
            for line in text.splitlines():
                if m := pat.match(line):
                    pair = by_mode.setdefault(m.group(2), [0.0, 0.0])
                    pair[0 if m.group(1) == "sum" else 1] = float(m.group(3))
                elif m := counters.match(line):  # a counter: (0, value)
                    by_mode[m.group(1)] = [0.0, float(m.group(2))]
        out[node.name] = {k: (v[0], v[1]) for k, v in by_mode.items()}
    return out


def sync_delta(
    before: dict[str, dict[str, tuple[float, float]]],
    after: dict[str, dict[str, tuple[float, float]]],
) -> dict[str, dict[str, float]]:
    """Return, per sync mode, the syncs the agents ran between two scrapes (all nodes) and
    their mean duration in ms; the drift-repair and refused-transaction counters come as
    modes `nft_drift_repairs` / `nft_transaction_failures` (mean_ms 0)."""
    acc: dict[str, list[float]] = {}
    for node, modes in after.items():
        for mode, (total, count) in modes.items():
            t0, c0 = before.get(node, {}).get(mode, (0.0, 0.0))
            pair = acc.setdefault(mode, [0.0, 0.0])
            pair[0] += total - t0
            pair[1] += count - c0
    return {
        mode: {"syncs": c, "mean_ms": 1e3 * t / c if c else 0.0}
        for mode, (t, c) in acc.items()
        if c
    }


# -- nft monitor -----------------------------------------------------------------------------


class Monitor:
    """`nft monitor new` in one node namespace (a lab process writing to a FIFO); a reader
    thread stamps every line on arrival and keeps only nodelb / kube-proxy additions."""

    def __init__(self, cluster: ClusterLab, node: str, fifo_dir: Path) -> None:
        self.node = node
        self.lines: list[tuple[float, str]] = []
        self.total_lines = 0
        self.cond = threading.Condition()
        fifo = fifo_dir / f"monitor-{node}.fifo"
        os.mkfifo(fifo)
        ns = cluster.lab.node(node).ns
        self._cluster = cluster
        self.proc = cluster.lab.spawn(
            ns, ["sh", "-c", f'exec nft monitor new >"{fifo}"'], log_name=f"monitor-{node}"
        )
        # O_RDWR never blocks on open and keeps EOF away if nft restarts; we stop on close.
        self._fd = os.open(fifo, os.O_RDWR)
        self._closed = False
        self._thread = threading.Thread(target=self._read, name=f"mon-{node}", daemon=True)
        self._thread.start()

    def subscribed(self) -> bool:
        """True once the `nft` process (same PID: `ip netns exec` and `sh` exec it) holds a
        NETLINK_NETFILTER socket joined to multicast groups, so no event can be missed."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"nft monitor in {self.node} exited {self.proc.returncode}")
        try:
            if not os.readlink(f"/proc/{self.proc.pid}/exe").endswith("/nft"):
                return False
            table = Path(f"/proc/{self.proc.pid}/net/netlink").read_text().splitlines()[1:]
        except OSError:
            return False
        for row in table:
            cols = row.split()  # sk Eth Pid Groups ...
            if cols[1] == "12" and cols[2] == str(self.proc.pid) and int(cols[3], 16):
                return True
        return False

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except OSError:
                return
            if not chunk or chunk.endswith(_END):
                return
            now = time.monotonic()
            buf += chunk
            if b"\n" not in chunk:
                continue
            *complete, buf = buf.split(b"\n")
            kept = []
            for raw in complete:
                line = raw.decode(errors="replace")
                if "inet nodelb" in line or "ip kube-proxy" in line:
                    kept.append((now, line))
            with self.cond:
                self.total_lines += len(complete)
                self.lines.extend(kept)
                self.cond.notify_all()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._cluster.lab.stop(self.proc)
        with contextlib.suppress(OSError):  # wake the reader: it stops on the marker
            os.write(self._fd, _END)
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass
class Change:
    n: int
    service: int
    addr: str
    t0: float
    write_ms: float = 0.0
    nodelb: dict[str, float] = field(default_factory=dict)  # node -> seconds after t0
    kube_proxy: dict[str, float] = field(default_factory=dict)


def _patterns(ch: Change) -> tuple[re.Pattern[str], re.Pattern[str]]:
    a = re.escape(ch.addr)
    ip, port = re.escape(lb_ip(ch.service)), lb_port(ch.service)
    nodelb = re.compile(
        rf"inet nodelb .*{ip} \. tcp \. {port} \. \d+ : {a} \. {POD_TCP_PORT}(?!\d)"
    )
    kp = re.compile(
        rf"ip kube-proxy service-\S+/{re.escape(svc_name(ch.service))}/tcp/{PORT_NAME} "
        rf".* : {a} \. {POD_TCP_PORT}(?!\d)"
    )
    return nodelb, kp


def wait_change(
    monitors: list[Monitor], ch: Change, cursors: dict[str, int], timeout: float
) -> None:
    """Scan each node's monitor lines (from its cursor) until both tables show the change."""
    pat_nodelb, pat_kp = _patterns(ch)
    deadline = time.monotonic() + timeout
    want_kp = True
    for mon in monitors:
        while True:
            with mon.cond:
                new = mon.lines[cursors[mon.node] :]
                cursors[mon.node] = len(mon.lines)
            for t, line in new:
                if mon.node not in ch.nodelb and pat_nodelb.search(line):
                    ch.nodelb[mon.node] = t - ch.t0
                elif want_kp and mon.node not in ch.kube_proxy and pat_kp.search(line):
                    ch.kube_proxy[mon.node] = t - ch.t0
            if mon.node in ch.nodelb and mon.node in ch.kube_proxy:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with mon.cond:
                if len(mon.lines) == cursors[mon.node]:
                    mon.cond.wait(min(left, 0.5))


# -- the run ---------------------------------------------------------------------------------


@dataclass
class SizeFigures:
    services: int
    endpoints: int
    created: int
    setup_writes: int
    setup_write_s: float
    setup_writes_per_s: float
    setup_settle_s: float
    changes: int
    missed_nodelb: int
    missed_kube_proxy: int
    write_p50_ms: float
    nodelb_p50_ms: float
    nodelb_p99_ms: float
    nodelb_max_ms: float
    kube_proxy_p50_ms: float
    kube_proxy_p99_ms: float
    kube_proxy_max_ms: float
    ratio_p50: float
    ratio_p99: float
    nodelb_proc: ProcFigures
    kube_proxy_proc: ProcFigures
    ratio_rss: float
    ratio_changes_cpu: float
    change_phase_s: float
    monitor_lines: int
    agent_syncs: dict[str, dict[str, float]]
    loadavg: tuple[float, float, float]
    per_change: list[dict[str, Any]]


class Bench:
    def __init__(self, cluster: ClusterLab, endpoints: int, threads: int) -> None:
        self.cluster = cluster
        self.endpoints = endpoints
        self.threads = threads
        self.nodes = len(cluster.nodes)
        self.eps: dict[int, list[tuple[str, int]]] = {}
        self.change_counts: dict[int, int] = {}
        self.extra_cidr = False

    def _ensure_service_cidr(self, services: int) -> None:
        if services <= EXTRA_CIDR_ABOVE or self.extra_cidr:
            return
        body: Any = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "bench-extra"},
            "spec": {"cidrs": [EXTRA_SERVICE_CIDR]},
        }
        kclient.NetworkingV1Api(self.cluster.api).create_service_cidr(
            body, _request_timeout=REQUEST_TIMEOUT
        )
        self.extra_cidr = True
        time.sleep(2.0)  # the allocator picks the new range up from its informer

    def _create_one(self, i: int) -> None:
        core = kclient.CoreV1Api(self.cluster.api)
        disc = kclient.DiscoveryV1Api(self.cluster.api)
        body: Any = service_body(i)
        for attempt in range(5):
            try:
                resp = core.create_namespaced_service(
                    NAMESPACE, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                )
                break
            except ApiException as exc:
                if exc.status == 409:  # a retried create that had gone through
                    resp = core.read_namespaced_service(
                        svc_name(i), NAMESPACE, _preload_content=False
                    )
                    break
                if attempt == 4 or exc.status not in (429, 500, 503, 504):
                    raise
                time.sleep(0.5 * (attempt + 1))
        uid = str(json.loads(cast(urllib3.BaseHTTPResponse, resp).data)["metadata"]["uid"])
        status = {"status": {"loadBalancer": {"ingress": [{"ip": lb_ip(i), "ipMode": "VIP"}]}}}
        core.patch_namespaced_service_status(
            svc_name(i), NAMESPACE, status, _request_timeout=REQUEST_TIMEOUT
        )
        eps = base_endpoints(i, self.endpoints, self.nodes)
        sl: Any = slice_body(i, uid, eps)
        disc.create_namespaced_endpoint_slice(NAMESPACE, sl, _request_timeout=REQUEST_TIMEOUT)
        self.eps[i] = eps

    def grow(self, services: int) -> tuple[int, float]:
        """Create Services len(eps)..services-1 in parallel; return (writes, seconds)."""
        self._ensure_service_cidr(services)
        todo = range(len(self.eps), services)
        t0 = time.monotonic()
        done = 0
        with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
            for fut in concurrent.futures.as_completed(
                pool.submit(self._create_one, i) for i in todo
            ):
                fut.result()
                done += 1
                if done % 1000 == 0:
                    el = time.monotonic() - t0
                    print(f"# created {done}/{len(todo)} in {el:.0f}s", file=sys.stderr, flush=True)
        return 3 * len(todo), time.monotonic() - t0

    def _count(self, node: str, cmd: list[str], token: str) -> int:
        ns = self.cluster.lab.node(node).ns
        proc = netns.run(ns, cmd, check=False, timeout=120)
        return proc.stdout.count(token) if proc.returncode == 0 else -1

    def settled(self, services: int) -> bool:
        """True when every node's nodelb `ext4` map holds every frontend and kube-proxy's
        `service-ips` map holds every LB IP:port (counted by port tokens)."""
        for node in (n.name for n in self.cluster.nodes):
            nodelb = self._count(
                node, ["nft", "list", "map", "inet", "nodelb", "ext4"], " . tcp . "
            )
            if nodelb < services:
                return False
            kp = self._count(
                node, ["nft", "list", "map", "ip", "kube-proxy", "service-ips"], "goto "
            )
            # Each Service has its ClusterIP and its LB IP element; plus `kubernetes`.
            if kp < 2 * services:
                return False
        return True

    def wait_settled(self, services: int) -> float:
        t0 = time.monotonic()
        while not self.settled(services):
            if time.monotonic() - t0 > SETTLE_TIMEOUT:
                raise TimeoutError(f"tables did not settle at {services} Services")
            time.sleep(1.0)
        return time.monotonic() - t0

    def change(self, n: int, rng: random.Random, services: int, used: set[int]) -> Change:
        """Replace one endpoint of one Service (each Service at most once per size, while
        there are enough) by an address no baseline uses; return the Change started."""
        pick = [i for i in range(services) if i not in used]
        i = rng.choice(pick) if pick else rng.randrange(services)
        used.add(i)
        c = self.change_counts.get(i, 0)
        self.change_counts[i] = c + 1
        eps = list(self.eps[i])
        j = rng.randrange(len(eps))
        k = eps[j][1]
        addr = f"198.19.{k}.{CHANGE_HOSTS[(c * self.nodes + k) % len(CHANGE_HOSTS)]}"
        eps[j] = (addr, k)
        self.eps[i] = eps
        disc = kclient.DiscoveryV1Api(self.cluster.api)
        ch = Change(n=n, service=i, addr=addr, t0=time.monotonic())
        disc.patch_namespaced_endpoint_slice(
            f"{svc_name(i)}-ipv4",
            NAMESPACE,
            {"endpoints": slice_endpoints(eps)},
            _request_timeout=REQUEST_TIMEOUT,
        )
        ch.write_ms = (time.monotonic() - ch.t0) * 1e3
        return ch


def measure(
    bench: Bench,
    *,
    services: int,
    changes: int,
    gap: float,
    timeout: float,
    fifo_dir: Path,
    rng: random.Random,
) -> SizeFigures:
    cl = bench.cluster
    agents, proxies = cl.agent_pids, cl.kube_proxy_pids
    a0, k0 = cpu_all(agents), cpu_all(proxies)
    created = services - len(bench.eps)
    writes, write_s = bench.grow(services)
    print(f"# {services}: {writes} writes in {write_s:.1f}s; settling", file=sys.stderr, flush=True)
    settle_s = bench.wait_settled(services)
    print(f"# {services}: settled {settle_s:.1f}s after the writes", file=sys.stderr, flush=True)
    time.sleep(2.0)  # let trailing syncs finish before the change phase is timed
    a1, k1 = cpu_all(agents), cpu_all(proxies)

    metrics0 = sync_metrics(cl)
    monitors = [Monitor(cl, n.name, fifo_dir / str(services)) for n in cl.nodes]
    wait_until(lambda: all(m.subscribed() for m in monitors), 30.0, "nft monitors to subscribe")
    cursors = {m.node: len(m.lines) for m in monitors}
    done: list[Change] = []
    used: set[int] = set()
    t_start = time.monotonic()
    try:
        for n in range(changes):
            ch = bench.change(n, rng, services, used)
            wait_change(monitors, ch, cursors, timeout)
            done.append(ch)
            if (n + 1) % 20 == 0:
                print(f"# {services}: {n + 1}/{changes} changes", file=sys.stderr, flush=True)
            time.sleep(gap)
        change_wall = time.monotonic() - t_start
        a2, k2 = cpu_all(agents), cpu_all(proxies)
        mon_lines = sum(m.total_lines for m in monitors)
        agent_syncs = sync_delta(metrics0, sync_metrics(cl))
    finally:
        for m in monitors:
            m.close()

    node_names = [n.name for n in cl.nodes]

    def worst(d: dict[str, float]) -> float | None:
        return max(d.values()) * 1e3 if len(d) == len(node_names) else None

    lat_n = [v for c in done if (v := worst(c.nodelb)) is not None]
    lat_k = [v for c in done if (v := worst(c.kube_proxy)) is not None]
    nodelb_proc = proc_figures(agents, a0, a1, a2, change_wall)
    kp_proc = proc_figures(proxies, k0, k1, k2, change_wall)
    p50n, p99n = statistics.median(lat_n) if lat_n else float("nan"), percentile(lat_n, 0.99)
    p50k, p99k = statistics.median(lat_k) if lat_k else float("nan"), percentile(lat_k, 0.99)
    return SizeFigures(
        services=services,
        endpoints=bench.endpoints,
        created=created,
        setup_writes=writes,
        setup_write_s=write_s,
        setup_writes_per_s=writes / write_s if write_s > 0 else 0.0,
        setup_settle_s=settle_s,
        changes=len(done),
        missed_nodelb=len(done) - len(lat_n),
        missed_kube_proxy=len(done) - len(lat_k),
        write_p50_ms=statistics.median(c.write_ms for c in done),
        nodelb_p50_ms=p50n,
        nodelb_p99_ms=p99n,
        nodelb_max_ms=max(lat_n, default=float("nan")),
        kube_proxy_p50_ms=p50k,
        kube_proxy_p99_ms=p99k,
        kube_proxy_max_ms=max(lat_k, default=float("nan")),
        ratio_p50=p50k / p50n,
        ratio_p99=p99k / p99n,
        nodelb_proc=nodelb_proc,
        kube_proxy_proc=kp_proc,
        ratio_rss=kp_proc.rss_mb / nodelb_proc.rss_mb,
        ratio_changes_cpu=(
            kp_proc.changes_cpu_s / nodelb_proc.changes_cpu_s
            if nodelb_proc.changes_cpu_s > 0
            else float("nan")
        ),
        change_phase_s=change_wall,
        monitor_lines=mon_lines,
        agent_syncs=agent_syncs,
        loadavg=os.getloadavg(),
        per_change=[
            {
                "n": c.n,
                "service": svc_name(c.service),
                "write_ms": round(c.write_ms, 2),
                "nodelb_ms": {k: round(v * 1e3, 2) for k, v in c.nodelb.items()},
                "kube_proxy_ms": {k: round(v * 1e3, 2) for k, v in c.kube_proxy.items()},
            }
            for c in done
        ],
    )


def table(rows: list[SizeFigures], nodes: int, gap: float) -> str:
    head = (
        f"{'services':>8} | {'setup writes/s':>14} {'settle s':>8} | "
        f"{'nodelb p50/p99/max ms':>23} | {'kube-proxy p50/p99/max ms':>25} | "
        f"{'ratio p50/p99':>13} | {'missed n/k':>10}"
    )
    out = [
        "EndpointSlice PATCH sent -> new endpoint in the kernel table on every node "
        f"({nodes} nodes; slowest node counts)",
        head,
        "-" * len(head),
    ]
    for f in rows:
        out.append(
            f"{f.services:>8} | {f.setup_writes_per_s:>14.0f} {f.setup_settle_s:>8.1f} | "
            f"{f.nodelb_p50_ms:>7.1f}/{f.nodelb_p99_ms:>7.1f}/{f.nodelb_max_ms:>7.1f} | "
            f"{f.kube_proxy_p50_ms:>8.1f}/{f.kube_proxy_p99_ms:>8.1f}/"
            f"{f.kube_proxy_max_ms:>7.1f} | "
            f"{f.ratio_p50:>5.1f}x/{f.ratio_p99:>5.1f}x | "
            f"{f.missed_nodelb:>4}/{f.missed_kube_proxy:<4}"
        )
    head2 = (
        f"{'services':>8} | {'RSS / HWM MB nodelb':>19} {'kube-proxy':>15} {'ratio':>6} | "
        f"{'CPU s setup nodelb/kp':>21} | {'CPU s changes nodelb/kp':>23} {'ratio':>6}"
    )
    out += ["", "Per process, worst node", head2, "-" * len(head2)]
    for f in rows:
        n, k = f.nodelb_proc, f.kube_proxy_proc
        out.append(
            f"{f.services:>8} | {n.rss_mb:>8.1f} / {n.hwm_mb:>8.1f} "
            f"{k.rss_mb:>6.1f} / {k.hwm_mb:>6.1f} {f.ratio_rss:>5.2f}x | "
            f"{n.setup_cpu_s:>9.1f} / {k.setup_cpu_s:>9.1f} | "
            f"{n.changes_cpu_s:>7.2f} ({n.changes_cpu_pct:>4.1f}%) / "
            f"{k.changes_cpu_s:>5.2f} ({k.changes_cpu_pct:>4.1f}%) {f.ratio_changes_cpu:>5.2f}x"
        )
    out.append("")
    for f in rows:
        out.append(
            f"{f.services}: setup {f.setup_writes} writes ({f.created} Services x Service + "
            f"status + slice) in {f.setup_write_s:.1f}s, tables settled {f.setup_settle_s:.1f}s "
            f"later; PATCH round trip p50 {f.write_p50_ms:.1f} ms; change phase "
            f"{f.change_phase_s:.0f}s ({f.changes} changes, gap {gap:g}s); "
            f"load average {f.loadavg[0]:.2f}"
        )
        syncs = ", ".join(
            f"{mode} {int(v['syncs'])}" + (f" x {v['mean_ms']:.1f} ms" if v["mean_ms"] else "")
            for mode, v in sorted(f.agent_syncs.items())
        )
        out.append(
            f"{f.services}: agent syncs in the change phase (all nodes; transaction time from "
            f"nodelb_sync_duration_seconds): {syncs or 'none'}"
        )
    out.append(
        f"targets: object-written-to-rule p99 < {TARGET_P99_MS:g} ms; agent RSS < "
        f"{TARGET_RSS_MB:g} MB (at 100k endpoints). ratio = kube-proxy / nodelb "
        "(higher is better for nodelb). kube-proxy CPU includes its reaped `nft` children; "
        "its RSS does not."
    )
    met = [
        f"{f.services}: p99 {'MET' if f.nodelb_p99_ms < TARGET_P99_MS else 'MISSED'}, "
        f"RSS {'MET' if f.nodelb_proc.hwm_mb < TARGET_RSS_MB else 'MISSED'} "
        f"(peak {f.nodelb_proc.hwm_mb:.0f} MB at {f.services * f.endpoints} endpoints)"
        for f in rows
    ]
    out.append("nodelb vs targets: " + "; ".join(met))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--services", default="1000,10000", help="comma-separated Service counts")
    p.add_argument("--changes", type=int, default=100, help="slice changes per size")
    p.add_argument("--nodes", type=int, default=2, help="lab nodes")
    p.add_argument("--endpoints", type=int, default=10, help="endpoints per Service")
    p.add_argument("--threads", type=int, default=8, help="parallel API writers for setup")
    p.add_argument("--gap", type=float, default=1.0, help="seconds between settled changes")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait per change")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--announce",
        action="store_true",
        help="agents run with the announcer on (VRRP election; each holds its share of IPs)",
    )
    p.add_argument(
        "--resync-period",
        type=float,
        help="the agents' sync.fullResyncPeriod in seconds (default: the agent's, 900), to "
        "measure changes while periodic resyncs run",
    )
    p.add_argument(
        "--workdir", type=Path, help="keep the lab's files and logs here (default: temporary)"
    )
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.services.split(",") if s})
    if not sizes or sizes[0] < 1 or args.changes < 1 or args.endpoints < 1:
        p.error("sizes, changes and endpoints must be positive")
    if args.endpoints > len(BASE_HOSTS) * args.nodes:
        p.error("too many endpoints per Service for the pod CIDRs")

    load0 = os.getloadavg()
    rows: list[SizeFigures] = []
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            work = args.workdir
            work.mkdir(parents=True, exist_ok=False)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nodelb-e2e-")))
        spec = LabSpec(nodes=args.nodes, pods_per_node=0)
        t0 = time.monotonic()
        agent_config: dict[str, Any] = dict(LAB_ANNOUNCE) if args.announce else {}
        if args.resync_period is not None:
            agent_config["sync"] = {"fullResyncPeriod": args.resync_period}
        with ClusterLab(spec, work / "cluster", agent_config=agent_config) as cl:
            up_s = time.monotonic() - t0
            print(f"# cluster up in {up_s:.1f}s", file=sys.stderr, flush=True)
            bench = Bench(cl, args.endpoints, args.threads)
            rng = random.Random(args.seed)
            for s in sizes:
                (work / str(s)).mkdir()
                rows.append(
                    measure(
                        bench,
                        services=s,
                        changes=args.changes,
                        gap=args.gap,
                        timeout=args.timeout,
                        fifo_dir=work,
                        rng=rng,
                    )
                )
                print(f"# done: {s} services", file=sys.stderr, flush=True)
    print(table(rows, args.nodes, args.gap))
    print(
        f"announcer: {'on (VRRP election)' if args.announce else 'off (every node holds every IP)'}"
    )
    if args.resync_period is not None:
        print(f"periodic resync every {args.resync_period:g} s (sync.fullResyncPeriod)")
    print(
        json.dumps(
            {
                "bench": "e2e_latency",
                "nodes": args.nodes,
                "endpoints": args.endpoints,
                "changes": args.changes,
                "gap_s": args.gap,
                "announce": args.announce,
                "resync_period_s": args.resync_period,
                "cluster_up_s": up_s,
                "cpus": os.cpu_count(),
                "loadavg_start": load0,
                "loadavg_end": os.getloadavg(),
                "targets": {"p99_ms": TARGET_P99_MS, "agent_rss_mb": TARGET_RSS_MB},
                "results": [
                    {
                        k: v
                        for k, v in vars(f).items()
                        if k not in ("nodelb_proc", "kube_proxy_proc")
                    }
                    | {
                        "nodelb_proc": vars(f.nodelb_proc),
                        "kube_proxy_proc": vars(f.kube_proxy_proc),
                    }
                    for f in rows
                ],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
