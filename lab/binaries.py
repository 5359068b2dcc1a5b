"""Locate the pinned etcd and Kubernetes binaries that scripts/build-kube.sh builds.

The directories come from NODELB_ETCD_BIN / NODELB_KUBE_BIN when set (the Makefile exports
them), else from `~/.cache/nodelb/{etcd,k8s}/<version>` with the versions read from the repo's
`versions.env`, the single place they are pinned.
"""

from __future__ import annotations

import os
from pathlib import Path

VERSIONS_FILE = Path(__file__).resolve().parents[1] / "versions.env"
CACHE_DIR = Path.home() / ".cache" / "nodelb"

KUBE_BINARIES = frozenset({"kube-apiserver", "kube-proxy", "kubectl"})
ETCD_BINARIES = frozenset({"etcd"})


class BinaryMissing(FileNotFoundError):
    """A pinned binary is not where it should be; the message says how to build it."""


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


def kube_bin_dir() -> Path:
    """Return the directory holding kube-apiserver, kube-proxy and kubectl."""
    env = os.environ.get("NODELB_KUBE_BIN")
    return Path(env) if env else CACHE_DIR / "k8s" / kube_version()


def etcd_bin_dir() -> Path:
    """Return the directory holding etcd."""
    env = os.environ.get("NODELB_ETCD_BIN")
    return Path(env) if env else CACHE_DIR / "etcd" / etcd_version()


def binary(name: str) -> Path:
    """Return the path of the pinned binary `name`; raise BinaryMissing if it is not built."""
    if name in KUBE_BINARIES:
        directory, var = kube_bin_dir(), "NODELB_KUBE_BIN"
    elif name in ETCD_BINARIES:
        directory, var = etcd_bin_dir(), "NODELB_ETCD_BIN"
    else:
        raise ValueError(f"unknown binary {name!r}")
    path = directory / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinaryMissing(
            f"{name} not found at {path} (directory from {var} or versions.env): "
            "run scripts/build-kube.sh"
        )
    return path
