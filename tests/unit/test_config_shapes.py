"""Config documents of the wrong shape: every key type-checked, only ConfigError escapes.

The loader here is what the controller runs on each reload (agent/controller/loop.py): the
file's bytes through `parse_document`, then `parse_controller_config`, which parses the
agents' settings too. A valid document with every key set is the base; each of its values
replaced by one of another type must be refused with an error naming the key path and the
expected type, and random YAML of any shape must never raise anything but ConfigError.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import ConfigError, parse_config
from agent.config_file import parse_document
from agent.controller.config import ClusterAddresses, ControllerConfig, parse_controller_config

BASE: dict[str, Any] = {
    "nodeName": "node-1",
    "loadBalancerClass": "nodelb.io/lb",
    "handleClasslessServices": False,
    "externalIPCIDRs": ["198.18.200.0/24"],
    "localCIDRs": ["198.18.64.0/24"],
    "serviceCIDRs": ["198.18.96.0/24"],
    "pools": [
        {
            "name": "main",
            "addresses": ["198.19.0.0/24", "2001:db8:10::/120"],
            "autoAssign": True,
            "avoidBuggyIPs": True,
            "namespaces": ["prod"],
            "namespaceSelector": {"matchLabels": {"team": "a"}},
            "serviceSelector": {"matchLabels": {"expose": "public"}},
        }
    ],
    "serveAllIPs": False,
    "sync": {"minInterval": 0.1, "fullResyncPeriod": 600, "driftCheckPeriod": 60},
    "metricsAddress": "0.0.0.0:9472",
    "healthCheckNodePorts": True,
    "localTraffic": "spread",
    "announce": {
        "enabled": True,
        "interface": "eth1",
        "advertIntervalCs": 50,
        "preempt": False,
        "preemptDelayCs": 10,
        "checksumMode": "rfc5798",
        "ipv4VRIDs": "1-100",
        "ipv6VRIDs": "101-200",
        "nodeSelector": {
            "matchLabels": {"lb": "yes"},
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
        },
        "gratuitous": {"count": 3, "spacingMs": 100, "refreshSeconds": 30},
        "reportNamespace": "nodelb-system",
        "reportLeaseSeconds": 20,
        "speakerCPU": 1,
        "realtimePriority": 10,
    },
}

Path = tuple[str | int, ...]


def load(document: Any) -> ControllerConfig:
    """Return what the controller makes of `document`, written to a file and read back."""
    data = yaml.safe_dump(document, sort_keys=False).encode()
    return parse_controller_config(parse_document(data, "config.yaml"), cluster=ClusterAddresses())


def leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Yield every (path, value) of a document, containers included (the root excepted)."""
    if path:
        yield path, value
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, i))


def replaced(path: Path, new: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    parent: Any = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new
    return doc


def spelled(path: Path) -> str:
    """Return the key path as errors spell it: pools[0] (main).addresses[1]."""
    out = ""
    for i, step in enumerate(path):
        if isinstance(step, int):
            out += f"[{step}]"
            if path[:1] == ("pools",) and i == 1 and path[2:] not in ((), ("name",)):
                out += f" ({BASE['pools'][step]['name']})"
        else:
            out += f".{step}" if out else step
    return out


def wrong_type(value: Any) -> Any:
    """Return a value of another type than `value`, as a careless operator writes one."""
    if isinstance(value, bool):
        return str(value).lower()  # the quoted boolean: "false" must not read as true
    if isinstance(value, int | float):
        return str(value)  # a number in quotes
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {"x": value}
    return ["x"]  # a list where a mapping belongs


@dataclass(frozen=True)
class Expected:
    path: Path
    value: Any


CASES = [
    pytest.param(Expected(path, wrong_type(value)), id=f"{spelled(path)} as {wrong_type(value)!r}")
    for path, value in leaves(BASE)
]


def test_the_base_document_is_valid() -> None:
    cfg = load(BASE)
    assert [p.name for p in cfg.pools.pools] == ["main"]


@pytest.mark.parametrize("case", CASES)
def test_a_value_of_the_wrong_type_is_refused_naming_its_key(case: Expected) -> None:
    with pytest.raises(ConfigError) as info:
        load(replaced(case.path, case.value))
    message = str(info.value)
    assert spelled(case.path) in message, message
    assert "expected" in message or "not a" in message, message


@pytest.mark.parametrize(
    ("document", "needles"),
    [
        pytest.param(
            {"pools": [{"name": "p", "addresses": 5}]},
            ("pools[0] (p).addresses", "expected a list", "an integer 5"),
            id="pools[0].addresses: 5 (crashed every controller replica)",
        ),
        pytest.param(
            {"pools": [{"name": "p", "addresses": ["198.19.0.0/24"], 7: "x"}]},
            ("pools[0]", "keys must be strings", "an integer 7"),
            id="a non-string key inside a pool",
        ),
        pytest.param(
            {"pools": [], 1: 2}, ("the configuration", "keys must be strings"), id="a top-level key"
        ),
        pytest.param(
            {"pools": [], "handleClasslessServices": "false"},
            ("handleClasslessServices", "expected true or false", "a string 'false'"),
            id="a quoted boolean is refused, not read as true",
        ),
        pytest.param(
            {"pools": [], "sync": {"minInterval": 10**400}},
            ("sync.minInterval", "expected a number"),
            id="a huge integer does not overflow a float",
        ),
        pytest.param(
            {"pools": [], "sync": {"fullResyncPeriod": float("nan")}},
            ("sync.fullResyncPeriod",),
            id="NaN is not a number of seconds",
        ),
        pytest.param(
            {"pools": [], "announce": {"gratuitous": {"count": "5"}}},
            ("announce.gratuitous.count", "expected an integer", "a string '5'"),
            id="a number in quotes",
        ),
        pytest.param(
            {"pools": [], "announce": {"speakerCPU": True}},
            ("announce.speakerCPU", "expected an integer"),
            id="a boolean is not an integer",
        ),
        pytest.param(
            {"pools": [], "announce": []}, ("announce", "expected a mapping"), id="a list section"
        ),
        pytest.param(
            {"pools": [], "metricsAddress": "0.0.0.0:99999"},
            ("metricsAddress",),
            id="a port out of range",
        ),
    ],
)
def test_the_reported_cases_are_refused_with_the_key_and_type(
    document: Any, needles: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as info:
        load(document)
    missing = [n for n in needles if n not in str(info.value)]
    assert not missing, f"{info.value!s} lacks {missing}"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"", id="an empty file"),
        pytest.param(b"# pools: []\n", id="only comments"),
        pytest.param(b"null\n", id="null"),
        pytest.param(b"- pools\n", id="a list"),
        pytest.param(b"pools: [\n", id="not YAML"),
        pytest.param(b"a: 2026-13-45\n", id="a date that is no date"),
        pytest.param(b"a: 1" + b"0" * 5000 + b"\n", id="an integer too long to read"),
        pytest.param(b"\xff\xfe\x00garbage", id="not text"),
        pytest.param(b"[" * 5000, id="nested too deep"),
    ],
)
def test_a_file_that_is_not_a_configuration_is_a_config_error(text: bytes) -> None:
    with pytest.raises(ConfigError):
        parse_document(text, "config.yaml")


def test_an_empty_mapping_is_every_default_but_the_controller_needs_pools() -> None:
    assert parse_config(parse_document(b"{}\n", "c")).handle_classless is True
    assert load({"pools": []}).pools.pools == ()


# -- property tests --------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**64, max_value=10**400),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["false", "5", "198.19.0.0/24", "1-255", "In", "rfc5798", "0.0.0.0:1"]),
    st.dates(min_value=datetime.date(2000, 1, 1), max_value=datetime.date(2100, 1, 1)),
)
KEYS = st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none(), st.floats())
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)
PATHS = [path for path, _ in leaves(BASE)]


def only_config_errors(document: Any) -> None:
    with contextlib.suppress(ConfigError):
        load(document)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(path=st.sampled_from(PATHS), junk=JUNK)
def test_any_value_anywhere_raises_nothing_but_config_error(path: Path, junk: Any) -> None:
    only_config_errors(replaced(path, junk))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(document=JUNK)
def test_any_document_raises_nothing_but_config_error(document: Any) -> None:
    only_config_errors(document)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    extra=st.dictionaries(st.text(min_size=1, max_size=8), JUNK, min_size=1, max_size=3),
    section=st.sampled_from(["", "sync", "announce", "announce.gratuitous", "pools.0"]),
)
def test_unknown_keys_of_any_value_are_refused(extra: dict[str, Any], section: str) -> None:
    doc = copy.deepcopy(BASE)
    target: Any = doc
    for step in filter(None, section.split(".")):
        target = target[int(step)] if step.isdigit() else target[step]
    fresh = {k: v for k, v in extra.items() if k not in target}
    target.update(fresh)
    if not fresh:
        return
    with pytest.raises(ConfigError, match="unknown"):
        load(doc)


@st.composite
def valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    """Return a valid document with drawn values (what the round trip must give back)."""
    blocks = draw(st.lists(st.integers(0, 255), min_size=1, max_size=4, unique=True))
    pools = [
        {
            "name": f"pool-{b}",
            "addresses": [f"198.19.{b}.0/24", f"2001:db8:{b:x}::/120"],
            "autoAssign": draw(st.booleans()),
            "avoidBuggyIPs": draw(st.booleans()),
            "namespaces": draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True)),
        }
        for b in blocks
    ]
    return {
        "handleClasslessServices": draw(st.booleans()),
        "serveAllIPs": draw(st.booleans()),
        "externalIPCIDRs": [f"198.18.{n}.0/24" for n in draw(st.sets(st.integers(0, 255)))],
        "sync": {
            "minInterval": draw(st.floats(0, 10)),
            "driftCheckPeriod": draw(st.integers(0, 3600)),
        },
        "announce": {
            "enabled": draw(st.booleans()),
            "advertIntervalCs": draw(st.integers(1, 4095)),
            "gratuitous": {"count": draw(st.integers(1, 1000))},
        },
        "pools": pools,
    }


@settings(max_examples=100, deadline=None)
@given(document=valid_documents())
def test_valid_documents_round_trip(document: dict[str, Any]) -> None:
    cfg = load(document)
    agent = cfg.agent
    assert agent.handle_classless is document["handleClasslessServices"]
    assert agent.serve_all_ips is document["serveAllIPs"]
    assert [str(n) for n in agent.external_ip_cidrs] == document["externalIPCIDRs"]
    assert agent.sync.min_interval == document["sync"]["minInterval"]
    assert agent.sync.drift_check_period == document["sync"]["driftCheckPeriod"]
    announce = document["announce"]
    assert agent.announce.enabled is announce["enabled"]
    assert agent.announce.advert_interval_cs == announce["advertIntervalCs"]
    assert agent.announce.gratuitous.count == announce["gratuitous"]["count"]
    got = [
        (p.name, [str(n) for n in p.networks], p.auto_assign, p.avoid_buggy_ips, list(p.namespaces))
        for p in cfg.pools.pools
    ]
    want = [
        (
            p["name"],
            [str(ipaddress.ip_network(a)) for a in p["addresses"]],
            p["autoAssign"],
            p["avoidBuggyIPs"],
            p["namespaces"],
        )
        for p in document["pools"]
    ]
    assert got == want
    assert [(p.name, p.networks) for p in agent.pools] == [
        (p["name"], tuple(ipaddress.ip_network(a) for a in p["addresses"]))
        for p in document["pools"]
    ]


@pytest.mark.parametrize(
    "document",
    [pytest.param({"sync": {}}, id="pools unset"), pytest.param({"pools": None}, id="pools null")],
)
def test_without_pools_the_controller_reads_pool_objects(document: Any) -> None:
    """No `pools:` key: the pools are LoadBalancerIPPool objects (none until they are read),
    not a refusal; `pools: []` stays "allocate nothing" from the file."""
    cfg = load(document)
    assert cfg.pool_objects and cfg.pools.pools == ()
    assert not load({"pools": []}).pool_objects
