"""The list+watch store and reflector: no lost or duplicated state across relists and reconnects."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from agent.backoff import Backoff
from agent.kube.reflector import Reflector, iter_lines
from agent.kube.store import Change, EventType, Store


def svc(name: str, port: int, rv: str = "1", ns: str = "default") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv},
        "spec": {"ports": [{"port": port}]},
    }


def parse(obj: Mapping[str, Any]) -> int:
    return int(obj["spec"]["ports"][0]["port"])


def test_replace_reports_deletes_that_happened_while_disconnected() -> None:
    store: Store[int] = Store(parse)
    store.replace([svc("a", 80), svc("b", 81)])
    changes = store.replace([svc("a", 80), svc("c", 82)])
    assert {(c.key, c.old, c.new) for c in changes} == {
        ("default/b", 81, None),
        ("default/c", None, 82),
    }
    assert store.items() == {"default/a": 80, "default/c": 82}


def test_apply_ignores_duplicate_and_unknown_deletes() -> None:
    store: Store[int] = Store(parse)
    assert store.apply(EventType.ADDED, svc("a", 80)) == Change("default/a", None, 80)
    assert store.apply(EventType.MODIFIED, svc("a", 80, rv="2")) is None
    assert store.apply(EventType.DELETED, svc("zzz", 1)) is None
    assert store.apply(EventType.DELETED, svc("a", 80)) == Change("default/a", 80, None)
    assert len(store) == 0


def test_iter_lines_joins_split_chunks_and_skips_blank_lines() -> None:
    chunks = iter([b'{"a":', b"1}\n\n", b'{"b":2}\n{"c"', b":3}"])
    assert list(iter_lines(chunks)) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


def test_backoff_doubles_per_failure_up_to_the_cap() -> None:
    b = Backoff(initial=0.5, maximum=3.0)
    assert [b.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


@dataclass
class FakeResponse:
    status: int
    data: bytes = b""
    lines: list[bytes] = field(default_factory=list)

    def stream(self, amt: int) -> Iterator[bytes]:
        yield from (line + b"\n" for line in self.lines)

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


@dataclass
class FakeServer:
    """Scripted API responses: each call pops the next one; records the calls made."""

    script: list[FakeResponse | Exception]
    calls: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __call__(self, **kwargs: Any) -> FakeResponse:
        self.calls.append(kwargs)
        if not self.script:
            self.stop.set()
            return FakeResponse(200)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def listing(rv: str, *items: dict[str, Any], cont: str | None = None) -> FakeResponse:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return FakeResponse(200, orjson.dumps({"metadata": meta, "items": list(items)}))


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


def test_reflector_lists_pages_watches_relists_on_gone_and_resumes_after_errors() -> None:
    gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
    server = FakeServer(
        [
            listing("10", svc("a", 80), cont="page2"),
            listing("11", svc("b", 81)),
            FakeResponse(
                200,
                lines=[
                    event("MODIFIED", svc("a", 8080, rv="12")),
                    event("BOOKMARK", {"metadata": {"resourceVersion": "15"}}),
                ],
            ),
            ConnectionResetError("connection reset"),
            FakeResponse(200, lines=[event("ERROR", gone)]),
            listing("30", svc("a", 8080), svc("c", 82)),
        ]
    )
    store: Store[int] = Store(parse)
    seen: list[tuple[str, int | None, int | None]] = []
    restarts: list[str] = []
    reflector = Reflector(
        name="services",
        list_fn=server,
        store=store,
        on_changes=lambda cs: seen.extend((c.key, c.old, c.new) for c in cs),
        backoff=Backoff(initial=0.0, maximum=0.0),
        on_restart=restarts.append,
    )
    reflector.run(server.stop)
    assert reflector.synced.is_set()
    assert store.items() == {"default/a": 8080, "default/c": 82}
    assert seen == [
        ("default/a", None, 80),
        ("default/b", None, 81),
        ("default/a", 80, 8080),
        ("default/b", 81, None),
        ("default/c", None, 82),
    ]
    assert restarts == ["error", "gone"]
    # The second page carried the continue token; the watch after the error resumed from the
    # bookmark's resourceVersion, not from the list's.
    assert server.calls[1]["_continue"] == "page2"
    watches = [c for c in server.calls if c.get("watch")]
    assert [w["resource_version"] for w in watches[:2]] == ["11", "15"]
    assert all(w["allow_watch_bookmarks"] for w in watches)


@pytest.mark.parametrize("status", [403, 500])
def test_reflector_retries_http_errors_without_marking_synced(status: int) -> None:
    server = FakeServer([FakeResponse(status, b"nope"), FakeResponse(status, b"nope")])
    store: Store[int] = Store(parse)
    restarts: list[str] = []
    reflector = Reflector(
        name="svc",
        list_fn=server,
        store=store,
        on_changes=lambda cs: None,
        backoff=Backoff(initial=0.0, maximum=0.0),
        on_restart=restarts.append,
    )
    reflector.run(server.stop)
    assert restarts[:2] == ["error", "error"]
    assert not reflector.synced.is_set()
    assert store.items() == {}


def parse_fresh(obj: Mapping[str, Any]) -> list[int]:
    """A parser that returns a new (equal) object on every call."""
    return [parse(obj)]


def test_replace_keeps_the_stored_object_for_unchanged_items() -> None:
    store: Store[list[int]] = Store(parse_fresh)
    store.replace([svc("a", 80), svc("b", 81)])
    before = store.get("default/a")
    changes = store.replace([svc("a", 80, rv="9"), svc("b", 82)])
    assert changes == [Change("default/b", [81], [82])]
    assert store.get("default/a") is before  # no second, equal copy kept alive


def test_replace_from_a_failing_lazy_list_leaves_the_store_as_it_was() -> None:
    store: Store[int] = Store(parse)
    store.replace([svc("a", 80)])

    def pages() -> Iterator[dict[str, Any]]:
        yield svc("a", 8080)
        raise ConnectionResetError("page 2 failed")

    with pytest.raises(ConnectionResetError):
        store.replace(pages())
    assert store.items() == {"default/a": 80}


def test_replace_reports_a_key_listed_twice_once_with_the_last_copy() -> None:
    store: Store[int] = Store(parse)
    store.replace([svc("a", 80)])
    assert store.replace([svc("a", 81), svc("a", 82)]) == [Change("default/a", 80, 82)]
    assert store.items() == {"default/a": 82}


def test_reflector_parses_each_page_before_fetching_the_next() -> None:
    server = FakeServer(
        [
            listing("10", svc("a", 80), svc("b", 81), cont="p2"),
            listing("11", svc("c", 82)),
        ]
    )
    calls_when_parsed: dict[int, int] = {}

    def parse_counting(obj: Mapping[str, Any]) -> int:
        calls_when_parsed[parse(obj)] = len(server.calls)
        return parse(obj)

    store: Store[int] = Store(parse_counting)
    reflector = Reflector(
        name="services",
        list_fn=server,
        store=store,
        on_changes=lambda cs: None,
        backoff=Backoff(initial=0.0, maximum=0.0),
    )
    reflector.run(server.stop)
    assert calls_when_parsed == {80: 1, 81: 1, 82: 2}
    assert store.items() == {"default/a": 80, "default/b": 81, "default/c": 82}
    assert server.calls[2]["resource_version"] == "11"  # the watch starts at the list's RV
