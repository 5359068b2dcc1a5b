"""The network-namespace lab: nodes, pods, a client and a control plane on one bridge segment.

Used by every test tier and by `nodelb lab`. Nothing here touches the root network namespace
beyond creating and deleting named namespaces; every address lives inside the lab.
"""
