"""The network-namespace lab: nodes, pods, a client and a control plane on one bridge segment.

Used by every test tier, the benchmarks and `nodelb lab` (from a checkout; the lab is not part
of the wheel or the image). Nothing here touches the root network namespace beyond creating and
deleting named namespaces; every address lives inside the lab.
"""
