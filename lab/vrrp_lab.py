"""Run nodelb VRRP speakers in lab node namespaces, and read what the lab's kernels show.

Used by the speaker kernel tests and bench/failover.py. A speaker is a `SpeakerProcess`
whose child is exec'd by `ip netns exec <node ns>`, so its PID is the child's own; the
caller stops every one by PID (`stop_all`), and the lab's teardown stops anything left in its
namespaces.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.announce.vrrp.codec import Advert, ChecksumMode, encode
from agent.announce.vrrp.config import GratuitousConfig, InstanceConfig, SpeakerConfig
from agent.announce.vrrp.control import SpeakerStatus
from agent.announce.vrrp.process import SpeakerProcess
from agent.announce.vrrp.sockets import GROUP4, GROUP6
from agent.model.net import IPAddress
from lab import netns
from lab.topology import Host, Lab, LabNode
from lab.wait import GiveUp, wait_until

_REPO_ROOT = Path(__file__).resolve().parents[1]
SO_TIMESTAMPNS = 35  # <asm/socket.h>; not exported by Python's socket module


def link_local(host: Host) -> IPAddress:
    """Return the IPv6 link-local address of `host`'s segment interface."""
    out = netns.run(host.ns, ["ip", "-j", "-6", "addr", "show", "dev", host.ifname])
    for link in json.loads(out.stdout):
        for a in link["addr_info"]:
            address = ipaddress.ip_address(a.get("local", "::"))
            if address.is_link_local:
                return address
    raise LookupError(f"{host.name} has no link-local address")


@dataclass(frozen=True, slots=True)
class DualStack:
    """One VRID carrying one IPv4 and one IPv6 VIP at one advert interval (cs).

    The speaker kernel tests and their keepalived peers all run this shape; `instances`
    gives a speaker's two InstanceConfigs at a priority.
    """

    vrid: int
    vip4: ipaddress.IPv4Address
    vip6: ipaddress.IPv6Address
    interval_cs: int = 10

    @classmethod
    def numbered(cls, *, vrid: int, host: int, interval_cs: int = 10) -> DualStack:
        """Return `vrid` carrying 198.18.0.<host> and 2001:db8::<host> (the same digits)."""
        return cls(
            vrid=vrid,
            vip4=ipaddress.IPv4Address(f"198.18.0.{host}"),
            vip6=ipaddress.IPv6Address(f"2001:db8::{host}"),
            interval_cs=interval_cs,
        )

    def instances(self, priority: int, *, preempt: bool = True) -> list[InstanceConfig]:
        """Return the IPv4 and the IPv6 instance of this VRID at `priority`."""
        return [
            InstanceConfig(
                vrid=self.vrid,
                family=family,
                priority=priority,
                advert_interval_cs=self.interval_cs,
                preempt=preempt,
                addresses=(vip,),
            )
            for family, vip in ((4, self.vip4), (6, self.vip6))
        ]


def speaker_config(
    lab: Lab,
    node: LabNode,
    instances: Iterable[InstanceConfig],
    *,
    gratuitous: GratuitousConfig | None = None,
    extra_peers: Iterable[IPAddress] = (),
) -> SpeakerConfig:
    """Return the config of a speaker on `node` that accepts adverts from every other node.

    `extra_peers` are keepalived boxes: accepted as peers, with any priority.
    """
    extra = frozenset(extra_peers)
    peers: set[IPAddress] = set(extra)
    for other in lab.nodes:
        if other.name != node.name:
            peers.add(other.ip4)
            peers.add(link_local(other))
    return SpeakerConfig(
        interface=node.ifname,
        source4=node.ip4,
        peers=frozenset(peers),
        keepalived_peers=extra,
        instances=tuple(instances),
        gratuitous=gratuitous if gratuitous is not None else GratuitousConfig(),
    )


def start_speaker(
    lab: Lab,
    node: LabNode,
    config: SpeakerConfig,
    *,
    name: str,
    rt_priority: int = 0,
    cpus: Iterable[int] = (),
) -> SpeakerProcess:
    """Start a speaker for `node` inside its namespace; wait until it reports running."""
    workdir = lab.workdir / f"speaker-{name}"
    (lab.workdir / "logs").mkdir(parents=True, exist_ok=True)
    sp = SpeakerProcess(
        config,
        workdir=workdir,
        argv_prefix=("ip", "netns", "exec", node.ns),
        log=lab.workdir / "logs" / f"speaker-{name}.log",
        rt_priority=rt_priority,
        cpus=cpus,
    )
    sp.start()

    def running() -> SpeakerStatus | None:
        if not sp.alive():
            raise GiveUp(f"speaker {name} exited: {speaker_log(lab, name)}")
        status = sp.status()
        return status if status is not None and status.state == "running" else None

    wait_until(running, 30.0, f"speaker {name} running")
    return sp


class Speakers:
    """The speakers one test (or bench run) started; `stop_all()` stops every one by PID."""

    def __init__(self) -> None:
        self.started: list[SpeakerProcess] = []

    def append(self, speaker: SpeakerProcess) -> None:
        """Track a speaker started some other way, so that `stop_all` stops it too."""
        self.started.append(speaker)

    def start(
        self,
        lab: Lab,
        node: LabNode,
        instances: Iterable[InstanceConfig],
        *,
        name: str,
        gratuitous: GratuitousConfig | None = None,
        rt_priority: int = 0,
        cpus: Iterable[int] = (),
    ) -> SpeakerProcess:
        """Return a running, tracked speaker on `node` with `instances` (see `speaker_config`)."""
        config = speaker_config(lab, node, instances, gratuitous=gratuitous)
        speaker = start_speaker(lab, node, config, name=name, rt_priority=rt_priority, cpus=cpus)
        self.started.append(speaker)
        return speaker

    def stop_all(self) -> None:
        """Stop every tracked speaker (see the module function `stop_all`)."""
        stop_all(self.started)


def speaker_log(lab: Lab, name: str) -> str:
    """Return what speaker `name` logged so far ('' if nothing)."""
    path: Path = lab.workdir / "logs" / f"speaker-{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def stop_all(speakers: Iterable[SpeakerProcess]) -> None:
    """Stop every speaker by its PID (graceful first, killed after a grace period)."""
    for sp in speakers:
        with contextlib.suppress(Exception):
            sp.stop(graceful=False, timeout=5.0)


def child_speaker_pids(parent: int) -> list[int]:
    """Return the PIDs of the speakers whose parent is process `parent` (an agent).

    The agent starts its speaker in a session of its own, so signalling the agent's process
    group never reaches it: a crash has to kill it by its own PID.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"agent.announce.vrrp.speaker" in cmdline:
            found.append(int(entry.name))
    return found


def crash(lab: Lab, node: LabNode, pids: Iterable[int]) -> None:
    """Crash `node` as a power loss would: its segment link goes down, then each of `pids`
    (its VRRP daemons) gets SIGKILL by PID. No priority-0 advert leaves, nothing is cleaned
    up: the addresses they held stay on the node, unreachable (see `revive`)."""
    lab.unplug(node)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def crash_speaker(lab: Lab, node: LabNode, speaker: SpeakerProcess) -> None:
    """Crash `node` (see `crash`) whose only daemon is `speaker`, and reap the speaker."""
    assert speaker.pid is not None
    crash(lab, node, [speaker.pid])
    speaker.stop(graceful=False)  # reaps the killed child


def revive(lab: Lab, node: LabNode) -> None:
    """Boot `node` again after `crash`: the addresses its daemons held are gone (a reboot),
    then its link comes up. Its daemons are the caller's to start."""
    lab.forget_addresses(node)
    lab.plug(node)


def holds(host: Host, address: IPAddress) -> bool:
    """Return True when `address` is configured on `host`'s segment interface."""
    family = "-4" if address.version == 4 else "-6"
    out = netns.run(host.ns, ["ip", "-j", family, "addr", "show", "dev", host.ifname]).stdout
    return any(a["local"] == str(address) for link in json.loads(out) for a in link["addr_info"])


def mac_of(host: Host) -> str:
    """Return the MAC of `host`'s segment interface, as `ip` prints it."""
    out = netns.run(host.ns, ["ip", "-j", "link", "show", "dev", host.ifname]).stdout
    return str(json.loads(out)[0]["address"])


def neighbour_mac(ns: str, address: IPAddress) -> str | None:
    """Return the MAC in `ns`'s neighbour entry for `address`, None when it has none."""
    out = netns.run(ns, ["ip", "-j", "neigh", "show", str(address)]).stdout
    entries = [e for e in json.loads(out or "[]") if "lladdr" in e]
    return str(entries[0]["lladdr"]) if entries else None


# -- tools run inside a lab namespace: `python -m lab.vrrp_lab capture|send ...` --------


@dataclass(frozen=True, slots=True)
class Frame:
    """One captured frame of interest: kernel receive time (ns), kind and a few fields.

    `kind` is vrrp4 | vrrp6 | arp | na; `src` the IP (VRRP, NA) or sender IP (ARP) source;
    `priority` the VRRP priority (-1 otherwise); `ttl` the TTL / hop limit (-1 for ARP);
    `op` the ARP operation (-1 otherwise); `target` the ARP / NA target address ('' else).
    """

    t_ns: int
    kind: str
    src: str
    priority: int
    ttl: int
    op: int
    target: str


def _classify(frame: bytes) -> dict[str, Any] | None:
    ethertype = int.from_bytes(frame[12:14], "big")
    body = frame[14:]
    if ethertype == 0x0806 and len(body) >= 28:
        return {
            "kind": "arp",
            "src": str(ipaddress.IPv4Address(body[14:18])),
            "priority": -1,
            "ttl": -1,
            "op": int.from_bytes(body[6:8], "big"),
            "target": str(ipaddress.IPv4Address(body[24:28])),
        }
    if ethertype == 0x0800 and len(body) >= 20 and body[9] == 112:
        ihl = (body[0] & 0x0F) * 4
        return {
            "kind": "vrrp4",
            "src": str(ipaddress.IPv4Address(body[12:16])),
            "priority": body[ihl + 2],
            "ttl": body[8],
            "op": -1,
            "target": "",
        }
    if ethertype == 0x86DD and len(body) >= 48:
        src = str(ipaddress.IPv6Address(body[8:24]))
        if body[6] == 112:
            return {"kind": "vrrp6", "src": src, "priority": body[42], "ttl": body[7]}
        if body[6] == 58 and body[40] == 136:
            target = str(ipaddress.IPv6Address(body[48:64]))
            return {"kind": "na", "src": src, "priority": -1, "ttl": body[7], "target": target}
    return None


def capture_main(ifname: str) -> None:
    """Print one JSON line per VRRP / ARP / NA frame seen on `ifname` (runs until killed)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind((ifname, 0x0003))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        data, anc, _, addr = sock.recvmsg(65535, socket.CMSG_SPACE(16))
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        fields = _classify(data)
        if fields is None:
            continue
        t_ns = time.time_ns()
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("@qq", value[:16])
                t_ns = sec * 1_000_000_000 + nsec
        print(json.dumps({"t_ns": t_ns, "op": -1, "target": "", **fields}), flush=True)


def parse_capture(text: str) -> list[Frame]:
    """Return the frames in a capture_main output (lines that are not frames are skipped)."""
    frames = []
    for line in text.splitlines():
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict) and "t_ns" in raw:
            frames.append(Frame(**raw))
    return frames


def start_capture(lab: Lab, host: Host, *, name: str) -> subprocess.Popen[bytes]:
    """Start capture_main on `host` (tracked by the lab); return once it is listening."""
    argv = [sys.executable, "-m", "lab.vrrp_lab", "capture", host.ifname]
    env = {**os.environ, "PYTHONPATH": str(_REPO_ROOT)}
    proc = lab.spawn(host.ns, argv, log_name=name, env=env)

    def ready() -> bool:
        if proc.poll() is not None:
            raise GiveUp(f"capture exited {proc.returncode}: {lab.log_of(proc)}")
        return '"ready"' in lab.log_of(proc)

    wait_until(ready, 30.0, f"capture on {host.name}")
    return proc


def send_main(args: list[str]) -> None:
    """Send crafted adverts: FAMILY SRC VRID PRIORITY TTL COUNT CHECKSUM_MODE ADDRESS."""
    family, src_text, vrid, priority, ttl, count, mode, address = args
    src = ipaddress.ip_address(src_text)
    fam = int(family)
    dst = GROUP4 if fam == 4 else GROUP6
    advert = Advert(
        vrid=int(vrid), priority=int(priority), max_adver_int=10,
        addresses=(ipaddress.ip_address(address),),
    )  # fmt: skip
    message = encode(advert, src=src, dst=dst, checksum_mode=ChecksumMode(mode))
    ifindex = socket.if_nametoindex("eth0")
    if fam == 4:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, 112)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, int(ttl))
        sock.setsockopt(
            socket.IPPROTO_IP,
            socket.IP_MULTICAST_IF,
            b"\x00" * 8 + struct.pack("@i", ifindex),
        )
        sock.bind((src_text, 0))
        target: tuple[Any, ...] = (str(dst), 0)
    else:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, 112)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, int(ttl))
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
        sock.bind((src_text, 0, 0, ifindex))
        target = (str(dst), 0, 0, ifindex)
    for _ in range(int(count)):
        sock.sendto(message, target)
        time.sleep(0.01)  # pacing only: the receiver's counters are what the test waits on


def _ipv4_checksum(header: bytes) -> int:
    total = sum(int.from_bytes(header[i : i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def forged_frame(mac: bytes, family: int, src: IPAddress, ttl: int, message: bytes) -> bytes:
    """Return an Ethernet frame carrying `message` (a VRRP advert) to the VRRP group from
    `src`, with `mac` as the frame's source: what a host forging a peer's address sends."""
    if family == 4:
        dst_mac, ethertype = bytes.fromhex("01005e000012"), 0x0800
        header = bytearray(20)
        header[0], header[1], header[8], header[9] = 0x45, 0xC0, ttl, 112
        header[2:4] = (20 + len(message)).to_bytes(2, "big")
        header[12:16], header[16:20] = src.packed, GROUP4.packed
        header[10:12] = _ipv4_checksum(bytes(header)).to_bytes(2, "big")
    else:
        dst_mac, ethertype = bytes.fromhex("333300000012"), 0x86DD
        header = bytearray(40)
        header[0], header[6], header[7] = 0x60, 112, ttl
        header[4:6] = len(message).to_bytes(2, "big")
        header[8:24], header[24:40] = src.packed, GROUP6.packed
    return dst_mac + mac + ethertype.to_bytes(2, "big") + bytes(header) + message


def forge_main(args: list[str]) -> None:
    """Send crafted adverts as whole frames from this host's MAC, with any source address
    (not only this host's own): FAMILY SRC VRID PRIORITY TTL COUNT CHECKSUM_MODE ADDRESS."""
    family, src_text, vrid, priority, ttl, count, mode, address = args
    src = ipaddress.ip_address(src_text)
    fam = int(family)
    advert = Advert(
        vrid=int(vrid), priority=int(priority), max_adver_int=10,
        addresses=(ipaddress.ip_address(address),),
    )  # fmt: skip
    dst = GROUP4 if fam == 4 else GROUP6
    message = encode(advert, src=src, dst=dst, checksum_mode=ChecksumMode(mode))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind(("eth0", 0))
    mac = sock.getsockname()[4][:6]
    frame = forged_frame(mac, fam, src, int(ttl), message)
    for _ in range(int(count)):
        sock.send(frame)
        time.sleep(0.01)  # pacing only: the receiver's counters are what the test waits on


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        capture_main(sys.argv[2])
    elif sys.argv[1] == "send":
        send_main(sys.argv[2:])
    elif sys.argv[1] == "forge":
        forge_main(sys.argv[2:])
    else:
        raise SystemExit(f"unknown tool {sys.argv[1]!r}")
