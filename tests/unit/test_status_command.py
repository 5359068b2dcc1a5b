"""`nodelb status`: the document's parser, the table, the JSON form, and the command itself.

`main` runs against a small http.server on 127.0.0.1 in this process (loopback in the root
namespace: it programs nothing) and against a port where nothing listens.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import status_command
from agent.config import DEFAULT_METRICS_ADDRESS
from agent.model.net import IPAddress, IPFamily, Protocol
from agent.node.status_document import (
    FrontendStatus,
    LastSync,
    LastSyncResult,
    StatusDocument,
    StatusFormatError,
    SyncKind,
    VrrpInstanceStatus,
    VrrpState,
    parse_status,
    to_json,
)
from agent.serving_cert import client_context, server_context
from agent.status_command import (
    StatusFetchError,
    default_url,
    fetch,
    main,
    render_table,
    status_url,
)

# Lists deliberately out of order: the table sorts, the JSON keeps the agent's order.
DOC: dict[str, Any] = {
    "node": "node-1",
    "time": "2026-12-01T03:00:00Z",
    "lastSync": {
        "time": "2026-12-01T02:59:57.500Z",
        "result": "ok",
        "message": "",
        "durationSeconds": 0.012,
        "kind": "partial",
    },
    "vrrp": [
        {
            "vrid": 51,
            "family": "IPv6",
            "state": "Backup",
            "priority": 253,
            "addresses": ["2001:db8::20"],
            # IPv6 adverts come from the master's link-local address (RFC 5798 §5.1.2.1).
            "master": "fe80::1",
        },
        {
            "vrid": 7,
            "family": "IPv4",
            "state": "Master",
            "priority": 254,
            "addresses": ["198.19.0.11", "198.19.0.10"],
            "master": "198.18.0.11",
        },
        {
            "vrid": 12,
            "family": "IPv4",
            "state": "Initialize",
            "priority": 252,
            "addresses": ["198.19.0.30"],
            "master": None,
        },
    ],
    "heldIPs": ["198.19.0.11", "198.19.0.10"],
    "frontends": [
        {
            "ip": "198.19.0.10",
            "port": 443,
            "protocol": "TCP",
            "service": "default/web",
            "endpoints": 3,
            "localEndpoints": 1,
        },
        {
            "ip": "2001:db8::20",
            "port": 53,
            "protocol": "UDP",
            "service": "kube-system/dns-external",
            "endpoints": 12,
            "localEndpoints": 0,
        },
        {
            "ip": "198.19.0.10",
            "port": 80,
            "protocol": "UDP",
            "service": "default/web",
            "endpoints": 3,
            "localEndpoints": 1,
        },
        {
            "ip": "198.19.0.10",
            "port": 80,
            "protocol": "TCP",
            "service": "default/web",
            "endpoints": 3,
            "localEndpoints": 1,
        },
    ],
}

GOLDEN = """\
Node       node-1
Time       2026-12-01T03:00:00Z
Last sync  ok (partial) at 2026-12-01T02:59:57.500Z, 2.500s before this report, took 0.012s

VRRP instances
VRID  FAMILY  STATE       PRIORITY  MASTER       ADDRESSES
   7  IPv4    Master           254  198.18.0.11  198.19.0.10, 198.19.0.11
  12  IPv4    Initialize       252  -            198.19.0.30
  51  IPv6    Backup           253  fe80::1      2001:db8::20

Held IPs
198.19.0.10
198.19.0.11

Frontends
IP            PORT  PROTOCOL  SERVICE                   ENDPOINTS  LOCAL
198.19.0.10     80  TCP       default/web                       3      1
198.19.0.10     80  UDP       default/web                       3      1
198.19.0.10    443  TCP       default/web                       3      1
2001:db8::20    53  UDP       kube-system/dns-external         12      0"""

FRESH_AGENT: dict[str, Any] = {
    "node": "node-2",
    "time": "2026-12-01T03:00:00+00:00",
    "lastSync": {
        "time": None,
        "result": "never",
        "message": "",
        "durationSeconds": 0,
        "kind": None,
    },
    "vrrp": [],
    "heldIPs": [],
    "frontends": [],
}

FRESH_GOLDEN = """\
Node       node-2
Time       2026-12-01T03:00:00Z
Last sync  never

VRRP instances
(none)

Held IPs
(none)

Frontends
(none)"""


def test_the_fixture_renders_as_the_golden_table() -> None:
    assert render_table(parse_status(DOC)) == GOLDEN


def test_an_agent_that_never_synced_renders_empty_sections() -> None:
    status = parse_status(FRESH_AGENT)
    assert status.last_sync.result is LastSyncResult.NEVER
    assert render_table(status) == FRESH_GOLDEN


def test_a_failed_sync_shows_its_message_under_the_sync_line() -> None:
    doc = copy.deepcopy(FRESH_AGENT)
    doc["lastSync"] = {
        "time": "2026-12-01T02:59:00Z",
        "result": "error",
        "message": "nft: Could not process rule: No such file or directory",
        "durationSeconds": 12.5,
        "kind": "full",
    }
    lines = render_table(parse_status(doc)).splitlines()
    assert lines[2] == (
        "Last sync  error (full) at 2026-12-01T02:59:00Z, 60.0s before this report, took 12.5s"
    )
    assert lines[3] == "           nft: Could not process rule: No such file or directory"


def test_a_multi_line_sync_message_stays_indented_under_the_sync_line() -> None:
    doc = copy.deepcopy(DOC)
    doc["lastSync"]["result"] = "error"
    doc["lastSync"]["message"] = "first line\nsecond line"
    lines = render_table(parse_status(doc)).splitlines()
    assert lines[3:6] == ["           first line", "           second line", ""]


def test_parsing_keeps_types_and_order() -> None:
    status = parse_status(DOC)
    assert status.vrrp[0].vrid == 51
    assert status.vrrp[1].state is VrrpState.MASTER
    assert [str(ip) for ip in status.held_ips] == ["198.19.0.11", "198.19.0.10"]
    assert status.last_sync.duration_seconds == pytest.approx(0.012)


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(DOC, id="the full fixture survives to_json and back unchanged"),
        pytest.param(FRESH_AGENT, id="a never-synced agent survives to_json and back"),
    ],
)
def test_json_round_trips(doc: dict[str, Any]) -> None:
    status = parse_status(doc)
    out = json.loads(to_json(status))
    assert parse_status(out) == status
    if doc is DOC:
        assert out == DOC  # the fixture is written in the canonical form


V4S = st.integers(0, 2**17 - 1).map(lambda o: ipaddress.IPv4Address("198.18.0.0") + o)
V6S = st.integers(0, 2**96 - 1).map(lambda o: ipaddress.IPv6Address("2001:db8::") + o)
IPS: st.SearchStrategy[IPAddress] = st.one_of(V4S, V6S)
TIMES = st.builds(
    lambda t, minutes: t.replace(tzinfo=timezone(timedelta(minutes=minutes))),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
    st.sampled_from([0, 0, 60, -300, 330]),
)


@st.composite
def vrrp_instances(draw: st.DrawFn) -> VrrpInstanceStatus:
    family = draw(st.sampled_from(IPFamily))
    addrs = V4S if family is IPFamily.IPV4 else V6S
    return VrrpInstanceStatus(
        vrid=draw(st.integers(1, 255)),
        family=family,
        state=draw(st.sampled_from(VrrpState)),
        priority=draw(st.integers(0, 255)),
        addresses=tuple(draw(st.lists(addrs, min_size=1, max_size=4))),
        master=draw(st.none() | IPS),
    )


@st.composite
def last_syncs(draw: st.DrawFn) -> LastSync:
    result = draw(st.sampled_from(LastSyncResult))
    never = result is LastSyncResult.NEVER
    return LastSync(
        time=None if never else draw(TIMES),
        result=result,
        message=draw(st.text(max_size=40)),
        duration_seconds=draw(st.floats(0, 1e6, allow_nan=False, allow_infinity=False)),
        kind=None if never else draw(st.sampled_from(SyncKind)),
    )


# Node names and Service keys are Kubernetes names: no spaces or control characters.
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=20)
STATUSES = st.builds(
    StatusDocument,
    node=NAMES,
    time=TIMES,
    last_sync=last_syncs(),
    vrrp=st.lists(vrrp_instances(), max_size=4).map(tuple),
    held_ips=st.lists(IPS, max_size=4).map(tuple),
    frontends=st.lists(
        st.builds(
            FrontendStatus,
            ip=IPS,
            port=st.integers(1, 65535),
            protocol=st.sampled_from(Protocol),
            service=st.builds(lambda a, b: f"{a}/{b}", NAMES, NAMES),
            endpoints=st.integers(0, 10_000),
            local_endpoints=st.integers(0, 10_000),
        ),
        max_size=5,
    ).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(STATUSES)
def test_any_valid_status_survives_json_and_renders_every_row(status: StatusDocument) -> None:
    text = to_json(status)
    back = parse_status(json.loads(text))
    assert back == status
    assert to_json(back) == text  # the JSON form is canonical: a second trip is identical
    table = render_table(status)
    for ip in status.held_ips:
        assert f"\n{ip}\n" in f"\n{table}\n"
    frontend_rows = table.split("\nFrontends\n", 1)[1].split("\n")
    assert len(frontend_rows) == (len(status.frontends) + 1 if status.frontends else 1)


def test_times_with_offsets_keep_their_instant() -> None:
    doc = copy.deepcopy(FRESH_AGENT)
    doc["time"] = "2026-12-01T08:30:00+05:30"
    status = parse_status(doc)
    assert status.time == datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    assert json.loads(to_json(status))["time"] == "2026-12-01T08:30:00+05:30"


def test_unknown_keys_are_ignored_for_newer_agents() -> None:
    doc = copy.deepcopy(DOC)
    doc["uptimeSeconds"] = 12
    doc["vrrp"][0]["advertIntervalCentiseconds"] = 100
    assert parse_status(doc) == parse_status(DOC)


def mutated(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """Return a copy of DOC with the item at `path` set to `value` (or removed for DELETE)."""
    doc = copy.deepcopy(DOC)
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


DELETE = object()


@dataclass(frozen=True)
class Bad:
    doc: Any
    message: str


MALFORMED = [
    pytest.param(Bad([DOC], "document: expected an object"), id="a list instead of an object"),
    pytest.param(Bad(mutated(("node",), DELETE), "node: missing"), id="no node name"),
    pytest.param(
        Bad(mutated(("node",), ""), "node: expected a non-empty string"), id="an empty node name"
    ),
    pytest.param(
        Bad(mutated(("time",), "yesterday"), "time: 'yesterday' is not an RFC 3339 time"),
        id="a time that is not RFC 3339",
    ),
    pytest.param(
        Bad(mutated(("time",), "2026-12-01T03:00:00"), "time: '2026-12-01T03:00:00' has no UTC"),
        id="a time without an offset",
    ),
    pytest.param(
        Bad(mutated(("lastSync", "result"), "maybe"), "lastSync.result: 'maybe' is not one of"),
        id="an unknown sync result",
    ),
    pytest.param(
        Bad(mutated(("lastSync", "result"), "never"), "lastSync.time: must be null exactly"),
        id="a sync result of never with a time",
    ),
    pytest.param(
        Bad(mutated(("lastSync", "kind"), None), "lastSync.kind: must be null exactly"),
        id="a finished sync without a kind",
    ),
    pytest.param(
        Bad(mutated(("lastSync", "durationSeconds"), -1), "lastSync.durationSeconds: expected"),
        id="a negative sync duration",
    ),
    pytest.param(
        Bad(mutated(("lastSync", "durationSeconds"), "12ms"), "lastSync.durationSeconds"),
        id="a sync duration given as text",
    ),
    pytest.param(
        Bad(mutated(("vrrp",), {}), "vrrp: expected a list"), id="vrrp as an object, not a list"
    ),
    pytest.param(
        Bad(mutated(("vrrp", 1, "state"), "Leader"), "vrrp[1].state: 'Leader' is not one of"),
        id="an unknown VRRP state",
    ),
    pytest.param(
        Bad(mutated(("vrrp", 0, "vrid"), 0), "vrrp[0].vrid: 0 is not in 1..255"), id="VRID 0"
    ),
    pytest.param(
        Bad(mutated(("vrrp", 0, "vrid"), True), "vrrp[0].vrid: expected an integer"),
        id="a boolean where a VRID belongs",
    ),
    pytest.param(
        Bad(mutated(("vrrp", 2, "priority"), 256), "vrrp[2].priority: 256 is not in 0..255"),
        id="a priority above 255",
    ),
    pytest.param(
        Bad(mutated(("vrrp", 0, "family"), "IPv5"), "vrrp[0].family: 'IPv5' is not one of"),
        id="an unknown family",
    ),
    pytest.param(
        Bad(
            mutated(("vrrp", 1, "addresses"), ["198.19.0.10", "2001:db8::1"]),
            "vrrp[1].addresses[1]: 2001:db8::1 is not an IPv4 address",
        ),
        id="an IPv6 address in an IPv4 instance",
    ),
    pytest.param(
        Bad(mutated(("vrrp", 1, "addresses"), []), "vrrp[1].addresses: an instance carries"),
        id="an instance without addresses",
    ),
    pytest.param(
        Bad(mutated(("vrrp", 1, "master"), "node-2"), "vrrp[1].master: 'node-2' is not an IP"),
        id="a master given by name",
    ),
    pytest.param(
        Bad(mutated(("heldIPs", 1), "198.19.0.300"), "heldIPs[1]: '198.19.0.300' is not an IP"),
        id="a held IP that is not an address",
    ),
    pytest.param(
        Bad(mutated(("frontends", 2, "port"), 0), "frontends[2].port: 0 is not in 1..65535"),
        id="frontend port 0",
    ),
    pytest.param(
        Bad(
            mutated(("frontends", 0, "protocol"), "tcp"),
            "frontends[0].protocol: 'tcp' is not one of TCP, UDP, SCTP",
        ),
        id="a protocol spelled as nftables does instead of as the API does",
    ),
    pytest.param(
        Bad(mutated(("frontends", 1, "localEndpoints"), -1), "frontends[1].localEndpoints: -1"),
        id="a negative endpoint count",
    ),
    pytest.param(
        Bad(mutated(("frontends", 3, "service"), DELETE), "frontends[3].service: missing"),
        id="a frontend without its Service",
    ),
]


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_documents_are_refused_with_the_path(bad: Bad) -> None:
    with pytest.raises(StatusFormatError) as info:
        parse_status(bad.doc)
    assert bad.message in str(info.value)


@pytest.mark.parametrize(
    ("given", "wanted"),
    [
        pytest.param(
            "https://127.0.0.1:9472", "https://127.0.0.1:9472/status", id="a bare address"
        ),
        pytest.param("https://127.0.0.1:9472/", "https://127.0.0.1:9472/status", id="a root path"),
        pytest.param(
            "https://[2001:db8::5]:9472/debug/status",
            "https://[2001:db8::5]:9472/debug/status",
            id="an explicit path is kept",
        ),
    ],
)
def test_status_url(given: str, wanted: str) -> None:
    assert status_url(given) == wanted


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://127.0.0.1:9472", id="plain http, which the agent does not serve"),
        pytest.param("127.0.0.1:9472", id="an address without a scheme"),
        pytest.param("https://", id="a scheme without a host"),
    ],
)
def test_status_url_refuses_what_is_not_https(url: str) -> None:
    with pytest.raises(StatusFetchError, match="expected an https://host:port URL"):
        status_url(url)


def test_default_url_is_loopback_on_the_default_metrics_port(tmp_path: Path) -> None:
    port = DEFAULT_METRICS_ADDRESS.partition(",")[0].rpartition(":")[2]
    assert default_url(tmp_path / "absent.yaml") == f"https://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("address", "url"),
    [
        pytest.param("0.0.0.0:9000,[::]:9000", "https://127.0.0.1:9000", id="wildcards: loopback"),
        pytest.param("[::]:9001", "https://[::1]:9001", id="the IPv6 wildcard: ::1"),
        pytest.param("198.18.0.7:9002", "https://198.18.0.7:9002", id="a specific address"),
        pytest.param("[2001:db8::7]:9003", "https://[2001:db8::7]:9003", id="a specific IPv6"),
    ],
)
def test_default_url_comes_from_the_agents_config_file(
    tmp_path: Path, address: str, url: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"loadBalancerClass: nodelb.io/lb\nmetricsAddress: '{address}'\n")
    assert default_url(config) == url


def test_a_bad_address_in_the_config_is_named(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("metricsAddress: nowhere\n")
    with pytest.raises(StatusFetchError, match="metricsAddress: listen address 'nowhere'"):
        default_url(config)


# --- the command against a real HTTP server on loopback -----------------------------------


@dataclass
class Answer:
    code: int
    body: bytes


TOKEN = "reader-token"


class Agent:
    """A stand-in for the agent's HTTPS server: answers GET /status with `answer` to the
    bearer TOKEN (401 otherwise), with a self-signed certificate published to `cert`."""

    def __init__(self, cert: Path) -> None:
        self.answer = Answer(200, json.dumps(DOC).encode())
        self.paths: list[str] = []
        self.cert = cert
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                agent.paths.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(Answer(401, b"Unauthorized\n"))
                elif self.path != "/status":
                    self._send(Answer(404, b"not found\n"))
                else:
                    self._send(agent.answer)

            def _send(self, answer: Answer) -> None:
                self.send_response(answer.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = server_context(cert_file=None, key_file=None, publish_to=cert)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"

    def args(self, *more: str) -> list[str]:
        """Return `nodelb status` arguments that reach, trust and authenticate to it."""
        return ["--url", self.url, "--agent-cert", str(self.cert), "--token", TOKEN, *more]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    fake = Agent(tmp_path / "metrics.crt")
    thread = threading.Thread(target=fake.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        thread.join(timeout=5)


def test_main_prints_the_table(agent: Agent, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(agent.args()) == 0
    out, err = capsys.readouterr()
    assert out == GOLDEN + "\n"
    assert err == ""
    assert agent.paths == ["/status"]


def test_main_json_parses_back_identically(
    agent: Agent, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(agent.args("--json")) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out) == DOC
    assert parse_status(json.loads(out)) == parse_status(DOC)


def test_fetch_returns_the_decoded_document(agent: Agent) -> None:
    pinned = client_context(ca_file=agent.cert, pinned=True)
    assert fetch(agent.url + "/", timeout=5, token=TOKEN, context=pinned) == DOC


def test_the_token_can_come_from_a_file(agent: Agent, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    args = ["--url", agent.url, "--agent-cert", str(agent.cert), "--token-file", str(token_file)]
    assert main(args) == 0


def test_without_a_token_the_refusal_says_what_to_pass(
    agent: Agent, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status_command, "IN_CLUSTER_TOKEN", Path("/nonexistent/token"))
    assert main(["--url", agent.url, "--agent-cert", str(agent.cert)]) == 1
    err = capsys.readouterr().err
    assert "the agent answered HTTP 401" in err and "--token" in err
    assert "nodelb-metrics-reader" in err


def test_an_agent_whose_certificate_is_not_trusted_is_refused(
    agent: Agent, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other = tmp_path / "other.crt"
    server_context(cert_file=None, key_file=None, publish_to=other)
    assert main(["--url", agent.url, "--agent-cert", str(other), "--token", TOKEN]) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    assert agent.paths == []  # the token never left
    insecure = ["--url", agent.url, "--token", TOKEN, "--insecure-skip-tls-verify"]
    assert main([*insecure, "--agent-cert", str(other)]) == 0  # the explicit opt-out


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param(Answer(500, b"boom"), "the agent answered HTTP 500", id="a server error"),
        pytest.param(Answer(200, b"<html>"), "the answer is not JSON", id="HTML instead of JSON"),
        pytest.param(
            Answer(200, json.dumps(mutated(("vrrp", 0, "vrid"), 300)).encode()),
            "malformed status document: vrrp[0].vrid: 300 is not in 1..255",
            id="JSON that breaks the schema",
        ),
    ],
)
def test_main_reports_bad_answers_with_the_url(
    agent: Agent, capsys: pytest.CaptureFixture[str], answer: Answer, message: str
) -> None:
    agent.answer = answer
    assert main(agent.args()) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"nodelb status: {agent.url}/status: ")
    assert message in err


def test_main_reports_a_missing_status_path(
    agent: Agent, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*agent.args(), "--url", agent.url + "/nothing-here"]) == 1
    assert "the agent answered HTTP 404" in capsys.readouterr().err


def test_main_reports_an_unreachable_agent(capsys: pytest.CaptureFixture[str]) -> None:
    # A bound socket that never listens: connections are refused, and holding it keeps the
    # port from being reused by anything else for the test's duration.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"https://127.0.0.1:{sock.getsockname()[1]}"
        assert main(["--url", url, "--timeout", "5"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"nodelb status: {url}/status: cannot reach the agent")
