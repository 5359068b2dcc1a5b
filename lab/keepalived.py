"""keepalived (Debian's, the reference VRRP peer) run in a lab node: config and process.

keepalived runs inside the node namespace via `ip netns exec` (never its own --namespace
option), in the foreground, VRRP subsystem only, with its pid files and config in a per-run
directory, and without respawning children, so `kill -9` of the VRRP process is a crash that
stays a crash. The lab tracks the process and tears it down with the namespaces. Used by the
keepalived kernel tests and bench/failover.py.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent.model.net import IPAddress
from lab import netns
from lab.topology import Lab, LabNode
from lab.wait import wait_until

KEEPALIVED = "/usr/sbin/keepalived"
START_TIMEOUT = 30.0

_GLOBAL = """\
global_defs {{
    router_id {router_id}
    vrrp_version 3
    vrrp_garp_master_repeat 3
    vrrp_garp_master_refresh 0
}}
"""
_INSTANCE = """\
vrrp_instance VI_{version} {{
    state BACKUP
    interface {interface}
    virtual_router_id {vrid}
    priority {priority}
    advert_int {advert_int}
    virtual_ipaddress {{
        {vip}/{prefix} dev {interface}
    }}
}}
"""


def config_text(
    *,
    router_id: str,
    vrid: int,
    priority: int,
    advert_int: float,
    vips: tuple[IPAddress, ...],
    interface: str = "eth0",
) -> str:
    """Return a VRRPv3 keepalived.conf with one instance per VIP (one per family at most).

    Every instance starts as BACKUP with preemption on (keepalived's default), so the highest
    priority wins, as nodelb's instances do. `advert_int` is in seconds (centisecond steps).
    """
    text = _GLOBAL.format(router_id=router_id)
    for vip in vips:
        text += _INSTANCE.format(
            version=vip.version,
            interface=interface,
            vrid=vrid,
            priority=priority,
            advert_int=advert_int,
            vip=vip,
            prefix=32 if isinstance(vip, ipaddress.IPv4Address) else 128,
        )
    return text


@dataclass(frozen=True, slots=True)
class Keepalived:
    """One keepalived run: its node, parent process and the VRRP child's pid file."""

    node: LabNode
    proc: subprocess.Popen[bytes]  # the parent, tracked by the lab
    vrrp_pidfile: Path

    def vrrp_pid(self) -> int:
        """Return the PID of keepalived's VRRP child (raises until it has written it)."""
        return int(self.vrrp_pidfile.read_text().split()[0])


def start_keepalived(
    lab: Lab,
    node: LabNode,
    *,
    config: str,
    workdir: Path,
    name: str | None = None,
) -> Keepalived:
    """Start keepalived with `config` on `node`; return once its VRRP child runs."""
    label = name or f"keepalived-{node.name}"
    d = workdir / label
    d.mkdir(parents=True)
    conf = d / "keepalived.conf"
    conf.write_text(config)
    check = netns.run(node.ns, [KEEPALIVED, "--config-test", "-f", str(conf)], check=False)
    if check.returncode != 0:
        raise RuntimeError(f"keepalived rejects its config: {check.stderr}")
    argv = [
        KEEPALIVED,
        "--dont-fork",
        "--log-console",
        "--log-detail",
        "--no-syslog",
        "--vrrp",
        "--dont-respawn",
        "-f", str(conf),
        "-p", str(d / "keepalived.pid"),
        "-r", str(d / "vrrp.pid"),
        "-c", str(d / "checkers.pid"),
        "-b", str(d / "bfd.pid"),
    ]  # fmt: skip
    proc = lab.spawn(node.ns, argv, log_name=label)
    ka = Keepalived(node=node, proc=proc, vrrp_pidfile=d / "vrrp.pid")
    wait_until(
        lambda: proc.poll() is None and ka.vrrp_pid() > 0,
        START_TIMEOUT,
        f"keepalived's VRRP process on {node.name}",
    )
    return ka
