"""lab.binaries: where the pinned etcd / Kubernetes binaries are looked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import binaries


def test_versions_come_from_the_repo_versions_file() -> None:
    versions = binaries.read_versions()
    assert versions["KUBE_VERSION"].startswith("v1.")
    assert versions["ETCD_VERSION"].startswith("v3.")


def test_read_versions_skips_comments_and_strips_quotes(tmp_path: Path) -> None:
    path = tmp_path / "versions.env"
    path.write_text("# pinned\n\nKUBE_VERSION=v1.2.3\nETCD_VERSION='v3.4.5'\n")
    assert binaries.read_versions(path) == {"KUBE_VERSION": "v1.2.3", "ETCD_VERSION": "v3.4.5"}


def test_default_dirs_are_the_cache_keyed_by_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODELB_KUBE_BIN", raising=False)
    monkeypatch.delenv("NODELB_ETCD_BIN", raising=False)
    assert binaries.kube_bin_dir() == binaries.CACHE_DIR / "k8s" / binaries.kube_version()
    assert binaries.etcd_bin_dir() == binaries.CACHE_DIR / "etcd" / binaries.etcd_version()


def test_env_vars_override_the_dirs_and_missing_binaries_say_how_to_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NODELB_KUBE_BIN", str(tmp_path))
    monkeypatch.setenv("NODELB_ETCD_BIN", str(tmp_path))
    etcd = tmp_path / "etcd"
    etcd.write_text("#!/bin/sh\n")
    etcd.chmod(0o755)
    assert binaries.binary("etcd") == etcd
    with pytest.raises(binaries.BinaryMissing, match=r"run scripts/build-kube\.sh"):
        binaries.binary("kube-apiserver")


def test_unknown_binary_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown binary"):
        binaries.binary("kubelet")
