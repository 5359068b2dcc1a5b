"""End-to-end fixtures: a real etcd + kube-apiserver running inside a lab namespace.

`cp_host` says where the control plane lives (a namespace and its lab IPv4 address);
`controlplane` starts etcd and kube-apiserver there for the whole session. When any test
fails, the last lines of both logs are printed at the end of the run (the files are kept).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from agent.lab import netns
from agent.lab.controlplane import ControlPlane, tail
from agent.lab.topology import CONTROLPLANE4, CONTROLPLANE6, Host

LOGS = pytest.StashKey[list[Path]]()
FAILED = pytest.StashKey[bool]()
LOG_TAIL_LINES = 50


@pytest.fixture(scope="session")
def cp_host() -> Iterator[Host]:
    """Yield the lab host the control plane runs on: its own namespace, 198.18.0.2 on lo.

    To move the control plane onto a full lab segment, yield `lab.controlplane` instead.
    """
    ns = f"nlbcp{os.getpid()}"
    host = Host("controlplane", ns, CONTROLPLANE4, CONTROLPLANE6, "lo")
    netns.create(ns)
    try:
        netns.run(ns, ["ip", "addr", "add", f"{host.ip4}/32", "dev", "lo"])
        yield host
    finally:
        netns.delete(ns)


@pytest.fixture(scope="session")
def controlplane(
    cp_host: Host, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[ControlPlane]:
    """Yield a started control plane on `cp_host`; stopped (by PID) at the end of the session."""
    cp = ControlPlane(cp_host.ns, cp_host.ip4, tmp_path_factory.mktemp("controlplane"))
    pytestconfig.stash.setdefault(LOGS, []).extend(cp.logs)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


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
    """Print the tail of every control-plane log when the session had a failure."""
    logs = config.stash.get(LOGS, [])
    if not logs or not config.stash.get(FAILED, False):
        return
    terminalreporter.section("control plane logs")
    for log in logs:
        terminalreporter.write_line(tail(log, LOG_TAIL_LINES))
