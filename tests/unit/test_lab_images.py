"""lab.images: which OCI archives the lab's nodes import, and the script that names them.

Nothing is built here: the listing is parsed from strings, archives are files in a temp dir,
and scripts/build-images.sh runs only in its `--list` mode (git and bash, no root).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lab import images
from lab.binaries import read_versions

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images.sh"


@dataclass(frozen=True, slots=True)
class BadListing:
    text: str
    error: str


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(BadListing("", "names no image"), id="an empty listing names no image"),
        pytest.param(
            BadListing("example.org/a:1 /cache/a.oci.tar\n", "line 1"),
            id="a line separated by a space instead of a tab is refused",
        ),
        pytest.param(
            BadListing("example.org/a:1\trelative/a.oci.tar\n", "line 1"),
            id="a relative archive path is refused",
        ),
        pytest.param(
            BadListing("\t/cache/a.oci.tar\n", "line 1"), id="a line without a reference is refused"
        ),
        pytest.param(
            BadListing("example.org/a:1\t/cache/a.oci.tar\textra\n", "line 1"),
            id="a line with a third field is refused",
        ),
        pytest.param(
            BadListing("example.org/a:1\t/x/a.tar\nexample.org/a:1\t/y/a.tar\n", "more than once"),
            id="a reference listed twice is refused",
        ),
    ],
)
def test_malformed_listings_are_refused(case: BadListing) -> None:
    with pytest.raises(images.ImageListingError, match=case.error):
        images.parse_listing(case.text)


def test_a_listing_keeps_its_order_and_skips_blank_lines() -> None:
    text = "ghcr.io/x/y:0.1.0\t/cache/y.oci.tar\n\nregistry.k8s.io/pause:3\t/cache/p.oci.tar\n"
    assert images.parse_listing(text) == [
        images.ImageArchive("ghcr.io/x/y:0.1.0", Path("/cache/y.oci.tar")),
        images.ImageArchive("registry.k8s.io/pause:3", Path("/cache/p.oci.tar")),
    ]


def test_missing_archives_are_named_with_the_script_that_builds_them(tmp_path: Path) -> None:
    built = tmp_path / "built.oci.tar"
    built.write_bytes(b"")
    wanted = [
        images.ImageArchive("example.org/built:1", built),
        images.ImageArchive("example.org/absent:1", tmp_path / "absent.oci.tar"),
        images.ImageArchive("example.org/dir:1", tmp_path),
    ]
    assert images.missing_archives(wanted) == wanted[1:]
    with pytest.raises(images.ImageArchiveMissing) as raised:
        images.require_archives(wanted)
    message = str(raised.value)
    assert "example.org/absent:1" in message and "example.org/dir:1" in message
    assert "example.org/built:1" not in message
    assert "scripts/build-images.sh" in message


def test_every_archive_present_returns_the_list(tmp_path: Path) -> None:
    archive = tmp_path / "a.oci.tar"
    archive.write_bytes(b"")
    wanted = [images.ImageArchive("example.org/a:1", archive)]
    assert images.require_archives(wanted) == wanted


def fake_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "build-images.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_lab_images_reads_the_scripts_listing(tmp_path: Path) -> None:
    archive = tmp_path / "a.oci.tar"
    archive.write_bytes(b"")
    script = fake_script(tmp_path, f'[ "$1" = --list ] && printf "example.org/a:1\\t{archive}\\n"')
    assert images.lab_images(script) == [images.ImageArchive("example.org/a:1", archive)]


def test_a_failing_script_is_reported_with_its_error(tmp_path: Path) -> None:
    script = fake_script(tmp_path, "echo 'not a git checkout' >&2; exit 1")
    with pytest.raises(images.ImageListingError, match="not a git checkout"):
        images.list_images(script)
    with pytest.raises(images.ImageListingError, match="cannot run"):
        images.list_images(tmp_path / "absent.sh")


# -- the real script, in --list mode, on a small copy of the repo --------------------------

COPIED = [
    "scripts/build-images.sh",
    "versions.env",
    "deploy/daemonset.yaml",
    "deploy/Containerfile",
    "deploy/Containerfile.dockerignore",
    "pyproject.toml",
    "README.md",
    "agent/__init__.py",
    "rules/__init__.py",
    "tests/__init__.py",
]


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a committed git repo holding the files the script and nodelb's image read."""
    if shutil.which("git") is None:
        pytest.fail("git is not installed")
    repo = tmp_path / "repo"
    for name in COPIED:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "copy")
    monkeypatch.setenv("NODELB_CACHE", str(tmp_path / "cache"))
    return repo


def listing_of(repo: Path) -> dict[str, Path]:
    return {
        image.reference: image.archive
        for image in images.list_images(repo / "scripts" / "build-images.sh")
    }


def nodelb_archive(repo: Path) -> Path:
    return listing_of(repo)[daemonset_image()]


def daemonset_image() -> str:
    """Return the one image deploy/daemonset.yaml runs, read as YAML (helm quotes it)."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text())
    references: set[str] = {
        str(c["image"])
        for d in docs
        if d and d.get("kind") in {"DaemonSet", "Deployment"}
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    (reference,) = references
    return reference


def test_the_script_lists_nodelb_the_e2e_images_and_coredns_under_the_cache(
    repo: Path, tmp_path: Path
) -> None:
    versions = read_versions()
    by_ref = listing_of(repo)
    assert set(by_ref) == {
        daemonset_image(),
        versions["PAUSE_IMAGE"],
        versions["AGNHOST_IMAGE"],
        versions["COREDNS_IMAGE"],
    }
    assert all(path.is_relative_to(tmp_path / "cache" / "images") for path in by_ref.values())
    assert re.fullmatch(r"[0-9a-f]{16}", by_ref[daemonset_image()].parent.name)
    for key in ("PAUSE_IMAGE", "COREDNS_IMAGE"):
        reference = versions[key]
        assert by_ref[reference].parent.name == reference.rsplit(":", 1)[-1]


def test_the_e2e_references_are_those_of_the_pinned_kubernetes() -> None:
    versions = read_versions()
    assert versions["PAUSE_IMAGE"].startswith("registry.k8s.io/pause:")
    assert versions["AGNHOST_IMAGE"].startswith("registry.k8s.io/e2e-test-images/agnhost:")


def test_nodelb_key_moves_with_the_image_inputs_only(repo: Path) -> None:
    before = nodelb_archive(repo)
    (repo / "tests" / "__init__.py").write_text("# a test change\n")
    (repo / "docs.md").write_text("not an input\n")
    assert nodelb_archive(repo) == before, "files outside the image inputs moved the key"

    (repo / "agent" / "__init__.py").write_text("# a code change\n")
    changed = nodelb_archive(repo)
    assert changed != before
    git(repo, "commit", "-q", "-am", "code change")
    assert nodelb_archive(repo) == changed, "committing the same content moved the key"

    (repo / "rules" / "new_module.py").write_text("X = 1\n")
    assert nodelb_archive(repo) not in {before, changed}, "an untracked input did not count"


def test_nodelb_key_ignores_git_ignored_files(repo: Path) -> None:
    before = nodelb_archive(repo)
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "add", ".gitignore")
    cache = repo / "agent" / "__pycache__"
    cache.mkdir()
    (cache / "x.pyc").write_bytes(b"\0")
    assert nodelb_archive(repo) == before


def test_the_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: make test installs it (Debian package)")
    result = subprocess.run(
        [shellcheck, "-x", SCRIPT.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=SCRIPT.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the lab images' recipes ------------------------------------------------------------------


def instructions(name: str) -> list[str]:
    text = (ROOT / "lab" / "images" / name / "Containerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def test_pause_is_the_static_binary_alone() -> None:
    lines = instructions("pause")
    assert lines[0] == "FROM scratch"
    assert 'ENTRYPOINT ["/pause"]' in lines
    assert [line for line in lines if line.startswith(("RUN", "FROM"))] == ["FROM scratch"]


def test_agnhost_has_the_tools_the_e2e_specs_exec() -> None:
    lines = instructions("agnhost")
    assert lines[0] == "FROM docker.io/library/debian:bookworm-slim"
    installed = set(" ".join(line for line in lines if line.startswith("RUN")).split())
    assert {"curl", "netcat-openbsd", "iproute2", "iputils-ping", "dnsutils"} <= installed
    assert 'ENTRYPOINT ["/agnhost"]' in lines
