"""Host-wide state a real-node lab changes, recorded before and restored after.

A node namespace isolates the network only. kubelet and containerd also touch what every
namespace shares: kubelet rewrites a few kernel sysctls at start, pods live in cgroups of
every hierarchy, and volumes, container root filesystems and pod network namespaces are
mounts in the host's mount namespace. This module records the sysctls before the lab
starts, and at teardown stops every process left in the lab's cgroups, unmounts what is
mounted under the lab's directories (deepest first), removes the lab's cgroups and writes
the sysctls back.

The deciding parts are pure (`mounts_under`, `changed_sysctls`, `cgroup_hierarchies`); the
rest is a thin shell over /proc and /sys.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from lab.wait import wait_until

# What kubelet's container manager writes when protectKernelDefaults is false
# (pkg/kubelet/cm: setupKernelTunables), plus what this lab's kube-proxy is told to leave alone.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
KILL_TIMEOUT = 20.0


class HostStateError(RuntimeError):
    """Host state could not be restored; the message says what is left."""


def sysctl_path(name: str) -> Path:
    """Return the /proc/sys file of sysctl `name` ("kernel.panic" -> /proc/sys/kernel/panic)."""
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: Iterable[str]) -> dict[str, str]:
    """Return the current value of each sysctl in `names` that exists on this kernel."""
    out: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            out[name] = sysctl_path(name).read_text().strip()
    return out


def changed_sysctls(saved: Mapping[str, str], now: Mapping[str, str]) -> dict[str, str]:
    """Return {name: saved value} for every sysctl whose value `now` differs from `saved`."""
    return {name: value for name, value in saved.items() if now.get(name) != value}


def restore_sysctls(saved: Mapping[str, str]) -> dict[str, str]:
    """Write back every sysctl in `saved` that changed; return {name: value it had}."""
    now = read_sysctls(saved)
    changed = changed_sysctls(saved, now)
    for name, value in changed.items():
        sysctl_path(name).write_text(value + "\n")
    return {name: now.get(name, "") for name in changed}


def _unescape(field: str) -> str:
    """Undo /proc/self/mountinfo's octal escapes (space, tab, newline, backslash)."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> list[str]:
    """Return the mount points listed in a /proc/<pid>/mountinfo text, in listed order."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(_unescape(fields[4]))
    return points


def mounts_under(mountinfo: str, roots: Sequence[Path]) -> list[str]:
    """Return the mount points at or below any of `roots`, deepest first, each once.

    Deepest first is the order `umount` needs: a parent mount is busy while a child is there.
    Mounts stacked on one point are listed once per layer (each needs its own umount).
    """
    prefixes = [str(r).rstrip("/") for r in roots]
    hits = [
        p for p in mount_points(mountinfo) if any(p == x or p.startswith(x + "/") for x in prefixes)
    ]
    # Later mounts on the same point (or below it) come later in mountinfo: reverse, then by
    # depth, keeps stacked layers in unmount order.
    hits.reverse()
    return sorted(hits, key=lambda p: p.count("/"), reverse=True)


def unmount_under(roots: Sequence[Path]) -> list[str]:
    """Unmount everything at or below `roots` (deepest first); return what was unmounted.

    A mount that stays busy is detached lazily (`umount -l`), so the directories can go.
    """
    done: list[str] = []
    for _ in range(5):  # a few passes: an unmount can reveal a mount it covered
        points = mounts_under(Path("/proc/self/mountinfo").read_text(), roots)
        if not points:
            return done
        for point in points:
            proc = subprocess.run(["umount", point], capture_output=True, check=False)
            if proc.returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            done.append(point)
    left = mounts_under(Path("/proc/self/mountinfo").read_text(), roots)
    if left:
        raise HostStateError(f"mounts left under {[str(r) for r in roots]}: {left}")
    return done


def cgroup_hierarchies(mounts: str, base: Path = CGROUP_ROOT) -> list[Path]:
    """Return the mounted cgroup hierarchies under `base` from a /proc/mounts text.

    Both v1 hierarchies (type cgroup) and the v2 one (cgroup2) are returned: a process
    placed in the lab's cgroup must be placed in every one of them.
    """
    out = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in ("cgroup", "cgroup2"):
            point = Path(_unescape(fields[1]))
            if base in (point.parent, point):
                out.append(point)
    return out


def hierarchies() -> list[Path]:
    """Return this host's mounted cgroup hierarchies (see `cgroup_hierarchies`)."""
    return cgroup_hierarchies(Path("/proc/mounts").read_text())


def create_cgroup(name: str) -> list[Path]:
    """Create cgroup `/<name>` in every hierarchy; return the directories made.

    A new cpuset cgroup has no CPUs or memory nodes until given some: it gets its parent's,
    or no process could join it.
    """
    made = []
    for h in hierarchies():
        path = h / name
        path.mkdir(exist_ok=True)
        made.append(path)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((path.parent / knob).read_text())
    return made


def join_cgroup(name: str, pid: int) -> None:
    """Move process `pid` into cgroup `/<name>` of every hierarchy (made by create_cgroup)."""
    for h in hierarchies():
        (h / name / "cgroup.procs").write_text(f"{pid}\n")


def cgroup_pids(name: str) -> set[int]:
    """Return every PID in cgroup `/<name>` or below it, in any hierarchy (empty if none)."""
    pids: set[int] = set()
    for h in hierarchies():
        top = h / name
        if not top.is_dir():
            continue
        for directory, _, _ in os.walk(top):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                text = (Path(directory) / "cgroup.procs").read_text()
                pids.update(int(p) for p in text.split())
    return pids


def kill_cgroup(name: str, *, timeout: float = KILL_TIMEOUT) -> set[int]:
    """SIGKILL every process in cgroup `/<name>` and below, until none is left; return them.

    The v1 freezer (when mounted) stops the tree first, so nothing forks past the kill; the
    processes were all started by the lab (kubelet, containerd, shims, containers).
    """
    freezer = CGROUP_ROOT / "freezer" / name / "freezer.state"
    killed: set[int] = set()
    if freezer.exists():
        with contextlib.suppress(OSError):
            freezer.write_text("FROZEN\n")
    try:

        def gone() -> bool:
            left = cgroup_pids(name)
            for pid in left - killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(left)
            return not left

        # Killed processes in a frozen cgroup die once thawed: thaw after the first signals.
        gone()
        if freezer.exists():
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED\n")
        wait_until(gone, timeout, f"processes in cgroup {name} to exit", interval=0.05)
    finally:
        if freezer.exists():
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED\n")
    return killed


def remove_cgroup(name: str, *, timeout: float = 10.0) -> None:
    """Remove cgroup `/<name>` and every cgroup below it, in every hierarchy (deepest first).

    A cgroup whose last process just died can refuse removal for a moment (EBUSY): retried
    until `timeout`.
    """
    deadline = time.monotonic() + timeout
    for h in hierarchies():
        top = h / name
        if not top.is_dir():
            continue
        dirs = [Path(d) for d, _, _ in os.walk(top)]
        for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise HostStateError(f"cgroup {directory} cannot be removed") from None
                    time.sleep(0.05)


def top_level_cgroups() -> frozenset[str]:
    """Return "<hierarchy>/<name>" for every top-level cgroup on this host (for snapshots)."""
    out: set[str] = set()
    for h in hierarchies():
        with contextlib.suppress(OSError):
            out.update(f"{h.name}/{e.name}" for e in h.iterdir() if e.is_dir())
    return frozenset(out)
