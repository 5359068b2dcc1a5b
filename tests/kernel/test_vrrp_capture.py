"""Real keepalived 2.2.7 adverts, captured on the lab wire, against agent.announce.vrrp.codec.

keepalived (VRRP only, `vrrp_version 3`, `advert_int 0.1`, one IPv4 and one IPv6 instance)
runs in node-1; tcpdump in node-2 writes every IP protocol 112 frame it receives to a pcap
file. Every captured advert must decode with the codec's default checksum mode and re-encode
to the same bytes; IPv4 adverts must *fail* in VRRPV2_COMPAT mode, which is the evidence that
keepalived's default checksum covers the IPv4 pseudo-header. Stopping keepalived (SIGTERM to
its process group) makes it resign with priority-0 adverts, which are checked the same way.

Both processes are started through the lab (so teardown stops them even on failure) and
stopped by PID; nothing runs in or is programmed into the root namespace.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

from agent.announce.vrrp.codec import (
    DEFAULT_CHECKSUM_MODE,
    ChecksumMode,
    DecodeReason,
    VrrpDecodeError,
    decode,
    encode,
)
from agent.model.net import IPAddress
from lab import netns
from lab.topology import Lab, LabNode, LabSpec
from lab.wait import GiveUp, wait_until

pytestmark = pytest.mark.kernel

KEEPALIVED = "/usr/sbin/keepalived"
TCPDUMP = "/usr/bin/tcpdump"
VRID = 51
PRIORITY = 150
VIPS4 = (IPv4Address("198.18.0.200"), IPv4Address("198.18.0.201"))
VIP6 = IPv6Address("2001:db8::200")
GROUP4 = IPv4Address("224.0.0.18")
GROUP6 = IPv6Address("ff02::12")
TIMEOUT = 30.0  # generous: the machine is busy; nothing here asserts a duration

CONFIG = """\
global_defs {{
    router_id capture
    vrrp_version 3
    vrrp_garp_master_repeat 1
    vrrp_garp_master_refresh 0
}}
vrrp_instance VI_4 {{
    state BACKUP
    interface eth0
    virtual_router_id {vrid}
    priority {priority}
    advert_int 0.1
    virtual_ipaddress {{
        {vip4a}/32 dev eth0
        {vip4b}/32 dev eth0
    }}
}}
vrrp_instance VI_6 {{
    state BACKUP
    interface eth0
    virtual_router_id {vrid}
    priority {priority}
    advert_int 0.1
    virtual_ipaddress {{
        {vip6}/128 dev eth0
    }}
}}
"""


@dataclass(frozen=True, slots=True)
class Captured:
    """One VRRP message off the wire with the IP-layer facts the codec does not see."""

    family: int
    src: IPAddress
    dst: IPAddress
    ttl: int  # IPv4 TTL or IPv6 hop limit
    payload: bytes


def read_pcap(path: Path) -> list[Captured]:
    """Return the IPv4/IPv6 protocol-112 packets in a (possibly still growing) pcap file."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < 24:
        return []
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise GiveUp(f"{path} is not a pcap file (magic {magic.hex()})")
    (linktype,) = struct.unpack_from(f"{endian}I", data, 20)
    if linktype != 1:
        raise GiveUp(f"{path}: link type {linktype}, expected Ethernet (1)")
    out: list[Captured] = []
    offset = 24
    while offset + 16 <= len(data):
        caplen, wirelen = struct.unpack_from(f"{endian}II", data, offset + 8)
        frame = data[offset + 16 : offset + 16 + caplen]
        offset += 16 + caplen
        if len(frame) < caplen:  # a record still being written
            break
        assert caplen == wirelen, "tcpdump truncated a frame"
        ethertype = int.from_bytes(frame[12:14], "big")
        ip = frame[14:]
        if ethertype == 0x0800 and ip[9] == 112:
            ihl = (ip[0] & 0x0F) * 4
            total = int.from_bytes(ip[2:4], "big")
            out.append(
                Captured(4, IPv4Address(ip[12:16]), IPv4Address(ip[16:20]), ip[8], ip[ihl:total])
            )
        elif ethertype == 0x86DD and ip[6] == 112:
            length = int.from_bytes(ip[4:6], "big")
            out.append(
                Captured(
                    6, IPv6Address(ip[8:24]), IPv6Address(ip[24:40]), ip[7], ip[40 : 40 + length]
                )
            )
    return out


def priorities(packets: list[Captured], family: int) -> list[int]:
    return [p.payload[2] for p in packets if p.family == family]


def start_tcpdump(lab: Lab, node: LabNode, pcap: Path) -> None:
    argv = [TCPDUMP, "-i", node.ifname, "-n", "-U", "-s", "0", "-Z", "root", "-w", str(pcap)]
    argv.append("ip proto 112 or ip6 proto 112")
    proc = lab.spawn(node.ns, argv, log_name=f"tcpdump-{node.name}")

    def listening() -> bool:
        if proc.poll() is not None:
            raise GiveUp(f"tcpdump exited {proc.returncode}: {lab.log_of(proc)}")
        return "listening on" in lab.log_of(proc)

    wait_until(listening, TIMEOUT, f"tcpdump listening in {node.name}")


def keepalived_config(workdir: Path) -> Path:
    workdir.mkdir(parents=True)
    conf = workdir / "keepalived.conf"
    conf.write_text(
        CONFIG.format(vrid=VRID, priority=PRIORITY, vip4a=VIPS4[0], vip4b=VIPS4[1], vip6=VIP6)
    )
    return conf


@pytest.mark.skipif(
    not (os.access(KEEPALIVED, os.X_OK) and os.access(TCPDUMP, os.X_OK)),
    reason="keepalived or tcpdump is not installed",
)
def test_keepalived_adverts_decode_with_the_default_mode_and_reencode_byte_for_byte(
    make_lab: Callable[[LabSpec], Lab], tmp_path: Path
) -> None:
    lab = make_lab(LabSpec(nodes=2, pods_per_node=0, with_controlplane=False, with_client=False))
    speaker, listener = lab.node("node-1"), lab.node("node-2")
    pcap = tmp_path / "vrrp.pcap"
    start_tcpdump(lab, listener, pcap)

    d = tmp_path / "keepalived"
    conf = keepalived_config(d)
    check = netns.run(speaker.ns, [KEEPALIVED, "--config-test", "-f", str(conf)], check=False)
    assert check.returncode == 0, f"keepalived rejects its config: {check.stderr}"
    argv = [
        KEEPALIVED, "--dont-fork", "--log-console", "--log-detail", "--no-syslog", "--vrrp",
        "--dont-respawn", "-f", str(conf),
        "-p", str(d / "keepalived.pid"), "-r", str(d / "vrrp.pid"),
        "-c", str(d / "checkers.pid"), "-b", str(d / "bfd.pid"),
    ]  # fmt: skip
    keepalived = lab.spawn(speaker.ns, argv, log_name="keepalived")

    def adverts_of_both_families() -> bool:
        if keepalived.poll() is not None:
            raise GiveUp(f"keepalived exited {keepalived.returncode}: {lab.log_of(keepalived)}")
        packets = read_pcap(pcap)
        return all(priorities(packets, f).count(PRIORITY) >= 3 for f in (4, 6))

    wait_until(adverts_of_both_families, TIMEOUT, "three IPv4 and three IPv6 keepalived adverts")
    lab.stop(keepalived)  # SIGTERM by PID: keepalived resigns with priority-0 adverts
    wait_until(
        lambda: all(0 in priorities(read_pcap(pcap), f) for f in (4, 6)),
        TIMEOUT,
        "keepalived's priority-0 resignation adverts",
    )

    packets = read_pcap(pcap)
    link_local = [p.src for p in packets if p.family == 6]
    assert all(a.is_link_local for a in link_local), link_local
    for p in packets:
        expected_dst = GROUP4 if p.family == 4 else GROUP6
        assert (p.dst, p.ttl) == (expected_dst, 255), p
        if p.family == 4:
            assert p.src == speaker.ip4, p
        advert = decode(p.payload, src=p.src, dst=p.dst, family=p.family)
        assert (advert.vrid, advert.max_adver_int) == (VRID, 10), advert
        assert advert.priority in (PRIORITY, 0), advert
        assert advert.addresses == (VIPS4 if p.family == 4 else (VIP6,)), advert
        reencoded = encode(advert, src=p.src, dst=p.dst, checksum_mode=DEFAULT_CHECKSUM_MODE)
        assert reencoded == p.payload, f"{reencoded.hex()} != {p.payload.hex()}"
        if p.family == 4:
            # The evidence: keepalived's IPv4 checksum covers the pseudo-header.
            with pytest.raises(VrrpDecodeError) as refused:
                decode(
                    p.payload,
                    src=p.src,
                    dst=p.dst,
                    family=4,
                    checksum_mode=ChecksumMode.VRRPV2_COMPAT,
                )
            assert refused.value.reason is DecodeReason.BAD_CHECKSUM
        else:  # IPv6 always includes the pseudo-header: the mode makes no difference
            decode(
                p.payload, src=p.src, dst=p.dst, family=6, checksum_mode=ChecksumMode.VRRPV2_COMPAT
            )
    first = {
        f: next(p for p in packets if p.family == f and p.payload[2] == PRIORITY) for f in (4, 6)
    }
    for f, p in first.items():  # shown with -s; the unit tests freeze one of each
        print(f"IPv{f} advert from {p.src} to {p.dst}: {p.payload.hex()}")


@pytest.mark.skipif(not os.access(KEEPALIVED, os.X_OK), reason="keepalived is not installed")
def test_keepalived_2_2_7_has_no_switch_for_the_ipv4_checksum_without_pseudo_header(
    make_lab: Callable[[LabSpec], Lab], tmp_path: Path
) -> None:
    """`v3_checksum_as_v2` (added after 2.2.7) is an unknown keyword: the default is fixed."""
    lab = make_lab(LabSpec(nodes=1, pods_per_node=0, with_controlplane=False, with_client=False))
    node = lab.node("node-1")
    conf = keepalived_config(tmp_path / "keepalived")
    text = conf.read_text().replace("advert_int 0.1", "advert_int 0.1\n    v3_checksum_as_v2", 1)
    conf.write_text(text)
    check = netns.run(node.ns, [KEEPALIVED, "--config-test", "-f", str(conf)], check=False)
    assert "Unknown keyword 'v3_checksum_as_v2'" in check.stderr + check.stdout, check
