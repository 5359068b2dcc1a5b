"""The pinned helm (scripts/build-helm.sh) and the chart's renderings, for the tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lab import binaries

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "nodelb"
ALL_VALUES = CHART / "ci" / "all-values.yaml"
TIMEOUT = 60.0


def helm_path() -> Path:
    """Return the pinned helm's path: $HELM, else the build script's cache directory."""
    return binaries.pinned_tool("helm", versions="versions-helm.env", key="HELM_VERSION")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Return a finished run of the pinned helm (never raises on a non-zero exit)."""
    return subprocess.run(
        [str(helm_path()), *args], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def template(*args: str, namespace: str = "nodelb-system") -> str:
    """Return `helm template` of the chart (release nodelb); raise with helm's stderr on error."""
    done = helm("template", "nodelb", str(CHART), "--namespace", namespace, *args)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr}")
    return done.stdout
