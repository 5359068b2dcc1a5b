"""Run the `[Feature:LoadBalancer]` e2e specs against the real-node lab (issue #14).

e2e.test runs inside the lab's outside network (`<prefix>-outside`, 198.19.200.10 and
2001:db8:2::10): a client beyond the router, outside the nodes' /24 and /64, which is what the
source-IP specs compare against. It reaches the API server through the router and runs kubectl
(`--kubectl-path`: the lab's, never whatever is first on PATH) for the specs that exec in pods.
Nothing runs in the root namespace but this process and the lab's own processes.

`run_specs` runs a focus against a cluster that is up and returns one SpecResult per spec of
specs.txt; `python -m lab.conformance_run` (`make conformance`) checks both lists by a dry run,
brings a lab up, runs every listed spec (skip.txt's skipped), prints the results, records the
table with `--record`, takes the lab down, and exits 1 unless every spec not skipped passed.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab import binaries, images
from lab import conformance_report as report
from lab.conformance import (
    FOCUS,
    SKIP_FILE,
    SPECS_FILE,
    DryRunError,
    ListError,
    Skip,
    check,
    read_skips,
    read_specs,
    skip_expression,
)
from lab.conformance_report import Outcome, SpecResult, parse_junit
from lab.realnodes import RealNodeCluster
from lab.topology import LabSpec

# The cluster the specs run against: the real-node tier's (three nodes, two zones).
CONFORMANCE_SPEC = LabSpec(
    nodes=3, pods_per_node=0, zones=("zone-a", "zone-b"), with_client=False, with_router=True
)
# ginkgo's own deadline for the whole run: a spec that hangs fails, the run still reports.
DEFAULT_TIMEOUT = 3 * 3600.0
# Beyond ginkgo's deadline, for e2e.test to write its report and exit.
EXIT_GRACE = 120.0


class ConformanceError(RuntimeError):
    """e2e.test could not be run or wrote no report; the message says where its log is."""


@dataclass(frozen=True, slots=True)
class SpecRun:
    """One run: every listed spec's result, and where e2e.test's log and JUnit are."""

    results: tuple[SpecResult, ...]
    log: Path
    junit: Path
    seconds: float

    def not_passed(self, wanted: Sequence[str]) -> tuple[SpecResult, ...]:
        """Return the results of the `wanted` specs that did not pass (failed, not run, or
        skipped at run time)."""
        want = set(wanted)
        return tuple(r for r in self.results if r.spec in want and r.outcome is not Outcome.PASSED)


def e2e_arguments(
    *,
    kubeconfig: Path,
    kubectl: Path,
    report_dir: Path,
    focus: str,
    skips: Sequence[Skip],
    timeout: float,
) -> list[str]:
    """Return e2e.test's arguments for a run of `focus` without `skips`, JUnit in report_dir."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--kubectl-path={kubectl}",
        f"--report-dir={report_dir}",
        "--ginkgo.no-color",
        "--ginkgo.v",
        f"--ginkgo.timeout={int(timeout)}s",
        f"--ginkgo.focus={focus}",
        *(f"--ginkgo.skip={skip_expression(s.spec)}" for s in skips),
    ]


def run_specs(
    cluster: RealNodeCluster,
    *,
    focus: str = FOCUS,
    report_dir: Path,
    timeout: float = DEFAULT_TIMEOUT,
) -> SpecRun:
    """Run e2e.test with `focus` (skip.txt's specs skipped) from the cluster's outside network.

    Returns the result of every spec of specs.txt (NOT_RUN for those outside `focus`). Raises
    ConformanceError when e2e.test wrote no JUnit (it could not start, or was killed).
    """
    specs = read_specs(SPECS_FILE.read_text(), source=str(SPECS_FILE))
    skips = read_skips(SKIP_FILE.read_text(), source=str(SKIP_FILE))
    report_dir.mkdir(parents=True, exist_ok=True)
    log = report_dir / "e2e.log"
    argv = [
        "ip",
        "netns",
        "exec",
        cluster.outside.ns,
        str(binaries.binary("e2e.test")),
        *e2e_arguments(
            kubeconfig=cluster.controlplane.admin_kubeconfig(),
            kubectl=binaries.binary("kubectl"),
            report_dir=report_dir,
            focus=focus,
            skips=skips,
            timeout=timeout,
        ),
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        # cwd: the suite writes what it dumps there, not into the caller's directory.
        proc = subprocess.Popen(
            argv, cwd=report_dir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout + EXIT_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()  # its own session: e2e.test and the kubectl it runs
            proc.wait()
    seconds = time.monotonic() - started
    junit = report_dir / "junit_01.xml"
    if not junit.is_file():
        raise ConformanceError(f"e2e.test exited {proc.returncode} without a JUnit; see {log}")
    results = parse_junit(junit.read_text(), specs=specs, skips=skips)
    return SpecRun(results, log, junit, seconds)


def run_in_new_lab(
    *, focus: str = FOCUS, timeout: float = DEFAULT_TIMEOUT, workdir: Path | None = None
) -> SpecRun:
    """Bring a real-node lab up, run `focus` against it, take it down (also on failure)."""
    base = workdir or Path(tempfile.mkdtemp(prefix="nodelb-conformance-"))
    with RealNodeCluster(CONFORMANCE_SPEC, base / "lab") as cluster:
        return run_specs(cluster, focus=focus, report_dir=base / "report", timeout=timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every listed spec against a new real-node lab; see the module's doc."""
    parser = argparse.ArgumentParser(prog="python -m lab.conformance_run", description=__doc__)
    parser.add_argument("--record", type=Path, help="write the per-spec table here")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="ginkgo's, in s")
    args = parser.parse_args(argv)
    try:
        if check(binaries.binary("e2e.test")) != 0:
            return 1
        specs = read_specs(SPECS_FILE.read_text(), source=str(SPECS_FILE))
        skipped = {s.spec for s in read_skips(SKIP_FILE.read_text(), source=str(SKIP_FILE))}
    except (binaries.BinaryMissing, ListError, DryRunError) as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 1
    started = time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run = run_in_new_lab(timeout=args.timeout)
    wall = time.monotonic() - started
    for result in run.results:
        note = f" ({result.note})" if result.note else ""
        print(f"{result.outcome.value:8} {result.spec}{note}")
    print(f"{report.summary(run.results)}\ne2e.test log: {run.log}\nJUnit: {run.junit}")
    if args.record is not None:
        record = report.RunRecord(
            date=date,
            kube_version=binaries.kube_version(),
            nodelb_image=next(i.reference for i in images.lab_images() if "nodelb" in i.reference),
            command="make conformance",
            wall_seconds=wall,
        )
        args.record.write_text(report.markdown(run.results, record))
        print(f"recorded in {args.record}")
    return 1 if run.not_passed([s for s in specs if s not in skipped]) else 0


if __name__ == "__main__":
    sys.exit(main())
