"""The spread tunnel device and its peers, through rtnetlink (pyroute2): the imperative shell.

`program(ipr, node, peers)` makes the calling thread's network namespace hold exactly:
- one VXLAN device `nlb-vx` (VNI, port 4789, `local` = this node's segment IPv4, no learning,
  MTU = underlay - 50, MAC `vtep_mac(node)`), up, with reverse-path filtering off (a
  tunnelled packet's source is the client, whose route leaves through the segment);
- per peer a permanent FDB entry (peer's vtep MAC -> peer's segment IPv4) and two permanent
  neighbour entries on the device (peer's IPv4 and `hop6(peer)` -> peer's vtep MAC): what the
  holder's `fwd ip to PEER device nlb-vx` (rules/spread.py) resolves;
- no entry for a node that is no longer a peer.
`remove(ipr)` deletes the device (with it every FDB and neighbour entry). Nothing here decides
who is a peer; the caller passes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from agent.model import tunnel as T

NUD_PERMANENT = 0x80
NTF_SELF = 0x02
AF_BRIDGE = 7
_ENODEV = 19
_ENOENT = 2


def _index(ipr: Any, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return int(found[0]) if found else None


def _mtu(ipr: Any, index: int) -> int:
    return int(ipr.get_links(index)[0].get_attr("IFLA_MTU"))


def _device_of(ipr: Any, node: IPv4Address) -> int:
    """Return the index of the interface holding `node` (the segment underlay)."""
    for msg in ipr.get_addr(family=2):
        if msg.get_attr("IFA_LOCAL") == str(node):
            return int(msg["index"])
    raise LookupError(f"no interface holds {node}: cannot anchor the tunnel")


def _sysctl(name: str, value: str) -> None:
    Path("/proc/sys", *name.split(".")).write_text(value)


def program(ipr: Any, node: IPv4Address, peers: Iterable[IPv4Address]) -> int:
    """Make the tunnel device and its peer entries exactly as the module docstring says.

    Returns the device's index. Raises LookupError when no interface holds `node`, ValueError
    for a peer that cannot be a tunnel endpoint; nothing is half-removed on an error (adds
    and replaces only, stale entries removed last)."""
    wanted = sorted(set(peers) - {node})
    for peer in wanted:
        T.check_peer(peer)
    underlay = _device_of(ipr, node)
    mtu = _mtu(ipr, underlay) - T.OVERHEAD
    index = _index(ipr, T.IFNAME)
    if index is None:
        ipr.link(
            "add",
            ifname=T.IFNAME,
            kind="vxlan",
            vxlan_id=T.VNI,
            vxlan_port=T.VXLAN_PORT,
            vxlan_local=str(node),
            vxlan_link=underlay,
            vxlan_learning=0,
        )
        index = _index(ipr, T.IFNAME)
        assert index is not None
    ipr.link("set", index=index, address=T.vtep_mac(node), mtu=mtu)
    _sysctl(f"net.ipv4.conf.{T.IFNAME}.rp_filter", "0")
    with contextlib.suppress(FileNotFoundError):  # a kernel without IPv6: IPv4 spreads alone
        _sysctl(f"net.ipv6.conf.{T.IFNAME}.disable_ipv6", "0")
    ipr.link("set", index=index, state="up")
    for peer in wanted:
        mac = T.vtep_mac(peer)
        ipr.fdb(
            "replace", ifindex=index, lladdr=mac, dst=str(peer), state=NUD_PERMANENT, flags=NTF_SELF
        )
        for hop in (str(peer), str(T.hop6(peer))):
            ipr.neigh("replace", ifindex=index, dst=hop, lladdr=mac, state=NUD_PERMANENT)
    _remove_stale(ipr, index, {T.vtep_mac(p) for p in wanted}, wanted)
    return index


def _remove_stale(ipr: Any, index: int, macs: set[str], peers: list[IPv4Address]) -> None:
    keep = {str(p) for p in peers} | {str(T.hop6(p)) for p in peers}
    for msg in ipr.get_neighbours(ifindex=index):
        dst = msg.get_attr("NDA_DST")
        if dst is not None and dst not in keep and msg["state"] & NUD_PERMANENT:
            ipr.neigh("del", ifindex=index, dst=dst, family=msg["family"])
    for msg in ipr.fdb("dump", ifindex=index):
        mac = msg.get_attr("NDA_LLADDR")
        if msg["ifindex"] != index or mac is None or mac in macs or not mac.startswith("02:6e:"):
            continue
        try:
            ipr.fdb("del", ifindex=index, lladdr=mac, dst=msg.get_attr("NDA_DST"), flags=NTF_SELF)
        except NetlinkError as exc:
            if exc.code != _ENOENT:
                raise


def remove(ipr: Any) -> bool:
    """Delete the tunnel device; return False if there was none."""
    index = _index(ipr, T.IFNAME)
    if index is None:
        return False
    try:
        ipr.link("del", index=index)
    except NetlinkError as exc:
        if exc.code == _ENODEV:
            return False
        raise
    return True
