"""The bearer-token gate of /metrics and /status: the pure decision, the cache, the gate's
review calls, and the real HTTPS server answering 401 / 403 / 200 with a fake reviewer.

The same server against a real apiserver's TokenReview and SubjectAccessReview is
tests/e2e/test_agent_e2e.py's and test_deploy.py's.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.http_server import HealthServer, parse_addresses
from agent.kube.access import (
    ALLOW_TTL,
    DENY_TTL,
    AccessResult,
    Decision,
    Identity,
    ReviewCache,
    TokenResult,
    Verdict,
    bearer_token,
    decide,
    identity_from_review,
    needs_token,
)
from agent.kube.reviews import AccessGate, ReviewError
from agent.serving_cert import client_context, server_context

READER = Identity("system:serviceaccount:monitoring:prometheus", "u1", ("system:authenticated",))
STRANGER = Identity("system:serviceaccount:default:default", "u2")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        pytest.param("Bearer abc.def", "abc.def", id="a bearer token"),
        pytest.param("bearer abc", "abc", id="the scheme is case-insensitive"),
        pytest.param("  Bearer   abc  ", "abc", id="surrounding blanks are dropped"),
        pytest.param(None, None, id="no header"),
        pytest.param("", None, id="an empty header"),
        pytest.param("Bearer", None, id="the scheme without a token"),
        pytest.param("Bearer ", None, id="the scheme and a blank"),
        pytest.param("Basic YWRtaW46YWRtaW4=", None, id="another scheme"),
        pytest.param("Bearer a b", None, id="two words are not one token"),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        pytest.param("/healthz", False, id="liveness is open to probes"),
        pytest.param("/readyz", False, id="readiness is open to probes"),
        pytest.param("/metrics", True, id="metrics need a token"),
        pytest.param("/status", True, id="status needs a token"),
        pytest.param("/nothing", True, id="an unknown path needs a token too (no probing)"),
        pytest.param("/healthz/", True, id="only the exact probe paths are open"),
    ],
)
def test_which_paths_need_a_token(path: str, protected: bool) -> None:
    assert needs_token(path) is protected


@pytest.mark.parametrize(
    ("token", "access", "verdict"),
    [
        pytest.param(None, None, Verdict.NO_TOKEN, id="no token: 401"),
        pytest.param(TokenResult(None, "bad"), None, Verdict.UNAUTHENTICATED, id="bad: 401"),
        pytest.param(
            TokenResult(STRANGER), AccessResult(False), Verdict.FORBIDDEN, id="not allowed: 403"
        ),
        pytest.param(TokenResult(STRANGER), None, Verdict.FORBIDDEN, id="no access answer: 403"),
        pytest.param(TokenResult(READER), AccessResult(True), Verdict.ALLOWED, id="allowed"),
    ],
)
def test_decide(token: TokenResult | None, access: AccessResult | None, verdict: Verdict) -> None:
    decision = decide(token, access)
    assert decision.verdict is verdict
    assert (
        decision.verdict.status
        == {
            Verdict.NO_TOKEN: 401,
            Verdict.UNAUTHENTICATED: 401,
            Verdict.FORBIDDEN: 403,
            Verdict.ALLOWED: 200,
        }[verdict]
    )


def test_a_token_review_status_becomes_an_identity() -> None:
    status = {
        "authenticated": True,
        "user": {
            "username": "system:serviceaccount:nodelb-system:nodelb-agent",
            "uid": "7",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/node-name": ["node-1"]},
        },
    }
    result = identity_from_review(status)
    assert result.identity == Identity(
        "system:serviceaccount:nodelb-system:nodelb-agent",
        "7",
        ("system:serviceaccounts", "system:authenticated"),
        (("authentication.kubernetes.io/node-name", ("node-1",)),),
    )
    assert result.identity.extra_dict() == {"authentication.kubernetes.io/node-name": ["node-1"]}
    for refused in ({"authenticated": False, "error": "expired"}, {}, {"authenticated": "yes"}):
        assert identity_from_review(refused).identity is None


def test_the_cache_keeps_grants_longer_than_refusals_and_stays_bounded() -> None:
    cache = ReviewCache(max_entries=2)
    cache.put(("token", "a"), TokenResult(READER), 0.0)
    cache.put(("token", "b"), TokenResult(None), 0.0)
    assert cache.get(("token", "b"), DENY_TTL - 0.1) == TokenResult(None)
    assert cache.get(("token", "b"), DENY_TTL) is None  # expired, and dropped
    assert cache.get(("token", "a"), ALLOW_TTL - 0.1) == TokenResult(READER)
    assert cache.get(("token", "a"), ALLOW_TTL) is None
    for i in range(5):
        cache.put(("token", str(i)), AccessResult(True), 1.0)
    assert len(cache) == 2
    assert cache.get(("token", "0"), 1.0) is None  # the oldest went first
    assert cache.get(("token", "4"), 1.0) == AccessResult(True)


@dataclass
class FakeReviewer:
    """Answers reviews from tables and counts the calls (what the apiserver would be asked)."""

    tokens: dict[str, Identity]
    allowed: set[tuple[str, str]]  # (username, path)
    down: bool = False
    calls: list[tuple[str, str]] = field(default_factory=list)

    def review_token(self, token: str) -> TokenResult:
        self.calls.append(("token", token))
        if self.down:
            raise ReviewError("TokenReview failed: connection refused")
        return TokenResult(self.tokens.get(token))

    def review_access(self, identity: Identity, path: str) -> AccessResult:
        self.calls.append(("access", path))
        if self.down:
            raise ReviewError("SubjectAccessReview failed: connection refused")
        return AccessResult((identity.username, path) in self.allowed)


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def reviewer() -> FakeReviewer:
    return FakeReviewer(
        tokens={"reader": READER, "stranger": STRANGER},
        allowed={(READER.username, "/metrics"), (READER.username, "/status")},
    )


def test_a_scrape_costs_two_reviews_per_ttl_not_per_request() -> None:
    fake, clock = reviewer(), Clock()
    gate = AccessGate(fake, clock=clock)
    for _ in range(3):
        assert gate.check("/metrics", "Bearer reader").verdict is Verdict.ALLOWED
    assert fake.calls == [("token", "reader"), ("access", "/metrics")]
    # Another path of the same token: the identity is cached, the permission is per path.
    assert gate.check("/status", "Bearer reader").verdict is Verdict.ALLOWED
    assert fake.calls[2:] == [("access", "/status")]
    clock.now += ALLOW_TTL
    assert gate.check("/metrics", "Bearer reader").verdict is Verdict.ALLOWED
    assert fake.calls[3:] == [("token", "reader"), ("access", "/metrics")]


def test_the_gate_answers_each_kind_of_caller() -> None:
    fake = reviewer()
    gate = AccessGate(fake, clock=Clock())
    assert gate.check("/healthz", None).verdict is Verdict.OPEN
    assert gate.check("/readyz", "Bearer garbage").verdict is Verdict.OPEN
    assert fake.calls == []  # probes cost no review
    assert gate.check("/metrics", None).verdict is Verdict.NO_TOKEN
    assert gate.check("/metrics", "Basic cmVhZGVyOg==").verdict is Verdict.NO_TOKEN
    assert gate.check("/metrics", "Bearer forged").verdict is Verdict.UNAUTHENTICATED
    denied = gate.check("/status", "Bearer stranger")
    assert denied.verdict is Verdict.FORBIDDEN and STRANGER.username in denied.message
    assert gate.check("/status", "Bearer reader").verdict is Verdict.ALLOWED
    assert ("token", "forged") in fake.calls  # reviewed, and not let through


def test_a_review_that_fails_answers_503_and_is_not_cached() -> None:
    fake, clock = reviewer(), Clock()
    gate = AccessGate(fake, clock=clock)
    fake.down = True
    failed = gate.check("/metrics", "Bearer reader")
    assert failed.verdict is Verdict.REVIEW_FAILED and failed.verdict.status == 503
    assert "connection refused" in failed.message
    fake.down = False
    assert gate.check("/metrics", "Bearer reader").verdict is Verdict.ALLOWED


def test_a_refusal_is_reviewed_again_soon_so_a_new_grant_takes_effect() -> None:
    fake, clock = reviewer(), Clock()
    gate = AccessGate(fake, clock=clock)
    assert gate.check("/metrics", "Bearer stranger").verdict is Verdict.FORBIDDEN
    fake.allowed.add((STRANGER.username, "/metrics"))
    assert gate.check("/metrics", "Bearer stranger").verdict is Verdict.FORBIDDEN  # cached
    clock.now += DENY_TTL
    assert gate.check("/metrics", "Bearer stranger").verdict is Verdict.ALLOWED


# -- the real server, over TLS, on loopback --------------------------------------------------


@dataclass
class Served:
    server: HealthServer
    cert: Path  # the self-signed certificate it published


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    cert = tmp_path / "metrics.crt"
    tls = server_context(cert_file=None, key_file=None, publish_to=cert)
    server = HealthServer(
        "127.0.0.1:0,[::1]:0",
        alive=lambda: True,
        ready=lambda: False,
        gate=AccessGate(reviewer(), clock=Clock()),
        tls=tls,
        status=lambda: {"node": "n1"},
    )
    server.run()
    try:
        yield Served(server, cert)
    finally:
        server.close()


def get(host: str, port: int, path: str, cert: Path, token: str | None = None) -> tuple[int, str]:
    """Return (status, body) of a GET over TLS, verifying the pinned certificate."""
    conn = http.client.HTTPSConnection(
        host, port, timeout=5, context=client_context(ca_file=cert, pinned=True)
    )
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_the_server_answers_401_403_and_200_on_both_families(served: Served) -> None:
    v4, v6 = served.server.ports
    for host, port in (("127.0.0.1", v4), ("::1", v6)):
        assert get(host, port, "/healthz", served.cert) == (200, "ok\n")
        assert get(host, port, "/readyz", served.cert) == (503, "not ready\n")
        assert get(host, port, "/metrics", served.cert)[0] == 401
        assert get(host, port, "/metrics", served.cert, "forged")[0] == 401
        assert get(host, port, "/status", served.cert, "stranger")[0] == 403
        code, body = get(host, port, "/metrics", served.cert, "reader")
        assert code == 200 and "nodelb_http_auth_total" in body
        assert get(host, port, "/status", served.cert, "reader") == (200, '{"node":"n1"}')
        assert get(host, port, "/nothing", served.cert, "reader")[0] == 403  # not probed


def test_a_401_names_the_scheme_it_wants(served: Served) -> None:
    conn = http.client.HTTPSConnection(
        "127.0.0.1",
        served.server.port,
        timeout=5,
        context=client_context(ca_file=served.cert, pinned=True),
    )
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    assert response.status == 401 and response.getheader("WWW-Authenticate") == "Bearer"
    conn.close()


def test_plain_http_and_a_stalled_handshake_hold_up_nobody(served: Served) -> None:
    port = served.server.port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as stalled:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
            plain.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert b"nodelb" not in plain.recv(4096)  # no metrics in clear, whatever comes
        # While `stalled` has not even started its handshake, others are served.
        assert get("127.0.0.1", port, "/healthz", served.cert) == (200, "ok\n")
        assert stalled.fileno() >= 0


def test_a_client_that_does_not_trust_the_certificate_gets_nothing(
    served: Served, tmp_path: Path
) -> None:
    other = tmp_path / "other.crt"
    server_context(cert_file=None, key_file=None, publish_to=other)  # another agent's
    with pytest.raises(ssl.SSLCertVerificationError):
        get("127.0.0.1", served.server.port, "/healthz", other)


def test_a_mounted_pair_must_come_whole(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        server_context(cert_file=tmp_path / "tls.crt", key_file=None, publish_to=None)


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        pytest.param("0.0.0.0:9472,[::]:9472", [("0.0.0.0", 9472), ("::", 9472)], id="default"),
        pytest.param("198.18.0.1:9472", [("198.18.0.1", 9472)], id="one address"),
        pytest.param(" [2001:db8::1]:1 , ", [("2001:db8::1", 1)], id="blanks and a trailing comma"),
    ],
)
def test_parse_addresses(text: str, wanted: list[tuple[str, int]]) -> None:
    assert parse_addresses(text) == wanted


@pytest.mark.parametrize("text", ["", ",", "9472", "host:port"])
def test_parse_addresses_refuses_what_is_no_address(text: str) -> None:
    with pytest.raises(ValueError):
        parse_addresses(text)


def test_decision_messages_end_in_a_newline() -> None:
    for d in (decide(None, None), decide(TokenResult(None), None)):
        assert isinstance(d, Decision) and d.message.endswith("\n")
