"""lab.hoststate's pure parts: which mounts to take down in which order, which sysctls to
write back, which cgroup hierarchies a process must join."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import hoststate

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw
100 22 0:50 / /var/lib/nodelb-lab/nlb1/node-1/kubelet/pods/a/volumes/x rw - tmpfs tmpfs rw
101 22 0:51 / /var/lib/nodelb-lab/nlb1/node-1/containerd/state/t/rootfs rw - overlay overlay rw
102 101 0:52 / /var/lib/nodelb-lab/nlb1/node-1/containerd/state/t/rootfs/proc rw - proc proc rw
103 22 0:53 / /var/lib/nodelb-lab/nlb1/node-10/kubelet rw - tmpfs tmpfs rw
104 22 0:54 / /var/lib/nodelb-lab/nlb1/node-1/netns/cni-1 rw - nsfs nsfs rw
105 104 0:54 / /var/lib/nodelb-lab/nlb1/node-1/netns/cni-1 rw - nsfs nsfs rw
106 22 0:55 / /var/lib/nodelb-lab/nlb1/node-1/with\\040space rw - tmpfs tmpfs rw
"""


def test_mounts_under_a_node_are_listed_deepest_first_and_stacked_layers_each_once() -> None:
    node = Path("/var/lib/nodelb-lab/nlb1/node-1")
    got = hoststate.mounts_under(MOUNTINFO, [node])
    assert got[0].endswith("/rootfs/proc"), got  # the child before its parent
    assert got.index(f"{node}/containerd/state/t/rootfs/proc") < got.index(
        f"{node}/containerd/state/t/rootfs"
    )
    assert got.count(f"{node}/netns/cni-1") == 2  # two layers, two unmounts
    assert f"{node}/with space" in got  # mountinfo's octal escape undone
    assert not any("node-10" in p for p in got), "a sibling with a longer name is not below"
    assert "/sys/fs/cgroup" not in got and "/" not in got


def test_nothing_is_under_a_directory_without_mounts() -> None:
    assert hoststate.mounts_under(MOUNTINFO, [Path("/var/lib/nodelb-lab/other")]) == []


@pytest.mark.parametrize(
    ("saved", "now", "changed"),
    [
        pytest.param({"kernel.panic": "0"}, {"kernel.panic": "10"}, {"kernel.panic": "0"},
                     id="a value kubelet rewrote is written back"),
        pytest.param({"kernel.panic": "0"}, {"kernel.panic": "0"}, {},
                     id="an unchanged value is left alone"),
        pytest.param({"vm.overcommit_memory": "0"}, {}, {"vm.overcommit_memory": "0"},
                     id="a value that cannot be read now counts as changed"),
    ],
)  # fmt: skip
def test_changed_sysctls(
    saved: dict[str, str], now: dict[str, str], changed: dict[str, str]
) -> None:
    assert hoststate.changed_sysctls(saved, now) == changed


def test_sysctl_names_map_to_proc_sys_files() -> None:
    assert hoststate.sysctl_path("kernel.keys.root_maxkeys") == Path(
        "/proc/sys/kernel/keys/root_maxkeys"
    )


MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0
cgroup /mnt/elsewhere/cpu cgroup rw,cpu 0 0
proc /proc proc rw 0 0
"""


def test_every_v1_hierarchy_and_the_v2_one_under_sys_fs_cgroup_are_joined() -> None:
    got = hoststate.cgroup_hierarchies(MOUNTS)
    assert [p.name for p in got] == ["cpu", "memory", "systemd", "unified"]


def test_a_pure_v2_host_has_one_hierarchy() -> None:
    got = hoststate.cgroup_hierarchies("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    assert got == [Path("/sys/fs/cgroup")]
