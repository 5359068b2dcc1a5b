"""lab.conformance: the spec and skip lists, the ginkgo expressions, and reading a dry run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab import conformance
from lab.conformance import Skip, SpecEntry

# ginkgo matches focus and skip against "<suite description> <spec text>" (internal/focus.go).
SUITE = "Kubernetes e2e suite"
TARGET_ALL = (
    "[sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] "
    "should target all nodes with endpoints [Slow]"
)


def matched_by(expression: str, specs: tuple[str, ...]) -> set[str]:
    """Return the specs a ginkgo expression selects (escaped literals: re reads them as RE2)."""
    return {spec for spec in specs if re.search(expression, f"{SUITE} {spec}")}


# -- the lists in the repository ------------------------------------------------------------


def repo_specs() -> tuple[str, ...]:
    return conformance.read_specs(conformance.SPECS_FILE.read_text())


def repo_skips() -> tuple[Skip, ...]:
    return conformance.read_skips(conformance.SKIP_FILE.read_text())


def test_the_spec_list_holds_every_spec_of_both_load_balancer_describes() -> None:
    specs = repo_specs()
    assert len(specs) == 17
    assert all("[Feature:LoadBalancer]" in spec for spec in specs)
    assert {spec.split(" [Feature:LoadBalancer] ")[0] for spec in specs} == {
        "[sig-network] LoadBalancers",
        "[sig-network] LoadBalancers ExternalTrafficPolicy: Local",
    }
    assert matched_by(conformance.FOCUS, specs) == set(specs)


def test_every_skip_names_a_listed_spec_and_its_expression_selects_only_that_spec() -> None:
    specs = repo_specs()
    for skip in repo_skips():
        assert skip.spec in specs
        assert matched_by(conformance.skip_expression(skip.spec), specs) == {skip.spec}


def test_the_ci_subset_runs_listed_specs_nodelb_does_not_skip() -> None:
    subset = conformance.read_specs(conformance.SUBSET_FILE.read_text())
    skipped = {skip.spec for skip in repo_skips()}
    assert subset, "make test runs no upstream spec"
    assert set(subset) <= set(repo_specs()), set(subset) - set(repo_specs())
    assert not set(subset) & skipped, set(subset) & skipped


def test_the_etp_local_spread_spec_is_skipped_until_the_spread_lands() -> None:
    skips = {skip.spec: skip.reason for skip in repo_skips()}
    assert TARGET_ALL in skips
    assert "spread" in skips[TARGET_ALL]


def test_every_skip_reason_says_what_nodelb_lacks_in_a_sentence_or_more() -> None:
    for skip in repo_skips():
        assert len(skip.reason.split()) >= 10, skip


# -- reading the lists ----------------------------------------------------------------------


def test_specs_skip_comments_and_blank_lines_and_keep_the_file_order() -> None:
    text = "# header\n\nspec b\n  spec a  \n# spec c\n"
    assert conformance.read_specs(text) == ("spec b", "spec a")


def test_a_spec_listed_twice_is_refused_with_both_lines() -> None:
    with pytest.raises(conformance.ListError, match=r"^specs\.txt:3: .*first at specs\.txt:1"):
        conformance.read_specs("spec a\nspec b\nspec a\n")


def test_a_skip_line_is_a_spec_and_a_reason() -> None:
    text = "# comment\nspec a | no SCTP | in this kernel\n\nspec b|c | reason b\n"
    assert conformance.read_skips(text) == (
        Skip("spec a", "no SCTP | in this kernel"),
        Skip("spec b|c", "reason b"),
    )


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("spec a", id="a spec without a reason"),
        pytest.param("spec a |", id="an empty reason"),
        pytest.param(" | reason", id="an empty spec"),
        pytest.param("spec a|reason", id="a bar without the spaces around it"),
    ],
)
def test_a_skip_line_without_spec_and_reason_is_refused_with_its_line(line: str) -> None:
    with pytest.raises(conformance.ListError, match=r"^skip\.txt:2: "):
        conformance.read_skips(f"# comment\n{line}\n")


def test_a_spec_skipped_twice_is_refused() -> None:
    with pytest.raises(conformance.ListError, match="skipped again"):
        conformance.read_skips("spec a | one\nspec a | two\n")


# -- expressions ----------------------------------------------------------------------------


def test_go_metacharacters_are_escaped_like_regexp_quote_meta() -> None:
    assert conformance.go_quote_meta("[sig-network] a.b (c) x=1 $y^ {z} a|b *+?\\") == (
        r"\[sig-network\] a\.b \(c\) x=1 \$y\^ \{z\} a\|b \*\+\?\\"
    )


@given(st.text())
def test_an_escaped_text_matches_itself_literally(text: str) -> None:
    assert re.fullmatch(conformance.go_quote_meta(text), text, flags=re.DOTALL)


def test_a_skip_expression_does_not_catch_a_spec_that_extends_the_skipped_one() -> None:
    specs = (TARGET_ALL, f"{TARGET_ALL} [Flaky]")
    assert matched_by(conformance.skip_expression(TARGET_ALL), specs) == {TARGET_ALL}


def test_dry_run_arguments_give_one_skip_flag_per_expression() -> None:
    args = conformance.dry_run_arguments(
        focus=conformance.FOCUS, skips=["a$", "b$"], report=Path("/r.json")
    )
    assert args == [
        "--ginkgo.dry-run",
        "--ginkgo.no-color",
        r"--ginkgo.focus=\[Feature:LoadBalancer\]",
        "--ginkgo.skip=a$",
        "--ginkgo.skip=b$",
        "--ginkgo.json-report=/r.json",
    ]


# -- reading a dry run's report -------------------------------------------------------------


def spec_report(
    leaf: str, *, state: str = "passed", node: str = "It", line: int = 1, containers: list[str]
) -> dict[str, object]:
    return {
        "ContainerHierarchyTexts": containers,
        "LeafNodeType": node,
        "LeafNodeText": leaf,
        "LeafNodeLocation": {
            "FileName": "k8s.io/kubernetes/test/e2e/network/lb.go",
            "LineNumber": line,
        },
        "State": state,
    }


def test_the_specs_that_would_run_are_the_passed_its_in_source_order() -> None:
    report = [
        {
            "SpecReports": [
                spec_report("", node="SynchronizedBeforeSuite", containers=[]),
                spec_report("second [Slow]", line=20, containers=["[sig-network] LB [Feature:X]"]),
                spec_report("first", line=10, containers=["[sig-network] LB", ""]),
                spec_report("other", state="skipped", line=5, containers=["[sig-apps] D"]),
            ]
        }
    ]
    file = "k8s.io/kubernetes/test/e2e/network/lb.go"
    assert conformance.specs_that_would_run(report) == (
        SpecEntry(file, 10, "[sig-network] LB first"),
        SpecEntry(file, 20, "[sig-network] LB [Feature:X] second [Slow]"),
    )


@pytest.mark.parametrize(
    "report",
    [
        pytest.param({}, id="an object instead of a list of suites"),
        pytest.param([], id="no suite at all"),
        pytest.param([{"SpecReports": [{"LeafNodeType": "It"}]}], id="a spec without its fields"),
        pytest.param([{"Suite": "x"}], id="a suite without spec reports"),
    ],
)
def test_a_report_that_is_not_ginkgos_is_refused(report: object) -> None:
    with pytest.raises(conformance.DryRunError):
        conformance.specs_that_would_run(report)


@dataclass(frozen=True, slots=True)
class Case:
    specs: tuple[str, ...]
    skips: tuple[str, ...]
    focused: tuple[str, ...]
    remaining: tuple[str, ...]
    expected: tuple[str, ...]  # the start of each problem reported


CASES = [
    pytest.param(
        Case(("a", "b", "c"), ("c",), ("c", "b", "a"), ("a", "b"), ()),
        id="lists and dry runs agree: nothing to report",
    ),
    pytest.param(
        Case(("a", "b"), ("z",), ("a", "b"), ("a", "b"), ("skip.txt names a spec",)),
        id="a skip names a spec that is not listed",
    ),
    pytest.param(
        Case(("a",), (), ("a", "new"), ("a", "new"), ("the focus selects a spec specs.txt lacks",)),
        id="the suite gained a spec the list does not have",
    ),
    pytest.param(
        Case(("a", "gone"), (), ("a",), ("a",), ("specs.txt lists a spec the focus misses",)),
        id="the list names a spec the suite no longer has",
    ),
    pytest.param(
        Case(("a", "ab"), ("a",), ("a", "ab"), (), ("a skip expression also skips",)),
        id="a skip expression skips one spec too many",
    ),
    pytest.param(
        Case(("a", "b"), ("a",), ("a", "b"), ("a", "b"), ("the skip expressions do not skip",)),
        id="a skip expression matches nothing",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_problems_report_every_disagreement(case: Case) -> None:
    found = conformance.problems(
        specs=case.specs,
        skips=[Skip(spec, "reason") for spec in case.skips],
        focused=case.focused,
        focused_and_skipped=case.remaining,
    )
    assert len(found) == len(case.expected), found
    for problem, start in zip(found, case.expected, strict=True):
        assert problem.startswith(start), problem


def test_format_specs_writes_a_list_read_specs_reads_back() -> None:
    entries = (SpecEntry("f.go", 1, "spec a"), SpecEntry("f.go", 2, "spec b"))
    text = conformance.format_specs(entries, kube_version="v1.2.3")
    assert "e2e.test v1.2.3" in text
    assert conformance.read_specs(text) == ("spec a", "spec b")


# -- the dry run, over a stand-in for e2e.test ----------------------------------------------

FAKE_E2E = """#!/usr/bin/env python3
import json, os, sys
# A dry run must not hand the suite a kubeconfig or an in-cluster address.
if "KUBECONFIG" in os.environ or "KUBERNETES_SERVICE_HOST" in os.environ:
    sys.exit("a server was named")
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
assert "--ginkgo.dry-run" in sys.argv, sys.argv
skipped = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--ginkgo.skip=")]
spec = {
    "ContainerHierarchyTexts": ["[sig-network] LoadBalancers [Feature:LoadBalancer]"],
    "LeafNodeType": "It",
    "LeafNodeText": "should work",
    "LeafNodeLocation": {"FileName": "lb.go", "LineNumber": 7},
    "State": "skipped" if skipped else "passed",
}
with open(args["--ginkgo.json-report"], "w") as report:
    json.dump([{"SpecReports": [spec]}], report)
"""


def test_dry_run_reads_the_report_e2e_test_writes_without_a_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "e2e.test"
    fake.write_text(FAKE_E2E)
    fake.chmod(0o755)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "admin.kubeconfig"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "198.18.128.1")
    spec = "[sig-network] LoadBalancers [Feature:LoadBalancer] should work"
    assert conformance.dry_run(fake, focus=conformance.FOCUS, skips=()) == (
        SpecEntry("lb.go", 7, spec),
    )
    assert conformance.dry_run(fake, focus=conformance.FOCUS, skips=["x$"]) == ()


def test_a_failing_dry_run_says_how_it_ended(tmp_path: Path) -> None:
    fake = tmp_path / "e2e.test"
    fake.write_text("#!/bin/sh\necho 'flag provided but not defined' >&2\nexit 2\n")
    fake.chmod(0o755)
    with pytest.raises(conformance.DryRunError, match="exited 2:\nflag provided but not defined"):
        conformance.dry_run(fake, focus=conformance.FOCUS, skips=())


def test_main_without_e2e_test_says_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODELB_KUBE_BIN", str(tmp_path))
    assert conformance.main(["check"]) == 1
    assert "run scripts/build-kube.sh conformance" in capsys.readouterr().err
