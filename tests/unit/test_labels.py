"""The one label selector type (agent/model/labels.py): parsing, refusals and matching, as
pools and the announcer's node selector both read it."""

from __future__ import annotations

from typing import Any

import pytest

from agent.announce.settings import AnnounceConfigError, parse_announce
from agent.model.config_values import ConfigError
from agent.model.labels import LabelSelector, Requirement, SelectorOperator, parse_label_selector
from agent.model.pools import Forbidden, PoolError, parse_pools


def test_both_halves_are_read_and_must_hold() -> None:
    sel = parse_label_selector(
        {
            "matchLabels": {"team": "a"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["edge", "dmz"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        },
        "s",
    )
    assert sel == LabelSelector(
        match_labels=frozenset({("team", "a")}),
        match_expressions=frozenset(
            {
                Requirement("tier", SelectorOperator.IN, frozenset({"edge", "dmz"})),
                Requirement("legacy", SelectorOperator.DOES_NOT_EXIST),
            }
        ),
    )
    assert sel.matches({"team": "a", "tier": "dmz"})
    assert not sel.matches({"team": "a", "tier": "core"})
    assert not sel.matches({"team": "a", "tier": "edge", "legacy": ""})
    assert not sel.matches({"tier": "edge"})
    assert parse_label_selector({}, "s").matches({})  # empty selects everything


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param([], "s: expected a mapping", id="a list for the selector"),
        pytest.param({"matchLabel": {}}, "unknown s keys: matchLabel", id="a misspelt key"),
        pytest.param({"matchLabels": {"a": 1}}, "s.matchLabels", id="a number as a label value"),
        pytest.param({"matchExpressions": {}}, "s.matchExpressions: expected a list", id="a map"),
        pytest.param(
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            "s.matchExpressions[0].operator: 'Gt' is not one of",
            id="an operator of node affinity, not of label selectors",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "a", "operator": "In"}]},
            "s.matchExpressions[0].values: In needs at least one value",
            id="In with no values (the API server refuses it too)",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "s.matchExpressions[0].values: Exists takes no values",
            id="Exists with values",
        ),
        pytest.param(
            {"matchExpressions": [{"operator": "Exists"}]},
            "s.matchExpressions[0].key",
            id="no key",
        ),
    ],
)
def test_a_bad_selector_is_refused_naming_the_key(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_label_selector(raw, "s")
    assert message in str(err.value)


def test_pools_and_the_node_selector_read_the_same_selector() -> None:
    raw = {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["core"]}]}
    pools = parse_pools(
        [{"name": "p", "addresses": ["198.18.50.0/28"], "serviceSelector": raw}],
        forbidden=Forbidden(),
    )
    assert pools is not None
    announce = parse_announce({"nodeSelector": raw})
    assert pools.pools[0].service_selector == announce.ownership.selector
    bad = {"matchExpressions": [{"key": "tier", "operator": "In"}]}
    with pytest.raises(PoolError, match=r"pools\[0\] \(p\)\.serviceSelector"):
        parse_pools(
            [{"name": "p", "addresses": ["198.18.50.0/28"], "serviceSelector": bad}],
            forbidden=Forbidden(),
        )
    with pytest.raises(AnnounceConfigError, match=r"announce\.nodeSelector"):
        parse_announce({"nodeSelector": bad})
