"""The OCI image archives each lab node imports into containerd (`ctr -n k8s.io images import`).

No registry is reachable from the lab, so each image a node runs arrives as an archive built by
scripts/build-images.sh (`make images`): nodelb's own image from deploy/Containerfile, and the
pause and agnhost images under the references the Kubernetes e2e framework uses. The script is
the one place that knows the references and the cache paths (nodelb's path is keyed by a hash of
its build inputs); `scripts/build-images.sh --list` prints them without building anything, one
`<reference><TAB><archive>` line per image, and this module reads that.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build-images.sh"
LIST_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class ImageArchive:
    """One image a node imports: the reference it must carry and the OCI archive holding it.

    The archive's index names the image with the `org.opencontainers.image.ref.name`
    annotation, so importing it without `--base-name` stores it under `reference`.
    """

    reference: str
    archive: Path


class ImageArchiveMissing(FileNotFoundError):
    """An archive the lab needs is not built; the message names each one and the script."""


class ImageListingError(RuntimeError):
    """scripts/build-images.sh --list failed or printed something that is not a listing."""


def parse_listing(text: str) -> list[ImageArchive]:
    """Return the images of a `build-images.sh --list` output, in its order.

    Each non-empty line is `<reference><TAB><absolute archive path>`; anything else, an
    empty listing or a reference listed twice raises ImageListingError.
    """
    images: list[ImageArchive] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        reference, sep, archive = line.partition("\t")
        path = Path(archive)
        if not sep or not reference or "\t" in archive or not path.is_absolute():
            raise ImageListingError(f"line {number}: not '<reference><TAB><archive>': {line!r}")
        images.append(ImageArchive(reference=reference, archive=path))
    if not images:
        raise ImageListingError("the listing names no image")
    references = [image.reference for image in images]
    duplicates = sorted({ref for ref in references if references.count(ref) > 1})
    if duplicates:
        raise ImageListingError(f"references listed more than once: {', '.join(duplicates)}")
    return images


def missing_archives(images: Sequence[ImageArchive]) -> list[ImageArchive]:
    """Return the images whose archive is not a file (empty when every archive is built)."""
    return [image for image in images if not image.archive.is_file()]


def require_archives(images: Sequence[ImageArchive]) -> list[ImageArchive]:
    """Return `images` unchanged when every archive exists; else raise ImageArchiveMissing."""
    missing = missing_archives(images)
    if missing:
        lines = "".join(f"\n  {image.reference}: {image.archive}" for image in missing)
        raise ImageArchiveMissing(
            f"image archives not built:{lines}\nrun scripts/build-images.sh (make images)"
        )
    return list(images)


def list_images(script: Path = SCRIPT) -> list[ImageArchive]:
    """Return every image the lab imports, as `script --list` names them (built or not)."""
    try:
        result = subprocess.run(
            [str(script), "--list"],
            capture_output=True,
            text=True,
            timeout=LIST_TIMEOUT,
            check=False,
        )
    except OSError as err:
        raise ImageListingError(f"cannot run {script}: {err}") from err
    if result.returncode != 0:
        raise ImageListingError(
            f"{script} --list exited {result.returncode}: {result.stderr.strip()}"
        )
    return parse_listing(result.stdout)


def lab_images(script: Path = SCRIPT) -> list[ImageArchive]:
    """Return every image the lab imports into each node; raise ImageArchiveMissing if unbuilt."""
    return require_archives(list_images(script))
