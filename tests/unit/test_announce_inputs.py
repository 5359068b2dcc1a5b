"""The announcer's pure glue: the announce settings, the ownership input, the speaker config."""

from __future__ import annotations

import ipaddress

import pytest

from agent.announce.inputs import ip_uses, node_states, peer_sources, speaker_config
from agent.announce.ownership import OwnershipConfig, plan, rank_nodes
from agent.announce.settings import AnnounceConfigError, parse_announce
from agent.kube.node_report import parse_sources
from agent.model.endpoint_slice import AddressType, Slice, SliceEndpoint
from agent.model.node import Node
from agent.model.service import parse_service

IP = ipaddress.ip_address


def service(name: str, ip: str, *, local: bool = False) -> object:
    svc = parse_service(
        {
            "metadata": {"namespace": "ns", "name": name, "uid": name},
            "spec": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Local" if local else "Cluster",
                "ports": [{"port": 80}],
            },
            "status": {"loadBalancer": {"ingress": [{"ip": ip}]}},
        }
    )
    return svc


def test_settings_parse_with_errors_naming_the_key() -> None:
    s = parse_announce({"interface": "eth1", "ipv4VRIDs": "10-20", "speakerCPU": 1})
    assert s.enabled and s.interface == "eth1" and s.speaker_cpu == 1
    assert (s.ownership.ipv4_vrids.first, s.ownership.ipv4_vrids.last) == (10, 20)
    assert not parse_announce(None).enabled
    cases = {
        "unknown announce keys: bogus": {"bogus": 1},
        "announce.advertIntervalCs": {"advertIntervalCs": 0},
        "announce.ipv6VRIDs": {"ipv6VRIDs": "0-300"},
        "announce.checksumMode": {"checksumMode": "crc"},
        "matchExpressions[0].operator": {
            "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}
        },
    }
    for needle, raw in cases.items():
        with pytest.raises(AnnounceConfigError, match=needle.replace("[", r"\[")):
            parse_announce(raw)


def test_a_shared_ip_merges_its_services_and_local_nodes_are_per_family() -> None:
    a, b = service("a", "198.19.0.1"), service("b", "198.19.0.1", local=True)
    slices = [
        Slice(
            "ns",
            "b-1",
            "b",
            AddressType.IPV4,
            endpoints=(
                SliceEndpoint(ip=IP("198.19.1.5"), node_name="n1"),
                SliceEndpoint(ip=IP("198.19.2.5"), node_name="n2", ready=False),
            ),
        ),
        Slice(
            "ns",
            "b-2",
            "b",
            AddressType.IPV6,
            endpoints=(SliceEndpoint(ip=IP("2001:db8::5"), node_name="n3"),),
        ),
    ]
    uses = ip_uses(
        {"ns/a": [IP("198.19.0.1")], "ns/b": [IP("198.19.0.1")]},
        {"ns/a": a, "ns/b": b},  # type: ignore[dict-item]
        {"ns/b": slices},
    )
    (use,) = uses
    assert [(u.service, u.local, u.local_nodes) for u in use.services] == [
        ("ns/a", False, frozenset()),
        ("ns/b", True, frozenset({"n1"})),  # n2 not ready, n3 only has IPv6 endpoints
    ]
    nodes = node_states([Node(n, None, True, (), ()) for n in ("n1", "n2", "n3")])
    p = plan(nodes=nodes, ips=uses, config=OwnershipConfig())
    assert p.ips[0].holder == "n1"  # the only node with a local endpoint of the Local Service


def test_peers_are_other_nodes_v4_and_their_reported_link_locals() -> None:
    nodes = [
        Node("me", None, True, (IP("198.18.0.11"),), ()),
        Node("n2", None, True, (IP("198.18.0.12"), IP("2001:db8::12")), ()),
    ]
    reported = {"me": parse_sources("198.18.0.11,fe80::1"), "n2": parse_sources("fe80::2,junk")}
    assert peer_sources(nodes, reported, "me") == {IP("198.18.0.12"), IP("fe80::2")}


def test_without_an_ipv4_source_the_node_runs_no_ipv4_instance() -> None:
    settings = parse_announce({"advertIntervalCs": 20})
    nodes = node_states([Node("me", None, True, (), ())])
    uses = ip_uses(
        {"ns/a": [IP("198.19.0.1"), IP("2001:db8::1")]},
        {"ns/a": service("a", "198.19.0.1")},  # type: ignore[dict-item]
        {},
    )
    p = plan(nodes=nodes, ips=uses, config=settings.ownership)
    cfg = speaker_config(node="me", plan=p, settings=settings, source4=None, peers=frozenset())
    assert [(i.family, i.addresses) for i in cfg.instances] == [(6, (IP("2001:db8::1"),))]
    assert all(i.advert_interval_cs == 20 for i in cfg.instances)
    with_v4 = speaker_config(
        node="me",
        plan=p,
        settings=settings,
        source4=ipaddress.IPv4Address("198.18.0.11"),
        peers=frozenset(),
    )
    assert sorted(i.family for i in with_v4.instances) == [4, 6]


def test_each_node_runs_a_new_instance_with_the_startup_delay_of_its_rank() -> None:
    settings = parse_announce({"advertIntervalCs": 20})
    names = ["n1", "n2", "n3"]
    nodes = node_states([Node(n, None, True, (), ()) for n in names])
    uses = ip_uses({"ns/a": [IP("198.19.0.1")]}, {"ns/a": service("a", "198.19.0.1")}, {})  # type: ignore[dict-item]
    p = plan(nodes=nodes, ips=uses, config=settings.ownership)
    ranked = rank_nodes(IP("198.19.0.1"), names)
    delays = {}
    for name in names:
        cfg = speaker_config(
            node=name,
            plan=p,
            settings=settings,
            source4=ipaddress.IPv4Address("198.18.0.11"),
            peers=frozenset(),
        )
        [inst] = cfg.instances
        delays[name] = (inst.priority, inst.startup_delay_cs)
    assert [delays[n] for n in ranked] == [(254, 0), (253, 20), (252, 40)]
