"""The cleanup finalizer's pure parts: whose it is, the patches, and what a view reads of it.

agent/controller/finalizer.py decides whether nodelb may remove
``service.kubernetes.io/load-balancer-cleanup`` from a Service (the name is shared with the
cloud-provider's service controller), and builds the metadata patches; parse_view reads
deletionTimestamp, finalizers and the spec's verdict from the raw object without ever
raising. What reconcile does with them is in test_controller_reconcile.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from agent.controller.finalizer import (
    FINALIZER,
    FinalizerChange,
    Owner,
    finalizer_patch,
    owner,
    spec_owner,
)
from agent.controller.service_status import parse_view, plan_cleared
from tests.unit.test_controller_reconcile import ip, raw_service

OURS = "nodelb.io/lb"


@dataclass(frozen=True, slots=True)
class SpecCase:
    spec: Any
    handle_classless: bool
    expect: Owner


SPEC_CASES = [
    pytest.param(
        SpecCase({"type": "LoadBalancer", "loadBalancerClass": OURS}, False, Owner.OUR_CLASS),
        id="a LoadBalancer of nodelb's class is nodelb's, class-less handling aside",
    ),
    pytest.param(
        SpecCase({"type": "LoadBalancer"}, True, Owner.OUR_CLASS),
        id="a class-less LoadBalancer is nodelb's when it handles class-less Services",
    ),
    pytest.param(
        SpecCase({"type": "LoadBalancer"}, False, Owner.NOT_OURS),
        id="a class-less LoadBalancer is not nodelb's when it leaves them to the cloud provider",
    ),
    pytest.param(
        SpecCase(
            {"type": "LoadBalancer", "loadBalancerClass": "example.com/x"}, True, Owner.NOT_OURS
        ),
        id="another class is never nodelb's",
    ),
    pytest.param(
        SpecCase({"type": "ClusterIP"}, True, Owner.TYPE_CHANGED),
        id="no longer a LoadBalancer (its class dropped) is nodelb's when class-less ones are",
    ),
    pytest.param(
        SpecCase({"type": "NodePort"}, False, Owner.NOT_OURS),
        id="no longer a LoadBalancer, class-less ones not handled: not nodelb's",
    ),
    pytest.param(
        SpecCase(["not", "a", "mapping"], True, Owner.TYPE_CHANGED),
        id="a spec that is not a mapping reads as an empty one (ClusterIP, no class)",
    ),
    pytest.param(
        SpecCase({"type": "LoadBalancer", "loadBalancerClass": 7}, True, Owner.NOT_OURS),
        id="a class that is not a string is nobody's nodelb knows",
    ),
]


@pytest.mark.parametrize("case", SPEC_CASES)
def test_spec_owner(case: SpecCase) -> None:
    got = spec_owner(case.spec, lb_class=OURS, handle_classless=case.handle_classless)
    assert got is case.expect


@dataclass(frozen=True, slots=True)
class OwnerCase:
    spec: Owner
    our_conditions: bool
    released: bool
    expect: Owner


OWNER_CASES = [
    pytest.param(
        OwnerCase(Owner.OUR_CLASS, False, False, Owner.OUR_CLASS),
        id="its spec says nodelb handles it: nodelb's",
    ),
    pytest.param(
        OwnerCase(Owner.TYPE_CHANGED, False, False, Owner.TYPE_CHANGED),
        id="type changed away while nodelb handles class-less Services: nodelb's",
    ),
    pytest.param(
        OwnerCase(Owner.NOT_OURS, True, False, Owner.OUR_CONDITIONS),
        id="another spec, but its status carries nodelb's conditions: nodelb handled it",
    ),
    pytest.param(
        OwnerCase(Owner.NOT_OURS, False, True, Owner.RELEASED),
        id="another spec, but nodelb just released its addresses: nodelb handled it",
    ),
    pytest.param(
        OwnerCase(Owner.NOT_OURS, False, False, Owner.NOT_OURS),
        id="another class's Service with the finalizer and no trace of nodelb: left alone",
    ),
    pytest.param(
        OwnerCase(Owner.OUR_CLASS, True, True, Owner.OUR_CLASS),
        id="every reason at once: the spec's is given",
    ),
]


@pytest.mark.parametrize("case", OWNER_CASES)
def test_owner(case: OwnerCase) -> None:
    got = owner(spec=case.spec, our_conditions=case.our_conditions, released=case.released)
    assert got is case.expect
    assert got.ours is (case.expect is not Owner.NOT_OURS)


@dataclass(frozen=True, slots=True)
class PatchCase:
    finalizers: tuple[str, ...]
    change: FinalizerChange
    expect: list[str]


PATCH_CASES = [
    pytest.param(
        PatchCase(("example.com/keep",), FinalizerChange.ADD, ["example.com/keep", FINALIZER]),
        id="adding keeps every other finalizer and appends ours",
    ),
    pytest.param(
        PatchCase((FINALIZER,), FinalizerChange.ADD, [FINALIZER]),
        id="adding one that is there already leaves the list as it is",
    ),
    pytest.param(
        PatchCase(("a.io/x", FINALIZER, "b.io/y"), FinalizerChange.REMOVE, ["a.io/x", "b.io/y"]),
        id="removing takes ours out and keeps the others in order",
    ),
    pytest.param(
        PatchCase((FINALIZER,), FinalizerChange.REMOVE, []),
        id="removing the only one leaves an empty list (the apiserver may then delete it)",
    ),
]


@pytest.mark.parametrize("case", PATCH_CASES)
def test_finalizer_patch(case: PatchCase) -> None:
    patch = finalizer_patch(case.finalizers, case.change, resource_version="42")
    assert patch == {"metadata": {"resourceVersion": "42", "finalizers": case.expect}}


def with_meta(**meta: Any) -> dict[str, Any]:
    """Return a raw LoadBalancer Service ns/web with `meta` merged into its metadata."""
    raw = raw_service("web")
    raw["metadata"].update(meta)
    return raw


@dataclass(frozen=True, slots=True)
class ViewCase:
    raw: dict[str, Any]
    deleting: bool
    finalizers: tuple[str, ...]
    generation: int = 0


VIEW_CASES = [
    pytest.param(ViewCase(with_meta(), False, ()), id="a fresh Service: not deleting, none"),
    pytest.param(
        ViewCase(
            with_meta(deletionTimestamp="2026-12-01T12:00:00Z", finalizers=[FINALIZER, "a.io/b"]),
            True,
            (FINALIZER, "a.io/b"),
        ),
        id="deletionTimestamp set: deleting; finalizers kept as stored, in order",
    ),
    pytest.param(
        ViewCase(with_meta(finalizers="service.kubernetes.io/load-balancer-cleanup"), False, ()),
        id="finalizers that are a string, not a list, read as none",
    ),
    pytest.param(
        ViewCase(with_meta(finalizers=[FINALIZER, 3, None, {"x": 1}]), False, (FINALIZER,)),
        id="entries that are not strings are skipped",
    ),
    pytest.param(
        ViewCase(with_meta(finalizers=None, deletionTimestamp=""), False, ()),
        id="null finalizers and an empty deletionTimestamp: none, not deleting",
    ),
    pytest.param(
        ViewCase(with_meta(generation="three"), False, (), 0),
        id="a generation that is not an integer reads as 0 instead of raising",
    ),
    pytest.param(
        ViewCase(with_meta(generation=4, finalizers={"a": "b"}), False, (), 4),
        id="finalizers that are a mapping read as none; an integer generation is kept",
    ),
]


@pytest.mark.parametrize("case", VIEW_CASES)
def test_parse_view_reads_deletion_and_finalizers(case: ViewCase) -> None:
    view = parse_view(case.raw, lb_class=OURS, handle_classless=True)
    assert (view.deleting, view.finalizers, view.generation) == (
        case.deleting,
        case.finalizers,
        case.generation,
    )
    assert view.has_cleanup_finalizer is (FINALIZER in case.finalizers)
    assert view.request is not None  # malformed metadata does not make the request unparseable


def test_an_unparseable_service_still_says_what_its_spec_claims() -> None:
    raw = with_meta(deletionTimestamp="2026-12-01T12:00:00Z", finalizers=[FINALIZER])
    raw["spec"]["ports"] = [{"port": "eighty"}]
    view = parse_view(raw, lb_class=OURS, handle_classless=True)
    assert view.request is None and view.problem
    assert (view.spec_owner, view.load_balancer, view.deleting) == (Owner.OUR_CLASS, True, True)


def test_our_conditions_are_recognised_and_malformed_ones_ignored() -> None:
    raw = raw_service("web")
    raw["status"] = {"conditions": ["junk", {"type": "Ready"}]}
    assert parse_view(raw, lb_class=OURS, handle_classless=True).has_our_conditions is False
    raw["status"]["conditions"].append({"type": "LoadBalancerServing", "status": "False"})
    assert parse_view(raw, lb_class=OURS, handle_classless=True).has_our_conditions is True


def test_plan_cleared_drops_our_conditions_and_all_or_only_the_released_ingress() -> None:
    raw = raw_service("web", ingress=("198.19.0.1", "203.0.113.5"))
    raw["status"]["conditions"] = [
        {"type": "LoadBalancerServing", "status": "True"},
        {"type": "example.com/Other", "status": "True"},
    ]
    view = parse_view(raw, lb_class=OURS, handle_classless=True)
    everything = plan_cleared(view, (), clear_all=True)
    released = plan_cleared(view, (ip("198.19.0.1"),), clear_all=False)
    assert everything is not None and released is not None
    assert everything.ingress == [] and [e["ip"] for e in released.ingress] == ["203.0.113.5"]
    others = [{"type": "example.com/Other", "status": "True"}]
    assert everything.conditions == released.conditions == others
    cleared = raw_service("web")
    cleared["status"] = {"conditions": others}
    clean = parse_view(cleared, lb_class=OURS, handle_classless=True)
    assert plan_cleared(clean, (), clear_all=True) is None  # nothing left to clear: no write
