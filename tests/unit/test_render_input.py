"""What `nodelb render -f` reads (agent/kube/manifests.py): JSON through orjson, YAML through
libyaml, every malformed input named by file, document, List item and line:column."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from agent.kube import manifests
from agent.kube.manifests import ManifestError, line_column, load_files

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "d"}}
SLICE = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {"name": "a-1", "namespace": "d"},
}


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def names(by_kind: dict[str, list[Mapping[str, Any]]]) -> dict[str, list[str]]:
    return {k: [o["metadata"]["name"] for o in v] for k, v in by_kind.items()}


def no_warning(message: str) -> None:
    raise AssertionError(f"unexpected warning: {message}")


# -- what is read -----------------------------------------------------------------------------


def test_a_kubectl_json_list_is_read_with_orjson_by_kind(tmp_path: Path) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": [SERVICE, SLICE, SERVICE]}
    path = write(tmp_path, "state.json", orjson.dumps(doc))
    got = load_files([path], warn=no_warning)
    assert names(got) == {"Service": ["a", "a"], "EndpointSlice": ["a-1"]}


def test_json_content_under_another_name_is_sniffed_as_json(tmp_path: Path) -> None:
    path = write(
        tmp_path, "state.out", b"\n  " + orjson.dumps({"kind": "ServiceList", "items": [SERVICE]})
    )
    assert names(load_files([path], warn=no_warning)) == {"Service": ["a"]}


def test_a_multi_document_yaml_stream_keeps_its_order_and_skips_empty_documents(
    tmp_path: Path,
) -> None:
    text = (
        "---\n"
        + yaml.safe_dump(SERVICE)
        + "---\n---\n"
        + yaml.safe_dump({"kind": "EndpointSliceList", "items": [SLICE, SLICE]})
    )
    path = write(tmp_path, "state.yaml", text)
    assert names(load_files([path], warn=no_warning)) == {
        "Service": ["a"],
        "EndpointSlice": ["a-1", "a-1"],
    }


def test_several_files_add_up(tmp_path: Path) -> None:
    a = write(tmp_path, "a.json", orjson.dumps(SERVICE))
    b = write(tmp_path, "b.yml", yaml.safe_dump(SERVICE))
    assert names(load_files([a, b], warn=no_warning)) == {"Service": ["a", "a"]}


def test_a_list_with_items_null_is_an_object_of_kind_list_not_an_error(tmp_path: Path) -> None:
    # `items` not a list: the document is kept as the one object it claims to be.
    path = write(tmp_path, "odd.yaml", "kind: List\nmetadata: {name: l}\nitems: null\n")
    assert names(load_files([path], warn=no_warning)) == {"List": ["l"]}


# -- malformed input, each with the message an operator needs ----------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    text: str | bytes
    message: str  # the whole error, with {path} for the file's path


BAD = [
    pytest.param(
        Bad(
            "broken.json",
            '{"kind": "List",\n  "items": [\n    {"kind": "Service",, }\n]}',
            "{path}: document 0: line 3, column 24: not valid JSON: ",
        ),
        id="a JSON syntax error gives the line and column orjson's character offset points at",
    ),
    pytest.param(
        Bad(
            "accents.json",
            '{"kind": "Service",\n "metadata": {"name": "\u00e9t\u00e9", "x": }}',
            "{path}: document 0: line 2, column 35: not valid JSON: ",
        ),
        id="the JSON column counts characters, not UTF-8 bytes",
    ),
    pytest.param(
        Bad(
            "cut.json",
            '{"kind": "List", "items": [',
            "{path}: document 0: line 1, column 28: not valid JSON: ",
        ),
        id="a JSON file cut short points at its end",
    ),
    pytest.param(
        Bad("latin1.json", b'{"kind": "Service", "x": "\xe9"}', "{path}: document 0: "),
        id="JSON that is not UTF-8 is refused, naming the file",
    ),
    pytest.param(
        Bad(
            "three.yaml",
            "kind: Service\n---\nkind: Service\n---\nkind: [Service\nx: 1\n",
            "{path}: document 2: line 6, column 2: not valid YAML: ",
        ),
        id="a YAML syntax error names the document of the stream it is in, and its position",
    ),
    pytest.param(
        Bad(
            "tabs.yaml",
            "kind: Service\nmetadata:\n\tname: a\n",
            "{path}: document 0: line 3, column 1: not valid YAML: ",
        ),
        id="a tab indent is refused with its position",
    ),
    pytest.param(
        Bad(
            "tag.yaml",
            "kind: !!python/object:os.system Service\n",
            "{path}: document 0: line 1, column 7: not valid YAML: ",
        ),
        id="a Python tag is refused by the safe loader, with its position",
    ),
    pytest.param(
        Bad(
            "scalar.yaml",
            "kind: Service\n---\njust text\n",
            "{path}: document 1: not a Kubernetes object (no kind)",
        ),
        id="a YAML document that is not a mapping names its index",
    ),
    pytest.param(
        Bad(
            "item.json",
            orjson.dumps({"kind": "List", "items": [SERVICE, SERVICE, {"metadata": {}}]}),
            "{path}: document 0, item 2: not a Kubernetes object (no kind)",
        ),
        id="a List item without kind names the item",
    ),
    pytest.param(
        Bad(
            "nested.yaml",
            "kind: Service\n---\nkind: List\nitems:\n"
            "- kind: List\n  items: [{kind: Service}, [1]]\n",
            "{path}: document 1, item 0, item 1: not a Kubernetes object (no kind)",
        ),
        id="a List inside a List names both items",
    ),
    pytest.param(
        Bad("array.json", "[1, 2]", "{path}: document 0: not a Kubernetes object (no kind)"),
        id="a top-level JSON array is not a Kubernetes object",
    ),
]


@pytest.mark.parametrize("bad", BAD)
def test_malformed_input_names_the_file_document_and_position(tmp_path: Path, bad: Bad) -> None:
    path = write(tmp_path, bad.name, bad.text)
    with pytest.raises(ManifestError) as err:
        load_files([path], warn=no_warning)
    assert str(err.value).startswith(bad.message.format(path=path)), str(err.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"gone\.yaml: No such file"):
        load_files([tmp_path / "gone.yaml"])


@pytest.mark.parametrize(
    ("text", "pos", "expected"),
    [
        ("abc", 0, (1, 1)),
        ("abc", 2, (1, 3)),
        ("ab\ncd", 3, (2, 1)),
        ("ab\ncd", 4, (2, 2)),
        ("ab\n", 3, (2, 1)),
        ("ab", 99, (1, 3)),
        ("\n\n\n", 2, (3, 1)),
    ],
)
def test_line_column_of_a_character_offset(text: str, pos: int, expected: tuple[int, int]) -> None:
    assert line_column(text, pos) == expected


# -- the loader -------------------------------------------------------------------------------


def test_yaml_is_read_with_libyaml_when_pyyaml_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[type[object]] = []
    real = manifests.parse_yaml

    def spy(data: bytes, source: str, *, loader: type[object]) -> list[object]:
        used.append(loader)
        return real(data, source, loader=loader)

    monkeypatch.setattr(manifests, "parse_yaml", spy)
    path = write(tmp_path, "s.yaml", yaml.safe_dump(SERVICE))
    load_files([path, path], warn=no_warning)
    assert used == [yaml.CSafeLoader, yaml.CSafeLoader]


def test_without_libyaml_the_pure_python_loader_reads_yaml_after_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(yaml, "CSafeLoader")
    warnings: list[str] = []
    a = write(tmp_path, "a.yaml", yaml.safe_dump(SERVICE))
    b = write(tmp_path, "b.yaml", "kind: Service\n---\nkind: [\n")
    assert names(load_files([a, a], warn=warnings.append)) == {"Service": ["a", "a"]}
    assert len(warnings) == 1 and "CSafeLoader" in warnings[0] and "slower" in warnings[0]
    # Errors from the pure-Python loader carry the same document and position.
    with pytest.raises(
        ManifestError, match=r"b\.yaml: document 1: line 4, column 1: not valid YAML"
    ):
        load_files([b], warn=warnings.append)


def test_without_libyaml_json_needs_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(yaml, "CSafeLoader")
    path = write(tmp_path, "a.json", orjson.dumps(SERVICE))
    assert names(load_files([path], warn=no_warning)) == {"Service": ["a"]}


def test_the_default_warning_goes_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delattr(yaml, "CSafeLoader")
    load_files([write(tmp_path, "a.yaml", yaml.safe_dump(SERVICE))])
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("warning: PyYAML has no libyaml")
