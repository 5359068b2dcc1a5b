"""The announcer's pure glue: the announce settings, the ownership input, the speaker config."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from agent.announce.inputs import (
    OwnershipIndex,
    OwnershipInput,
    OwnershipView,
    ip_use,
    ip_uses,
    node_states,
    ownership_view,
    peer_sources,
    speaker_config,
)
from agent.announce.ownership import IPUse, OwnershipConfig, plan
from agent.announce.settings import AnnounceConfigError, AnnounceSettings, parse_announce
from agent.announce.vrrp.config import DEFAULT_REFRESH_S
from agent.kube.node_report import PeerReport, parse_sources
from agent.model.endpoint_slice import AddressType, Slice, SliceEndpoint
from agent.model.net import IPAddress
from agent.model.node import Node
from agent.model.service import InvalidService, parse_service

IP = ipaddress.ip_address
ROOT = Path(__file__).resolve().parents[2]


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
    # Real-time scheduling is on unless turned off; SCHED_RR priorities are 1..99.
    assert s.realtime_priority == 10
    assert parse_announce({"realtimePriority": 0}).realtime_priority == 0
    cases = {
        "unknown announce keys: bogus": {"bogus": 1},
        "announce.advertIntervalCs": {"advertIntervalCs": 0},
        "announce.ipv6VRIDs": {"ipv6VRIDs": "0-300"},
        "announce.checksumMode": {"checksumMode": "crc"},
        "announce.realtimePriority": {"realtimePriority": 100},
        "matchExpressions[0].operator": {
            "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}
        },
    }
    for needle, raw in cases.items():
        with pytest.raises(AnnounceConfigError, match=needle.replace("[", r"\[")):
            parse_announce(raw)


@pytest.mark.parametrize(
    ("gratuitous", "refresh_s"),
    [
        pytest.param(None, 60.0, id="no gratuitous section: refresh every 60 s"),
        pytest.param({"count": 3}, 60.0, id="a section without refreshSeconds keeps the default"),
        pytest.param({"refreshSeconds": 20}, 20.0, id="refreshSeconds sets the interval"),
        pytest.param({"refreshSeconds": 0}, None, id="refreshSeconds 0 turns the refresh off"),
        pytest.param({"refreshSeconds": None}, None, id="refreshSeconds null turns it off"),
    ],
)
def test_a_default_install_refreshes_its_announcements(
    gratuitous: dict[str, object] | None, refresh_s: float | None
) -> None:
    raw = {} if gratuitous is None else {"gratuitous": gratuitous}
    assert parse_announce(raw).gratuitous.refresh_s == refresh_s
    assert AnnounceSettings().gratuitous.refresh_s == DEFAULT_REFRESH_S == 60.0


def test_the_shipped_config_refreshes_by_default() -> None:
    docs = yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text())
    (cm,) = [d for d in docs if d and d.get("kind") == "ConfigMap" and "config.yaml" in d["data"]]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert parse_announce(cfg["announce"]).gratuitous.refresh_s == DEFAULT_REFRESH_S


# Service b's slices: a ready IPv4 endpoint on n1, an unready one on n2, an IPv6 one on n3.
B_SLICES = [
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


def test_a_shared_ip_merges_its_services_and_local_nodes_are_per_family() -> None:
    a, b = service("a", "198.19.0.1"), service("b", "198.19.0.1", local=True)
    slices = B_SLICES
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
    reported = {
        "me": PeerReport("me", parse_sources("198.18.0.11,fe80::1")),
        "n2": PeerReport("n2", parse_sources("fe80::2,junk")),
        # A report for a node that is no Node adds no peer.
        "ghost": PeerReport("ghost", parse_sources("fe80::66")),
    }
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
    (group,) = p.groups
    ranked = group.ranking
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
    assert [delays[n] for n in ranked] == [(254, 0), (253, 20), (189, 40)]


# --- the incremental ownership input ---------------------------------------------------------

IP1, IP2, IP3 = IP("198.19.0.1"), IP("198.19.0.2"), IP("2001:db8::3")
NODES = (Node("n1", None, True, (), ()), Node("n2", None, True, (), ()))


def cluster(*ips: IPAddress) -> OwnershipView:
    return OwnershipView(ips, False)


def local(*ips: IPAddress, v4: tuple[str, ...] = (), v6: tuple[str, ...] = ()) -> OwnershipView:
    return OwnershipView(ips, True, frozenset(v4), frozenset(v6))


def from_scratch(views: dict[str, OwnershipView], nodes: tuple[Node, ...]) -> OwnershipInput:
    """The input every view gives when built at once (what the index must equal)."""
    by_ip: dict[IPAddress, list[str]] = {}
    for key, view in views.items():
        for ip in view.lb_ips:
            by_ip.setdefault(ip, []).append(key)
    return OwnershipInput(
        node_states(nodes),
        frozenset(
            ip_use(ip, [views[k].use(k, ip.version) for k in keys]) for ip, keys in by_ip.items()
        ),
    )


def records(inp: OwnershipInput) -> dict[IPAddress, IPUse]:
    return {u.ip: u for u in inp.ips}


@dataclass(frozen=True)
class IndexCase:
    before: dict[str, OwnershipView]  # recorded first, with NODES
    views: dict[str, OwnershipView | None]  # then this update
    moved: bool  # the update returns a new input
    rebuilt: frozenset[IPAddress] = frozenset()  # IP records built anew (others are reused)
    nodes: tuple[Node, ...] = NODES
    after: dict[str, OwnershipView] = field(default_factory=dict)  # every view recorded then


INDEX_CASES = [
    pytest.param(
        IndexCase(
            before={"a": cluster(IP1), "b": local(IP2, v4=("n1",))},
            views={"a": cluster(IP1), "b": local(IP2, v4=("n1",))},
            moved=False,
        ),
        id="Services recomputed to the views they had move nothing and no input is built",
    ),
    pytest.param(
        IndexCase(before={"a": cluster(IP1)}, views={"c": None}, moved=False),
        id="a Service that used no planned IP and still uses none moves nothing",
    ),
    pytest.param(
        IndexCase(
            before={"a": local(IP1, v4=("n1",)), "b": cluster(IP2)},
            views={"a": local(IP1, v4=("n1", "n2"))},
            moved=True,
            rebuilt=frozenset({IP1}),
            after={"a": local(IP1, v4=("n1", "n2")), "b": cluster(IP2)},
        ),
        id="a Local Service gaining an eligible node rebuilds its own IP's record only",
    ),
    pytest.param(
        IndexCase(
            before={"a": local(IP1, IP3, v4=("n1",), v6=("n2",))},
            views={"a": local(IP1, IP3, v4=("n1",), v6=("n1",))},
            moved=True,
            rebuilt=frozenset({IP1, IP3}),
            after={"a": local(IP1, IP3, v4=("n1",), v6=("n1",))},
        ),
        id="a dual-stack Local Service's IPs are rebuilt together, each with its family's nodes",
    ),
    pytest.param(
        IndexCase(
            before={"a": cluster(IP1), "b": cluster(IP3)},
            views={"a": cluster(IP2)},
            moved=True,
            rebuilt=frozenset({IP2}),
            after={"a": cluster(IP2), "b": cluster(IP3)},
        ),
        id="a Service moving to another IP adds the new record and drops the unused old one",
    ),
    pytest.param(
        IndexCase(
            before={"a": cluster(IP1), "b": local(IP1, v4=("n2",))},
            views={"a": None},
            moved=True,
            rebuilt=frozenset({IP1}),
            after={"b": local(IP1, v4=("n2",))},
        ),
        id="a Service leaving a shared IP rebuilds that IP with the Service that stays",
    ),
    pytest.param(
        IndexCase(
            before={"a": cluster(IP1)},
            views={"a": local(IP1)},
            moved=True,
            rebuilt=frozenset({IP1}),
            after={"a": local(IP1)},
        ),
        id="a Service turning to Local policy with no ready endpoint rebuilds its IP",
    ),
    pytest.param(
        IndexCase(
            before={"a": cluster(IP1), "b": local(IP2, v4=("n1",))},
            views={},
            nodes=(NODES[0], Node("n2", None, False, (), ())),
            moved=True,
            after={"a": cluster(IP1), "b": local(IP2, v4=("n1",))},
        ),
        id="another Node's readiness alone gives a new input that reuses every IP record",
    ),
    pytest.param(
        IndexCase(
            before={"a": cluster(IP1)},
            views={},
            nodes=(*NODES, Node("n3", None, True, (), ())),
            moved=True,
            after={"a": cluster(IP1)},
        ),
        id="a Node joining gives a new input although no Service changed",
    ),
]


@pytest.mark.parametrize("case", INDEX_CASES)
def test_the_ownership_index_rebuilds_only_the_ips_whose_services_moved(case: IndexCase) -> None:
    index = OwnershipIndex()
    first = index.update(case.before, reversed(NODES))
    assert first == from_scratch(case.before, NODES)
    got = index.update(case.views, case.nodes)
    assert (got is not None) == case.moved
    if got is None:
        return
    assert got == from_scratch(case.after, case.nodes)
    assert index.nodes == tuple(sorted(case.nodes, key=lambda n: n.name))
    old, new = records(first), records(got)
    rebuilt = {ip for ip, rec in new.items() if old.get(ip) is not rec}
    assert rebuilt == case.rebuilt


def test_the_first_update_builds_an_input_even_with_nothing_to_place() -> None:
    index = OwnershipIndex()
    assert index.update({}, ()) == OwnershipInput(frozenset(), frozenset())
    assert index.update({}, ()) is None


def test_a_service_s_ownership_view_reads_slices_only_for_local_policy() -> None:
    a, b = service("a", "198.19.0.1"), service("b", "198.19.0.1", local=True)
    assert ownership_view(a, (IP1,), B_SLICES) == cluster(IP1)  # type: ignore[arg-type]
    want = local(IP1, v4=("n1",), v6=("n3",))  # n2's endpoint is not ready
    assert ownership_view(b, (IP1,), B_SLICES) == want  # type: ignore[arg-type]
    assert ownership_view(b, (), B_SLICES) is None  # type: ignore[arg-type]
    assert ownership_view(None, (IP1,), B_SLICES) is None
    assert ownership_view(InvalidService("ns/b", "u", "bad"), (IP1,), B_SLICES) is None
