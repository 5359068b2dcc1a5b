"""Fixtures for the kernel tier: a network-namespace lab that is always torn down.

`lab` is a fresh 2-node × 2-pod lab (client and control plane included) per test; it is
removed when the test ends, whether it passed, failed or raised. `make_lab` builds labs from
any LabSpec and removes every one of them at the end of the test. `speakers` starts and
collects the VRRP speakers of a test and stops every one by PID afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab.topology import Lab, LabSpec
from lab.vrrp_lab import Speakers


@pytest.fixture
def make_lab(tmp_path: Path) -> Iterator[Callable[[LabSpec], Lab]]:
    """Yield a factory that builds (`up()`) a Lab from a spec; every lab is torn down after."""
    if os.geteuid() != 0:
        pytest.skip("kernel tests need root (they create network namespaces)")
    labs: list[Lab] = []

    def build(spec: LabSpec) -> Lab:
        lab = Lab(spec, tmp_path / f"lab{len(labs)}")
        labs.append(lab)  # before up(): a lab whose up() failed is still torn down
        lab.up()
        return lab

    try:
        yield build
    finally:
        errors = []
        for lab in reversed(labs):
            try:
                lab.down()
            except Exception as exc:  # keep tearing down the others, report all at the end
                errors.append(f"{lab.prefix}: {exc!r}")
        assert not errors, f"lab teardown failed: {errors}"


@pytest.fixture
def lab(make_lab: Callable[[LabSpec], Lab]) -> Lab:
    """Return a running two-node lab (two pods per node, client, control plane)."""
    return make_lab(LabSpec())


@pytest.fixture
def speakers() -> Iterator[Speakers]:
    """Yield the test's speakers (`start` one on a node, or `append`); all stopped by PID after."""
    started = Speakers()
    try:
        yield started
    finally:
        started.stop_all()
