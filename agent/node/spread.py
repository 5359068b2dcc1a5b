"""The spread table of an eTP=Local frontend: which node serves each hash bucket (pure).

With `localTraffic: spread` the holder of a Local Service's IP hashes every new flow into one
of `BUCKETS` buckets (nft `jhash` of the client address and port, seed `HASH_SEED`) and sends
the flow to the node that owns the bucket: itself (the Local DNAT path) or a peer, through
the tunnel (agent/dataplane/tunnel.py). The table is a pure function of the nodes' ready local
endpoint counts, so every agent computes the same one and a new holder sends each existing
flow to the node that already serves it.

The fill is Maglev's (Eisenbud et al., NSDI 2016, section 3.4): every node walks its own
permutation of the buckets (offset and skip from a hash of its name) and takes the next free
bucket on its turn; a node with more endpoints gets proportionally more turns. When a node
leaves, the others mostly keep their buckets (minimal disruption), which the unit tests
measure.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from typing import Protocol

from agent.model.desired_state import Endpoint
from agent.model.tunnel import BUCKETS, HASH_SEED, LOCAL_TRAFFIC_ANNOTATION, LocalTraffic

__all__ = [
    "BUCKETS",
    "HASH_SEED",
    "ModeReason",
    "bucket_table",
    "local_traffic_mode",
    "peer_buckets",
    "spread_weights",
]


def _hash(text: str, salt: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, salt=salt).digest(), "big")


def bucket_table(weights: Mapping[str, int], size: int = BUCKETS) -> tuple[str, ...]:
    """Return the node name owning each of `size` buckets, weighted by `weights`.

    `weights` maps node names to their ready local endpoint counts; names with a count of zero
    or less own no bucket. Empty result when no node has a positive count. The result depends
    only on the (name, count) pairs, never on the mapping's order. `size` must be a prime
    (each node's permutation then visits every bucket) larger than the number of nodes.
    """
    nodes = sorted(n for n, w in weights.items() if w > 0)
    if not nodes:
        return ()
    if size <= len(nodes):
        raise ValueError(f"{size} buckets cannot be shared by {len(nodes)} nodes")
    offset = [_hash(n, b"offset") % size for n in nodes]
    skip = [_hash(n, b"skip") % (size - 1) + 1 for n in nodes]
    top = max(weights[n] for n in nodes)
    credit = [0.0] * len(nodes)
    step = [0] * len(nodes)
    owner: list[str | None] = [None] * size
    filled = 0
    while filled < size:
        for i, name in enumerate(nodes):
            credit[i] += weights[name] / top
            while credit[i] >= 1.0 and filled < size:
                credit[i] -= 1.0
                while True:
                    b = (offset[i] + step[i] * skip[i]) % size
                    step[i] += 1
                    if owner[b] is None:
                        break
                owner[b] = name
                filled += 1
    return tuple(n for n in owner if n is not None)


class _Counted(Protocol):
    @property
    def node_name(self) -> str | None: ...
    @property
    def ready(self) -> bool: ...
    @property
    def target(self) -> Endpoint: ...


def spread_weights(endpoints: Iterable[_Counted]) -> dict[str, int]:
    """Return each node's number of distinct ready endpoints (address, port) among `endpoints`.

    The weight of a node in the bucket table: its ready local endpoints, the set kube-proxy
    serves Local traffic with on that node. Endpoints without a node and not-ready ones
    (a node with only terminating endpoints gets no new flows) do not count.
    """
    seen: dict[str, set[Endpoint]] = {}
    for ep in endpoints:
        if ep.ready and ep.node_name:
            seen.setdefault(ep.node_name, set()).add(ep.target)
    return {name: len(targets) for name, targets in seen.items()}


def peer_buckets(table: tuple[str, ...], me: str) -> tuple[tuple[int, str], ...]:
    """Return (bucket, node) for every bucket of `table` another node than `me` owns.

    The buckets `me` owns are absent: their flows take this node's own Local path. Empty when
    `table` is empty or `me` owns every bucket.
    """
    return tuple((b, name) for b, name in enumerate(table) if name != me)


class ModeReason(enum.StrEnum):
    """Why a Service's Local traffic is served the way `local_traffic_mode` says."""

    CLUSTER_DEFAULT = "ClusterDefault"
    ANNOTATION = "Annotation"
    INVALID_ANNOTATION = "InvalidAnnotation"


def local_traffic_mode(
    *, annotations: tuple[tuple[str, str], ...], default: LocalTraffic
) -> tuple[LocalTraffic, ModeReason]:
    """Return how an eTP=Local Service's traffic is served, and why.

    The Service's `nodelb.io/local-traffic` annotation (`spread` or `holder`, exactly) wins
    over the agent's `localTraffic`; any other value is ignored with INVALID_ANNOTATION, so a
    typo keeps the cluster's choice instead of failing the Service.
    """
    for key, value in annotations:
        if key != LOCAL_TRAFFIC_ANNOTATION:
            continue
        try:
            return LocalTraffic(value), ModeReason.ANNOTATION
        except ValueError:
            return default, ModeReason.INVALID_ANNOTATION
    return default, ModeReason.CLUSTER_DEFAULT
