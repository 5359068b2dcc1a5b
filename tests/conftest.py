"""Session-wide guard: the test run must leave the root network namespace exactly as it was.

Kernel and e2e tests build their own namespaces; this check fails the session if any nft rule,
address, route or link in the root namespace differs at the end, or if a namespace this
process created is still there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lab import netns
from tests import rootns


@pytest.fixture(scope="session", autouse=True)
def root_namespace_unchanged() -> Iterator[None]:
    """Snapshot the root namespace before the session and assert it is unchanged after."""
    if os.geteuid() != 0:
        yield
        return
    before = rootns.take()
    yield
    diffs = before.differences(rootns.take())
    if netns.CREATED:
        diffs.append(f"network namespaces left behind: {sorted(netns.CREATED)}")
    assert not diffs, "the test run changed the root network namespace:\n" + "\n".join(diffs)
