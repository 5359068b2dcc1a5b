"""What a run of the `[Feature:LoadBalancer]` specs came to, read from ginkgo's JUnit (pure).

`parse_junit` turns the JUnit e2e.test writes into one `SpecResult` per spec of specs.txt, in
specs.txt's order: the JUnit lists every spec of the suite (thousands, nearly all skipped by
the focus), so only the listed ones are kept, and a listed spec the JUnit lacks is NOT_RUN.
A spec of skip.txt that ginkgo skipped is SKIPPED with skip.txt's reason. `markdown` renders
the record docs/conformance.md keeps: how the run was made, the counts, a table per spec.
"""

from __future__ import annotations

import enum
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lab.conformance import Skip

# ginkgo names a spec's JUnit testcase "[It] <full spec text>".
_IT_PREFIX = "[It] "
# A failure message is kept to its first line and this many characters in the table.
MESSAGE_CHARS = 200


class ReportError(ValueError):
    """The JUnit is not what e2e.test writes; the message says what is wrong."""


class Outcome(enum.StrEnum):
    """What became of one listed spec."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # by skip.txt (its reason), or by the spec itself at run time
    NOT_RUN = "not run"  # the JUnit does not list it: outside this run's focus, or aborted


@dataclass(frozen=True, slots=True)
class SpecResult:
    """One spec of specs.txt: its outcome, its time in seconds and why (skip or failure)."""

    spec: str
    outcome: Outcome
    seconds: float
    note: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """How a run was made, for the record: when, against what, with which command."""

    date: str
    kube_version: str
    nodelb_image: str
    command: str
    wall_seconds: float


def _first_line(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


def parse_junit(
    xml_text: str, *, specs: Sequence[str], skips: Sequence[Skip]
) -> tuple[SpecResult, ...]:
    """Return the result of every spec in `specs`, in that order, from e2e.test's JUnit.

    Raises ReportError for text that is not XML or has no testsuite, and for a listed spec
    the JUnit names twice.
    """
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ReportError(f"the JUnit is not XML: {exc}") from exc
    if root.tag not in ("testsuites", "testsuite") or root.find(".//testcase") is None:
        raise ReportError(f"the JUnit has no testcase (root element <{root.tag}>)")
    listed = set(specs)
    reasons = {s.spec: s.reason for s in skips}
    found: dict[str, SpecResult] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(_IT_PREFIX) or name[len(_IT_PREFIX) :] not in listed:
            continue
        spec = name[len(_IT_PREFIX) :]
        if spec in found:
            raise ReportError(f"the JUnit lists a spec twice: {spec}")
        found[spec] = _result(spec, case, reasons)
    return tuple(found.get(s) or SpecResult(s, Outcome.NOT_RUN, 0.0, "") for s in specs)


def _result(spec: str, case: ET.Element, reasons: Mapping[str, str]) -> SpecResult:
    status = case.get("status", "")
    try:
        seconds = float(case.get("time") or 0.0)
    except ValueError as exc:
        raise ReportError(f"{spec}: time {case.get('time')!r} is not a number") from exc
    failure = case.find("failure")
    if failure is None:
        failure = case.find("error")
    if failure is not None or status in ("failed", "panicked", "interrupted", "timedout"):
        text = "" if failure is None else (failure.get("message") or failure.text or "")
        return SpecResult(spec, Outcome.FAILED, seconds, _first_line(text) or status)
    if status == "skipped" or case.find("skipped") is not None:
        skipped = case.find("skipped")
        why = reasons.get(spec) or _first_line(
            "" if skipped is None else skipped.get("message", "")
        )
        return SpecResult(spec, Outcome.SKIPPED, seconds, why)
    if status == "passed":
        return SpecResult(spec, Outcome.PASSED, seconds, "")
    raise ReportError(f"{spec}: unknown status {status!r}")


def counts(results: Sequence[SpecResult]) -> Counter[Outcome]:
    """Return how many specs ended each way."""
    return Counter(r.outcome for r in results)


def summary(results: Sequence[SpecResult]) -> str:
    """Return "N passed, N failed, N skipped, N not run" (every outcome, zeros included)."""
    seen = counts(results)
    return ", ".join(f"{seen[o]} {o.value}" for o in Outcome)


def _cell(text: str) -> str:
    # A table cell must not end the row or the cell early.
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: Sequence[SpecResult], record: RunRecord) -> str:
    """Return docs/conformance.md for one run: how it was made, its counts, a row per spec."""
    minutes, seconds = divmod(round(record.wall_seconds), 60)
    lines = [
        "# Upstream conformance: the `[Feature:LoadBalancer]` e2e specs",
        "",
        "Written by `make conformance` (`python -m lab.conformance_run --record "
        "docs/conformance.md`): every spec the Kubernetes e2e suite tags `[Feature:LoadBalancer]`,",
        "run by e2e.test from the real-node lab's outside network against three real kubelets",
        "with nodelb installed from deploy/. conformance/README.md says how the lists are kept,",
        "conformance/skip.txt why a spec is skipped.",
        "",
        f"- date: {record.date}",
        f"- Kubernetes (e2e.test, kubelet, control plane): {record.kube_version}",
        f"- nodelb image: `{record.nodelb_image}`",
        f"- command: `{record.command}`",
        f"- wall time: {minutes} min {seconds:02d} s (lab up and down included)",
        f"- result: {summary(results)}",
        "",
        "| spec | result | time | note |",
        "|---|---|---|---|",
    ]
    for r in results:
        time = f"{r.seconds:.0f} s" if r.outcome in (Outcome.PASSED, Outcome.FAILED) else ""
        lines.append(f"| {_cell(r.spec)} | {r.outcome.value} | {time} | {_cell(r.note)} |")
    return "\n".join(lines) + "\n"
