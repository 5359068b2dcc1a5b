"""Merging a Service's EndpointSlices into per-port endpoint lists, and parsing raw slices.

The merge follows kube-proxy's EndpointSliceCache: FQDN slices ignored, families apart, target
ports resolved in each endpoint's own slice, duplicates collapsed (non-terminating first), with
a deterministic tie-break by slice name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import orjson
import pytest

from agent.model.desired_state import Endpoint
from agent.model.endpoint_slice import AddressType, Slice, SliceEndpoint, SlicePort, parse_slice
from agent.model.net import IPFamily, Protocol
from agent.node.endpoints import PortKey, ServicePortEndpoints, merge_slices

V4 = IPFamily.IPV4
V6 = IPFamily.IPV6
TCP = Protocol.TCP
UDP = Protocol.UDP


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def sep(
    address: str, *, ready: bool = True, terminating: bool = False, node: str | None = None
) -> SliceEndpoint:
    return SliceEndpoint(
        ip=ip(address), node_name=node, ready=ready, serving=True, terminating=terminating
    )


def slc(
    name: str,
    ports: tuple[SlicePort, ...],
    endpoints: tuple[SliceEndpoint, ...],
    address_type: AddressType = AddressType.IPV4,
) -> Slice:
    return Slice("ns", name, "svc", address_type, ports, endpoints)


HTTP_8080 = SlicePort("http", TCP, 8080)
HTTP_9090 = SlicePort("http", TCP, 9090)
UNNAMED_80 = SlicePort("", TCP, 80)

# What a merged entry is compared on: address, port, ready, terminating, slice it came from.
Row = tuple[str, int, bool, bool, str]


@dataclass(frozen=True)
class MergeCase:
    slices: tuple[Slice, ...]
    want: dict[PortKey, tuple[Row, ...]]


def _rows(merged: ServicePortEndpoints) -> dict[PortKey, tuple[Row, ...]]:
    return {
        key: tuple((str(e.ip), e.port, e.ready, e.terminating, e.slice_name) for e in eps)
        for key, eps in merged.items()
    }


MERGE_CASES = [
    pytest.param(
        MergeCase(
            slices=(slc("a", (UNNAMED_80,), (sep("10.0.0.2"), sep("10.0.0.1"))),),
            want={
                PortKey(V4, "", TCP): (
                    ("10.0.0.1", 80, True, False, "a"),
                    ("10.0.0.2", 80, True, False, "a"),
                )
            },
        ),
        id="one slice with an unnamed port gives one sorted list under the empty port name",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("a", (HTTP_8080,), (sep("10.0.0.1"),)),
                slc("b", (HTTP_9090,), (sep("10.0.0.2"),)),
            ),
            want={
                PortKey(V4, "http", TCP): (
                    ("10.0.0.1", 8080, True, False, "a"),
                    ("10.0.0.2", 9090, True, False, "b"),
                )
            },
        ),
        id="a named port resolves to the number in each endpoint's own slice",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("b", (HTTP_8080,), (sep("10.0.0.1", ready=False),)),
                slc("a", (HTTP_8080,), (sep("10.0.0.1"),)),
            ),
            want={PortKey(V4, "http", TCP): (("10.0.0.1", 8080, True, False, "a"),)},
        ),
        id="a duplicate address across slices collapses to one entry, the ready copy winning",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("a", (HTTP_8080,), (sep("10.0.0.1", ready=False, terminating=True),)),
                slc("b", (HTTP_8080,), (sep("10.0.0.1", ready=False),)),
            ),
            want={PortKey(V4, "http", TCP): (("10.0.0.1", 8080, False, False, "b"),)},
        ),
        id="a non-terminating copy beats a terminating one even from a later slice",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("b", (HTTP_8080,), (sep("10.0.0.1", node="n2"),)),
                slc("a", (HTTP_8080,), (sep("10.0.0.1", node="n1"),)),
            ),
            want={PortKey(V4, "http", TCP): (("10.0.0.1", 8080, True, False, "a"),)},
        ),
        id="between equal duplicates the slice whose name sorts first wins whatever the order",
    ),
    pytest.param(
        MergeCase(
            slices=(slc("a", (HTTP_8080,), (sep("10.0.0.1"), sep("10.0.0.1", ready=False))),),
            want={PortKey(V4, "http", TCP): (("10.0.0.1", 8080, True, False, "a"),)},
        ),
        id="a duplicate inside one slice collapses too",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("a", (HTTP_8080,), (sep("10.0.0.1"),)),
                slc("b", (HTTP_9090,), (sep("10.0.0.1"),)),
            ),
            want={
                PortKey(V4, "http", TCP): (
                    ("10.0.0.1", 8080, True, False, "a"),
                    ("10.0.0.1", 9090, True, False, "b"),
                )
            },
        ),
        id="the same address with different target ports stays two endpoints like kube-proxy",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("a", (HTTP_8080,), (sep("10.0.0.1"),)),
                slc("f", (HTTP_8080,), (), AddressType.FQDN),
            ),
            want={PortKey(V4, "http", TCP): (("10.0.0.1", 8080, True, False, "a"),)},
        ),
        id="FQDN slices are ignored",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc("v6", (HTTP_8080,), (sep("2001:db8::1"),), AddressType.IPV6),
                slc("v4", (HTTP_8080,), (sep("198.18.0.1"),)),
            ),
            want={
                PortKey(V4, "http", TCP): (("198.18.0.1", 8080, True, False, "v4"),),
                PortKey(V6, "http", TCP): (("2001:db8::1", 8080, True, False, "v6"),),
            },
        ),
        id="IPv4 and IPv6 slices give separate lists per family",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc(
                    "a",
                    (SlicePort("dns", TCP, 53), SlicePort("dns", UDP, 5353)),
                    (sep("10.0.0.1"),),
                ),
            ),
            want={
                PortKey(V4, "dns", TCP): (("10.0.0.1", 53, True, False, "a"),),
                PortKey(V4, "dns", UDP): (("10.0.0.1", 5353, True, False, "a"),),
            },
        ),
        id="one port name with two protocols gives two lists",
    ),
    pytest.param(
        MergeCase(
            slices=(slc("a", (HTTP_8080,), ()), slc("b", (), (sep("10.0.0.1"),))),
            want={},
        ),
        id="a port without endpoints and endpoints without ports give no list at all",
    ),
    pytest.param(
        MergeCase(
            slices=(
                slc(
                    "a",
                    (HTTP_8080, SlicePort("metrics", TCP, 9100)),
                    (sep("10.0.0.10"), sep("10.0.0.9")),
                ),
            ),
            want={
                PortKey(V4, "http", TCP): (
                    ("10.0.0.9", 8080, True, False, "a"),
                    ("10.0.0.10", 8080, True, False, "a"),
                ),
                PortKey(V4, "metrics", TCP): (
                    ("10.0.0.9", 9100, True, False, "a"),
                    ("10.0.0.10", 9100, True, False, "a"),
                ),
            },
        ),
        id="every port of a slice gets every endpoint, sorted numerically by address",
    ),
]


@pytest.mark.parametrize("case", MERGE_CASES)
def test_merge_slices(case: MergeCase) -> None:
    got = _rows(merge_slices(case.slices))
    problems = [
        f"{key}: got {got.get(key)}, want {case.want.get(key)}"
        for key in sorted(set(got) | set(case.want))
        if got.get(key) != case.want.get(key)
    ]
    assert not problems, "\n".join(problems)


def test_merge_is_independent_of_slice_order() -> None:
    slices = [
        slc("a", (HTTP_8080,), (sep("10.0.0.1", node="n1"), sep("10.0.0.3"))),
        slc("b", (HTTP_9090,), (sep("10.0.0.1", node="n2"), sep("10.0.0.2", ready=False))),
        slc("c", (HTTP_8080,), (sep("10.0.0.1", terminating=True), sep("10.0.0.2"))),
    ]
    assert merge_slices(slices) == merge_slices(reversed(slices))


def test_service_endpoint_carries_hints_and_target() -> None:
    endpoint = SliceEndpoint(
        ip=ip("10.0.0.1"),
        node_name="n1",
        zone="z1",
        hints_for_nodes=frozenset({"n1"}),
        hints_for_zones=frozenset(),
    )
    (merged,) = merge_slices([slc("a", (HTTP_8080,), (endpoint,))])[PortKey(V4, "http", TCP)]
    assert merged.endpoint is endpoint, "the slice's record is carried, not copied"
    assert merged.target == Endpoint(ip("10.0.0.1"), 8080)
    assert (merged.node_name, merged.zone) == ("n1", "z1")
    assert merged.hints_for_nodes == frozenset({"n1"})
    assert merged.hints_for_zones == frozenset()


# --- parse_slice --------------------------------------------------------------------------


def raw_slice(**overrides: object) -> dict[str, object]:
    obj: dict[str, object] = {
        "metadata": {
            "name": "svc-abcde",
            "namespace": "ns",
            "labels": {"kubernetes.io/service-name": "svc"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["10.0.0.1"],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": "node-a",
                "zone": "zone-a",
                "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]},
            }
        ],
    }
    obj.update(overrides)
    return obj


def test_parse_slice_reads_every_field() -> None:
    got = parse_slice(raw_slice())
    assert got == Slice(
        namespace="ns",
        name="svc-abcde",
        service_name="svc",
        address_type=AddressType.IPV4,
        ports=(SlicePort("http", TCP, 8080),),
        endpoints=(
            SliceEndpoint(
                ip=ip("10.0.0.1"),
                node_name="node-a",
                zone="zone-a",
                ready=True,
                serving=True,
                terminating=False,
                hints_for_nodes=frozenset({"node-a"}),
                hints_for_zones=frozenset({"zone-a"}),
            ),
        ),
    )


@dataclass(frozen=True)
class EndpointCase:
    raw: dict[str, object]
    want: SliceEndpoint | None  # None: the endpoint is skipped


ENDPOINT_CASES = [
    pytest.param(
        EndpointCase({"addresses": ["10.0.0.1"]}, SliceEndpoint(ip=ip("10.0.0.1"))),
        id="absent conditions mean ready and serving and not terminating",
    ),
    pytest.param(
        EndpointCase(
            {"addresses": ["10.0.0.1"], "conditions": {"ready": False, "terminating": True}},
            SliceEndpoint(ip=ip("10.0.0.1"), ready=False, serving=True, terminating=True),
        ),
        id="absent serving means serving like kube-proxy",
    ),
    pytest.param(
        EndpointCase(
            {"addresses": ["10.0.0.1"], "hints": {"forZones": []}},
            SliceEndpoint(ip=ip("10.0.0.1"), hints_for_zones=frozenset()),
        ),
        id="an empty forZones list is kept as an empty set and absent forNodes as None",
    ),
    pytest.param(
        EndpointCase({"addresses": []}, None),
        id="an endpoint with no address is skipped",
    ),
    pytest.param(
        EndpointCase({"addresses": ["10.0.0.1", "10.0.0.2"]}, SliceEndpoint(ip=ip("10.0.0.1"))),
        id="only the first address of an endpoint is used",
    ),
    pytest.param(
        EndpointCase({"addresses": ["010.000.000.001"]}, SliceEndpoint(ip=ip("10.0.0.1"))),
        id="IPv4 octets with leading zeros are read as decimal like Go's ParseIPSloppy",
    ),
]


@pytest.mark.parametrize("case", ENDPOINT_CASES)
def test_parse_endpoint(case: EndpointCase) -> None:
    got = parse_slice(raw_slice(endpoints=[case.raw])).endpoints
    assert got == (() if case.want is None else (case.want,))


@dataclass(frozen=True)
class PortCase:
    raw: dict[str, object]
    want: SlicePort | None  # None: the port is skipped


PORT_CASES = [
    pytest.param(
        PortCase({"name": "", "port": 80}, SlicePort("", TCP, 80)),
        id="an unnamed port has the empty name and absent protocol means TCP",
    ),
    pytest.param(
        PortCase({"name": "dns", "port": 53, "protocol": "UDP"}, SlicePort("dns", UDP, 53)),
        id="the protocol is read",
    ),
    pytest.param(
        PortCase({"name": "s", "port": 9, "protocol": "SCTP"}, SlicePort("s", Protocol.SCTP, 9)),
        id="SCTP is accepted",
    ),
    pytest.param(PortCase({"port": 80}, None), id="a port with no name field is skipped"),
    pytest.param(PortCase({"name": "http"}, None), id="a port with no number is skipped"),
    pytest.param(PortCase({"name": "http", "port": 0}, None), id="port 0 is skipped"),
]


@pytest.mark.parametrize("case", PORT_CASES)
def test_parse_port(case: PortCase) -> None:
    got = parse_slice(raw_slice(ports=[case.raw])).ports
    assert got == (() if case.want is None else (case.want,))


def test_parse_fqdn_slice_keeps_no_endpoints() -> None:
    got = parse_slice(raw_slice(addressType="FQDN", endpoints=[{"addresses": ["example.com"]}]))
    assert (got.address_type, got.endpoints) == (AddressType.FQDN, ())


def test_parse_ipv6_slice() -> None:
    got = parse_slice(raw_slice(addressType="IPv6", endpoints=[{"addresses": ["2001:db8::1"]}]))
    assert got.endpoints == (SliceEndpoint(ip=ip("2001:db8::1")),)


def test_parse_null_lists_are_empty() -> None:
    got = parse_slice(raw_slice(ports=None, endpoints=None))
    assert (got.ports, got.endpoints) == ((), ())


@dataclass(frozen=True)
class BadCase:
    obj: dict[str, object]
    message: str  # a fragment the ValueError must contain


BAD_CASES = [
    pytest.param(BadCase({"addressType": "IPv4"}, "metadata"), id="no metadata"),
    pytest.param(
        BadCase(raw_slice(metadata={"namespace": "ns"}), "metadata.name"),
        id="no metadata.name",
    ),
    pytest.param(
        BadCase(raw_slice(metadata={"name": "x", "namespace": "ns"}), "service-name"),
        id="no kubernetes.io/service-name label",
    ),
    pytest.param(
        BadCase(raw_slice(addressType="IPv5"), "addressType"), id="an unknown addressType"
    ),
    pytest.param(
        BadCase(raw_slice(ports=[{"name": "x", "port": 1, "protocol": "ICMP"}]), "protocol"),
        id="an unknown protocol",
    ),
    pytest.param(
        BadCase(raw_slice(ports=[{"name": "x", "port": "80"}]), "integer"),
        id="a port number given as a string",
    ),
    pytest.param(
        BadCase(raw_slice(ports=[{"name": "x", "port": 70000}]), "out of range"),
        id="a port number above 65535",
    ),
    pytest.param(
        BadCase(raw_slice(endpoints=[{"addresses": ["2001:db8::1"]}]), "not IPv4"),
        id="an IPv6 address in an IPv4 slice",
    ),
    pytest.param(
        BadCase(raw_slice(endpoints=[{"addresses": ["10.0.0.300"]}]), "invalid address"),
        id="an address that does not parse",
    ),
    pytest.param(
        BadCase(
            raw_slice(endpoints=[{"addresses": ["10.0.0.1"], "conditions": {"ready": 1}}]),
            "conditions.ready",
        ),
        id="a condition that is not a boolean",
    ),
    pytest.param(
        BadCase(
            raw_slice(endpoints=[{"addresses": ["10.0.0.1"], "hints": {"forZones": ["zone-a"]}}]),
            "hints.forZones[0]",
        ),
        id="a zone hint that is not an object",
    ),
    pytest.param(
        BadCase(raw_slice(endpoints={"addresses": ["10.0.0.1"]}), "endpoints must be a list"),
        id="endpoints given as an object",
    ),
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_parse_slice_rejects_malformed_input(case: BadCase) -> None:
    with pytest.raises(ValueError, match="EndpointSlice") as info:
        parse_slice(case.obj)
    assert case.message in str(info.value)


def test_parse_slice_shares_one_string_per_node_zone_and_namespace() -> None:
    # orjson makes a new string object for every value, as the reflector's parse does.
    a, b = (parse_slice(orjson.loads(orjson.dumps(raw_slice()))) for _ in range(2))
    ea, eb = a.endpoints[0], b.endpoints[0]
    assert ea.node_name is eb.node_name and ea.zone is eb.zone
    assert a.namespace is b.namespace
    assert ea.hints_for_nodes is not None and eb.hints_for_nodes is not None
    assert next(iter(ea.hints_for_nodes)) is next(iter(eb.hints_for_nodes))
