"""Benchmark the allocation controller against a real kube-apiserver: allocations per second.

A minimal lab (control plane only) gets S LoadBalancer Services (one TCP port each,
`allocateLoadBalancerNodePorts: false`; an extra ServiceCIDR gives the apiserver room for the
ClusterIPs) created in parallel with no controller running. Then:

1. **reference** — the pure allocator in this process: the same Services, read with one LIST,
   parsed and allocated (`Allocator.record_existing` + `allocate` in order), no writes. This is
   the ceiling the controller's API round trips are measured against.
2. **controller** — one `nodelb controller` replica starts (a real process in the lab), takes
   the Lease, and allocates and writes status for all S. Timed from its start until its
   `nodelb_status_writes_total{result="ok"}` reaches S (scraped from its /metrics, so the
   bench adds no apiserver load while it waits). API requests per allocation come from the
   apiserver's own `apiserver_request_total`, before and after (the two scrapes subtracted).
   Controller VmRSS / VmHWM from /proc at the end; the CPU the controller (its whole life),
   kube-apiserver and etcd (that phase) used, per allocation. Then, until every allocation's
   Event is in the API (the counts of its Events there) or counted as dropped: the Events
   recorded, written and dropped (its metrics), and the time from its start until then
   (`events_s`).
3. **restart** — the replica is stopped (SIGTERM), a new one starts; timed until a Service
   created after the start has an address (it is allocated after every existing one is
   re-checked), and the number of status writes it made for the S existing ones (expected 0).

Prints a table, then as its last line one JSON object with the figures.

    .venv/bin/python -m bench.allocator [--services 10000] [--threads 8] [--workdir DIR]
        [--write-concurrency N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import orjson
from kubernetes import client as kclient

from agent.controller.allocator import Allocator, allocation_order
from agent.controller.service_status import parse_view
from agent.kube.lists import ListFn, list_all
from agent.model.pools import Forbidden, parse_pools
from bench.e2e_latency import EXTRA_SERVICE_CIDR
from bench.measure import proc_cpu_s, proc_mem_mb
from lab.controllers import ControllerSet
from lab.controlplane import ControlPlane
from lab.topology import Lab, LabSpec
from lab.wait import wait_until

NAMESPACE = "bench"
POOLS = [{"name": "bench", "addresses": ["198.19.0.0/16"]}]
REQUEST_TIMEOUT = 30.0
_REQUESTS = re.compile(r"^apiserver_request_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_WRITES_OK = re.compile(r'^nodelb_status_writes_total\{result="ok"\} ([0-9.e+]+)$', re.M)
_EVENT_WRITES = re.compile(r"^nodelb_event_writes_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_EVENTS_DROPPED = re.compile(r"^nodelb_events_dropped_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_EVENTS_RECORDED = re.compile(r"^nodelb_events_recorded_total ([0-9.e+]+)$", re.M)


def service_body(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"svc-{i:05d}"},
        "spec": {
            "type": "LoadBalancer",
            "allocateLoadBalancerNodePorts": False,
            "selector": {"app": f"a{i}"},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        },
    }


def apiserver_requests(api: kclient.ApiClient, cp: ControlPlane) -> float:
    """Return the apiserver's total request count (all verbs, resources and clients)."""
    resp = api.rest_client.pool_manager.request("GET", f"{cp.url}/metrics", timeout=30.0)
    return sum(float(m) for m in _REQUESTS.findall(resp.data.decode()))


def writes_ok(cs: ControllerSet, name: str) -> float:
    """Return the replica's successful status writes (0 while it is not answering yet)."""
    try:
        code, text = cs.scrape(name)
    except Exception:
        return 0.0
    found = _WRITES_OK.findall(text) if code == 200 else []
    return float(found[0]) if found else 0.0


def event_figures(cs: ControllerSet, name: str) -> dict[str, float]:
    """Return the replica's Event occurrences recorded, API writes made, and drops."""
    code, text = cs.scrape(name)
    assert code == 200, code
    return {
        key: sum(float(m) for m in pattern.findall(text))
        for key, pattern in (
            ("events_recorded", _EVENTS_RECORDED),
            ("event_writes", _EVENT_WRITES),
            ("events_dropped", _EVENTS_DROPPED),
        )
    }


def api_event_count(core: kclient.CoreV1Api, replica: str) -> int:
    """Return the occurrences the Events of controller `replica` add up to, in the API."""
    raw: Any = core.list_event_for_all_namespaces(_preload_content=False)
    items = orjson.loads(raw.data).get("items") or []
    return sum(int(e.get("count") or 1) for e in items if e.get("reportingInstance") == replica)


def reference(api: kclient.ApiClient) -> tuple[float, int]:
    """Return (seconds, allocations) for the pure allocator over one LIST of the Services."""
    core = kclient.CoreV1Api(api)
    t0 = time.monotonic()
    items = list_all(cast(ListFn, functools.partial(core.list_namespaced_service, NAMESPACE)))
    pools = parse_pools(POOLS, forbidden=Forbidden())
    assert pools is not None
    views = [parse_view(o, lb_class="nodelb.io/lb", handle_classless=True) for o in items]
    requests = [v.request for v in views if v.request is not None]
    allocator = Allocator(pools)
    allocator.record_existing(requests)
    got = sum(1 for r in allocation_order(requests) if allocator.allocate(r, now=0.0).allocated)
    return time.monotonic() - t0, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--write-concurrency", type=int, help="the controller's (default: its own)")
    p.add_argument("--workdir", type=Path, help="keep files and logs here (default: temporary)")
    args = p.parse_args(argv)
    n = args.services
    figures: dict[str, Any] = {"bench": "allocator", "services": n, "cpus": os.cpu_count()}
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            work = args.workdir
            work.mkdir(parents=True, exist_ok=False)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nodelb-alloc-")))
        lab = stack.enter_context(
            Lab(LabSpec(nodes=1, pods_per_node=0, with_client=False), work / "lab")
        )
        assert lab.controlplane is not None
        cp = ControlPlane(lab.controlplane.ns, lab.controlplane.ip4, work / "cp")
        cp.start()
        stack.callback(cp.stop)
        api = cp.api_client()
        core = kclient.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})  # type: ignore[arg-type]
        kclient.NetworkingV1Api(api).create_service_cidr(
            {  # type: ignore[arg-type]
                "apiVersion": "networking.k8s.io/v1",
                "kind": "ServiceCIDR",
                "metadata": {"name": "bench-extra"},
                "spec": {"cidrs": [EXTRA_SERVICE_CIDR]},
            }
        )
        cs = ControllerSet(lab, cp, work)
        cs.ensure_namespace()
        cs.write_config({"pools": POOLS})

        def create(i: int) -> None:
            for attempt in range(50):
                try:
                    core.create_namespaced_service(
                        NAMESPACE,
                        service_body(i),  # type: ignore[arg-type]
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                    return
                except kclient.exceptions.ApiException as exc:
                    # The extra ServiceCIDR becomes usable a moment after it is created.
                    if exc.status != 422 or attempt == 49:
                        raise
                    time.sleep(0.2)

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(create, range(n)))
        figures["create_s"] = time.monotonic() - t0
        print(f"# {n} Services created in {figures['create_s']:.1f}s", file=sys.stderr)

        ref_s, ref_n = reference(api)
        figures["reference_s"], figures["reference_allocations"] = ref_s, ref_n
        figures["reference_per_s"] = ref_n / ref_s

        before = apiserver_requests(api, cp)
        servers = {what: proc.pid for what, proc in cp._procs}  # etcd, kube-apiserver
        cpu0 = {what: proc_cpu_s(pid) for what, pid in servers.items()}
        t0 = time.monotonic()
        extra = (f"--write-concurrency={args.write_concurrency}",) if args.write_concurrency else ()
        proc = cs.start("bench-1", extra=extra)
        wait_until(lambda: writes_ok(cs, "bench-1") >= n, 3600, f"{n} status writes", interval=0.5)
        ctl_s = time.monotonic() - t0
        after = apiserver_requests(api, cp)
        rss, hwm = proc_mem_mb(proc.pid)
        # CPU per allocation: less at the mercy of a shared machine than allocations/s.
        figures["controller_cpu_ms_per_allocation"] = proc_cpu_s(proc.pid) * 1000 / n
        for what, pid in servers.items():
            used = proc_cpu_s(pid) - cpu0[what]
            figures[f"{what.replace('-', '_')}_cpu_ms_per_allocation"] = used * 1000 / n

        # Every Event occurrence the replica recorded is in an Event's count in the API, or
        # counted as dropped, before it stops.
        def events_settled() -> bool:
            f = event_figures(cs, "bench-1")
            in_api = api_event_count(core, "bench-1")
            figures.update(f, events_in_api=in_api)
            return in_api + f["events_dropped"] >= f["events_recorded"]

        wait_until(events_settled, 600, "the Events written or dropped", interval=1.0)
        figures["events_s"] = time.monotonic() - t0
        figures |= {
            "controller_s": ctl_s,
            "controller_per_s": n / ctl_s,
            "api_requests_per_allocation": (after - before - 1) / n,
            "controller_rss_mb": rss,
            "controller_hwm_mb": hwm,
            "ratio_controller_to_reference": (n / ctl_s) / figures["reference_per_s"],
        }
        cs.stop("bench-1")

        t0 = time.monotonic()
        cs.start("bench-2")
        wait_until(cs.leader, 120, "bench-2 to lead")
        core.create_namespaced_service(NAMESPACE, service_body(n))  # type: ignore[arg-type]

        def allocated() -> bool:
            raw: Any = core.read_namespaced_service(
                f"svc-{n:05d}", NAMESPACE, _preload_content=False
            )
            status = orjson.loads(raw.data).get("status") or {}
            return bool((status.get("loadBalancer") or {}).get("ingress"))

        wait_until(allocated, 3600, "the post-restart Service's address", interval=0.2)
        figures["restart_to_new_allocation_s"] = time.monotonic() - t0
        figures["restart_writes"] = writes_ok(cs, "bench-2")
        cs.stop_all()

    print(f"{'figure':<34} {'value':>12}")
    for key in (
        "create_s",
        "reference_per_s",
        "controller_per_s",
        "ratio_controller_to_reference",
        "api_requests_per_allocation",
        "controller_cpu_ms_per_allocation",
        "kube_apiserver_cpu_ms_per_allocation",
        "etcd_cpu_ms_per_allocation",
        "controller_rss_mb",
        "controller_hwm_mb",
        "restart_to_new_allocation_s",
        "restart_writes",
        "events_recorded",
        "event_writes",
        "events_in_api",
        "events_dropped",
        "events_s",
    ):
        print(f"{key:<34} {figures[key]:>12.3f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
