"""The upstream `[Feature:LoadBalancer]` e2e specs nodelb is judged by (issue #14).

Two lists in `conformance/` hold the selection, and a ginkgo dry run of `e2e.test` (no cluster,
no server contacted) checks them against the suite that is built:

- `specs.txt`: every spec FOCUS selects at KUBE_VERSION, one full spec text a line, as ginkgo
  prints it (its container texts and its own text joined by spaces);
- `skip.txt`: the specs nodelb cannot pass yet, `<full spec text> | <reason>` a line.

In both, blank lines and lines starting with `#` are comments. ginkgo matches `--ginkgo.focus`
and `--ginkgo.skip` (Go regular expressions, unanchored) against "<suite description> <spec
text>"; a skip expression is the spec text with Go's metacharacters escaped and `$` after it,
so it cannot also catch a spec whose text merely starts with it. `python -m lab.conformance
check` runs the dry run with the focus alone and with the skips added, and fails unless the
first selects exactly specs.txt and the second exactly specs.txt without skip.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lab import binaries

CONFORMANCE_DIR = Path(__file__).resolve().parents[1] / "conformance"
SPECS_FILE = CONFORMANCE_DIR / "specs.txt"
SKIP_FILE = CONFORMANCE_DIR / "skip.txt"
# The specs `make test` runs (tests/realnodes): listed in specs.txt, none of skip.txt.
SUBSET_FILE = CONFORMANCE_DIR / "subset.txt"
# The tag every LoadBalancer spec carries since kubernetes PR #124660 (test/e2e/feature).
FOCUS = r"\[Feature:LoadBalancer\]"
SKIP_SEPARATOR = " | "
DRY_RUN_TIMEOUT = 120.0
# Characters Go's regexp.QuoteMeta escapes; escaped, Python's re reads them the same way.
_GO_REGEXP_SPECIAL = frozenset("\\.+*?()|[]{}^$")


class ListError(ValueError):
    """A line of specs.txt or skip.txt is malformed; the message names the file and line."""


class DryRunError(RuntimeError):
    """e2e.test's dry run failed or wrote a report this module cannot read."""


@dataclass(frozen=True, slots=True)
class Skip:
    """One spec nodelb cannot pass yet, and why."""

    spec: str
    reason: str


@dataclass(frozen=True, slots=True, order=True)
class SpecEntry:
    """A spec a dry run would run: where it is defined (to order them) and its full text."""

    file: str
    line: int
    text: str


def _content_lines(text: str, source: str) -> Iterable[tuple[str, str]]:
    """Yield (`source:number`, line) for each line that is not blank or a comment."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield f"{source}:{number}", line


def read_specs(text: str, *, source: str = "specs.txt") -> tuple[str, ...]:
    """Return the spec texts of a specs.txt, in file order; raise ListError on a duplicate."""
    specs: dict[str, str] = {}
    for where, line in _content_lines(text, source):
        if line in specs:
            raise ListError(f"{where}: listed again (first at {specs[line]}): {line}")
        specs[line] = where
    return tuple(specs)


def read_skips(text: str, *, source: str = "skip.txt") -> tuple[Skip, ...]:
    """Return the entries of a skip.txt, in file order.

    Raise ListError for a line without `<spec> | <reason>`, an empty spec or reason, or a spec
    named twice.
    """
    skips: dict[str, tuple[str, Skip]] = {}
    for where, line in _content_lines(text, source):
        spec, sep, reason = line.partition(SKIP_SEPARATOR)
        spec, reason = spec.strip(), reason.strip()
        if not sep or not spec or not reason:
            raise ListError(f"{where}: not `<full spec text> | <reason>`: {line}")
        if spec in skips:
            raise ListError(f"{where}: skipped again (first at {skips[spec][0]}): {spec}")
        skips[spec] = (where, Skip(spec, reason))
    return tuple(entry for _, entry in skips.values())


def go_quote_meta(text: str) -> str:
    """Return `text` with Go's regexp metacharacters escaped, as regexp.QuoteMeta does."""
    return "".join(f"\\{c}" if c in _GO_REGEXP_SPECIAL else c for c in text)


def skip_expression(spec: str) -> str:
    """Return the --ginkgo.skip expression that selects the spec whose full text is `spec`."""
    return go_quote_meta(spec) + "$"


def focus_on(specs: Sequence[str]) -> str:
    """Return a --ginkgo.focus expression that selects exactly the specs named (full texts).

    ginkgo matches "<suite description> <spec text>", so each alternative is anchored at the
    end only, as a skip expression is (`skip_expression`).
    """
    if not specs:
        raise ValueError("no spec to focus on")
    return "|".join(skip_expression(s) for s in specs)


def dry_run_arguments(*, focus: str, skips: Sequence[str], report: Path) -> list[str]:
    """Return e2e.test's arguments for a dry run writing ginkgo's JSON report to `report`."""
    return [
        "--ginkgo.dry-run",
        "--ginkgo.no-color",
        f"--ginkgo.focus={focus}",
        *(f"--ginkgo.skip={expression}" for expression in skips),
        f"--ginkgo.json-report={report}",
    ]


def specs_that_would_run(report: object) -> tuple[SpecEntry, ...]:
    """Return the specs (`It` nodes) a ginkgo dry-run JSON report says would run, by location.

    In a dry run ginkgo reports every spec that would run as passed and every other as
    skipped. Raise DryRunError when `report` is not a list of suite reports with spec reports.
    """
    if not isinstance(report, list) or not report:
        raise DryRunError("the JSON report is not a non-empty list of suite reports")
    entries: list[SpecEntry] = []
    try:
        for suite in report:
            for spec in suite["SpecReports"] or ():
                if spec["LeafNodeType"] != "It" or spec["State"] != "passed":
                    continue
                texts = [*spec["ContainerHierarchyTexts"], spec["LeafNodeText"]]
                location = spec["LeafNodeLocation"]
                entries.append(
                    SpecEntry(
                        file=str(location["FileName"]),
                        line=int(location["LineNumber"]),
                        # ginkgo leaves empty texts out of a spec's full text
                        text=" ".join(str(t) for t in texts if t),
                    )
                )
    except (KeyError, TypeError) as exc:
        raise DryRunError(f"the JSON report lacks a field ginkgo writes: {exc!r}") from exc
    return tuple(sorted(entries))


def problems(
    *,
    specs: Sequence[str],
    skips: Sequence[Skip],
    focused: Iterable[str],
    focused_and_skipped: Iterable[str],
) -> list[str]:
    """Return every disagreement between the two lists and the two dry runs; empty if none.

    `focused` is what a dry run with FOCUS alone would run, `focused_and_skipped` what it runs
    with every skip expression added.
    """
    listed, skipped = set(specs), {s.spec for s in skips}
    found: list[str] = []
    found += [
        f"skip.txt names a spec specs.txt does not list: {s}" for s in sorted(skipped - listed)
    ]
    selected = set(focused)
    found += [f"the focus selects a spec specs.txt lacks: {s}" for s in sorted(selected - listed)]
    found += [f"specs.txt lists a spec the focus misses: {s}" for s in sorted(listed - selected)]
    would_run, expected = set(focused_and_skipped), selected - skipped
    found += [f"a skip expression also skips: {s}" for s in sorted(expected - would_run)]
    found += [f"the skip expressions do not skip: {s}" for s in sorted(would_run - expected)]
    return found


def format_specs(entries: Sequence[SpecEntry], *, kube_version: str) -> str:
    """Return the text of a specs.txt listing `entries`, with the header that says its origin."""
    header = [
        f"# The specs `--ginkgo.focus='{FOCUS}'` selects in e2e.test {kube_version}",
        "# (k8s.io/kubernetes test/e2e), in the order they are defined; written by",
        "# `python -m lab.conformance list`, checked by `python -m lab.conformance check`.",
    ]
    return "\n".join([*header, *(entry.text for entry in entries)]) + "\n"


def dry_run(e2e_test: Path, *, focus: str, skips: Sequence[str]) -> tuple[SpecEntry, ...]:
    """Return the specs a dry run of `e2e_test` would run with these expressions.

    No kubeconfig is given and none is read from the environment: the suite then defaults to
    https://127.0.0.1:6443, which a dry run never contacts (it opens no socket at all).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    }
    with tempfile.TemporaryDirectory(prefix="nodelb-dry-run-") as work:
        report = Path(work) / "report.json"
        args = dry_run_arguments(focus=focus, skips=skips, report=report)
        try:
            result = subprocess.run(
                [str(e2e_test), *args],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=DRY_RUN_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DryRunError(f"{e2e_test} dry run took over {DRY_RUN_TIMEOUT:.0f} s") from exc
        if result.returncode != 0 or not report.is_file():
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise DryRunError(f"{e2e_test} dry run exited {result.returncode}:\n{tail}")
        try:
            parsed = json.loads(report.read_text())
        except json.JSONDecodeError as exc:
            raise DryRunError(f"{e2e_test} wrote a report that is not JSON: {exc}") from exc
    return specs_that_would_run(parsed)


def check(e2e_test: Path) -> int:
    """Check both lists against two dry runs of `e2e_test`; print what differs; 0 if nothing."""
    specs = read_specs(SPECS_FILE.read_text(), source=str(SPECS_FILE))
    skips = read_skips(SKIP_FILE.read_text(), source=str(SKIP_FILE))
    focused = [e.text for e in dry_run(e2e_test, focus=FOCUS, skips=())]
    expressions = [skip_expression(s.spec) for s in skips]
    remaining = [e.text for e in dry_run(e2e_test, focus=FOCUS, skips=expressions)]
    found = problems(specs=specs, skips=skips, focused=focused, focused_and_skipped=remaining)
    subset = read_specs(SUBSET_FILE.read_text(), source=str(SUBSET_FILE))
    if subset:
        chosen = {e.text for e in dry_run(e2e_test, focus=focus_on(subset), skips=())}
        found += [f"subset.txt's focus misses: {s}" for s in sorted(set(subset) - chosen)]
        found += [f"subset.txt's focus also selects: {s}" for s in sorted(chosen - set(subset))]
    for problem in found:
        print(f"conformance: {problem}", file=sys.stderr)
    print(
        f"conformance: the focus selects {len(focused)} specs; skip.txt's expressions leave "
        f"{len(remaining)} to run and skip {len(focused) - len(remaining)}"
    )
    for skip in skips:
        print(f"  skipped: {skip.spec}\n    because {skip.reason}")
    return 1 if found else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.conformance list|check`: print specs.txt, or check both lists."""
    parser = argparse.ArgumentParser(prog="python -m lab.conformance", description=__doc__)
    parser.add_argument("command", choices=("list", "check"))
    args = parser.parse_args(argv)
    try:
        e2e_test = binaries.binary("e2e.test")
        if args.command == "list":
            entries = dry_run(e2e_test, focus=FOCUS, skips=())
            print(format_specs(entries, kube_version=binaries.kube_version()), end="")
            return 0
        return check(e2e_test)
    except (binaries.BinaryMissing, ListError, DryRunError) as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
