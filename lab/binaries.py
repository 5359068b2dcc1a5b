"""Locate the pinned binaries that scripts/build-kube.sh and scripts/build-runtime.sh build.

Each family of binaries lives in a cache directory keyed by what it is built from:
`$NODELB_CACHE/<family>/<version>` (NODELB_CACHE defaults to `~/.cache/nodelb`), with the
versions read from the repo's `versions.env`, the single place they are pinned; pause is keyed
by a hash of its source, `lab/images/pause/pause.c`. An environment variable per family
(NODELB_KUBE_BIN, NODELB_ETCD_BIN, NODELB_CONTAINERD_BIN, NODELB_RUNC_BIN, NODELB_PAUSE_BIN,
NODELB_COREDNS_BIN) names the directory instead when set.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

VERSIONS_FILE = Path(__file__).resolve().parents[1] / "versions.env"
PAUSE_SOURCE = Path(__file__).resolve().parent / "images" / "pause" / "pause.c"

# What the namespace lab's control plane runs, what real nodes add (issue #13), and the
# upstream e2e suite with the ginkgo CLI that runs it (issue #14); the groups are also
# scripts/build-kube.sh's arguments. The conformance group is built only when asked for.
KUBE_LAB_BINARIES = frozenset({"kube-apiserver", "kube-proxy", "kubectl"})
KUBE_NODE_BINARIES = frozenset({"kubelet", "kube-controller-manager", "kube-scheduler", "agnhost"})
KUBE_CONFORMANCE_BINARIES = frozenset({"e2e.test", "ginkgo"})
KUBE_BINARIES = KUBE_LAB_BINARIES | KUBE_NODE_BINARIES | KUBE_CONFORMANCE_BINARIES
ETCD_BINARIES = frozenset({"etcd"})
CONTAINERD_BINARIES = frozenset({"containerd", "containerd-shim-runc-v2", "ctr"})
RUNC_BINARIES = frozenset({"runc"})
PAUSE_BINARIES = frozenset({"pause"})
# The real-node lab's cluster DNS; nodes run it from an image (scripts/build-images.sh).
COREDNS_BINARIES = frozenset({"coredns"})


class BinaryMissing(FileNotFoundError):
    """A pinned binary is not where it should be; the message says how to build it."""


@dataclass(frozen=True, slots=True)
class Location:
    """Where a binary is looked for and how it gets there."""

    directory: Path
    env_var: str  # names `directory` instead of the cache when set
    key: str  # what the cache directory is keyed by
    build: str  # the command that builds it


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Return the KEY=value pairs of a versions.env file (comments and blank lines skipped)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not a KEY=value line: {raw!r}")
        versions[key.strip()] = value.strip().strip("'\"")
    return versions


def kube_version() -> str:
    """Return the pinned Kubernetes version, e.g. "v1.37.2"."""
    return read_versions()["KUBE_VERSION"]


def etcd_version() -> str:
    """Return the pinned etcd version, e.g. "v3.6.16"."""
    return read_versions()["ETCD_VERSION"]


def containerd_version() -> str:
    """Return the pinned containerd version, e.g. "v2.4.2"."""
    return read_versions()["CONTAINERD_VERSION"]


def runc_version() -> str:
    """Return the pinned runc version, e.g. "v1.5.3"."""
    return read_versions()["RUNC_VERSION"]


def coredns_version() -> str:
    """Return the pinned CoreDNS version, e.g. "v1.15.0"."""
    return read_versions()["COREDNS_VERSION"]


def pause_key(source: Path = PAUSE_SOURCE) -> str:
    """Return pause's cache key: the first 16 hex digits of its source's SHA-256.

    scripts/build-runtime.sh names the directory the same way (`sha256sum | cut -c1-16`).
    """
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def cache_dir() -> Path:
    """Return the cache root the build scripts use: $NODELB_CACHE, else ~/.cache/nodelb."""
    env = os.environ.get("NODELB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nodelb"


def _directory(env_var: str, *under_cache: str) -> Path:
    env = os.environ.get(env_var)
    return Path(env) if env else cache_dir().joinpath(*under_cache)


def kube_bin_dir() -> Path:
    """Return the directory holding the Kubernetes binaries (KUBE_BINARIES)."""
    return _directory("NODELB_KUBE_BIN", "k8s", kube_version())


def etcd_bin_dir() -> Path:
    """Return the directory holding etcd."""
    return _directory("NODELB_ETCD_BIN", "etcd", etcd_version())


def containerd_bin_dir() -> Path:
    """Return the directory holding containerd, containerd-shim-runc-v2 and ctr."""
    return _directory("NODELB_CONTAINERD_BIN", "containerd", containerd_version())


def runc_bin_dir() -> Path:
    """Return the directory holding runc."""
    return _directory("NODELB_RUNC_BIN", "runc", runc_version())


def pause_bin_dir() -> Path:
    """Return the directory holding pause, built from the source as it is now."""
    return _directory("NODELB_PAUSE_BIN", "pause", pause_key())


def coredns_bin_dir() -> Path:
    """Return the directory holding coredns."""
    return _directory("NODELB_COREDNS_BIN", "coredns", coredns_version())


def _pin(key: str) -> str:
    return f"{key} in versions.env"


def location(name: str) -> Location:
    """Return where the pinned binary `name` is looked for; raise ValueError for other names."""
    kube, runtime = "scripts/build-kube.sh", "scripts/build-runtime.sh"
    if name in KUBE_LAB_BINARIES:
        return Location(kube_bin_dir(), "NODELB_KUBE_BIN", _pin("KUBE_VERSION"), f"{kube} lab")
    if name in KUBE_NODE_BINARIES:
        return Location(kube_bin_dir(), "NODELB_KUBE_BIN", _pin("KUBE_VERSION"), f"{kube} nodes")
    if name in KUBE_CONFORMANCE_BINARIES:
        build = f"{kube} conformance"
        return Location(kube_bin_dir(), "NODELB_KUBE_BIN", _pin("KUBE_VERSION"), build)
    if name in ETCD_BINARIES:
        return Location(etcd_bin_dir(), "NODELB_ETCD_BIN", _pin("ETCD_VERSION"), f"{kube} lab")
    if name in CONTAINERD_BINARIES:
        key = _pin("CONTAINERD_VERSION")
        return Location(containerd_bin_dir(), "NODELB_CONTAINERD_BIN", key, runtime)
    if name in RUNC_BINARIES:
        return Location(runc_bin_dir(), "NODELB_RUNC_BIN", _pin("RUNC_VERSION"), runtime)
    if name in PAUSE_BINARIES:
        key = "the hash of lab/images/pause/pause.c"
        return Location(pause_bin_dir(), "NODELB_PAUSE_BIN", key, runtime)
    if name in COREDNS_BINARIES:
        key = _pin("COREDNS_VERSION")
        return Location(coredns_bin_dir(), "NODELB_COREDNS_BIN", key, runtime)
    raise ValueError(f"unknown binary {name!r}")


def binary(name: str) -> Path:
    """Return the path of the pinned binary `name`; raise BinaryMissing if it is not built."""
    where = location(name)
    path = where.directory / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        origin = (
            f"${where.env_var}"
            if os.environ.get(where.env_var)
            else f"$NODELB_CACHE or ~/.cache/nodelb, keyed by {where.key}"
        )
        raise BinaryMissing(
            f"{name} not found at {path} (directory from {origin}): run {where.build}"
        )
    return path


def pinned_tool(name: str, *, versions: str, key: str) -> Path:
    """Return where a tool built by scripts/build-<name>.sh lives: $<NAME> when set, else
    <cache>/<name>/<version>/<name>, the version read as `key` from the repository's
    `versions` file (promtool, helm)."""
    if env := os.environ.get(name.upper()):
        return Path(env)
    version = read_versions(VERSIONS_FILE.parent / versions)[key]
    cache = Path(os.environ.get("NODELB_CACHE", Path.home() / ".cache" / "nodelb"))
    return cache / name / version / name
