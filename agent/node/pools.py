"""The blocks a LoadBalancerIPPool object lets agents serve (pure; the pools reflector's parser).

An agent needs only a pool's networks (what it may hold, and the externalIP check of
CVE-2020-8554), never the allocation rules. It takes them from the object's spec when the
spec parses, else from `status.addressesInForce`, where the controller keeps the blocks of the
version in force (the previous valid one while an edit is refused), so a broken edit does
not make every agent drop the addresses its Services still use. An object with neither
serves nothing. Overlaps between pools are the controller's to judge: an agent serves the
union, and the controller hands out only what is in force.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from agent.config import Pool
from agent.model.config_values import ConfigError
from agent.model.net import IPNetwork
from agent.model.pools import Forbidden, parse_pool


def pool_of_object(obj: Mapping[str, Any]) -> Pool:
    """Return the name and servable networks of a raw LoadBalancerIPPool."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        try:
            pool = parse_pool(spec, name=name, where=name, forbidden=Forbidden())
        except ConfigError:
            pass
        else:
            return Pool(name=name, networks=pool.networks)
    status = obj.get("status")
    blocks = status.get("addressesInForce") if isinstance(status, Mapping) else None
    networks: list[IPNetwork] = []
    for text in blocks if isinstance(blocks, list) else []:
        try:
            networks.append(ipaddress.ip_network(str(text), strict=True))
        except ValueError:
            continue  # not the controller's writing: serve nothing of it
    return Pool(name=name, networks=tuple(networks))
