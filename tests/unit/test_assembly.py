"""FrontendIndex: results put and removed one at a time give what joining them all at once gives."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.model.desired_state import DesiredState, Endpoint, Frontend, FrontendKey
from agent.model.net import IPAddress, Protocol
from agent.node.assembly import FrontendIndex, assemble
from agent.node.service_frontends import Problem, ProblemReason, ServiceResult

IPS = [ipaddress.ip_address(a) for a in ("198.18.0.1", "198.18.0.2", "2001:db8::1")]
EP = (Endpoint(ipaddress.ip_address("198.19.0.5"), 80),)


def reference(
    results: list[ServiceResult], held: frozenset[IPAddress] | None
) -> tuple[DesiredState, dict[str, tuple[Problem, ...]]]:
    """The join written the plain way: oldest Service first, first claim keeps a key."""
    frontends: dict[FrontendKey, Frontend] = {}
    conflicts: dict[str, list[Problem]] = {}
    for r in sorted(results, key=lambda r: (r.created, r.uid, r.key)):
        for fe in {fe.key: fe for fe in r.frontends}.values():
            owner = frontends.get(fe.key)
            if owner is not None:
                conflicts.setdefault(r.key, []).append(
                    Problem(
                        ProblemReason.FRONTEND_CONFLICT,
                        f"{fe.key.ip} {fe.key.protocol.value.upper()}/{fe.key.port} is already "
                        f"served for {owner.service}",
                    )
                )
                continue
            frontends[fe.key] = fe
    programmed = {k.ip for k in frontends}
    wanted = {ip for r in results for ip in r.lb_ips} if held is None else held
    return (
        DesiredState(frontends=frontends, held_ips=frozenset(wanted & programmed)),
        {k: tuple(v) for k, v in conflicts.items()},
    )


@st.composite
def results(draw: st.DrawFn, name: str) -> ServiceResult:
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from(IPS), st.sampled_from(list(Protocol)), st.integers(1, 3)),
            max_size=4,
        )
    )
    gen = draw(st.integers(0, 9))  # tells two results of one Service apart
    frontends = tuple(
        Frontend(
            service=name,
            key=FrontendKey(ip, proto, port),
            endpoints=EP[: gen % 2],
            cluster_endpoints=EP,
        )
        for ip, proto, port in keys
    )
    return ServiceResult(
        key=name,
        created=draw(st.sampled_from(["2026-01-01", "2026-02-01"])),
        uid=name.upper(),
        frontends=frontends,
        lb_ips=tuple(draw(st.lists(st.sampled_from(IPS), max_size=3))),
    )


steps = st.lists(
    st.sampled_from(["ns/a", "ns/b", "ns/c", "ns/d"]).flatmap(
        lambda n: st.one_of(st.just(n), results(n))  # a name alone: remove that Service
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, held=st.one_of(st.none(), st.frozensets(st.sampled_from(IPS))))
def test_incremental_join_equals_the_plain_join(
    steps: list[str | ServiceResult], held: frozenset[IPAddress] | None
) -> None:
    index = FrontendIndex()
    current: dict[str, ServiceResult] = {}
    for step in steps:
        if isinstance(step, str):
            index.remove(step)
            current.pop(step, None)
        else:
            index.put(step)
            current[step.key] = step
        got = index.snapshot(held_ips=held, local_cidrs=())
        want, conflicts = reference(list(current.values()), held)
        assert got.desired.frontends == want.frontends
        assert got.desired.held_ips == want.held_ips
        assert got.programmed_ips == frozenset(k.ip for k in want.frontends)
        assert got.conflicts == conflicts
        assert dict(index.results) == current


def test_a_snapshot_is_not_changed_by_later_puts() -> None:
    index = FrontendIndex()
    fe = Frontend("ns/a", FrontendKey(IPS[0], Protocol.TCP, 80), EP, EP)
    index.put(ServiceResult("ns/a", "2026-01-01", "A", (fe,), (IPS[0],)))
    before = index.snapshot(held_ips=None, local_cidrs=())
    index.remove("ns/a")
    after = index.snapshot(held_ips=None, local_cidrs=())
    assert before.desired.frontends == {fe.key: fe}
    assert before.desired.held_ips == frozenset({IPS[0]})
    assert after.desired.frontends == {}
    assert after.desired.held_ips == frozenset()


def test_the_younger_service_gets_the_key_when_the_older_goes() -> None:
    key = FrontendKey(IPS[1], Protocol.UDP, 53)
    old = ServiceResult("ns/old", "2026-01-01", "O", (Frontend("ns/old", key, EP, EP),))
    new = ServiceResult("ns/new", "2026-02-01", "N", (Frontend("ns/new", key, (), EP),))
    joined = assemble([new, old], held_ips=frozenset(), local_cidrs=())
    assert joined.desired.frontends[key].service == "ns/old"
    assert [p.message for p in joined.conflicts["ns/new"]] == [
        "198.18.0.2 UDP/53 is already served for ns/old"
    ]
    index = FrontendIndex()
    index.put(new)
    index.put(old)
    index.remove("ns/old")
    left = index.snapshot(held_ips=frozenset(), local_cidrs=())
    assert left.desired.frontends[key].service == "ns/new"
    assert left.conflicts == {}
