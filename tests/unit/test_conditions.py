"""KEP-4631 conditions: true statements from the allocation and the nodes' reports."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from agent.controller.allocator import (
    AllocationReason,
    AllocationResult,
    FamilyOutcome,
)
from agent.controller.conditions import (
    Condition,
    ConditionReason,
    ConditionType,
    Feature,
    merge_conditions,
    service_conditions,
)
from agent.controller.request import FamilyPolicy, ProtocolPort, ServiceRequest
from agent.model.net import IPAddress, IPFamily, Protocol

R = AllocationReason
V4 = ipaddress.ip_address("198.18.0.1")
V6 = ipaddress.ip_address("2001:db8::1")


def req(**kw: Any) -> ServiceRequest:
    kw.setdefault("ports", frozenset({ProtocolPort(Protocol.TCP, 80)}))
    return ServiceRequest(key="ns/web", uid="u", created="2026-01-01T00:00:00Z", **kw)


def ok(*addresses: IPAddress, missing: tuple[IPFamily, ...] = ()) -> AllocationResult:
    families = tuple(
        FamilyOutcome(IPFamily.of(a), R.ALLOCATED, a, "default", "ok") for a in addresses
    ) + tuple(FamilyOutcome(f, R.NO_POOL_FOR_FAMILY, None, None, "none") for f in missing)
    return AllocationResult("ns/web", R.ALLOCATED, addresses, "allocated", families=families)


def failed(reason: AllocationReason, message: str = "it failed") -> AllocationResult:
    return AllocationResult("ns/web", reason, (), message)


Triple = tuple[
    tuple[bool, ConditionReason], tuple[bool, ConditionReason], tuple[bool, ConditionReason]
]


@dataclass(frozen=True)
class Case:
    request: ServiceRequest
    allocation: AllocationResult | None
    serving: frozenset[IPAddress]
    expected: Triple  # (Serving, Provisioning, Degraded) as (status, reason)
    message_contains: str = ""
    unsupported_protocols: frozenset[Protocol] = frozenset()
    unsupported_features: frozenset[Feature] = frozenset()


SERVING = (True, ConditionReason.SERVING)
COMPLETE = (False, ConditionReason.COMPLETE)
NOT_DEGRADED = (False, ConditionReason.NOT_DEGRADED)
WAITING = (
    (False, ConditionReason.PROVISIONING),
    (True, ConditionReason.PROVISIONING),
    NOT_DEGRADED,
)
DUAL_PREFER = {
    "ip_families": (IPFamily.IPV4, IPFamily.IPV6),
    "family_policy": FamilyPolicy.PREFER_DUAL_STACK,
}

CASES = [
    pytest.param(
        Case(req(), None, frozenset(), WAITING, "waiting for an address"),
        id="a Service the allocator has not seen yet is provisioning",
    ),
    pytest.param(
        Case(req(), ok(V4), frozenset(), WAITING, "198.18.0.1"),
        id="an allocated address no node holds yet is provisioning, not serving",
    ),
    pytest.param(
        Case(req(), ok(V4), frozenset({V4}), (SERVING, COMPLETE, NOT_DEGRADED)),
        id="an address held by a node with rules in place is serving",
    ),
    pytest.param(
        Case(
            req(ip_families=(IPFamily.IPV4, IPFamily.IPV6)),
            ok(V4, V6),
            frozenset({V4}),
            WAITING,
            "2001:db8::1",
        ),
        id="a dual-stack Service is serving only once both addresses are held",
    ),
    pytest.param(
        Case(
            req(**DUAL_PREFER),
            ok(V4, missing=(IPFamily.IPV6,)),
            frozenset({V4}),
            (SERVING, COMPLETE, (True, ConditionReason.IP_FAMILIES_NOT_SUPPORTED)),
            "IPv6",
        ),
        id="PreferDualStack served on one family is degraded for IPFamilies",
    ),
    pytest.param(
        Case(
            req(**DUAL_PREFER, required_features=("IPFamilies",)),
            ok(V4, missing=(IPFamily.IPV6,)),
            frozenset({V4}),
            ((False, ConditionReason.UNSUPPORTED), COMPLETE, NOT_DEGRADED),
            "required feature IPFamilies",
        ),
        id="a required IPFamilies that cannot be met is refused instead of degraded",
    ),
    pytest.param(
        Case(
            req(),
            failed(R.NO_POOL_FOR_FAMILY, "no IPv6 pool"),
            frozenset(),
            ((False, ConditionReason.UNSUPPORTED), COMPLETE, NOT_DEGRADED),
            "no IPv6 pool",
        ),
        id="a family with no pool is unsupported",
    ),
    pytest.param(
        Case(
            req(requested_ips=(V4,)),
            failed(R.REQUESTED_IP_NOT_IN_POOL),
            frozenset(),
            ((False, ConditionReason.UNSUPPORTED), COMPLETE, NOT_DEGRADED),
        ),
        id="a requested address outside every pool is unsupported, never swapped for another",
    ),
    pytest.param(
        Case(
            req(),
            failed(R.INVALID_ANNOTATION),
            frozenset(),
            ((False, ConditionReason.UNSUPPORTED), COMPLETE, NOT_DEGRADED),
        ),
        id="an invalid annotation is unsupported",
    ),
    pytest.param(
        Case(
            req(),
            failed(R.POOL_EXHAUSTED, "pool default is full"),
            frozenset(),
            ((False, ConditionReason.INFRASTRUCTURE), COMPLETE, NOT_DEGRADED),
            "pool default is full",
        ),
        id="an exhausted pool is an infrastructure problem",
    ),
    pytest.param(
        Case(
            req(),
            failed(R.REQUESTED_IP_IN_USE),
            frozenset(),
            ((False, ConditionReason.INFRASTRUCTURE), COMPLETE, NOT_DEGRADED),
        ),
        id="a requested address in use is an infrastructure problem",
    ),
    pytest.param(
        Case(
            req(ports=frozenset({ProtocolPort(Protocol.SCTP, 9), ProtocolPort(Protocol.TCP, 80)})),
            ok(V4),
            frozenset({V4}),
            (SERVING, COMPLETE, (True, ConditionReason.PORTS_NOT_SUPPORTED)),
            "SCTP/9",
            unsupported_protocols=frozenset({Protocol.SCTP}),
        ),
        id="a port whose protocol the nodes cannot serve degrades the Service",
    ),
    pytest.param(
        Case(
            req(
                ports=frozenset({ProtocolPort(Protocol.SCTP, 9)}),
                required_features=("Ports",),
            ),
            ok(V4),
            frozenset({V4}),
            ((False, ConditionReason.UNSUPPORTED), COMPLETE, NOT_DEGRADED),
            "SCTP/9",
            unsupported_protocols=frozenset({Protocol.SCTP}),
        ),
        id="a required Ports feature that cannot be met is refused",
    ),
    pytest.param(
        Case(
            req(session_affinity=True, local_policy=True),
            ok(V4),
            frozenset({V4}),
            (SERVING, COMPLETE, (True, ConditionReason.MULTIPLE)),
            "SessionAffinity",
            unsupported_features=frozenset(
                {Feature.SESSION_AFFINITY, Feature.EXTERNAL_TRAFFIC_POLICY}
            ),
        ),
        id="two unmet features degrade the Service with reason Multiple",
    ),
    pytest.param(
        Case(
            req(session_affinity=True, local_policy=True),
            ok(V4),
            frozenset({V4}),
            (SERVING, COMPLETE, NOT_DEGRADED),
        ),
        id="session affinity and Local traffic policy are implemented and do not degrade",
    ),
    pytest.param(
        Case(
            req(required_features=("Teleport",)),
            ok(V4),
            frozenset({V4}),
            ((False, ConditionReason.UNSUPPORTED), COMPLETE, NOT_DEGRADED),
            "Teleport",
        ),
        id="an unknown required feature is refused",
    ),
    pytest.param(
        Case(
            req(required_features=("SessionAffinity", "IPFamilies")),
            ok(V4),
            frozenset({V4}),
            (SERVING, COMPLETE, NOT_DEGRADED),
        ),
        id="required features that are met change nothing",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_service_conditions(case: Case) -> None:
    conds = service_conditions(
        request=case.request,
        allocation=case.allocation,
        serving_ips=case.serving,
        unsupported_protocols=case.unsupported_protocols,
        unsupported_features=case.unsupported_features,
    )
    assert [c.type for c in conds] == list(ConditionType)
    got = tuple((c.status, c.reason) for c in conds)
    assert got == case.expected, [c.message for c in conds]
    assert any(case.message_contains in c.message for c in conds), [c.message for c in conds]
    assert all(c.message for c in conds)


def test_serving_is_never_true_without_a_node_holding_every_address() -> None:
    for held in (frozenset(), frozenset({V6}), frozenset({V4})):
        conds = service_conditions(
            request=req(ip_families=(IPFamily.IPV4, IPFamily.IPV6)),
            allocation=ok(V4, V6),
            serving_ips=held,
        )
        assert conds[0].status is False, held


def test_services_that_are_not_ours_get_no_conditions() -> None:
    assert (
        service_conditions(request=req(ours=False), allocation=None, serving_ips=frozenset()) == []
    )
    assert (
        service_conditions(request=req(), allocation=failed(R.NOT_OURS), serving_ips=frozenset())
        == []
    )


T0 = datetime.datetime(2026, 12, 1, 1, 0, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)
SERVING_TRUE = Condition(
    ConditionType.SERVING, True, ConditionReason.SERVING, "serving on 198.18.0.1"
)
SERVING_FALSE = Condition(ConditionType.SERVING, False, ConditionReason.PROVISIONING, "waiting")
PROV_DONE = Condition(ConditionType.PROVISIONING, False, ConditionReason.COMPLETE, "done")
FOREIGN = {"type": "example.com/Other", "status": "True", "lastTransitionTime": "x"}


def test_merge_keeps_transition_time_when_status_is_unchanged_and_sets_generation() -> None:
    first = merge_conditions([FOREIGN], [SERVING_FALSE, PROV_DONE], now=T0, generation=3)
    assert first == [
        FOREIGN,
        {
            "type": "LoadBalancerServing",
            "status": "False",
            "reason": "Provisioning",
            "message": "waiting",
            "lastTransitionTime": "2026-12-01T01:00:00Z",
            "observedGeneration": 3,
        },
        {
            "type": "LoadBalancerProvisioning",
            "status": "False",
            "reason": "Complete",
            "message": "done",
            "lastTransitionTime": "2026-12-01T01:00:00Z",
            "observedGeneration": 3,
        },
    ]
    reworded = Condition(ConditionType.PROVISIONING, False, ConditionReason.COMPLETE, "still done")
    second = merge_conditions(first, [SERVING_TRUE, reworded], now=T1, generation=4)
    by_type = {c["type"]: c for c in second}
    assert by_type["LoadBalancerServing"]["lastTransitionTime"] == "2026-12-01T01:05:00Z"
    assert by_type["LoadBalancerServing"]["status"] == "True"
    assert by_type["LoadBalancerProvisioning"]["lastTransitionTime"] == "2026-12-01T01:00:00Z"
    assert by_type["LoadBalancerProvisioning"]["message"] == "still done"
    assert {c.get("observedGeneration") for c in second[1:]} == {4}
    assert second[0] == FOREIGN


def test_merge_removes_our_conditions_missing_from_new_and_keeps_foreign_ones() -> None:
    existing = merge_conditions([FOREIGN], [SERVING_TRUE, PROV_DONE], now=T0, generation=1)
    assert merge_conditions(existing, [], now=T1, generation=2) == [FOREIGN]
