"""Benchmark the dataplane applier against kube-proxy's nftables shape, in a throwaway namespace.

For each size N (Services, one TCP frontend each, 10 endpoints each by default) it measures:
- nodelb: full sync (render + one transaction) and the latency of one changed Service
  (Dataplane.sync with the changed key as hint: delta + one transaction), p50/p99 over
  --changes changes, and the same without the hint (every frontend compared);
- the reference, kube-proxy's shape (a chain per Service with an anonymous
  `numgen random mod n vmap { 0 : goto ep1, ... }`, a chain per endpoint, a service-ips
  verdict map), rendered by `kube_proxy_shape` below and applied through the same runner:
  full load, and one changed Service (new endpoint chain, flushed and rewritten Service chain,
  old endpoint chain deleted, in one transaction);
- the process's peak RSS during each phase (VmHWM, reset between phases; libnftables runs
  in-process, so its parser and cache count too), and the whole run's peak.

With `--foreign`, one more phase per size: nodelb's table is loaded, then kube-proxy's shape
for the same N Services is loaded next to it (a foreign table, ~11 chains per Service), and one
changed Service is applied alternately through the libnftables path and through the netlink
element fast path (dataplane/netlink.py), `--foreign-changes` times each, in the same run:
libnftables fetches every table's chains and sets before each command, the fast path
fetches nothing.

Everything runs inside a namespace `nlbt-bench-<hex>` created for the run and deleted at the
end. Prints a table, then as its last line one JSON object with every figure.

    .venv/bin/python -m bench.dataplane --sizes 1000,10000 [--changes 200] [--endpoints 10]
        [--foreign [--foreign-changes 100]]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import random
import resource
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from agent.dataplane.applier import Dataplane, SyncMode
from agent.dataplane.libnft import NetnsNftRunner, NftError
from agent.dataplane.netlink import ElementSender, NetlinkElementSender
from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import Protocol
from agent.netns import netns_inode, root_netns_inodes
from bench.measure import percentile, proc_mem_mb
from lab import netns
from rules.netlink import ElementOp
from rules.render import render

REF_TABLE = "inet kpref"


# -- states ----------------------------------------------------------------------------------


def _frontend_ip(i: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(ipaddress.IPv4Address("198.18.0.0")) + 256 + i)


def _endpoint(n: int) -> Endpoint:
    # 198.19.0.0/16 holds the pods; ports vary so that 300k endpoints stay distinct.
    return Endpoint(
        ipaddress.IPv4Address(int(ipaddress.IPv4Address("198.19.0.0")) + 1 + n % 65000),
        8000 + n // 65000,
    )


def build_state(services: int, endpoints: int) -> DesiredState:
    """Return N TCP frontends (port 80) with `endpoints` distinct endpoints each."""
    fes: dict[FrontendKey, Frontend] = {}
    for i in range(services):
        key = FrontendKey(_frontend_ip(i), Protocol.TCP, 80)
        eps = tuple(_endpoint(i * endpoints + j) for j in range(endpoints))
        fes[key] = Frontend(f"bench/svc-{i}", key, eps, eps)
    return DesiredState(frontends=fes)


def changed(state: DesiredState, rng: random.Random, serial: int) -> tuple[DesiredState, int]:
    """Return `state` with one Service's endpoint replaced by a new one, and that Service."""
    keys = list(state.frontends)
    idx = rng.randrange(len(keys))
    key = keys[idx]
    fe = state.frontends[key]
    eps = list(fe.endpoints)
    eps[rng.randrange(len(eps))] = Endpoint(
        ipaddress.IPv4Address(int(ipaddress.IPv4Address("198.19.254.0")) + serial % 250),
        20000 + serial,
    )
    new = replace(fe, endpoints=tuple(eps), cluster_endpoints=tuple(eps))
    fronts = dict(state.frontends)
    fronts[key] = new
    return DesiredState(frontends=fronts), idx


# -- the kube-proxy-shaped reference ---------------------------------------------------------


def _ep_chain(i: int, ep: Endpoint) -> str:
    return f"sep-{i}-{str(ep.ip).replace('.', '-')}-{ep.port}"


def _ep_chain_ops(i: int, ep: Endpoint) -> list[str]:
    c = _ep_chain(i, ep)
    return [
        f"add chain {REF_TABLE} {c}",
        f"add rule {REF_TABLE} {c} ip saddr {ep.ip} jump mark-for-masquerade",
        f"add rule {REF_TABLE} {c} meta l4proto tcp dnat ip to {ep.ip}:{ep.port}",
    ]


def _svc_rule(i: int, eps: tuple[Endpoint, ...]) -> str:
    vmap = ", ".join(f"{j} : goto {_ep_chain(i, ep)}" for j, ep in enumerate(eps))
    return f"add rule {REF_TABLE} svc-{i} numgen random mod {len(eps)} vmap {{ {vmap} }}"


def kube_proxy_shape(state: DesiredState) -> str:
    """Return the full kube-proxy-shaped table for `state` as `nft -f` text."""
    t = REF_TABLE
    lines = [
        f"add table {t}",
        f"add chain {t} mark-for-masquerade",
        f"add rule {t} mark-for-masquerade meta mark set meta mark | 0x4000",
        f"add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}",
        f"add chain {t} services",
        f"add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips",
        f"add chain {t} nat-prerouting {{ type nat hook prerouting priority dstnat ; }}",
        f"add rule {t} nat-prerouting jump services",
    ]
    elements = []
    for i, fe in enumerate(state.frontends.values()):
        lines.append(f"add chain {t} svc-{i}")
        for ep in fe.endpoints:
            lines.extend(_ep_chain_ops(i, ep))
        lines.append(_svc_rule(i, fe.endpoints))
        elements.append(f"{fe.key.ip} . tcp . {fe.key.port} : goto svc-{i}")
    for start in range(0, len(elements), 1000):
        lines.append(
            f"add element {t} service-ips {{ {', '.join(elements[start : start + 1000])} }}"
        )
    return "\n".join(lines) + "\n"


def kube_proxy_change(i: int, old: Frontend, new: Frontend) -> str:
    """Return kube-proxy's one-Service update: new endpoint chains, rewritten Service chain,
    old endpoint chains deleted, as one transaction."""
    added = [ep for ep in new.endpoints if ep not in old.endpoints]
    gone = [ep for ep in old.endpoints if ep not in new.endpoints]
    lines: list[str] = []
    for ep in added:
        lines.extend(_ep_chain_ops(i, ep))
    lines.append(f"flush chain {REF_TABLE} svc-{i}")
    lines.append(_svc_rule(i, new.endpoints))
    lines.extend(f"delete chain {REF_TABLE} {_ep_chain(i, ep)}" for ep in gone)
    return "\n".join(lines) + "\n"


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Figures:
    services: int
    endpoints: int
    nodelb_render_s: float
    nodelb_full_s: float
    nodelb_change_p50_ms: float
    nodelb_change_p99_ms: float
    nodelb_change_modes: dict[str, int]
    nodelb_change_nohint_p50_ms: float
    nodelb_change_nohint_p99_ms: float
    ref_full_s: float
    ref_change_p50_ms: float
    ref_change_p99_ms: float
    nodelb_peak_rss_mb: float
    nodelb_rss_after_full_mb: float
    ref_peak_rss_mb: float


def _reset_peak_rss() -> None:
    """Reset this process's peak RSS (VmHWM) so the next phase is measured on its own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(runner: NetnsNftRunner, services: int, endpoints: int, changes: int) -> Figures:
    _reset_peak_rss()
    rng = random.Random(services)
    state = build_state(services, endpoints)
    dp = Dataplane(runner)
    dp.cleanup()
    runner.run_text(f"add table {REF_TABLE}\ndelete table {REF_TABLE}\n")

    render_s = _timed(lambda: render(state))
    t0 = time.perf_counter()
    res = dp.sync(state)
    full_s = time.perf_counter() - t0
    assert res.ok and res.mode is SyncMode.FULL, res.error
    rss_after_full = proc_mem_mb()[0]

    lat: list[float] = []
    lat_nohint: list[float] = []
    modes: dict[str, int] = {}
    cur = state
    keys = list(state.frontends)
    for n in range(2 * changes):
        nxt, idx = changed(cur, rng, n)
        hinted = n % 2 == 0  # alternate: with the agent's hint, and comparing every frontend
        t0 = time.perf_counter()
        res = dp.sync(nxt, changed=[keys[idx]] if hinted else None)
        (lat if hinted else lat_nohint).append(time.perf_counter() - t0)
        assert res.ok, res.error
        modes[res.mode.value] = modes.get(res.mode.value, 0) + 1
        cur = nxt
    dp.cleanup()
    nodelb_rss = proc_mem_mb()[1]

    _reset_peak_rss()
    rng = random.Random(services)
    text = kube_proxy_shape(state)
    ref_full_s = _timed(lambda: runner.run_text(text))
    ref_lat: list[float] = []
    cur = state
    index = {k: i for i, k in enumerate(state.frontends)}
    for n in range(changes):
        nxt, idx = changed(cur, rng, n)
        key = list(cur.frontends)[idx]
        change = kube_proxy_change(index[key], cur.frontends[key], nxt.frontends[key])
        ref_lat.append(_timed(lambda change=change: runner.run_text(change)))  # type: ignore[misc]
        cur = nxt
    runner.run_text(f"delete table {REF_TABLE}\n")

    return Figures(
        services=services,
        endpoints=endpoints,
        nodelb_render_s=render_s,
        nodelb_full_s=full_s,
        nodelb_change_p50_ms=statistics.median(lat) * 1e3,
        nodelb_change_p99_ms=percentile(lat, 0.99) * 1e3,
        nodelb_change_modes=modes,
        nodelb_change_nohint_p50_ms=statistics.median(lat_nohint) * 1e3,
        nodelb_change_nohint_p99_ms=percentile(lat_nohint, 0.99) * 1e3,
        ref_full_s=ref_full_s,
        ref_change_p50_ms=statistics.median(ref_lat) * 1e3,
        ref_change_p99_ms=percentile(ref_lat, 0.99) * 1e3,
        nodelb_peak_rss_mb=nodelb_rss,
        nodelb_rss_after_full_mb=rss_after_full,
        ref_peak_rss_mb=proc_mem_mb()[1],
    )


@dataclass
class ForeignFigures:
    services: int
    foreign_load_s: float
    libnft_change_p50_ms: float
    libnft_change_p99_ms: float
    fast_change_p50_ms: float
    fast_change_p99_ms: float
    fast_applied: int
    fast_fallbacks: int


class _Switch:
    """An ElementSender that passes batches on while `on`, else refuses them at once, which
    sends the Dataplane down its libnftables path (counted as a fallback)."""

    def __init__(self, inner: ElementSender) -> None:
        self.inner = inner
        self.on = True

    def apply(self, ops: Iterable[ElementOp]) -> None:
        if not self.on:
            raise NftError("fast path switched off for this sync")
        self.inner.apply(ops)


def measure_foreign(
    runner: NetnsNftRunner, sender: ElementSender, services: int, endpoints: int, changes: int
) -> ForeignFigures:
    """Return one-change latencies through libnftables and through the fast path, alternated,
    with kube-proxy's shape for the same Services loaded as a foreign table."""
    rng = random.Random(services + 1)
    state = build_state(services, endpoints)
    switch = _Switch(sender)
    dp = Dataplane(runner, elements=switch)
    dp.cleanup()
    runner.run_text(f"add table {REF_TABLE}\ndelete table {REF_TABLE}\n")
    res = dp.sync(state)
    assert res.ok and res.mode is SyncMode.FULL, res.error
    load_s = _timed(lambda: runner.run_text(kube_proxy_shape(state)))
    slow: list[float] = []
    fast: list[float] = []
    cur = state
    keys = list(state.frontends)
    quiet = logging.getLogger("agent.dataplane.applier")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # every switched-off sync logs its fallback
    try:
        for n in range(2 * changes):
            nxt, idx = changed(cur, rng, n)
            switch.on = n % 2 == 1
            t0 = time.perf_counter()
            res = dp.sync(nxt, changed=[keys[idx]])
            (fast if switch.on else slow).append(time.perf_counter() - t0)
            assert res.ok and res.mode is SyncMode.PARTIAL, res.error
            cur = nxt
    finally:
        quiet.setLevel(level)
    runner.run_text(f"delete table {REF_TABLE}\n")
    dp.cleanup()
    assert dp.fast_applied == changes and dp.fast_fallbacks == changes
    return ForeignFigures(
        services=services,
        foreign_load_s=load_s,
        libnft_change_p50_ms=statistics.median(slow) * 1e3,
        libnft_change_p99_ms=percentile(slow, 0.99) * 1e3,
        fast_change_p50_ms=statistics.median(fast) * 1e3,
        fast_change_p99_ms=percentile(fast, 0.99) * 1e3,
        fast_applied=dp.fast_applied,
        fast_fallbacks=dp.fast_fallbacks,
    )


def foreign_table(rows: list[ForeignFigures]) -> str:
    head = (
        f"{'services':>8} | {'foreign load s':>14} | {'libnftables chg p50/p99 ms':>26} "
        f"{'fast path chg p50/p99 ms':>24} {'ratio p50':>9} {'ratio p99':>9}"
    )
    out = [head, "-" * len(head)]
    for f in rows:
        out.append(
            f"{f.services:>8} | {f.foreign_load_s:>14.1f} | "
            f"{f.libnft_change_p50_ms:>12.2f} / {f.libnft_change_p99_ms:>11.2f} "
            f"{f.fast_change_p50_ms:>11.2f} / {f.fast_change_p99_ms:>10.2f} "
            f"{f.libnft_change_p50_ms / f.fast_change_p50_ms:>8.0f}x "
            f"{f.libnft_change_p99_ms / f.fast_change_p99_ms:>8.0f}x"
        )
    out.append(
        "one changed Service = Dataplane.sync(state, changed=[key]) with kube-proxy's shape for "
        "the same Services loaded as a foreign table; libnftables path and netlink element "
        "fast path alternated in the same run; ratio = libnftables / fast path"
    )
    return "\n".join(out)


def table(rows: list[Figures]) -> str:
    head = (
        f"{'services':>8} {'eps':>4} | {'nodelb full s':>13} {'kp-shape full s':>15} "
        f"{'ratio':>6} | {'nodelb chg p50/p99 ms':>21} {'kp-shape chg p50/p99 ms':>23} "
        f"{'ratio p99':>9} | {'peak RSS MB nodelb / kp-shape':>29}"
    )
    out = [head, "-" * len(head)]
    for f in rows:
        out.append(
            f"{f.services:>8} {f.endpoints:>4} | {f.nodelb_full_s:>13.3f} {f.ref_full_s:>15.3f} "
            f"{f.ref_full_s / f.nodelb_full_s:>5.1f}x | "
            f"{f.nodelb_change_p50_ms:>9.2f} / {f.nodelb_change_p99_ms:>9.2f} "
            f"{f.ref_change_p50_ms:>10.2f} / {f.ref_change_p99_ms:>10.2f} "
            f"{f.ref_change_p99_ms / f.nodelb_change_p99_ms:>8.1f}x | "
            f"{f.nodelb_peak_rss_mb:>13.1f} / {f.ref_peak_rss_mb:>13.1f}"
        )
    out.append(
        "nodelb change = Dataplane.sync(state, changed=[key]) (delta + one transaction); "
        "without the hint (every frontend compared): "
        + ", ".join(
            f"{f.nodelb_change_nohint_p50_ms:.2f} / {f.nodelb_change_nohint_p99_ms:.2f} ms "
            f"at {f.services}"
            for f in rows
        )
    )
    out.append(
        "RSS right after the nodelb full sync (state + mirror held, heap trimmed): "
        + ", ".join(f"{f.nodelb_rss_after_full_mb:.1f} MB at {f.services}" for f in rows)
    )
    out.append(
        "ratio = kube-proxy shape / nodelb (higher is better for nodelb); "
        "nodelb full = render + apply (render alone: "
        + ", ".join(f"{f.nodelb_render_s:.3f} s at {f.services}" for f in rows)
        + ")"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="1000,10000", help="comma-separated Service counts")
    p.add_argument("--endpoints", type=int, default=10, help="endpoints per Service")
    p.add_argument("--changes", type=int, default=200, help="single-Service changes (>= 100)")
    p.add_argument(
        "--foreign",
        action="store_true",
        help="also measure one change with kube-proxy's table present: libnftables vs fast path",
    )
    p.add_argument(
        "--foreign-changes", type=int, default=100, help="changes per path in that phase"
    )
    p.add_argument("--skip-base", action="store_true", help="run only the --foreign phase")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.changes < 100:
        p.error("--changes must be at least 100")

    name = f"nlbt-bench-{secrets.token_hex(3)}"
    netns.create(name)
    runner = NetnsNftRunner(name)
    rows: list[Figures] = []
    foreign: list[ForeignFigures] = []
    sender: NetlinkElementSender | None = None
    try:
        if netns_inode(str(netns.NETNS_DIR / name)) in root_netns_inodes():
            raise SystemExit(f"{name} is the root namespace; refusing to run")
        for n in sizes:
            if not args.skip_base:
                rows.append(measure(runner, n, args.endpoints, args.changes))
            if args.foreign:
                sender = sender or NetlinkElementSender.in_namespace(name)
                foreign.append(
                    measure_foreign(runner, sender, n, args.endpoints, args.foreign_changes)
                )
            print(f"# done: {n} services", file=sys.stderr, flush=True)
    finally:
        if sender is not None:
            sender.close()
        runner.close()
        netns.delete(name)
    if rows:
        print(table(rows))
    if foreign:
        print(foreign_table(foreign))
    print(
        json.dumps(
            {
                "bench": "dataplane",
                "changes": args.changes,
                "results": [vars(f) for f in rows],
                "foreign": [vars(f) for f in foreign],
                "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
