"""Reloading the controller's configuration (agent/controller/config.py): the refusal cache."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.controller.config import (
    REFUSED_RECHECK,
    ConfigVerdict,
    Refusal,
    config_digest,
    config_verdict,
    refuse,
)

A = config_digest(b"pools: [{name: a, addresses: [198.19.0.0/24]}]")
B = config_digest(b"pools: [{name: b, addresses: [198.19.1.0/24]}]")
V = ConfigVerdict


@dataclass(frozen=True, slots=True)
class VerdictCase:
    digest: bytes
    loaded: bytes
    refused: Refusal | None
    initial: bool
    now: float
    verdict: ConfigVerdict


VERDICT_CASES = [
    pytest.param(
        VerdictCase(A, b"", None, True, 0.0, V.CHECK), id="the first load checks the file"
    ),
    pytest.param(
        VerdictCase(A, A, None, False, 10.0, V.UNCHANGED),
        id="content already in force costs nothing, not even a Node list",
    ),
    pytest.param(
        VerdictCase(B, A, None, False, 10.0, V.CHECK),
        id="new content is checked against the Nodes",
    ),
    pytest.param(
        VerdictCase(B, A, Refusal(B, "overlap", 70.0), False, 69.9, V.REFUSED_RECENTLY),
        id="the same refused content inside the recheck interval is not checked again",
    ),
    pytest.param(
        VerdictCase(B, A, Refusal(B, "overlap", 70.0), False, 70.0, V.CHECK),
        id="the same refused content is checked again once the interval has passed",
    ),
    pytest.param(
        VerdictCase(A, A, Refusal(B, "overlap", 70.0), False, 20.0, V.UNCHANGED),
        id="the file put back to what is in force is unchanged, whatever was refused meanwhile",
    ),
    pytest.param(
        VerdictCase(
            config_digest(b"pools: []"), A, Refusal(B, "overlap", 70.0), False, 20.0, V.CHECK
        ),
        id="other content after a refusal is checked at once",
    ),
]


@pytest.mark.parametrize("case", VERDICT_CASES)
def test_config_verdict(case: VerdictCase) -> None:
    got = config_verdict(
        case.digest,
        loaded=case.loaded,
        refused=case.refused,
        initial=case.initial,
        now=case.now,
    )
    assert got is case.verdict


@dataclass(frozen=True, slots=True)
class RefuseCase:
    last: Refusal | None
    digest: bytes
    message: str
    report: bool


REFUSE_CASES = [
    pytest.param(RefuseCase(None, B, "overlap", True), id="a first refusal is reported"),
    pytest.param(
        RefuseCase(Refusal(B, "overlap", 60.0), B, "overlap", False),
        id="the same content refused for the same reason is not reported again",
    ),
    pytest.param(
        RefuseCase(Refusal(B, "overlap", 60.0), B, "overlaps node-3", True),
        id="the same content refused for a new reason (the Nodes changed) is reported",
    ),
    pytest.param(
        RefuseCase(Refusal(B, "overlap", 60.0), A, "overlap", True),
        id="other content refused for the same reason is reported",
    ),
    pytest.param(
        RefuseCase(Refusal(b"", "cannot read", 60.0), b"", "cannot read", False),
        id="a file that stays unreadable is reported once",
    ),
]


@pytest.mark.parametrize("case", REFUSE_CASES)
def test_refuse(case: RefuseCase) -> None:
    refused = refuse(case.last, digest=case.digest, message=case.message, now=100.0)
    assert refused.report is case.report
    assert refused.refusal == Refusal(case.digest, case.message, 100.0 + REFUSED_RECHECK)


def test_a_refused_file_left_alone_is_checked_once_a_minute_and_reported_once() -> None:
    """Reloads every 2 s for two minutes over a file whose pools overlap a Node."""
    refused: Refusal | None = None
    checks: list[float] = []
    reports = 0
    for tick in range(61):
        now = 2.0 * tick
        if config_verdict(B, loaded=A, refused=refused, initial=False, now=now) is V.CHECK:
            checks.append(now)
            decision = refuse(refused, digest=B, message="overlaps node-1", now=now)
            refused, reports = decision.refusal, reports + decision.report
    assert checks == [0.0, 60.0, 120.0]
    assert reports == 1
