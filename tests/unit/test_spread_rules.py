"""The holder's spread table as nft text, and the tunnel's per-node addressing (pure)."""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address

import pytest

from agent.model import tunnel as T
from agent.model.desired_state import FrontendKey
from agent.model.net import Protocol
from rules.spread import MARK_BASE, render_spread, render_spread_cleanup

N1, N2, N3 = (IPv4Address(f"198.18.0.{i}") for i in (11, 12, 13))
LB4 = FrontendKey(ipaddress.ip_address("198.18.0.210"), Protocol.TCP, 80)
LB6 = FrontendKey(ipaddress.ip_address("2001:db8::210"), Protocol.UDP, 53)


def state() -> T.SpreadState:
    return T.SpreadState(
        device="eth0",
        node=N1,
        peers=frozenset({N3, N2}),
        buckets={LB4: ((0, N2), (7, N3)), LB6: ((3, N2),)},
    )


def test_the_script_fills_the_maps_with_each_peer_bucket_and_its_next_hop() -> None:
    text = render_spread(state())
    assert "add element netdev nodelb vtep4 { 198.18.0.12, 198.18.0.13 }" in text
    assert (
        "198.18.0.210 . tcp . 80 . 0 : 198.18.0.12, 198.18.0.210 . tcp . 80 . 7 : 198.18.0.13"
        in text
    )
    # IPv6: the bucket travels in the mark (MARK_BASE + bucket), the next hop is link-local.
    assert f"2001:db8::210 . udp . 53 . {MARK_BASE + 3} : {T.hop6(N2)}" in text
    assert 'hook ingress device "eth0"' in text
    assert "ip daddr 198.18.0.11 udp dport 4789 ip saddr != @vtep4 drop" in text


def test_the_script_is_the_same_whatever_order_the_frontends_come_in() -> None:
    a = state()
    b = T.SpreadState(a.device, a.node, a.peers, dict(reversed(list(a.buckets.items()))))
    assert render_spread(a) == render_spread(b)


def test_a_node_with_no_peers_and_no_buckets_accepts_no_vxlan_and_spreads_nothing() -> None:
    text = render_spread(T.SpreadState(device="eth0", node=N1))
    assert "add element" not in text
    assert "flush set netdev nodelb vtep4" in text  # peers that left are forgotten


@pytest.mark.parametrize("bucket", [-1, T.BUCKETS])
def test_a_bucket_outside_the_table_is_refused(bucket: int) -> None:
    bad = T.SpreadState(device="eth0", node=N1, buckets={LB4: ((bucket, N2),)})
    with pytest.raises(ValueError, match="outside"):
        render_spread(bad)


@pytest.mark.parametrize("peer", ["224.0.0.18", "0.0.0.0", "255.255.255.255"])
def test_a_peer_that_cannot_be_a_tunnel_endpoint_is_refused(peer: str) -> None:
    bad = T.SpreadState(device="eth0", node=N1, peers=frozenset({IPv4Address(peer)}))
    with pytest.raises(ValueError, match="cannot be a tunnel endpoint"):
        render_spread(bad)


def test_cleanup_removes_only_the_netdev_table() -> None:
    assert render_spread_cleanup() == "add table netdev nodelb\ndelete table netdev nodelb\n"


def test_tunnel_addresses_are_functions_of_the_node_address_and_distinct() -> None:
    assert T.vtep_mac(N2) == "02:6e:c6:12:00:0c"
    assert T.hop6(N2) == ipaddress.ip_address("fe80::4e4c:0:c612:c")
    nodes = [IPv4Address(f"198.18.{i}.{j}") for i in range(4) for j in range(1, 255)]
    assert len({T.vtep_mac(n) for n in nodes}) == len(nodes)
    assert all(T.hop6(n).is_link_local for n in nodes)
