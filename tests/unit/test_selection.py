"""Endpoint selection must match kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go).

The table covers what kube-proxy's own table covers (zone hints, unready endpoints, missing
hints, Local policy, terminating fallback, merging of the cluster and local lists) plus the
PreferSameNode rules of KEP-3015 and the edge cases of a node without a zone label.

Every case runs on node "node-a" in zone "zone-a" unless it says otherwise. Endpoints are
named by the last octet of 10.0.0.x.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pytest

from agent.model.endpoint_slice import SliceEndpoint
from agent.node.selection import (
    HintStatus,
    SelectionReason,
    TopologyMode,
    available_for_topology,
    is_local,
    select,
    topology_mode,
)

R = SelectionReason
H = HintStatus
NODE = "node-a"
ZONE = "zone-a"


def ep(
    n: int,
    *,
    node: str | None = None,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    zones: tuple[str, ...] | None = None,
    nodes: tuple[str, ...] | None = None,
) -> SliceEndpoint:
    """An endpoint 10.0.0.n; `serving` defaults to `ready`; hints None unless given."""
    return SliceEndpoint(
        ip=ipaddress.IPv4Address(f"10.0.0.{n}"),
        node_name=node,
        ready=ready,
        serving=ready if serving is None else serving,
        terminating=terminating,
        hints_for_zones=None if zones is None else frozenset(zones),
        hints_for_nodes=None if nodes is None else frozenset(nodes),
    )


def term(
    n: int,
    *,
    node: str | None = None,
    serving: bool = True,
    zones: tuple[str, ...] | None = None,
) -> SliceEndpoint:
    """A terminating, not-ready endpoint 10.0.0.n (serving unless told otherwise)."""
    return ep(n, node=node, ready=False, serving=serving, terminating=True, zones=zones)


def ids(*numbers: int) -> frozenset[int]:
    return frozenset(numbers)


@dataclass(frozen=True)
class Case:
    endpoints: tuple[SliceEndpoint, ...]
    cluster: frozenset[int]
    reason: SelectionReason
    mode: TopologyMode = TopologyMode.NONE
    local: frozenset[int] | None = None  # None: Local policy not asked for
    local_reason: SelectionReason | None = None
    all_reachable: frozenset[int] | None = None  # None: union of cluster and local
    node_hints: HintStatus | None = None  # None: not checked
    zone_hints: HintStatus | None = None  # None: not checked
    node_name: str = NODE
    node_zone: str | None = ZONE


def z(*names: str) -> tuple[str, ...]:
    return names


CASES = [
    # --- PreferSameZone -----------------------------------------------------------------------
    pytest.param(
        Case(
            endpoints=(
                ep(1, zones=z("zone-a")),
                ep(2, zones=z("zone-b")),
                ep(3, zones=z("zone-c")),
                ep(4, zones=z("zone-a")),
            ),
            cluster=ids(1, 4),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
            node_hints=H.ABSENT,
            zone_hints=H.MATCH,
        ),
        id="every ready endpoint has a zone hint and some name this zone: only those are used",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, zones=z("zone-a")),),
            node_zone=None,
            cluster=ids(1),
            reason=R.ALL_READY,
            zone_hints=H.NODE_HAS_NO_ZONE,
        ),
        id="node without a zone label ignores zone hints and uses every ready endpoint",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, zones=z("zone-a")), ep(2, zones=z("zone-b"))),
            node_zone="",
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            zone_hints=H.NODE_HAS_NO_ZONE,
        ),
        id="node whose zone label is the empty string is treated like a node without one",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, zones=z("zone-a")),),
            node_zone="zone-b",
            cluster=ids(1),
            reason=R.ALL_READY,
            zone_hints=H.NO_MATCH,
        ),
        id="no endpoint is hinted for this node's zone so no filtering is done",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, zones=z("zone-a")),
                ep(2, zones=z("zone-b")),
                ep(3, zones=z("zone-c")),
                ep(4, ready=False, zones=z("zone-a")),
            ),
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
        ),
        id="an unready endpoint hinted for this zone is left out of the zone-filtered list",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, ready=False, zones=z("zone-a")),
                ep(2, zones=z("zone-b")),
                ep(3, zones=z("zone-c")),
                ep(4, ready=False, zones=z("zone-a")),
            ),
            cluster=ids(2, 3),
            reason=R.ALL_READY,
            zone_hints=H.NO_MATCH,
        ),
        id="when only unready endpoints are hinted for this zone the zone hints are ignored",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, zones=z("zone-a")),
                ep(2, zones=z("zone-b")),
                ep(3),
                ep(4, zones=z("zone-a")),
            ),
            cluster=ids(1, 2, 3, 4),
            reason=R.ALL_READY,
            zone_hints=H.PARTIAL,
        ),
        id="one ready endpoint without a zone hint disables zone topology for the service",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, zones=z("zone-a")), ep(2, zones=z())),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            zone_hints=H.PARTIAL,
        ),
        id="an empty forZones list counts as no zone hint at all",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, zones=z("zone-a")),
                ep(2, zones=z("zone-b")),
                ep(3, ready=False),
            ),
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
        ),
        id="an unready endpoint without hints does not disable zone topology",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, zones=z("zone-a", "zone-b", "zone-c")),
                ep(2, zones=z("zone-b", "zone-c")),
                ep(3, zones=z("zone-b", "zone-d")),
                ep(4, zones=z("zone-c")),
            ),
            node_zone="zone-c",
            cluster=ids(1, 2, 4),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
        ),
        id="endpoints hinted for several zones are used by every zone they name",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1), ep(2)),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            node_hints=H.ABSENT,
            zone_hints=H.ABSENT,
        ),
        id="endpoints without any hints are all used",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, zones=z("")), ep(2, zones=z("zone-b"))),
            node_zone=None,
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
        ),
        id="like kube-proxy a node without zone label matches a hint for the empty zone name",
    ),
    # --- PreferSameNode -----------------------------------------------------------------------
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z(NODE), zones=z("zone-a")),
                ep(2, node="node-b", nodes=z("node-b"), zones=z("zone-a")),
                ep(3, node=NODE, nodes=z(NODE), zones=z("zone-a")),
                ep(4, node="node-c", nodes=z("node-c"), zones=z("zone-b")),
            ),
            cluster=ids(1, 3),
            reason=R.TOPOLOGY_SAME_NODE,
            mode=TopologyMode.PREFER_SAME_NODE,
            node_hints=H.MATCH,
            zone_hints=H.MATCH,
        ),
        id="every ready endpoint has a node hint and some name this node: only those are used",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node="node-b", nodes=z("node-b"), zones=z("zone-a")),
                ep(2, node="node-c", nodes=z("node-c"), zones=z("zone-b")),
            ),
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
            node_hints=H.NO_MATCH,
            zone_hints=H.MATCH,
        ),
        id="node hints that never name this node fall back to zone hints",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node="node-b", nodes=z("node-b")),
                ep(2, node="node-c", nodes=z("node-c")),
            ),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            node_hints=H.NO_MATCH,
            zone_hints=H.ABSENT,
        ),
        id="node hints that never name this node and no zone hints mean every ready endpoint",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z(NODE), zones=z("zone-a")),
                ep(2, node="node-b", zones=z("zone-a")),
                ep(3, node="node-c", nodes=z("node-c"), zones=z("zone-b")),
            ),
            cluster=ids(1, 2),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
            node_hints=H.PARTIAL,
        ),
        id="one ready endpoint without a node hint disables node topology but not zone topology",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z(NODE), zones=z("zone-a")),
                ep(2, node="node-b", zones=z("zone-a")),
                ep(3, node="node-c", nodes=z("node-c")),
            ),
            cluster=ids(1, 2, 3),
            reason=R.ALL_READY,
            node_hints=H.PARTIAL,
            zone_hints=H.PARTIAL,
        ),
        id="partial node hints and partial zone hints together mean every ready endpoint",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, ready=False, nodes=z(NODE), zones=z("zone-a")),
                ep(2, node="node-b", nodes=z("node-b"), zones=z("zone-a")),
                ep(3, node="node-c", nodes=z("node-c"), zones=z("zone-b")),
            ),
            cluster=ids(2),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
            node_hints=H.NO_MATCH,
        ),
        id="a node hint for this node on an unready endpoint does not select same-node mode",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z(NODE)),
                ep(2, node="node-b", nodes=z("node-b")),
                ep(3, node="node-c", ready=False),
            ),
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_NODE,
            mode=TopologyMode.PREFER_SAME_NODE,
        ),
        id="an unready endpoint without a node hint does not disable node topology",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node="node-b", nodes=z(NODE), zones=z("zone-b")),
                ep(2, node="node-b", nodes=z("node-b"), zones=z("zone-a")),
            ),
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_NODE,
            mode=TopologyMode.PREFER_SAME_NODE,
        ),
        id="same-node mode follows the node hint, not the endpoint's nodeName or zone hint",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node="node-b", nodes=z(NODE, "node-b")),
                ep(2, node="node-c", nodes=z("node-c", NODE)),
                ep(3, node="node-d", nodes=z("node-d")),
            ),
            cluster=ids(1, 2),
            reason=R.TOPOLOGY_SAME_NODE,
            mode=TopologyMode.PREFER_SAME_NODE,
        ),
        id="endpoints hinted for several nodes are used by every node they name",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z(NODE)),
                ep(2, node="node-b", nodes=z("node-b")),
            ),
            node_zone=None,
            cluster=ids(1),
            reason=R.TOPOLOGY_SAME_NODE,
            mode=TopologyMode.PREFER_SAME_NODE,
        ),
        id="same-node mode does not need the node to have a zone label",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z(NODE)),
                ep(2, node="node-b", nodes=z()),
            ),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            node_hints=H.PARTIAL,
        ),
        id="an empty forNodes list counts as no node hint at all",
    ),
    # --- readiness and the serving-terminating fallback ---------------------------------------
    pytest.param(
        Case(endpoints=(), cluster=ids(), reason=R.NO_ENDPOINTS),
        id="no endpoints at all gives an empty cluster list",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, ready=False), ep(2, ready=False)),
            cluster=ids(),
            reason=R.NO_ENDPOINTS,
        ),
        id="endpoints that are neither ready nor terminating are never used",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, ready=False), ep(2)),
            cluster=ids(2),
            reason=R.ALL_READY,
        ),
        id="only ready endpoints are used when some are ready",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1), term(2), term(3, node=NODE)),
            cluster=ids(1),
            reason=R.ALL_READY,
        ),
        id="serving terminating endpoints are not used while a ready endpoint exists",
    ),
    pytest.param(
        Case(
            endpoints=(term(1, node=NODE), term(2, node="node-b")),
            cluster=ids(1, 2),
            reason=R.SERVING_TERMINATING_FALLBACK,
        ),
        id="with no ready endpoint anywhere every serving terminating endpoint is used",
    ),
    pytest.param(
        Case(
            endpoints=(term(1, zones=z("zone-b")), term(2, zones=z("zone-a"))),
            cluster=ids(1, 2),
            reason=R.SERVING_TERMINATING_FALLBACK,
        ),
        id="the serving terminating fallback ignores topology hints",
    ),
    pytest.param(
        Case(
            endpoints=(term(1), term(2, serving=False), ep(3, ready=False, serving=True)),
            cluster=ids(1),
            reason=R.SERVING_TERMINATING_FALLBACK,
        ),
        id="the fallback needs both serving and terminating",
    ),
    # --- externalTrafficPolicy: Local ---------------------------------------------------------
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, zones=z("zone-a")),
                ep(2, node=NODE, zones=z("zone-b")),
                ep(3, node="node-b", zones=z("zone-c")),
                ep(4, node="node-b", zones=z("zone-a")),
            ),
            cluster=ids(1, 4),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
            local=ids(1, 2),
            local_reason=R.LOCAL_READY,
            all_reachable=ids(1, 2, 4),
        ),
        id="Local policy ignores zone hints for local endpoints and merges both lists",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, nodes=z("node-b")),
                ep(2, node="node-b", nodes=z(NODE)),
                ep(3, node="node-c", nodes=z("node-c")),
            ),
            cluster=ids(2),
            reason=R.TOPOLOGY_SAME_NODE,
            mode=TopologyMode.PREFER_SAME_NODE,
            local=ids(1),
            local_reason=R.LOCAL_READY,
            all_reachable=ids(1, 2),
        ),
        id="Local policy ignores node hints: local means nodeName is this node",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, node=NODE), ep(2, node="node-b")),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            local=ids(1),
            local_reason=R.LOCAL_READY,
            all_reachable=ids(1, 2),
        ),
        id="Local policy with some local endpoints uses just those for local traffic",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, node="node-b"), ep(2, node="node-c")),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            local=ids(),
            local_reason=R.NO_LOCAL_ENDPOINTS,
        ),
        id="Local policy with only remote endpoints has an empty local list but has endpoints",
    ),
    pytest.param(
        Case(
            endpoints=(term(1, node="node-b"), term(2, node="node-c")),
            cluster=ids(1, 2),
            reason=R.SERVING_TERMINATING_FALLBACK,
            local=ids(),
            local_reason=R.NO_LOCAL_ENDPOINTS,
        ),
        id="Local policy with only remote terminating endpoints has an empty local list",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node="node-b"),
                ep(2, node=NODE, ready=False, serving=False),
                term(3, node=NODE),
                term(4, node="node-b"),
            ),
            cluster=ids(1),
            reason=R.ALL_READY,
            local=ids(3),
            local_reason=R.LOCAL_SERVING_TERMINATING,
            all_reachable=ids(1, 3),
        ),
        id="Local policy falls back to local serving terminating endpoints independently",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, node=NODE), term(2, node=NODE), ep(3, node="node-b")),
            cluster=ids(1, 3),
            reason=R.ALL_READY,
            local=ids(1),
            local_reason=R.LOCAL_READY,
        ),
        id="a local ready endpoint shuts out local terminating endpoints",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1), ep(2, node="node-b")),
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            local=ids(),
            local_reason=R.NO_LOCAL_ENDPOINTS,
        ),
        id="an endpoint without nodeName is never local",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, node=""), ep(2, node="node-b")),
            node_name="",
            cluster=ids(1, 2),
            reason=R.ALL_READY,
            local=ids(),
            local_reason=R.NO_LOCAL_ENDPOINTS,
        ),
        id="with an empty node name nothing is local, not even endpoints with empty nodeName",
    ),
    pytest.param(
        Case(
            endpoints=(ep(1, node=NODE, ready=False), ep(2, node="node-b")),
            cluster=ids(2),
            reason=R.ALL_READY,
            local=ids(),
            local_reason=R.NO_LOCAL_ENDPOINTS,
        ),
        id="a local endpoint that is neither ready nor terminating is not used",
    ),
    pytest.param(
        Case(
            endpoints=(),
            cluster=ids(),
            reason=R.NO_ENDPOINTS,
            local=ids(),
            local_reason=R.NO_LOCAL_ENDPOINTS,
        ),
        id="Local policy with no endpoints at all has both lists empty and no endpoints",
    ),
    pytest.param(
        Case(
            endpoints=(
                ep(1, node=NODE, zones=z("zone-a")),
                ep(2, node=NODE, zones=z("zone-b")),
                ep(3, node="node-b", zones=z("zone-a")),
                ep(4, node="node-b", zones=z("zone-b")),
            ),
            cluster=ids(1, 3),
            reason=R.TOPOLOGY_SAME_ZONE,
            mode=TopologyMode.PREFER_SAME_ZONE,
            local=ids(1, 2),
            local_reason=R.LOCAL_READY,
            all_reachable=ids(1, 2, 3),
        ),
        id="conflicting topology and locality need the two lists merged for all reachable",
    ),
    pytest.param(
        Case(
            endpoints=(term(1, node=NODE), term(2, node="node-b")),
            cluster=ids(1, 2),
            reason=R.SERVING_TERMINATING_FALLBACK,
            local=ids(1),
            local_reason=R.LOCAL_SERVING_TERMINATING,
        ),
        id="with no ready endpoint anywhere both lists fall back to terminating endpoints",
    ),
]


def _numbers(endpoints: tuple[SliceEndpoint, ...] | None) -> frozenset[int] | None:
    if endpoints is None:
        return None
    return frozenset(int(e.ip) & 0xFF for e in endpoints)


@pytest.mark.parametrize("case", CASES)
def test_select(case: Case) -> None:
    local_policy = case.local is not None
    got = select(
        case.endpoints,
        node_name=case.node_name,
        node_zone=case.node_zone,
        local_policy=local_policy,
    )
    want_all = case.all_reachable
    if want_all is None:
        want_all = case.cluster | (case.local or frozenset())
    problems: list[str] = []

    def check(what: str, got_value: object, want_value: object) -> None:
        if got_value != want_value:
            problems.append(f"{what}: got {got_value!r}, want {want_value!r}")

    check("cluster", _numbers(got.cluster), case.cluster)
    check("local", _numbers(got.local), case.local)
    check("all_reachable", _numbers(got.all_reachable), want_all)
    check("reason", got.reason, case.reason)
    check("local_reason", got.local_reason, case.local_reason)
    check("topology mode", got.topology.mode, case.mode)
    check("has_any", got.has_any, bool(case.cluster))
    if case.node_hints is not None:
        check("node hints", got.topology.node_hints, case.node_hints)
    if case.zone_hints is not None:
        check("zone hints", got.topology.zone_hints, case.zone_hints)
    check("all_reachable has no duplicates", len(got.all_reachable), len(want_all))
    given = [id(e) for e in case.endpoints]
    for name, chosen in (
        ("cluster", got.cluster),
        ("local", got.local or ()),
        ("all", got.all_reachable),
    ):
        positions = [given.index(id(e)) for e in chosen if id(e) in given]
        check(f"{name} holds the objects passed in", len(positions), len(chosen))
        check(f"{name} keeps input order", positions, sorted(positions))
    assert not problems, "\n".join(problems)


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


def test_all_reachable_keeps_input_order_when_merging() -> None:
    endpoints = (
        ep(4, node="node-b", zones=z("zone-a")),
        ep(3, node=NODE, zones=z("zone-b")),
        ep(2, node="node-b", zones=z("zone-b")),
        ep(1, node=NODE, zones=z("zone-a")),
    )
    got = select(endpoints, node_name=NODE, node_zone=ZONE, local_policy=True)
    assert got.all_reachable == (endpoints[0], endpoints[1], endpoints[3])


def test_without_local_policy_all_reachable_is_the_cluster_list() -> None:
    endpoints = (ep(1, node=NODE), ep(2, node="node-b"))
    got = select(endpoints, node_name=NODE, node_zone=ZONE, local_policy=False)
    assert got.local is None
    assert got.local_reason is None
    assert got.all_reachable is got.cluster


def test_topology_mode_with_no_ready_endpoint_is_none() -> None:
    decision = topology_mode(
        [ep(1, ready=False, nodes=z(NODE), zones=z(ZONE))], node_name=NODE, node_zone=ZONE
    )
    assert (decision.mode, decision.node_hints, decision.zone_hints) == (
        TopologyMode.NONE,
        HintStatus.ABSENT,
        HintStatus.ABSENT,
    )


@pytest.mark.parametrize(
    ("mode", "endpoint", "want"),
    [
        pytest.param(TopologyMode.NONE, ep(1), True, id="no topology allows every endpoint"),
        pytest.param(
            TopologyMode.PREFER_SAME_NODE,
            ep(1, nodes=z(NODE)),
            True,
            id="same-node mode allows an endpoint hinted for this node",
        ),
        pytest.param(
            TopologyMode.PREFER_SAME_NODE,
            ep(1, zones=z(ZONE)),
            False,
            id="same-node mode refuses an endpoint with only zone hints",
        ),
        pytest.param(
            TopologyMode.PREFER_SAME_ZONE,
            ep(1, zones=z(ZONE)),
            True,
            id="same-zone mode allows an endpoint hinted for this zone",
        ),
        pytest.param(
            TopologyMode.PREFER_SAME_ZONE,
            ep(1, nodes=z(NODE)),
            False,
            id="same-zone mode refuses an endpoint with only node hints",
        ),
    ],
)
def test_available_for_topology(mode: TopologyMode, endpoint: SliceEndpoint, want: bool) -> None:
    assert available_for_topology(endpoint, mode, node_name=NODE, node_zone=ZONE) is want


def test_is_local_needs_a_matching_non_empty_node_name() -> None:
    assert is_local(ep(1, node=NODE), NODE)
    assert not is_local(ep(1, node="node-b"), NODE)
    assert not is_local(ep(1), NODE)
    assert not is_local(ep(1, node=""), "")
