"""Builders and hypothesis strategies for DesiredState values, shared by the rules/ tests."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from hypothesis import strategies as st

from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import IPAddress, IPNetwork, Protocol


def ip(text: str) -> IPAddress:
    """Return the address `text` as an ipaddress object."""
    return ipaddress.ip_address(text)


def net(text: str) -> IPNetwork:
    """Return the network `text` as an ipaddress object."""
    return ipaddress.ip_network(text)


def key(addr: str, proto: str = "tcp", port: int = 80) -> FrontendKey:
    """Return a FrontendKey from text."""
    return FrontendKey(ip(addr), Protocol(proto), port)


def eps(*specs: str) -> tuple[Endpoint, ...]:
    """Return endpoints from "addr:port" / "[v6]:port" strings."""
    out = []
    for spec in specs:
        addr, _, port = spec.rpartition(":")
        out.append(Endpoint(ip(addr.strip("[]")), int(port)))
    return tuple(out)


def fe(
    addr: str,
    proto: str = "tcp",
    port: int = 80,
    *,
    endpoints: tuple[Endpoint, ...] = (),
    cluster: tuple[Endpoint, ...] | None = None,
    service: str = "default/web",
    local_only: bool = False,
    ranges: tuple[str, ...] = (),
    affinity: int | None = None,
) -> Frontend:
    """Return a Frontend; `cluster` defaults to `endpoints` (externalTrafficPolicy=Cluster)."""
    return Frontend(
        service=service,
        key=key(addr, proto, port),
        endpoints=endpoints,
        cluster_endpoints=endpoints if cluster is None else cluster,
        local_only=local_only,
        source_ranges=tuple(net(r) for r in ranges),
        affinity_timeout=affinity,
    )


def state(
    frontends: Iterable[Frontend] = (), *, held: Iterable[str] = (), local: Iterable[str] = ()
) -> DesiredState:
    """Return a DesiredState keyed by each frontend's own key."""
    return DesiredState(
        frontends={f.key: f for f in frontends},
        held_ips=frozenset(ip(a) for a in held),
        local_cidrs=tuple(net(n) for n in local),
    )


# -- hypothesis ----------------------------------------------------------------------------

_V4_FRONT = ["198.18.0.200", "198.18.0.201"]
_V6_FRONT = ["2001:db8::200"]
_V4_EP = [Endpoint(ip(f"198.19.{n}.{h}"), p) for n in (1, 2) for h in (5, 6) for p in (8080, 9090)]
_V6_EP = [Endpoint(ip(f"2001:db8:1::{h}"), p) for h in (5, 6, 7) for p in (8080, 9090)]
_V4_RANGES = [net("203.0.113.0/24"), net("203.0.113.0/25"), net("192.0.2.7/32"), net("10.0.0.0/8")]
_V6_RANGES = [net("2001:db8:ffff::/48"), net("2001:db8:ffff:1::/64")]


@st.composite
def frontends(draw: st.DrawFn, addr: str) -> Frontend:
    """Draw one frontend for `addr` with a small universe of endpoints and options."""
    v4 = ipaddress.ip_address(addr).version == 4
    pool = _V4_EP if v4 else _V6_EP
    proto = draw(st.sampled_from(list(Protocol)))
    port = draw(st.sampled_from([80, 443]))
    local_only = draw(st.booleans())
    ext = tuple(draw(st.lists(st.sampled_from(pool), max_size=4)))
    if local_only or draw(st.booleans()):
        cluster = tuple(draw(st.lists(st.sampled_from(pool), max_size=4)))
    else:
        cluster = ext
    ranges = tuple(draw(st.lists(st.sampled_from(_V4_RANGES + _V6_RANGES), max_size=3)))
    return Frontend(
        service=f"ns/{addr}-{port}",
        key=FrontendKey(ip(addr), proto, port),
        endpoints=ext,
        cluster_endpoints=cluster,
        local_only=local_only,
        source_ranges=ranges,
        affinity_timeout=draw(st.sampled_from([None, None, 10, 10800])),
    )


@st.composite
def desired_states(draw: st.DrawFn) -> DesiredState:
    """Draw a small DesiredState: a few frontends, held IPs and local CIDRs."""
    fes: dict[FrontendKey, Frontend] = {}
    for addr in _V4_FRONT + _V6_FRONT:
        for f in draw(st.lists(frontends(addr), max_size=3)):
            fes[f.key] = f
    held = draw(st.frozensets(st.sampled_from([ip(a) for a in _V4_FRONT + _V6_FRONT])))
    local = tuple(
        draw(
            st.lists(
                st.sampled_from(
                    [net("198.19.1.0/24"), net("198.19.0.0/16"), net("2001:db8:1::/64")]
                ),
                max_size=2,
            )
        )
    )
    return DesiredState(frontends=fes, held_ips=held, local_cidrs=local)
