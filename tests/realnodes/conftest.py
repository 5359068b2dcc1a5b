"""The real-node tier's cluster: kubelets, containerd, the real controllers, nodelb from deploy/.

One cluster per test module (bringing it up costs about a minute): three
nodes in two zones (node-1 and node-3 in zone-a, node-2 in zone-b), a router and an outside
client. Tests that break something (a rolling update, a node powered off) run last, in the
order of the test module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.realnodes import RealNodeCluster
from lab.topology import LabSpec
from tests.conftest import LOGS

REAL_SPEC = LabSpec(
    nodes=3,
    pods_per_node=0,
    zones=("zone-a", "zone-b"),
    with_client=False,
    with_router=True,
)


@pytest.fixture(scope="module")
def real_cluster(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[RealNodeCluster]:
    """Yield the running real-node lab with nodelb installed; always torn down."""
    cluster = RealNodeCluster(REAL_SPEC, tmp_path_factory.mktemp("realnodes"))
    pytestconfig.stash.setdefault(LOGS, []).extend(cluster.logs)
    with cluster:
        yield cluster
