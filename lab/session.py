"""The persistent lab behind `nodelb lab up | down | status | demo`.

One lab at a time, under a fixed namespace prefix, described by a state file in /run (tmpfs:
gone after a reboot, like the namespaces themselves). `up` leaves the lab running when the
command exits; `down` removes it by its namespaces, which stops every process inside them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lab import netns
from lab.cluster import ClusterLab
from lab.realnodes import RealNodeCluster, teardown_recorded
from lab.topology import LabSpec, remove_stale

PREFIX = "nlblab"
STATE_DIR = Path("/run/nodelb-lab")
STATE_FILE = STATE_DIR / "state.json"
WORKDIR = STATE_DIR / "work"


class SessionError(RuntimeError):
    """The persistent lab is not in the state the command needs."""


def is_up() -> bool:
    """Return True when a persistent lab is recorded or any of its namespaces exists."""
    if STATE_FILE.exists():
        return True
    return netns.NETNS_DIR.exists() and any(
        e.name.startswith(f"{PREFIX}-") for e in netns.NETNS_DIR.iterdir()
    )


def up(
    *,
    nodes: int = 3,
    pods_per_node: int = 2,
    kube_proxy: bool = True,
    agent_config: dict[str, Any] | None = None,
) -> ClusterLab:
    """Build the persistent lab cluster, record it, detach it, and return it."""
    _fresh_workdir()
    spec = LabSpec(nodes=nodes, pods_per_node=pods_per_node, prefix=PREFIX)
    cluster = ClusterLab(spec, WORKDIR, kube_proxy=kube_proxy, agent_config=agent_config)
    _up_and_record(cluster)
    cluster.lab.detach()
    return cluster


def up_real_nodes(*, nodes: int = 3) -> RealNodeCluster:
    """Build the persistent real-node lab (kubelets, containerd, nodelb from deploy/), record
    it (with what `down` must restore on the host), detach it, and return it."""
    _fresh_workdir()
    spec = LabSpec(nodes=nodes, pods_per_node=0, prefix=PREFIX, with_client=False, with_router=True)
    cluster = RealNodeCluster(spec, WORKDIR)
    _up_and_record(cluster)
    cluster.detach()
    return cluster


def _fresh_workdir() -> None:
    """Refuse when a lab is up; else start from an empty work directory."""
    if is_up():
        raise SessionError("a lab is already up: run `nodelb lab down` first")
    if WORKDIR.exists():
        shutil.rmtree(WORKDIR)


def _up_and_record(cluster: ClusterLab | RealNodeCluster) -> None:
    """Bring `cluster` up and write its state file; tear it down if the state is not saved."""
    cluster.up()
    try:
        save(cluster)
    except BaseException:
        cluster.down()
        raise


def save(cluster: ClusterLab | RealNodeCluster) -> None:
    """Write the state file describing `cluster` (namespaces, addresses, PIDs, kubeconfig)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state = cluster.to_json()
    state["namespaces"] = cluster.lab.namespaces
    STATE_FILE.write_text(json.dumps(state, indent=2, default=str) + "\n")


def status() -> dict[str, Any]:
    """Return the recorded state of the persistent lab; raises SessionError when none is up."""
    if not STATE_FILE.exists():
        raise SessionError("no lab is up: run `nodelb lab up` or `make demo`")
    state: dict[str, Any] = json.loads(STATE_FILE.read_text())
    state["alive"] = {ns: netns.exists(ns) for ns in state.get("namespaces", [])}
    return state


def down() -> list[str]:
    """Remove the persistent lab: every recorded namespace (and any left with its prefix)."""
    removed: list[str] = []
    if STATE_FILE.exists():
        state = json.loads(STATE_FILE.read_text())
        if "real_nodes" in state:  # nodes first: their processes live in the namespaces
            teardown_recorded(state["real_nodes"])
        for ns in reversed(state.get("namespaces", [])):
            if netns.exists(ns):
                netns.delete(ns)
                removed.append(ns)
        STATE_FILE.unlink()
    removed += remove_stale(PREFIX)
    return removed
