"""Measure the agent's memory at S LoadBalancer Services × E endpoints, in-process, per phase.

Each size runs in a child process of its own (so one size's heap does not colour the next):
a real `Agent` runs its real loop (`Agent.run`: one reflector thread per resource, the sync
loop on its own thread, as `nodelb agent` does) against a fake API server that serves paged
lists and watch streams as raw JSON bytes shaped like kube-apiserver's (metadata with uid,
resourceVersion, creationTimestamp and managedFields; slices with targetRefs), generated page
by page so the fake server itself holds no objects. The dataplane is the real one: `Dataplane`
over `NetnsNftRunner` (libnftables in a throwaway namespace `nlbt-mem-<hex>`, never the root
one) with the netlink element sender (`NetlinkElementSender.in_namespace`).

Phases, each reporting VmRSS and VmHWM (the peak is reset at the start of each phase through
/proc/self/clear_refs, so every HWM is that phase's own peak):
- start:    modules imported, namespace created, nothing listed;
- listed:   lists parsed into the stores and cache, every Service computed (taken at the entry
            of the first sync, so it includes the desired state);
- full:     the first full sync applied;
- partial:  `--changes` EndpointSlice changes, each applied (one endpoint replaced) as a watch
            MODIFIED event, waiting for each to reach the dataplane's mirror;
- relist:   both Services and EndpointSlices relisted (a 410 Gone on their watches);
- resync:   one more full sync (`Dataplane.request_full`, as after drift or failures);
- drift check: the table read back and compared with the mirror (`Dataplane.check_drift`,
            what the agent does every `driftCheckPeriod`);
- takeover: a second Dataplane syncs the same state over the existing table, as a restarted
            agent does (reads the table's objects, then a full in-place sync);
- steady:   after a gc.collect().

Then the deep size of the main structures (reflector stores, cluster cache, per-Service
results, desired state, dataplane mirror, kernel object record), each alone and what it adds
to those listed before it (they share records). A last child for the largest size runs with
tracemalloc on and reports the top allocators by line and by file at the steady state (its
RSS figures are not used: tracemalloc costs memory itself).

    .venv/bin/python -m bench.memory [--sizes 1000,10000] [--endpoints 10] [--changes 300]
        [--no-tracemalloc] [--env NAME=VALUE ...]

Prints a table, then as its last line one JSON object with every figure; ratios are the
largest size against the smallest.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import gc
import ipaddress
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
import tracemalloc
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from agent.config import AgentConfig
from agent.dataplane.applier import Dataplane, SyncResult
from agent.dataplane.libnft import NetnsNftRunner
from agent.dataplane.netlink import NetlinkElementSender
from agent.dataplane.netlink_dump import NetlinkTableReader
from agent.kube.events import ListSink
from agent.memory import limit_malloc_arenas
from agent.model.desired_state import DesiredState, FrontendKey
from agent.model.net import Protocol
from agent.netns import netns_inode, root_netns_inodes
from agent.node.loop import Agent, ListFns
from bench.e2e_latency import (
    CHANGE_HOSTS,
    NAMESPACE,
    base_endpoints,
    lb_ip,
    lb_port,
    service_body,
    slice_body,
    svc_name,
)
from bench.measure import proc_mem_mb
from lab import netns

TARGET_RSS_MB = 200.0
NODE = "node-1"
NODES = 2


# -- the objects, as kube-apiserver lists them -----------------------------------------------


def _managed(manager: str, op: str, fields: dict[str, Any], sub: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": op,
        "apiVersion": "v1",
        "time": "2026-12-01T03:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if sub:
        entry["subresource"] = sub
    return entry


def service_object(i: int, rv: int) -> dict[str, Any]:
    """Return Service i as listed: bench.e2e_latency's body plus what the server adds."""
    obj = service_body(i)
    obj["metadata"].update(
        uid=f"5e1d{i:08x}-0000-4000-8000-{i:012x}",
        resourceVersion=str(rv),
        creationTimestamp="2026-12-01T03:00:00Z",
        namespace=NAMESPACE,
        managedFields=[
            _managed(
                "bench",
                "Update",
                {
                    "f:spec": {
                        "f:allocateLoadBalancerNodePorts": {},
                        "f:externalTrafficPolicy": {},
                        "f:ports": {'.:{"port":1,"protocol":"TCP"}': {}},
                        "f:selector": {},
                        "f:sessionAffinity": {},
                        "f:type": {},
                    }
                },
            ),
            _managed(
                "nodelb-controller",
                "Update",
                {"f:status": {"f:loadBalancer": {"f:ingress": {}}}},
                "status",
            ),
        ],
    )
    n = 1 + i % 4000
    obj["spec"].update(
        clusterIP=f"198.18.{128 + n // 250}.{n % 250}",
        clusterIPs=[f"198.18.{128 + n // 250}.{n % 250}"],
        ipFamilies=["IPv4"],
        ipFamilyPolicy="SingleStack",
        sessionAffinity="None",
        internalTrafficPolicy="Cluster",
    )
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": lb_ip(i), "ipMode": "VIP"}]}}
    obj["metadata"]["name"] = svc_name(i)
    return obj


def slice_object(i: int, rv: int, eps: list[tuple[str, int]]) -> dict[str, Any]:
    """Return Service i's EndpointSlice as listed, with targetRefs and managedFields."""
    obj = slice_body(i, f"5e1d{i:08x}-0000-4000-8000-{i:012x}", eps)
    for j, ep in enumerate(obj["endpoints"]):
        ep["targetRef"] = {
            "kind": "Pod",
            "namespace": NAMESPACE,
            "name": f"{svc_name(i)}-7d9f{j:04d}",
            "uid": f"90d{i:05x}-{j:04x}-4000-8000-{i:012x}",
        }
    obj["metadata"].update(
        uid=f"51ce{i:08x}-0000-4000-8000-{i:012x}",
        resourceVersion=str(rv),
        creationTimestamp="2026-12-01T03:00:00Z",
        generation=1,
        managedFields=[
            _managed(
                "kube-controller-manager",
                "Update",
                {
                    "f:addressType": {},
                    "f:endpoints": {},
                    "f:metadata": {"f:labels": {".": {}, "f:kubernetes.io/service-name": {}}},
                    "f:ports": {},
                },
            )
        ],
    )
    return obj


def node_object(k: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{k}",
            "uid": f"00de{k:08x}-0000-4000-8000-000000000000",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": f"node-{k}"},
        },
        "spec": {"podCIDR": f"198.19.{k}.0/24", "podCIDRs": [f"198.19.{k}.0/24"]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": f"198.18.0.{10 + k}"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


# -- a fake API server: paged lists and watch streams as raw bytes ---------------------------


class _Response:
    """The part of urllib3's HTTPResponse the reflector uses."""

    def __init__(self, data: bytes = b"", events: queue.Queue[bytes | None] | None = None):
        self.status = 200
        self.data = data
        self._events = events

    def stream(self, amt: int) -> Iterator[bytes]:
        assert self._events is not None
        while (line := self._events.get()) is not None:
            yield line

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        if self._events is not None:
            self._events.put(None)


class FakeResource:
    """One resource of the fake server: objects made on demand by index, watch by queue."""

    def __init__(self, count: int, make: Callable[[int, int], dict[str, Any]]) -> None:
        self.count = count
        self.make = make
        self.rv = 1
        self.lists = 0
        self.watches = 0
        self.watch_started = threading.Condition()
        self._watch: queue.Queue[bytes | None] | None = None

    def __call__(self, **kwargs: Any) -> _Response:
        if kwargs.get("watch"):
            events: queue.Queue[bytes | None] = queue.Queue()
            with self.watch_started:
                self._watch = events
                self.watches += 1
                self.watch_started.notify_all()
            return _Response(events=events)
        start = int(kwargs.get("_continue") or 0)
        if start == 0:
            self.lists += 1
        end = min(self.count, start + int(kwargs.get("limit") or self.count))
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if end < self.count:
            meta["continue"] = str(end)
        body = {"metadata": meta, "items": [self.make(i, self.rv) for i in range(start, end)]}
        return _Response(orjson.dumps(body))

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        """Send one watch event on the current watch."""
        assert self._watch is not None
        self._watch.put(orjson.dumps({"type": kind, "object": obj}) + b"\n")

    def wait_watches(self, n: int, timeout: float = 120.0) -> None:
        with self.watch_started:
            if not self.watch_started.wait_for(lambda: self.watches >= n, timeout):
                raise TimeoutError(f"no watch #{n} within {timeout}s")


# -- the measuring dataplane -----------------------------------------------------------------


def reset_peak() -> None:
    """Reset this process's VmHWM to its current RSS, so the next figure is a phase's peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@dataclass
class Phase:
    name: str
    rss_mb: float
    hwm_mb: float
    seconds: float


class MeasuringDataplane:
    """Wraps the real Dataplane: records memory at the entry and exit of the first sync, and
    wakes the bench after every sync."""

    def __init__(self, inner: Dataplane, phases: list[Phase], clock0: float) -> None:
        self.inner = inner
        self.phases = phases
        self.clock0 = clock0
        self.syncs = 0
        self.modes: dict[str, int] = {}
        self.cond = threading.Condition()

    def sync(
        self,
        desired: DesiredState,
        *,
        full: bool = False,
        changed: Iterable[FrontendKey] | None = None,
    ) -> SyncResult:
        first = self.syncs == 0
        if first:
            self.phases.append(Phase("listed", *proc_mem_mb(), time.monotonic() - self.clock0))
            reset_peak()
        t0 = time.monotonic()
        res = self.inner.sync(desired, full=full, changed=changed)
        if first:
            self.phases.append(Phase("full", *proc_mem_mb(), time.monotonic() - t0))
        with self.cond:
            self.syncs += 1
            self.modes[res.mode.value] = self.modes.get(res.mode.value, 0) + 1
            self.cond.notify_all()
        return res

    def check_drift(self) -> bool:
        return self.inner.check_drift()

    def wait(self, pred: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        with self.cond:
            if not self.cond.wait_for(pred, timeout):
                raise TimeoutError(f"{what} within {timeout}s")


# -- deep sizes ------------------------------------------------------------------------------


def deep_size(root: object, seen: set[int]) -> int:
    """Return the bytes of `root` and everything it reaches that is not in `seen` (updated).

    Follows containers, __dict__ and __slots__; types, modules, functions and enum members
    are shared and not counted."""
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, enum.Enum)
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip) or obj is None:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, str | bytes | int | float | bool):
            continue
        else:
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if slot != "__weakref__" and hasattr(obj, slot):
                        stack.append(getattr(obj, slot))
    return total


def structure_sizes(structures: list[tuple[str, object]]) -> list[dict[str, Any]]:
    """Return per structure its deep size alone and what it adds to the ones before it."""
    shared: set[int] = set()
    out = []
    for name, obj in structures:
        alone = deep_size(obj, set())
        added = deep_size(obj, shared)
        out.append({"name": name, "alone_mb": alone / 2**20, "added_mb": added / 2**20})
    return out


# -- one size, in this process ---------------------------------------------------------------


@dataclass
class ChildFigures:
    services: int
    endpoints: int
    changes: int
    phases: list[Phase]
    structures: list[dict[str, Any]] = field(default_factory=list)
    sync_modes: dict[str, int] = field(default_factory=dict)
    tracemalloc_lines: list[dict[str, Any]] = field(default_factory=list)
    tracemalloc_files: list[dict[str, Any]] = field(default_factory=list)
    tracemalloc_total_mb: float = 0.0
    env: dict[str, str] = field(default_factory=dict)


def run_child(services: int, endpoints: int, changes: int, ns: str, traced: bool) -> ChildFigures:
    """Run one size against the fake API with the real agent and dataplane in `ns`."""
    limit_malloc_arenas(os.environ)  # as `nodelb agent` does before its threads start
    if traced:
        tracemalloc.start(1)
    clock0 = time.monotonic()
    phases: list[Phase] = []
    # Only changed Services' endpoints are kept; the rest are generated again when listed.
    changed_eps: dict[int, list[tuple[str, int]]] = {}
    slice_rv: dict[int, int] = {}

    def eps_of(i: int) -> list[tuple[str, int]]:
        return changed_eps.get(i) or base_endpoints(i, endpoints, NODES)

    svc_res = FakeResource(services, service_object)
    slice_res = FakeResource(
        services, lambda i, rv: slice_object(i, slice_rv.get(i, rv), eps_of(i))
    )
    node_res = FakeResource(NODES, lambda k, rv: node_object(k + 1))

    netns.create(ns)
    runner = NetnsNftRunner(ns)
    sender: NetlinkElementSender | None = None
    stop = threading.Event()
    loop: threading.Thread | None = None
    try:
        if netns_inode(str(netns.NETNS_DIR / ns)) in root_netns_inodes():
            raise SystemExit(f"{ns} is the root namespace; refusing to run")
        sender = NetlinkElementSender.in_namespace(ns)
        dp = MeasuringDataplane(
            Dataplane(
                runner,
                elements=sender,
                readback=NetlinkTableReader(NetlinkElementSender.in_namespace(ns)),
            ),
            phases,
            clock0,
        )
        cfg = AgentConfig(node_name=NODE)
        agent = Agent(
            cfg,
            dataplane=dp,
            events=ListSink(),
            lists=ListFns(services=svc_res, slices=slice_res, nodes=node_res),
        )
        runner.start()
        gc.collect()
        phases.append(Phase("start", *proc_mem_mb(), time.monotonic() - clock0))
        reset_peak()
        loop = threading.Thread(target=agent.run, args=(stop,), name="agent", daemon=True)
        loop.start()
        dp.wait(lambda: dp.syncs >= 1, "the first sync", timeout=600)
        for res in (svc_res, slice_res, node_res):
            res.wait_watches(1)

        reset_peak()
        t0 = time.monotonic()
        rng_state = 0
        for n in range(changes):
            i = (n * 7919) % services
            c = n // services
            cur = list(eps_of(i))
            j = n % len(cur)
            k = cur[j][1]
            addr = f"198.19.{k}.{CHANGE_HOSTS[(c * NODES + k + rng_state) % len(CHANGE_HOSTS)]}"
            if any(a == addr for a, _ in cur):
                rng_state += 1
                addr = f"198.19.{k}.{CHANGE_HOSTS[(c * NODES + k + rng_state) % len(CHANGE_HOSTS)]}"
            cur[j] = (addr, k)
            changed_eps[i] = cur
            slice_res.rv += 1
            slice_rv[i] = slice_res.rv
            key = FrontendKey(ipaddress.ip_address(lb_ip(i)), Protocol.TCP, lb_port(i))
            want = ipaddress.ip_address(addr)
            slice_res.send("MODIFIED", slice_object(i, slice_res.rv, cur))

            def applied(key: FrontendKey = key, want: Any = want) -> bool:
                m = dp.inner.mirror
                return (
                    m is not None
                    and key in m.frontends
                    and any(e.ip == want for e in m.frontends[key].endpoints)
                )

            dp.wait(applied, f"change {n} to reach the mirror")
        phases.append(Phase("partial", *proc_mem_mb(), time.monotonic() - t0))

        reset_peak()
        t0 = time.monotonic()
        for res in (svc_res, slice_res):
            watches = res.watches
            res.send("ERROR", {"kind": "Status", "code": 410, "message": "too old"})
            res.wait_watches(watches + 1)
        phases.append(Phase("relist", *proc_mem_mb(), time.monotonic() - t0))

        reset_peak()
        t0 = time.monotonic()
        fulls = dp.modes.get("full", 0)
        dp.inner.request_full()
        agent.held_changed()  # any wake-up: the next sync is full
        dp.wait(lambda: dp.modes.get("full", 0) > fulls, "the full resync", timeout=600)
        phases.append(Phase("resync", *proc_mem_mb(), time.monotonic() - t0))

        reset_peak()
        t0 = time.monotonic()
        if dp.inner.check_drift():
            raise SystemExit("the drift check found drift in a table nothing else touched")
        phases.append(Phase("drift check", *proc_mem_mb(), time.monotonic() - t0))

        # A second applier takes the table over, as a restarted agent does: it reads what the
        # table holds (without its elements), then rewrites it in place in full.
        reset_peak()
        t0 = time.monotonic()
        mirror = dp.inner.mirror
        assert mirror is not None
        heir = Dataplane(
            runner,
            elements=sender,
            readback=NetlinkTableReader(NetlinkElementSender.in_namespace(ns)),
        )
        if not heir.sync(mirror).ok:
            raise SystemExit("the takeover's full sync failed")
        del heir
        phases.append(Phase("takeover", *proc_mem_mb(), time.monotonic() - t0))

        gc.collect()
        phases.append(Phase("steady", *proc_mem_mb(), 0.0))
        figs = ChildFigures(services, endpoints, changes, phases, sync_modes=dict(dp.modes))
        figs.env = {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "NODELB_"))}
        stores = {r.name: r._store for r in agent._reflectors}
        figs.structures = structure_sizes(
            [
                ("reflector stores", stores),
                ("cluster cache", agent._state.cache),
                ("service results", agent._state.index.results),
                ("desired state (last synced)", agent._last_desired),
                ("dataplane mirror", dp.inner.mirror),
                ("dataplane kernel objects", dp.inner._kernel),
            ]
        )
        if traced:
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            figs.tracemalloc_total_mb = sum(s.size for s in snap.statistics("filename")) / 2**20
            figs.tracemalloc_lines = [
                {"where": str(s.traceback), "mb": s.size / 2**20, "count": s.count}
                for s in snap.statistics("lineno")[:20]
            ]
            figs.tracemalloc_files = [
                {"where": str(s.traceback), "mb": s.size / 2**20, "count": s.count}
                for s in snap.statistics("filename")[:12]
            ]
        return figs
    finally:
        stop.set()
        if loop is not None:
            loop.join(timeout=30)
        if sender is not None:
            sender.close()
        runner.close()
        netns.delete(ns)


# -- the parent: one child per size, a table, one JSON line ----------------------------------


def _child(
    size: int, args: argparse.Namespace, *, traced: bool, env: dict[str, str]
) -> dict[str, Any]:
    ns = f"nlbt-mem-{secrets.token_hex(3)}"
    cmd = [
        sys.executable,
        "-m",
        "bench.memory",
        "--child",
        str(size),
        "--endpoints",
        str(args.endpoints),
        "--changes",
        str(args.changes),
        "--ns",
        ns,
    ] + (["--traced"] if traced else [])
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=os.environ | env, timeout=3600, check=False
        )
    finally:
        netns.delete(ns)  # the child deletes it; this covers a child that died
    if proc.returncode != 0:
        raise SystemExit(f"child for {size} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _phase_table(rows: list[dict[str, Any]]) -> str:
    names = [p["name"] for p in rows[0]["phases"]]
    head = f"{'phase':>8} | " + " | ".join(f"{r['services']:>6} svc RSS / HWM MB" for r in rows)
    out = [head, "-" * len(head)]
    for i, name in enumerate(names):
        cells = []
        for r in rows:
            p = r["phases"][i]
            cells.append(f"{p['rss_mb']:>10.1f} / {p['hwm_mb']:>9.1f}")
        out.append(f"{name:>8} | " + " | ".join(cells))
    return "\n".join(out)


def _structure_table(rows: list[dict[str, Any]]) -> str:
    head = f"{'structure':>30} | " + " | ".join(
        f"{r['services']:>6} svc alone / added MB" for r in rows
    )
    out = [head, "-" * len(head)]
    for i, s in enumerate(rows[0]["structures"]):
        cells = [
            f"{r['structures'][i]['alone_mb']:>12.1f} / {r['structures'][i]['added_mb']:>8.1f}"
            for r in rows
        ]
        out.append(f"{s['name']:>30} | " + " | ".join(cells))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="1000,10000", help="comma-separated Service counts")
    p.add_argument("--endpoints", type=int, default=10, help="endpoints per Service")
    p.add_argument("--changes", type=int, default=300, help="EndpointSlice changes")
    p.add_argument("--no-tracemalloc", action="store_true", help="skip the tracemalloc run")
    p.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the children (repeatable)"
    )
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ns", help=argparse.SUPPRESS)
    p.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        figs = run_child(args.child, args.endpoints, args.changes, args.ns, args.traced)
        print(json.dumps(_as_dict(figs)))
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if not sizes or sizes[0] < 1 or args.endpoints < 1 or args.changes < 1:
        p.error("sizes, endpoints and changes must be positive")
    env = dict(e.split("=", 1) for e in args.env)
    rows = []
    for s in sizes:
        rows.append(_child(s, args, traced=False, env=env))
        print(f"# done: {s} services", file=sys.stderr, flush=True)
    traced = None if args.no_tracemalloc else _child(sizes[-1], args, traced=True, env=env)

    print(
        f"Agent memory per phase ({args.endpoints} endpoints per Service, "
        f"{args.changes} slice changes; HWM = that phase's own peak)"
    )
    print(_phase_table(rows))
    print()
    print("Main structures at the steady state (deep size; 'added' = not shared with rows above)")
    print(_structure_table(rows))
    if traced is not None:
        print()
        print(
            f"tracemalloc at the steady state, {traced['services']} Services "
            f"({traced['tracemalloc_total_mb']:.1f} MB traced in all); top lines:"
        )
        for t in traced["tracemalloc_lines"]:
            print(f"  {t['mb']:>7.1f} MB {t['count']:>8} blocks  {t['where']}")
        print("  by file:")
        for t in traced["tracemalloc_files"]:
            print(f"  {t['mb']:>7.1f} MB {t['count']:>8} blocks  {t['where']}")
    big, small = rows[-1], rows[0]
    steady = {r["services"]: next(x for x in r["phases"] if x["name"] == "steady") for r in rows}
    peak = {r["services"]: max(x["hwm_mb"] for x in r["phases"]) for r in rows}
    ratio_rss = steady[big["services"]]["rss_mb"] / steady[small["services"]]["rss_mb"]
    ratio_peak = peak[big["services"]] / peak[small["services"]]
    print()
    for r in rows:
        s = r["services"]
        verdict = "MET" if steady[s]["rss_mb"] < TARGET_RSS_MB else "MISSED"
        print(
            f"{s} Services x {r['endpoints']} = {s * r['endpoints']} endpoints: steady RSS "
            f"{steady[s]['rss_mb']:.1f} MB ({verdict} < {TARGET_RSS_MB:g} MB), "
            f"peak {peak[s]:.1f} MB; syncs {r['sync_modes']}"
        )
    print(
        f"ratio {big['services']}/{small['services']}: steady RSS {ratio_rss:.2f}x, "
        f"peak {ratio_peak:.2f}x"
    )
    print(
        json.dumps(
            {
                "bench": "memory",
                "endpoints": args.endpoints,
                "changes": args.changes,
                "env": env,
                "target_rss_mb": TARGET_RSS_MB,
                "results": rows,
                "tracemalloc": traced,
                "ratio_steady_rss": ratio_rss,
                "ratio_peak": ratio_peak,
            }
        )
    )
    return 0


def _as_dict(f: ChildFigures) -> dict[str, Any]:
    d = dict(vars(f))
    d["phases"] = [vars(p) for p in f.phases]
    return d


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
