"""Reading e2e.test's JUnit into one result per listed spec, the record written from it, and
the arguments and focus the runner gives e2e.test (pure; no lab, no e2e.test)."""

from __future__ import annotations

import re
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from lab.conformance import Skip, focus_on, skip_expression
from lab.conformance_report import (
    Outcome,
    ReportError,
    RunRecord,
    SpecResult,
    markdown,
    parse_junit,
    summary,
)
from lab.conformance_run import SpecRun, e2e_arguments

A = "[sig-network] LoadBalancers [Feature:LoadBalancer] should do a [Slow]"
B = "[sig-network] LoadBalancers [Feature:LoadBalancer] should do b | with a bar"
C = "[sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] c"
D = "[sig-network] LoadBalancers [Feature:LoadBalancer] should do d"
OTHER = "[sig-apps] Deployment should roll"
SKIPS = (Skip(C, "needs the spread"),)
SUITE = "Kubernetes e2e suite"


def case(name: str, status: str, time: str = "1.5", inner: str = "") -> str:
    return (
        f'<testcase name={quoteattr(name)} classname="Kubernetes e2e suite" '
        f'status="{status}" time="{time}">{inner}</testcase>'
    )


def junit(*cases: str) -> str:
    body = "".join(cases)
    return (
        '<?xml version="1.0" encoding="UTF-8"?><testsuites tests="9">'
        f'<testsuite name="Kubernetes e2e suite">{body}</testsuite></testsuites>'
    )


def test_each_listed_spec_gets_its_outcome_in_the_lists_order() -> None:
    failure = '<failure message="Source IP not preserved&#10;second line" type="failed">x</failure>'
    text = junit(
        case("[ReportBeforeSuite]", "passed"),
        case(f"[It] {OTHER}", "skipped", "0", '<skipped message="skipped"/>'),
        case(f"[It] {C}", "skipped", "0", '<skipped message="skipped"/>'),
        case(f"[It] {B}", "failed", "608.25", failure),
        case(f"[It] {A}", "passed", "23.6"),
    )
    results = parse_junit(text, specs=(A, B, C, D), skips=SKIPS)
    assert results == (
        SpecResult(A, Outcome.PASSED, 23.6, ""),
        SpecResult(B, Outcome.FAILED, 608.25, "Source IP not preserved"),
        SpecResult(C, Outcome.SKIPPED, 0.0, "needs the spread"),
        SpecResult(D, Outcome.NOT_RUN, 0.0, ""),
    )
    assert summary(results) == "1 passed, 1 failed, 1 skipped, 1 not run"


def test_a_spec_that_skips_itself_at_run_time_keeps_its_own_message() -> None:
    text = junit(case(f"[It] {A}", "skipped", "3", '<skipped message="LoadBalancer uses Proxy"/>'))
    (result,) = parse_junit(text, specs=(A,), skips=SKIPS)
    assert result == SpecResult(A, Outcome.SKIPPED, 3.0, "LoadBalancer uses Proxy")


@pytest.mark.parametrize("status", ["panicked", "interrupted", "timedout"])
def test_a_spec_that_ended_abnormally_failed(status: str) -> None:
    (result,) = parse_junit(junit(case(f"[It] {A}", status)), specs=(A,), skips=())
    assert (result.outcome, result.note) == (Outcome.FAILED, status)


def test_a_long_failure_message_is_cut_for_the_table() -> None:
    message = "x" * 500
    text = junit(case(f"[It] {A}", "failed", inner=f'<failure message="{message}"/>'))
    (result,) = parse_junit(text, specs=(A,), skips=())
    assert len(result.note) == 200 and result.note.endswith("…")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not xml <", "not XML"),
        ("<testsuites></testsuites>", "no testcase"),
        (junit(case(f"[It] {A}", "passed"), case(f"[It] {A}", "failed")), "twice"),
        (junit(case(f"[It] {A}", "passed", time="soon")), "not a number"),
        (junit(case(f"[It] {A}", "wobbly")), "unknown status"),
    ],
)
def test_a_junit_that_is_not_e2e_tests_is_refused(text: str, match: str) -> None:
    with pytest.raises(ReportError, match=match):
        parse_junit(text, specs=(A,), skips=())


def test_the_record_says_how_the_run_was_made_and_escapes_table_cells() -> None:
    results = (
        SpecResult(A, Outcome.PASSED, 23.6, ""),
        SpecResult(B, Outcome.FAILED, 608.2, "got 'a|b'"),
        SpecResult(C, Outcome.SKIPPED, 0.0, "needs the spread"),
    )
    record = RunRecord("2026-12-04 23:00 UTC", "v1.37.2", "ghcr.io/x:1", "make conformance", 754)
    text = markdown(results, record)
    assert "- wall time: 12 min 34 s (lab up and down included)" in text
    assert "- result: 1 passed, 1 failed, 1 skipped, 0 not run" in text
    assert f"| {A} | passed | 24 s |  |" in text
    assert (
        "| [sig-network] LoadBalancers [Feature:LoadBalancer] should do b \\| with a bar " in text
    )
    assert "| failed | 608 s | got 'a\\|b' |" in text
    assert f"| {C} | skipped |  | needs the spread |" in text
    rows = [line for line in text.splitlines() if line.startswith("| [sig-network]")]
    # Every row has exactly four cells once escaped bars are left aside.
    assert all(len(re.split(r"(?<!\\)\|", row)) == 6 for row in rows), rows


def test_the_focus_selects_exactly_the_named_specs_as_ginkgo_matches_them() -> None:
    focus = focus_on([A, B])
    assert focus == f"{skip_expression(A)}|{skip_expression(B)}"
    pattern = re.compile(focus)
    # ginkgo matches "<suite description> <spec text>" (a `^` anchor selected nothing).
    assert pattern.search(f"{SUITE} {A}") and pattern.search(f"{SUITE} {B}")
    assert not pattern.search(f"{SUITE} {A} more") and not pattern.search(f"{SUITE} {D}")
    with pytest.raises(ValueError, match="no spec"):
        focus_on([])


def test_e2e_test_uses_the_labs_kubectl_and_skips_each_skipped_spec() -> None:
    args = e2e_arguments(
        kubeconfig=Path("/k/admin.kubeconfig"),
        kubectl=Path("/cache/kubectl"),
        report_dir=Path("/r"),
        focus="F",
        skips=SKIPS,
        timeout=600.0,
    )
    assert "--kubectl-path=/cache/kubectl" in args
    assert "--kubeconfig=/k/admin.kubeconfig" in args
    assert "--ginkgo.timeout=600s" in args
    assert [a for a in args if a.startswith("--ginkgo.skip=")] == [
        f"--ginkgo.skip={skip_expression(C)}"
    ]


def test_only_the_wanted_specs_that_did_not_pass_count_against_a_run() -> None:
    results = (
        SpecResult(A, Outcome.PASSED, 1.0, ""),
        SpecResult(B, Outcome.FAILED, 1.0, "no"),
        SpecResult(C, Outcome.SKIPPED, 0.0, "needs the spread"),
        SpecResult(D, Outcome.NOT_RUN, 0.0, ""),
    )
    run = SpecRun(results, Path("/log"), Path("/junit"), 1.0)
    assert [r.spec for r in run.not_passed([A, B, D])] == [B, D]
    assert run.not_passed([A]) == ()
