"""Cut off from the API server: when the agent says so (agent/kube/contact.py), how the probe
acts on it (agent/kube/contact_probe.py), and that the announcer then takes no new address
(agent/announce/announcer.py)."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY, CollectorRegistry

from agent.announce import announcer as announcer_module
from agent.announce.announcer import Announcer
from agent.announce.inputs import OwnershipInput, ip_use, node_states
from agent.announce.metrics import SpeakerMetrics
from agent.announce.ownership import ServiceUse
from agent.announce.settings import AnnounceSettings
from agent.announce.vrrp.config import SpeakerConfig
from agent.kube.contact import Contact, Reach, answered, decide, failed, sent
from agent.kube.contact_probe import ContactProbe
from agent.model.node import Node

IP = ipaddress.ip_address


@dataclass(frozen=True, slots=True)
class Step:
    at: float
    outcome: str  # "ok" (answered at `at`), "fail" (sent at `at`), "none" (only decide)


@dataclass(frozen=True, slots=True)
class Case:
    steps: tuple[Step, ...]
    reach: Reach


def run(steps: tuple[Step, ...]) -> Contact:
    c = Contact()
    for s in steps:
        if s.outcome == "ok":
            c = answered(c, at=s.at)
        elif s.outcome == "fail":
            c = failed(c, sent=s.at, error="connection refused")
        c, _ = decide(c, now=s.at + (2.0 if s.outcome == "fail" else 0.0))
    return c


CASES = [
    pytest.param(Case((Step(0, "ok"), Step(1, "ok")), Reach.CONNECTED), id="answers: connected"),
    pytest.param(
        Case((Step(0, "ok"), Step(1, "fail")), Reach.CUT_OFF),
        id="a request that failed after hanging for the grace period cuts off",
    ),
    pytest.param(
        Case((Step(0, "ok"), Step(1, "fail"), Step(3, "ok")), Reach.CONNECTED),
        id="an answer after being cut off reconnects",
    ),
    pytest.param(
        Case((Step(0, "ok"), Step(7, "none")), Reach.CUT_OFF),
        id="no answer for the stale period cuts off even with no failure seen",
    ),
    pytest.param(
        Case((Step(7, "none"),), Reach.CONNECTED),
        id="before the first answer silence is not a cut (the agent is starting)",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_cut_off_means_failures_for_the_grace_period_or_silence(case: Case) -> None:
    assert run(case.steps).reach is case.reach


def test_a_request_that_hangs_past_its_timeout_cuts_off_before_it_returns() -> None:
    c = answered(Contact(), at=0.0)
    c = sent(c, at=1.0)
    c, change = decide(c, now=2.5, timeout=2.0)
    assert change is None  # still within the request's own timeout
    c, change = decide(c, now=3.0, timeout=2.0)
    assert change is Reach.CUT_OFF and c.failing_since == 1.0 and "hangs" in c.error
    c, change = decide(answered(c, at=9.0), now=9.0)
    assert change is Reach.CONNECTED and c.pending_since is None


def test_the_ticker_says_cut_off_while_the_probe_hangs() -> None:
    clock = Clock()
    probe = ContactProbe(None, clock=clock, ask=Api(clock))
    probe.probe()
    probe.contact = sent(probe.contact, at=clock.now)  # a probe now stuck in the client
    clock.now += 2.5
    assert probe.tick() is Reach.CUT_OFF


def test_one_quick_failure_is_not_a_cut_but_failing_on_for_the_grace_period_is() -> None:
    c = answered(Contact(), at=0.0)
    c = failed(c, sent=1.0, error="reset")
    c, change = decide(c, now=1.1)
    assert change is None and c.reach is Reach.CONNECTED
    c = failed(c, sent=1.2, error="refused")
    c, change = decide(c, now=3.0)
    assert change is Reach.CUT_OFF
    assert c.failing_since == 1.0 and c.error == "refused"
    c, change = decide(c, now=3.5)
    assert change is None  # a change is reported once


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Api:
    """Stands in for the version GET: answers, raises, or hangs for `delay` (on the clock)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.error: Exception | None = None
        self.delay = 0.0

    def __call__(self, timeout: float) -> object:
        self.clock.now += self.delay
        if self.error is not None:
            raise self.error
        return {"gitVersion": "v1.37.2"}


def gauge() -> float:
    return REGISTRY.get_sample_value("nodelb_api_cut_off") or 0.0


def test_the_probe_logs_the_cut_within_seconds_and_the_return(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    api = Api(clock)
    changes: list[bool] = []
    probe = ContactProbe(None, on_change=changes.append, clock=clock, ask=api)
    assert probe.probe() is None
    # The API server's address stops answering: each probe hangs for its timeout, then fails.
    api.error, api.delay = (
        urllib3.exceptions.ReadTimeoutError(
            None,  # type: ignore[arg-type]
            "/version",
            "timed out",
        ),
        2.0,
    )
    with caplog.at_level(logging.WARNING, logger="agent.kube.contact_probe"):
        clock.now += 1.0
        assert probe.probe() is Reach.CUT_OFF
    assert changes == [True]
    assert gauge() == 1.0
    assert any("cut off from the API server" in r.getMessage() for r in caplog.records)
    assert "ReadTimeoutError" in probe.contact.error
    api.error, api.delay = None, 0.0
    clock.now += 1.0
    assert probe.probe() is Reach.CONNECTED
    assert changes == [True, False]
    assert gauge() == 0.0


def test_an_http_error_is_an_answer() -> None:
    clock = Clock()
    api = Api(clock)
    probe = ContactProbe(None, clock=clock, ask=api)
    api.error, api.delay = ApiException(status=403, reason="Forbidden"), 3.0
    for _ in range(5):
        assert probe.probe() is None
    assert probe.contact.reach is Reach.CONNECTED


# --- the announcer while cut off ------------------------------------------------------------


class ListSink:
    def record(self, event: Any) -> None:
        pass


class FakeSpeaker:
    def __init__(self, config: SpeakerConfig) -> None:
        self.config = config
        self.updates: list[SpeakerConfig] = []

    def update(self, config: SpeakerConfig) -> None:
        self.config = config
        self.updates.append(config)

    def status(self) -> Any:
        return None


def ownership(*ips: str) -> OwnershipInput:
    nodes = node_states(Node(n, None, True, (), ()) for n in ("node-1", "node-2"))
    return OwnershipInput(
        nodes, frozenset(ip_use(IP(ip), [ServiceUse("ns/web", False, frozenset())]) for ip in ips)
    )


def addresses(config: SpeakerConfig) -> set[Any]:
    return {a for inst in config.instances for a in inst.addresses}


def test_a_cut_off_announcer_sends_the_speaker_nothing_new_until_the_api_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its speaker metrics on a registry of their own, not the process-wide one.
    monkeypatch.setattr(
        announcer_module, "SpeakerMetrics", lambda: SpeakerMetrics(CollectorRegistry())
    )
    announcer = Announcer(
        AnnounceSettings(enabled=True), "node-1", events=ListSink(), on_held_change=lambda: None
    )
    announcer.source4 = IP("198.18.0.11")  # type: ignore[assignment]
    speaker = FakeSpeaker(SpeakerConfig(interface="eth0", source4=None, peers=frozenset()))
    announcer._speaker = speaker  # type: ignore[assignment]
    nodes = (Node("node-1", None, True, (), ()), Node("node-2", None, True, (), ()))
    announcer.submit(ownership("198.18.72.1"), nodes)
    announcer.step()
    assert addresses(speaker.config) == {IP("198.18.72.1")}
    kept = speaker.config

    announcer.set_cut_off(True)
    assert announcer.cut_off()
    announcer.submit(ownership("198.18.72.1", "198.18.72.2"), nodes)
    announcer.step()
    assert speaker.config is kept, "a cut-off announcer took on a new address"

    announcer.set_cut_off(False)
    announcer.step()
    assert addresses(speaker.config) == {IP("198.18.72.1"), IP("198.18.72.2")}
