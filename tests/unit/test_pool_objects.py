"""LoadBalancerIPPool objects: which pools are in force, the verdicts and the status (pure)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from agent.controller.pool_objects import (
    PoolObject,
    PoolVerdictReason,
    parse_pool_object,
    resolve_pools,
)
from agent.controller.pool_status import INT64_MAX, pool_status, usage
from agent.model.pools import AddressPool, Forbidden

CLUSTER = Forbidden(
    node_addresses=(ipaddress.ip_address("198.18.0.11"),),
    pod_cidrs=(ipaddress.ip_network("198.18.64.0/20"),),
    service_cidrs=(ipaddress.ip_network("198.18.128.0/20"),),
)


def obj(
    name: str, *addresses: str, created: str = "2026-12-01T00:00:00Z", **spec: Any
) -> PoolObject:
    return PoolObject(
        name=name, generation=3, created=created, spec={"addresses": list(addresses), **spec}
    )


def in_force(*objects: PoolObject) -> dict[str, AddressPool]:
    """Return the pools of a resolution of `objects` that all fit."""
    done = resolve_pools(objects, in_force={}, forbidden=CLUSTER)
    assert all(v.reason is PoolVerdictReason.VALID for v in done.verdicts.values())
    return {p.name: p for p in done.pools.pools}


@dataclass(frozen=True, slots=True)
class Case:
    objects: tuple[PoolObject, ...]
    before: tuple[PoolObject, ...]  # what was in force (all valid)
    names: tuple[str, ...]  # the pools in force afterwards, in order
    reasons: dict[str, PoolVerdictReason]
    says: dict[str, str]  # words each refused object's message must contain


A = obj("a", "198.18.1.0/24", created="2026-12-01T00:00:00Z")
B = obj("b", "198.18.2.0/24", created="2026-12-02T00:00:00Z")
B_ONTO_A = obj("b", "198.18.1.128/25", created="2026-12-02T00:00:00Z")
A_ONTO_B = obj("a", "198.18.2.0/25", created="2026-12-01T00:00:00Z")
V, OP, OC, INV = (
    PoolVerdictReason.VALID,
    PoolVerdictReason.OVERLAPS_POOL,
    PoolVerdictReason.OVERLAPS_CLUSTER,
    PoolVerdictReason.INVALID,
)

CASES = [
    pytest.param(Case((A, B), (), ("a", "b"), {"a": V, "b": V}, {}), id="two disjoint pools"),
    pytest.param(
        Case(
            (B_ONTO_A, A),
            (),
            ("a",),
            {"a": V, "b": OP},
            {"b": "overlaps 198.18.1.0/24 of LoadBalancerIPPool a"},
        ),
        id="after a restart the older of two overlapping pools wins, the newer names it",
    ),
    pytest.param(
        Case((A_ONTO_B, B), (A, B), ("a", "b"), {"a": OP, "b": V}, {"a": "LoadBalancerIPPool b"}),
        id="an edit onto an established pool loses even when older; its previous version stays",
    ),
    pytest.param(
        Case(
            (obj("a", "198.18.1.9/24"), B),
            (A, B),
            ("a", "b"),
            {"a": INV, "b": V},
            {"a": "spec.addresses[0]"},
        ),
        id="a spec that stops parsing keeps the previous version in force",
    ),
    pytest.param(
        Case((obj("c", "198.18.0.0/24"),), (), (), {"c": OC}, {"c": "node address 198.18.0.11"}),
        id="a pool holding a node address is refused naming the node address",
    ),
    pytest.param(
        Case((obj("c", "198.18.64.0/24"),), (), (), {"c": OC}, {"c": "pod CIDR 198.18.64.0/20"}),
        id="a pool inside the pod CIDR is refused naming it",
    ),
    pytest.param(
        Case((obj("c", "198.18.130.0/24"),), (), (), {"c": OC}, {"c": "service CIDR"}),
        id="a pool inside the service CIDR is refused naming it",
    ),
    pytest.param(
        Case(
            (obj("c", "2001:db8::20-2001:db8::10"),), (), (), {"c": INV}, {"c": "must not exceed"}
        ),
        id="a reversed IPv6 range (CEL checks IPv4 order only) is refused by the controller",
    ),
    pytest.param(
        Case(
            (obj("c", "198.18.3.0/24", "198.18.3.0/25"),),
            (),
            (),
            {"c": INV},
            {"c": "spec.addresses[1]"},
        ),
        id="a pool overlapping itself names both of its blocks",
    ),
    pytest.param(
        Case(
            (obj("c", "198.18.3.0/24", nameSpaces=["x"]),),
            (),
            (),
            {"c": INV},
            {"c": "unknown keys nameSpaces"},
        ),
        id="an unknown key (possible only with the CRD's pruning off) is not ignored",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_pool_objects_resolve_to_pools_in_force_with_a_verdict_each(case: Case) -> None:
    done = resolve_pools(case.objects, in_force=in_force(*case.before), forbidden=CLUSTER)
    assert [p.name for p in done.pools.pools] == list(case.names)
    assert {n: v.reason for n, v in done.verdicts.items()} == case.reasons
    for name, words in case.says.items():
        assert words in done.verdicts[name].message, done.verdicts[name].message
        assert f"LoadBalancerIPPool {name}" in done.verdicts[name].message or "overlaps" in (
            done.verdicts[name].message
        )


def test_the_previous_version_is_dropped_when_it_no_longer_fits() -> None:
    """a's edit is refused, and its previous version now overlaps b, which is in force."""
    before = in_force(A)
    b = obj("b", "198.18.1.0/25", created="2026-12-02T00:00:00Z")
    bad_a = obj("a", "198.18.1.1/24")
    done = resolve_pools((bad_a, b), in_force=before | in_force(b), forbidden=CLUSTER)
    # b is unchanged and in force, so it is placed first; a's old version does not fit.
    assert [p.name for p in done.pools.pools] == ["b"]
    assert done.verdicts["a"].pool is None and not done.verdicts["a"].previous


def test_parse_pool_object_reads_the_raw_object() -> None:
    raw = {
        "metadata": {
            "name": "a",
            "uid": "u1",
            "generation": 4,
            "creationTimestamp": "2026-12-01T00:00:00Z",
        },
        "spec": {"addresses": ["198.18.1.0/24"]},
        "status": {"observedGeneration": 3},
    }
    o = parse_pool_object(raw)
    assert (o.name, o.uid, o.generation, o.created) == ("a", "u1", 4, "2026-12-01T00:00:00Z")
    assert o.status == {"observedGeneration": 3}
    assert parse_pool_object({"metadata": {"name": "x"}, "spec": "junk"}).spec == {}


NOW, LATER = "2026-12-05T02:00:00Z", "2026-12-05T03:00:00Z"


def test_status_counts_per_family_and_marks_exhaustion() -> None:
    o = obj("d", "198.18.5.0/30", "2001:db8:5::/64")
    (v,) = resolve_pools([o], in_force={}, forbidden=CLUSTER).verdicts.values()
    held = [
        ipaddress.ip_address(a)
        for a in ("198.18.5.0", "198.18.5.1", "198.18.5.2", "198.18.5.3", "198.18.9.9")
    ]
    counts = usage(v, held)
    assert counts["ipv4"] == {"total": 4, "assigned": 4, "available": 0}
    assert counts["ipv6"]["total"] == INT64_MAX  # 2^64 - the anycast address, saturated
    status = pool_status(v, counts, now=NOW)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Valid"]["status"] == "True" and conds["Valid"]["observedGeneration"] == 3
    assert conds["Exhausted"]["status"] == "False"  # IPv6 still has addresses
    assert pool_status(v, {"ipv4": counts["ipv4"]}, now=NOW)["conditions"][1]["status"] == "True"


def test_status_transition_time_moves_only_with_the_status() -> None:
    o = obj("d", "198.18.5.0/30")
    (v,) = resolve_pools([o], in_force={}, forbidden=CLUSTER).verdicts.values()
    first = pool_status(v, usage(v, []), now=NOW)
    again = resolve_pools(
        [PoolObject(**{**_fields(o), "status": first})], in_force={}, forbidden=CLUSTER
    )
    (v2,) = again.verdicts.values()
    second = pool_status(v2, usage(v2, []), now=LATER)
    assert second == first  # nothing changed: nothing to write
    broken = PoolObject(**{**_fields(o), "spec": {"addresses": ["198.18.5.1/30"]}, "status": first})
    (v3,) = resolve_pools([broken], in_force={}, forbidden=CLUSTER).verdicts.values()
    third = {c["type"]: c for c in pool_status(v3, usage(v3, []), now=LATER)["conditions"]}
    assert third["Valid"]["lastTransitionTime"] == LATER
    assert third["Valid"]["reason"] == "InvalidSpec"
    assert "none of its addresses are handed out" in third["Valid"]["message"]
    assert third["Exhausted"]["status"] == "Unknown"
    assert "ipv4" not in pool_status(v3, usage(v3, []), now=LATER)


def _fields(o: PoolObject) -> dict[str, Any]:
    return {f: getattr(o, f) for f in o.__slots__}


def test_status_lists_the_blocks_in_force_even_while_an_edit_is_refused() -> None:
    good = obj("d", "198.18.5.0/30", "198.18.6.1-198.18.6.2")
    before = in_force(good)
    bad = obj("d", "198.18.7.1/30")
    (v,) = resolve_pools([bad], in_force=before, forbidden=CLUSTER).verdicts.values()
    status = pool_status(v, usage(v, []), now=NOW)
    assert status["addressesInForce"] == ["198.18.5.0/30", "198.18.6.1/32", "198.18.6.2/32"]
