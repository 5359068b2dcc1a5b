"""The agent loop hands the spread state to the spread plane after the inet table."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.kube.store import EventType
from agent.model.tunnel import BUCKETS, LocalTraffic, SpreadState
from agent.node.cache import new_stores
from agent.node.cluster_state import Changes
from agent.node.status_document import StatusFormatError, parse_status
from agent.status_command import render_table
from tests.unit.test_node_loop import feed_services, make_agent, metric, svc
from tests.unit.test_spread_wiring import slice_raw

ip = ipaddress.ip_address


@dataclass
class FakeSpread:
    fail: bool = False
    states: list[SpreadState | None] = field(default_factory=list)

    def sync(self, state: SpreadState | None) -> bool:
        self.states.append(state)
        if self.fail:
            raise OSError("no such device eth9")
        return True


def node(name: str, addr: str) -> Any:
    raw = {
        "metadata": {"name": name},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": addr}],
        },
    }
    return new_stores()[2].apply(EventType.ADDED, raw)


def two_node_slice() -> Any:
    raw = slice_raw(("198.19.1.10", "node-1", True), ("198.19.2.10", "node-2", True))
    return new_stores()[1].apply(EventType.ADDED, raw)


def local_service() -> dict[str, Any]:
    raw = svc("local", ip="198.18.0.201")
    raw["spec"]["externalTrafficPolicy"] = "Local"
    return raw


def run(mode: LocalTraffic, spread: FakeSpread) -> Any:
    agent, dp, _, clock = make_agent(config={"local_traffic": mode}, spread=spread)
    feed_services(agent, local_service())
    agent.apply(
        Changes(
            slices=[two_node_slice()],
            nodes=[node("node-1", "198.18.0.11"), node("node-2", "198.18.0.12")],
        )
    )
    agent.step()
    return agent, dp, clock


def test_in_spread_mode_the_plane_gets_node_2_s_buckets_after_the_table_is_synced() -> None:
    spread = FakeSpread()
    _, dp, _ = run(LocalTraffic.SPREAD, spread)
    assert len(dp.syncs) == 1
    (state,) = spread.states
    assert state is not None
    assert state.node == ip("198.18.0.11")
    assert state.peers == {ip("198.18.0.12")}
    ((key, hops),) = state.buckets.items()
    assert key.ip == ip("198.18.0.201")
    assert {h for _, h in hops} == {ip("198.18.0.12")}
    assert state.device == "eth0"


def test_in_holder_mode_the_plane_is_told_nothing_spreads() -> None:
    spread = FakeSpread()
    run(LocalTraffic.HOLDER, spread)
    assert spread.states == [None]


def test_a_failing_spread_sync_is_counted_and_retried_and_the_agent_says_why() -> None:
    before = metric("nodelb_spread_sync_failures_total")
    spread = FakeSpread(fail=True)
    agent, _, clock = run(LocalTraffic.SPREAD, spread)
    assert metric("nodelb_spread_sync_failures_total") == before + 1
    assert not agent.status.last_sync_ok
    assert "eth9" in agent.status.last_error
    spread.fail = False
    clock.now += 5
    agent.step()
    assert len(spread.states) == 2 and spread.states[-1] is not None
    assert agent.status.last_sync_ok


def test_the_status_document_and_table_show_the_spread_buckets_per_serving_node() -> None:
    agent, _, _ = run(LocalTraffic.SPREAD, FakeSpread())
    document = agent.status_document()
    (fe,) = document["frontends"]
    others = fe["spread"]
    assert set(others) == {"198.18.0.12"}
    status = parse_status(document)
    assert status.frontends[0].spread == ((ip("198.18.0.12"), others["198.18.0.12"]),)
    table = render_table(status)
    mine = BUCKETS - others["198.18.0.12"]
    assert f"Spread (buckets of {BUCKETS} per serving node)" in table
    assert f"198.18.0.12 {others['198.18.0.12']}" in table
    assert f" {mine} " in table.splitlines()[-1]


def test_a_holder_mode_document_has_no_spread_key_and_no_spread_section() -> None:
    agent, _, _ = run(LocalTraffic.HOLDER, FakeSpread())
    document = agent.status_document()
    assert "spread" not in document["frontends"][0]
    assert "Spread" not in render_table(parse_status(document))


@pytest.mark.parametrize(
    ("spread", "message"),
    [
        pytest.param({"198.18.0.12": 0}, "spread.198.18.0.12", id="a node with no bucket"),
        pytest.param({"198.18.0.12": BUCKETS + 1}, "spread", id="more buckets than the table"),
        pytest.param({"node-2": 3}, "spread.node-2", id="a name where an address belongs"),
        pytest.param(["198.18.0.12"], "spread", id="a list where a mapping belongs"),
    ],
)
def test_a_malformed_spread_entry_is_refused_naming_its_path(spread: Any, message: str) -> None:
    agent, _, _ = run(LocalTraffic.SPREAD, FakeSpread())
    document = agent.status_document()
    document["frontends"][0]["spread"] = spread
    with pytest.raises(StatusFormatError, match=message):
        parse_status(document)
