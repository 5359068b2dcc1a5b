"""Read Kubernetes objects from YAML/JSON files as `kubectl get -o yaml` prints them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml


class ManifestError(ValueError):
    """A file could not be read or holds something that is not a Kubernetes object."""


def iter_objects(doc: Any, source: str) -> Iterator[Mapping[str, Any]]:
    """Yield every object in a document, unwrapping `kind: List` / `*List` documents."""
    if doc is None:
        return
    if not isinstance(doc, Mapping) or "kind" not in doc:
        raise ManifestError(f"{source}: not a Kubernetes object (no kind)")
    if str(doc["kind"]).endswith("List") and isinstance(doc.get("items"), list):
        for item in doc["items"]:
            yield from iter_objects(item, source)
        return
    yield doc


def load_files(paths: list[Path]) -> dict[str, list[Mapping[str, Any]]]:
    """Return the objects of every file grouped by kind (multi-document YAML and JSON)."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for path in paths:
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise ManifestError(f"{path}: {exc}") from None
        for doc in docs:
            for obj in iter_objects(doc, str(path)):
                by_kind.setdefault(str(obj["kind"]), []).append(obj)
    return by_kind
