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

import hashlib
from collections.abc import Mapping

BUCKETS = 61
"""Buckets per spread frontend: a prime (Maglev's permutations need one). 61 keeps each
frontend at most 60 map elements and every node's share within one bucket (1.6 %) of its
weight."""

HASH_SEED = 0x4E4C4201
"""The jhash seed of the bucket choice. Fixed, so every holder picks the same bucket."""


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


def bucket_marks(table: tuple[str, ...], marks: Mapping[str, int], me: str) -> tuple[int, ...]:
    """Return, per bucket of `table`, the packet mark that sends its flows to their node.

    0 means this node (`me`) serves the bucket itself. `marks` maps every other node in the
    table to its tunnel mark (agent/dataplane/tunnel.py: `peer_mark`); a node missing there
    cannot be reached, so its buckets fall back to this node, whose Local path serves them
    (never a peer that is not in the tunnel). Empty when `table` is empty.
    """
    return tuple(0 if name == me else marks.get(name, 0) for name in table)
