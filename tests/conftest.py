"""Session-wide guard: the test run must leave the root network namespace exactly as it was.

Kernel and e2e tests build their own namespaces; this check fails the session if any nft rule,
address, route or link in the root namespace differs at the end, or if a namespace this
process created is still there; and, for the real-node labs it started, if a mount, directory
or cgroup of theirs is left or a sysctl kubelet rewrites has not been restored.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from lab import hoststate, netns, realnodes
from lab.controlplane import tail
from tests import rootns

# Log files of the labs a session started (control plane, kube-proxy, agents, kubelets...):
# their tails are printed at the end of a run in which any test failed.
LOGS = pytest.StashKey[list[Path]]()
FAILED = pytest.StashKey[bool]()
LOG_TAIL_LINES = 50


@pytest.fixture(scope="session", autouse=True)
def root_namespace_unchanged() -> Iterator[None]:
    """Snapshot the root namespace before the session and assert it is unchanged after."""
    if os.geteuid() != 0:
        yield
        return
    before = rootns.take()
    sysctls = hoststate.read_sysctls(hoststate.KUBELET_SYSCTLS)
    yield
    diffs = before.differences(rootns.take())
    if netns.CREATED:
        diffs.append(f"network namespaces left behind: {sorted(netns.CREATED)}")
    # What real-node labs of this run left on the host: mounts, directories, cgroups, and the
    # sysctls kubelet rewrites (host-wide: compared only when this run started such a lab).
    diffs += realnodes.leftovers()
    if realnodes.STARTED:
        after = hoststate.read_sysctls(hoststate.KUBELET_SYSCTLS)
        diffs += [
            f"sysctl {k} was {v}, is {after.get(k)}"
            for k, v in sysctls.items()
            if after.get(k) != v
        ]
    assert not diffs, "the test run changed the root network namespace:\n" + "\n".join(diffs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember that a test failed (in any phase) so the summary prints the logs."""
    report = yield
    if report.failed:
        item.config.stash[FAILED] = True
    return report


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """Print the tail of every control-plane, kube-proxy and agent log after a failure."""
    logs = config.stash.get(LOGS, [])
    if not logs or not config.stash.get(FAILED, False):
        return
    terminalreporter.section("lab logs")
    for log in logs:
        terminalreporter.write_line(tail(log, LOG_TAIL_LINES))
