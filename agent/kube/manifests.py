"""Read Kubernetes objects from YAML/JSON files as `kubectl get -o yaml|json` prints them.

JSON is parsed with orjson, YAML with libyaml's C loader (`yaml.CSafeLoader`); PyYAML's
pure-Python loader, ~50 times slower, is used only when PyYAML was built without libyaml, and
then with a warning. Which parser reads a file: a `.json` name means JSON, `.yaml` / `.yml`
YAML; any other name is JSON when its first non-blank character is `{` or `[`, else YAML.
A JSON file is one document; a YAML file is a stream of `---`-separated documents. Every
error names the file, the document's index in the stream (from 0) and, inside a `kind: List`
(or any `*List`), the item's index; a syntax error also gives its line and column (from 1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml


class ManifestError(ValueError):
    """A file could not be read or holds something that is not a Kubernetes object."""


Warn = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def yaml_loader(warn: Warn = _stderr) -> type[Any]:
    """Return libyaml's safe loader, or the pure-Python one after a warning when it is missing."""
    loader: type[Any] | None = getattr(yaml, "CSafeLoader", None)
    if loader is not None:
        return loader
    warn(
        "PyYAML has no libyaml (yaml.CSafeLoader): reading YAML with the pure-Python loader, "
        "which is ~50 times slower; install PyYAML with libyaml, or give JSON"
    )
    return yaml.SafeLoader


def line_column(text: str, pos: int) -> tuple[int, int]:
    """Return the line and column (both from 1) of character offset `pos` in `text`."""
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def parse_json(data: bytes, source: str) -> list[Any]:
    """Return the one document of a JSON file (raises ManifestError naming the position)."""
    try:
        return [orjson.loads(data)]
    except orjson.JSONDecodeError as exc:
        # orjson's `pos` is a character offset in the decoded text (`exc.doc`).
        line, column = line_column(str(exc.doc), exc.pos)
        raise ManifestError(
            f"{source}: document 0: line {line}, column {column}: not valid JSON: {exc.msg}"
        ) from None


def parse_yaml(data: bytes, source: str, *, loader: type[Any]) -> list[Any]:
    """Return the documents of a YAML stream, in order (raises ManifestError naming the
    document and position of the first error)."""
    docs: list[Any] = []
    try:
        for doc in yaml.load_all(data, Loader=loader):
            docs.append(doc)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f"line {mark.line + 1}, column {mark.column + 1}: "
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        about = f"{context}: {problem}" if context else problem
        raise ManifestError(
            f"{source}: document {len(docs)}: {where}not valid YAML: {about}"
        ) from None
    return docs


def is_json(path: Path, data: bytes) -> bool:
    """Return True when `path` is read as JSON (see the module docstring)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return True
    if suffix in (".yaml", ".yml"):
        return False
    return data.lstrip()[:1] in (b"{", b"[")


def iter_objects(doc: Any, where: str) -> Iterator[Mapping[str, Any]]:
    """Yield every object in a document, unwrapping `kind: List` / `*List` documents.

    `where` names the document in errors ("file: document 2"); an item adds its index.
    """
    if doc is None:
        return
    if not isinstance(doc, Mapping) or "kind" not in doc:
        raise ManifestError(f"{where}: not a Kubernetes object (no kind)")
    if str(doc["kind"]).endswith("List") and isinstance(doc.get("items"), list):
        for i, item in enumerate(doc["items"]):
            yield from iter_objects(item, f"{where}, item {i}")
        return
    yield doc


def load_files(paths: list[Path], *, warn: Warn = _stderr) -> dict[str, list[Mapping[str, Any]]]:
    """Return the objects of every file grouped by kind (multi-document YAML and JSON)."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    loader: type[Any] | None = None
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ManifestError(f"{path}: {exc.strerror or exc}") from None
        if is_json(path, data):
            docs = parse_json(data, str(path))
        else:
            loader = loader or yaml_loader(warn)
            docs = parse_yaml(data, str(path), loader=loader)
        for index, doc in enumerate(docs):
            for obj in iter_objects(doc, f"{path}: document {index}"):
                by_kind.setdefault(str(obj["kind"]), []).append(obj)
    return by_kind
