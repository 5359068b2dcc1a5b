"""lab.hoststate's shell on the real host: a cgroup in every hierarchy that a process joins
and is killed in, mounts unmounted deepest first, and `realnodes.leftovers` seeing each kind
of leftover until it is gone."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from lab import hoststate, realnodes
from lab.kubelet import NODES_ROOT
from lab.wait import wait_until


@pytest.fixture
def prefix() -> Iterator[str]:
    """Yield a fresh lab prefix; remove whatever the test left under it, whatever happened."""
    name = f"nlbhs{secrets.token_hex(3)}"
    yield name
    cgroup = f"{name}-node-1"
    hoststate.kill_cgroup(cgroup)
    hoststate.unmount_under([NODES_ROOT / name])
    hoststate.remove_cgroup(cgroup)
    shutil.rmtree(NODES_ROOT / name, ignore_errors=True)


def test_a_cgroup_in_every_hierarchy_holds_a_process_until_killed_and_removed(prefix: str) -> None:
    cgroup = f"{prefix}-node-1"
    made = hoststate.create_cgroup(cgroup)
    assert {p.parent for p in made} == set(hoststate.hierarchies())
    script = (
        "for f in "
        + " ".join(str(h / cgroup / "cgroup.procs") for h in hoststate.hierarchies())
        + '; do echo $$ > "$f"; done; sleep 600 & sleep 600; wait'
    )
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:

        def three() -> set[int] | None:
            pids = hoststate.cgroup_pids(cgroup)
            return pids if len(pids) >= 3 else None

        pids = wait_until(three, 10.0, "the shell and its two children in the cgroup")
        assert pids is not None
        assert proc.pid in pids
        assert f"cgroup left: cpu/{cgroup}" in realnodes.leftovers([prefix])
        killed = hoststate.kill_cgroup(cgroup)
        assert pids <= killed
        assert proc.wait(timeout=10) != 0  # killed, not exited
        assert hoststate.cgroup_pids(cgroup) == set()
        hoststate.remove_cgroup(cgroup)
        assert not any(c.endswith(f"/{cgroup}") for c in hoststate.top_level_cgroups())
        assert realnodes.leftovers([prefix]) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_mounts_below_a_node_are_found_and_unmounted_deepest_first(prefix: str) -> None:
    base = NODES_ROOT / prefix / "node-1"
    outer, inner = base / "outer", base / "outer" / "inner"
    outer.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "lab-outer", str(outer)], check=True)
    inner.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "lab-inner", str(inner)], check=True)
    left = realnodes.leftovers([prefix])
    assert f"mount left: {inner}" in left and f"mount left: {outer}" in left
    done = hoststate.unmount_under([base])
    assert done.index(str(inner)) < done.index(str(outer))
    assert realnodes.leftovers([prefix]) == [f"directory left: {NODES_ROOT / prefix}"]
