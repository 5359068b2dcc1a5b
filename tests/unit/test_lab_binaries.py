"""lab.binaries: where the pinned binaries are looked for, and what a missing one tells you."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import binaries

REPO = Path(__file__).resolve().parents[2]
FAMILY_VARS = (
    "NODELB_KUBE_BIN",
    "NODELB_ETCD_BIN",
    "NODELB_CONTAINERD_BIN",
    "NODELB_RUNC_BIN",
    "NODELB_PAUSE_BIN",
    "NODELB_COREDNS_BIN",
)
ALL_BINARIES = (
    binaries.KUBE_BINARIES
    | binaries.ETCD_BINARIES
    | binaries.CONTAINERD_BINARIES
    | binaries.RUNC_BINARIES
    | binaries.PAUSE_BINARIES
    | binaries.COREDNS_BINARIES
)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point NODELB_CACHE at an empty directory and unset every per-family override."""
    for var in FAMILY_VARS:
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "cache"
    monkeypatch.setenv("NODELB_CACHE", str(root))
    return root


def make_executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_versions_come_from_the_repo_versions_file() -> None:
    versions = binaries.read_versions()
    assert versions["KUBE_VERSION"].startswith("v1.")
    assert versions["ETCD_VERSION"].startswith("v3.")
    assert versions["CONTAINERD_VERSION"].startswith("v2.4.")
    assert versions["RUNC_VERSION"].startswith("v1.5.")
    assert versions["AGNHOST_IMAGE"].startswith("registry.k8s.io/e2e-test-images/agnhost:")
    assert versions["PAUSE_IMAGE"].startswith("registry.k8s.io/pause:")


def test_read_versions_skips_comments_and_strips_quotes(tmp_path: Path) -> None:
    path = tmp_path / "versions.env"
    path.write_text("# pinned\n\nKUBE_VERSION=v1.2.3\nETCD_VERSION='v3.4.5'\n")
    assert binaries.read_versions(path) == {"KUBE_VERSION": "v1.2.3", "ETCD_VERSION": "v3.4.5"}


def test_default_dirs_are_the_cache_keyed_by_version(cache: Path) -> None:
    assert binaries.kube_bin_dir() == cache / "k8s" / binaries.kube_version()
    assert binaries.etcd_bin_dir() == cache / "etcd" / binaries.etcd_version()
    assert binaries.containerd_bin_dir() == cache / "containerd" / binaries.containerd_version()
    assert binaries.runc_bin_dir() == cache / "runc" / binaries.runc_version()
    assert binaries.pause_bin_dir() == cache / "pause" / binaries.pause_key()


def test_the_cache_is_under_home_without_nodelb_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("NODELB_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert binaries.cache_dir() == tmp_path / ".cache" / "nodelb"


def test_pause_is_keyed_by_a_hash_of_its_source(tmp_path: Path) -> None:
    source = tmp_path / "pause.c"
    source.write_text("int main(void) { return 0; }\n")
    key = binaries.pause_key(source)
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert key == hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    source.write_text("int main(void) { return 1; }\n")
    assert binaries.pause_key(source) != key
    assert binaries.PAUSE_SOURCE.is_file()


def test_env_vars_override_the_dirs_and_missing_binaries_say_how_to_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NODELB_KUBE_BIN", str(tmp_path))
    monkeypatch.setenv("NODELB_ETCD_BIN", str(tmp_path))
    etcd = make_executable(tmp_path / "etcd")
    assert binaries.binary("etcd") == etcd
    expected = r"from \$NODELB_KUBE_BIN\): run scripts/build-kube\.sh lab$"
    with pytest.raises(binaries.BinaryMissing, match=expected):
        binaries.binary("kube-apiserver")


@dataclass(frozen=True, slots=True)
class Family:
    names: frozenset[str]
    env_var: str
    build: str


FAMILIES = [
    pytest.param(
        Family(binaries.KUBE_LAB_BINARIES, "NODELB_KUBE_BIN", "scripts/build-kube.sh lab"),
        id="the lab's kube binaries are built by build-kube.sh lab",
    ),
    pytest.param(
        Family(binaries.KUBE_NODE_BINARIES, "NODELB_KUBE_BIN", "scripts/build-kube.sh nodes"),
        id="kubelet, controller manager, scheduler and agnhost by build-kube.sh nodes",
    ),
    pytest.param(
        Family(
            binaries.KUBE_CONFORMANCE_BINARIES,
            "NODELB_KUBE_BIN",
            "scripts/build-kube.sh conformance",
        ),
        id="e2e.test and the ginkgo CLI by build-kube.sh conformance, which all leaves out",
    ),
    pytest.param(
        Family(binaries.ETCD_BINARIES, "NODELB_ETCD_BIN", "scripts/build-kube.sh lab"),
        id="etcd by build-kube.sh lab",
    ),
    pytest.param(
        Family(binaries.CONTAINERD_BINARIES, "NODELB_CONTAINERD_BIN", "scripts/build-runtime.sh"),
        id="containerd, its runc shim and ctr by build-runtime.sh",
    ),
    pytest.param(
        Family(binaries.RUNC_BINARIES, "NODELB_RUNC_BIN", "scripts/build-runtime.sh"),
        id="runc by build-runtime.sh",
    ),
    pytest.param(
        Family(binaries.PAUSE_BINARIES, "NODELB_PAUSE_BIN", "scripts/build-runtime.sh"),
        id="pause by build-runtime.sh",
    ),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_missing_binary_names_its_path_and_the_script_that_builds_it(
    family: Family, cache: Path
) -> None:
    for name in sorted(family.names):
        where = binaries.location(name)
        assert where.env_var == family.env_var
        assert where.directory.is_relative_to(cache)
        with pytest.raises(binaries.BinaryMissing) as missing:
            binaries.binary(name)
        message = str(missing.value)
        assert str(where.directory / name) in message
        assert message.endswith(f"run {family.build}"), message


@pytest.mark.parametrize("family", FAMILIES)
def test_a_built_binary_is_found_in_its_family_directory(
    family: Family, monkeypatch: pytest.MonkeyPatch, cache: Path, tmp_path: Path
) -> None:
    directory = tmp_path / family.env_var
    monkeypatch.setenv(family.env_var, str(directory))
    for name in sorted(family.names):
        built = make_executable(directory / name)
        assert binaries.binary(name) == built


def test_a_file_that_is_not_executable_counts_as_missing(cache: Path) -> None:
    runc = binaries.runc_bin_dir() / "runc"
    runc.parent.mkdir(parents=True)
    runc.write_text("")
    with pytest.raises(binaries.BinaryMissing, match=r"run scripts/build-runtime\.sh$"):
        binaries.binary("runc")


def test_every_known_binary_has_one_family() -> None:
    sizes = [
        len(family)
        for family in (
            binaries.KUBE_BINARIES,
            binaries.ETCD_BINARIES,
            binaries.CONTAINERD_BINARIES,
            binaries.RUNC_BINARIES,
            binaries.PAUSE_BINARIES,
            binaries.COREDNS_BINARIES,
        )
    ]
    assert sum(sizes) == len(ALL_BINARIES) == 16


def test_unknown_binary_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown binary"):
        binaries.binary("dockerd")


def test_the_build_scripts_print_the_directories_binaries_looks_in(
    cache: Path, tmp_path: Path
) -> None:
    """A warm run of each script over fakes at binaries' paths finds them all: same layout."""
    versions = binaries.read_versions()
    for name in ALL_BINARIES:
        make_executable(binaries.location(name).directory / name)
    # runc's version is checked on every run: the fake answers like the real one.
    runc_version = versions["RUNC_VERSION"].removeprefix("v")
    make_executable(
        binaries.binary("runc"),
        f"#!/bin/sh\necho 'runc version {runc_version}'\necho 'libseccomp: 2.5.4'\n",
    )
    (binaries.kube_bin_dir() / "e2e-images.env").write_text(
        f"AGNHOST_IMAGE={versions['AGNHOST_IMAGE']}\nPAUSE_IMAGE={versions['PAUSE_IMAGE']}\n"
    )
    # Should a script look elsewhere, it would start building: make that fail at once.
    stubs = tmp_path / "stubs"
    for tool in ("go", "gcc"):
        make_executable(stubs / tool, "#!/bin/sh\necho 'no builds in unit tests' >&2\nexit 1\n")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    printed: dict[str, str] = {}
    for script in ("build-kube.sh", "build-runtime.sh"):
        result = subprocess.run(
            [REPO / "scripts" / script],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        printed |= dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert printed == {
        "KUBE_BIN": str(binaries.kube_bin_dir()),
        "ETCD_BIN": str(binaries.etcd_bin_dir()),
        "CONTAINERD_BIN": str(binaries.containerd_bin_dir()),
        "RUNC_BIN": str(binaries.runc_bin_dir()),
        "PAUSE_BIN": str(binaries.pause_bin_dir()),
        "COREDNS_BIN": str(binaries.coredns_bin_dir()),
    }


@dataclass(frozen=True, slots=True)
class Group:
    args: tuple[str, ...]
    names: frozenset[str]  # what a warm run of build-kube.sh with `args` must find


GROUPS = [
    pytest.param(
        Group((), binaries.KUBE_LAB_BINARIES | binaries.KUBE_NODE_BINARIES | {"etcd"}),
        id="no argument means all: the lab and the nodes, without e2e.test and ginkgo",
    ),
    pytest.param(
        Group(("lab",), binaries.KUBE_LAB_BINARIES | {"etcd"}),
        id="lab: the control plane of the namespace lab and etcd",
    ),
    pytest.param(
        Group(("nodes",), binaries.KUBE_NODE_BINARIES),
        id="nodes: kubelet, controller manager, scheduler and agnhost",
    ),
    pytest.param(
        Group(("conformance",), binaries.KUBE_CONFORMANCE_BINARIES),
        id="conformance: e2e.test and ginkgo only",
    ),
]


def run_build_kube(args: tuple[str, ...], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run scripts/build-kube.sh with a `go` that fails: a run that would build anything fails."""
    stubs = tmp_path / "stubs"
    make_executable(stubs / "go", "#!/bin/sh\necho 'no builds in unit tests' >&2\nexit 1\n")
    return subprocess.run(
        [REPO / "scripts" / "build-kube.sh", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"},
        timeout=60,
        check=False,
    )


def fake_group(names: frozenset[str]) -> None:
    """Put fakes of `names` where binaries looks, with the image check's cached result."""
    for name in names:
        make_executable(binaries.location(name).directory / name)
    versions = binaries.read_versions()
    images = binaries.kube_bin_dir() / "e2e-images.env"
    images.parent.mkdir(parents=True, exist_ok=True)
    images.write_text(
        f"AGNHOST_IMAGE={versions['AGNHOST_IMAGE']}\nPAUSE_IMAGE={versions['PAUSE_IMAGE']}\n"
    )


@pytest.mark.parametrize("group", GROUPS)
def test_a_warm_build_kube_group_needs_exactly_its_binaries(
    group: Group, cache: Path, tmp_path: Path
) -> None:
    fake_group(group.names)
    warm = run_build_kube(group.args, tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert dict(line.split("=", 1) for line in warm.stdout.splitlines())["KUBE_BIN"] == str(
        binaries.kube_bin_dir()
    )
    # Each binary of the group counts: without it, the run gets as far as `go` and fails.
    for name in sorted(group.names):
        path = binaries.location(name).directory / name
        path.rename(path.with_suffix(".away"))
        cold = run_build_kube(group.args, tmp_path)
        assert cold.returncode != 0, f"{name} missing, yet {group.args} built nothing"
        assert "no builds in unit tests" in cold.stderr, cold.stderr
        path.with_suffix(".away").rename(path)


def test_build_kube_refuses_an_unknown_group(cache: Path, tmp_path: Path) -> None:
    result = run_build_kube(("e2e",), tmp_path)
    assert result.returncode == 2
    assert "usage:" in result.stderr
    assert "conformance" in result.stderr
